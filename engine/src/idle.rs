//! The workers' idle policy, opt-in: after a round that moved a packet, a
//! worker may poll on for a short window before it sleeps, and every worker
//! may ask the scheduler for a short slice (both off by default; see the
//! end of these docs for why). Its one caller is the run loop every
//! encapsulation shares (`worker.rs`): a change to how workers wait lands
//! here and there, once.
//!
//! A worker asleep in `poll` is woken by the kernel when its next packet
//! arrives, and a request/response exchange through the engine pays that
//! wake-up on both nodes in each direction, where the kernel's vxlan runs in
//! the sender's own context. Traced (`RR_TRACE=1` in the throughput
//! harness), one sockperf request through weft udp on a busy node is three
//! wake-ups instead of kernel vxlan's one (node 1's worker, woken by the
//! client's TUN write; node 2's, woken by node 1's `sendmmsg`; the server),
//! each 4-8 us from `sched_waking` to running, on the waker's CPU; on an
//! idle machine half of them cross to a halted vCPU (13-22 us).
//!
//! - [`SPIN`]: a worker that has just moved a packet keeps polling (its
//!   loop's non-blocking reads; each empty round ends in `sched_yield`, so
//!   that a task waiting for this CPU, such as the application the reply
//!   comes from, runs first) until 20 us have passed since its last packet,
//!   long enough for a local application's reply, shorter than a round
//!   trip. With no traffic a worker sleeps as before: idle, 0.08-0.10 % of a
//!   core per node over 30 s (0.03-0.08 % before). Alone, spinning took the busy-node p50 from 42-59 to
//!   25-29 us but its p99 to 0.9-1.2 ms: each `sched_yield` pushes the
//!   spinner's deadline a whole slice (1.4 ms here) later, so a spinner that
//!   yields a few dozen times loses the CPU to the node's other tasks for a
//!   slice.
//! - [`SLICE`]: so every worker asks for a 100 us EEVDF slice (the kernel's
//!   minimum; default 1.4 ms on two vCPUs): a yield then costs 100 us of
//!   deadline, and a waking worker preempts a task with a longer slice
//!   (`PREEMPT_SHORT`). Its CPU share does not change.
//!
//! Both together, A-B in one harness run (3 rounds, sockperf 64 B, busy
//! node): one-way p50 47/56/45 -> 33/33/32 us over UDP for weft udp, vxlan
//! and wireguard (kernel vxlan 14), p99 71/91/76 -> 68/65/56; idle p50
//! unchanged (29-34), idle p99 mostly worse (87-568 us, from 66-288). Throughput
//! stayed within the run's noise, but all eight tcp1/tcp4 medians of two
//! runs were 6-25 % lower, and neither change alone lowered them (README,
//! "Latency").
//!
//! **Both are off by default** ([`SPIN_US`] and [`SLICE_US`] are 0: a
//! worker sleeps as soon as a round moved nothing, with the kernel's
//! slice). The busy-node median gain did not come free: in the same runs
//! the idle-node p99 rose 2-5x (weft udp UDP 228 -> 492 us, wireguard TCP
//! 184 -> 568 us), every p99.9 rose (busy, quiet machine: 0.7-1.5 ms ->
//! 1.7-1.8 ms) and the throughput medians fell. A quiet-machine A-B on the
//! one-loop engine (2026-12-02) took back the throughput loss (tcp1/tcp4
//! vxlan +25/+37 %, wireguard +24/+15 %, udp -2/-8 %) and kept the rest:
//! busy p50 1.7-2.8x kernel vxlan with spin against 2.0-3.2x without, busy
//! p99 2.6-31x against 1.7-2.5x, p99.9 ~2 ms against 0.1-0.85 ms. So the
//! default keeps the tails, and latency-sensitive nodes opt in with
//! `WEFT_ENGINE_SPIN_US=20 WEFT_ENGINE_SLICE_US=100` in weftd's
//! environment (read once per worker at start; 0 turns either off).

use std::time::{Duration, Instant};

/// How long a worker polls on after its last packet before it sleeps (0: off;
/// 20 us is the measured opt-in, `WEFT_ENGINE_SPIN_US`).
pub(crate) const SPIN: Duration = Duration::from_micros(SPIN_US);
const SPIN_US: u64 = 0;

/// The EEVDF slice a worker asks for at start ([`crate::sys::sched::set_slice`];
/// 0: the kernel's; 100 us is the measured opt-in, `WEFT_ENGINE_SLICE_US`).
pub(crate) const SLICE: Duration = Duration::from_micros(SLICE_US);
const SLICE_US: u64 = 0;

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
