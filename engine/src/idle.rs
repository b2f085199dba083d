//! The workers' idle policy: after a round that moved a packet, a worker
//! polls on for a short window before it sleeps.
//!
//! A worker asleep in `poll` is woken by the kernel when its next packet
//! arrives, and a request/response exchange through the engine pays that
//! wake-up on both nodes in each direction, where the kernel's vxlan runs in
//! the sender's own context. So a worker that has just moved a packet keeps
//! polling (its loop's non-blocking reads; each empty round ends in
//! `sched_yield`, so that a task waiting for this CPU, such as the
//! application the reply comes from, runs first) until [`SPIN`] has passed
//! since its last packet, and only then sleeps. With no traffic a worker
//! sleeps as before: an idle node costs no CPU. `WEFT_ENGINE_SPIN_US` (read
//! once per worker at start; 0 never spins) overrides [`SPIN`] for
//! measurements.

use std::time::{Duration, Instant};

/// How long a worker polls on after its last packet before it sleeps.
pub(crate) const SPIN: Duration = Duration::from_micros(SPIN_US);
const SPIN_US: u64 = 100;

/// The EEVDF slice a worker asks for at start ([`crate::sys::sched::set_slice`]).
pub(crate) const SLICE: Duration = Duration::from_micros(SLICE_US);
const SLICE_US: u64 = 100;

/// A worker's idle state: when it last moved a packet.
#[derive(Debug)]
pub(crate) struct Idle {
    spin: Duration,
    last: Option<Instant>,
}

impl Idle {
    /// Called by a worker at start: [`SPIN`] and [`SLICE`], or
    /// `WEFT_ENGINE_SPIN_US` and `WEFT_ENGINE_SLICE_US` when set (a slice
    /// of 0 keeps the kernel's default).
    pub(crate) fn new() -> Idle {
        let us = |var: &str, default: Duration| {
            std::env::var(var)
                .ok()
                .and_then(|v| v.parse().ok())
                .map_or(default, Duration::from_micros)
        };
        let slice = us("WEFT_ENGINE_SLICE_US", SLICE);
        if !slice.is_zero()
            && let Err(e) = crate::sys::sched::set_slice(slice)
        {
            tracing::debug!("no custom scheduler slice for the worker ({e})");
        }
        Idle {
            spin: us("WEFT_ENGINE_SPIN_US", SPIN),
            last: None,
        }
    }

    /// Ends one round of a worker's loop: `worked` says whether it moved
    /// anything; `sleep` is its blocking wait, called only once the spin
    /// window since the last packet has passed.
    pub(crate) fn end_round(&mut self, worked: bool, sleep: impl FnOnce()) {
        if self.spin.is_zero() {
            if !worked {
                sleep();
            }
            return;
        }
        let now = Instant::now();
        if worked {
            self.last = Some(now);
        } else if self.last.is_some_and(|t| now.duration_since(t) < self.spin) {
            std::thread::yield_now();
        } else {
            self.last = None;
            sleep();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spins_after_work_then_sleeps() {
        let mut idle = Idle {
            spin: Duration::from_millis(50),
            last: None,
        };
        let mut slept = 0;
        idle.end_round(false, || slept += 1);
        assert_eq!(slept, 1, "no traffic yet: sleep");
        idle.end_round(true, || slept += 1);
        idle.end_round(false, || slept += 1);
        assert_eq!(slept, 1, "within the window after a packet: poll on");
        std::thread::sleep(Duration::from_millis(60));
        idle.end_round(false, || slept += 1);
        assert_eq!(slept, 2, "window passed: sleep");
        let mut never = Idle {
            spin: Duration::ZERO,
            last: None,
        };
        never.end_round(true, || slept += 1);
        never.end_round(false, || slept += 1);
        assert_eq!(slept, 3, "spin 0: sleep whenever idle");
    }
}
