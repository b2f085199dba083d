//! The workers' idle policy: when a worker sleeps. By default it sleeps in
//! `poll` as soon as a round moved nothing; opt-in (`WEFT_ENGINE_SPIN_US`),
//! a worker that has just moved a packet polls on for a short window first,
//! and backs off when polling costs it its CPU. Its one caller is the run
//! loop every encapsulation shares (`worker.rs`): a change to how workers
//! wait lands here and there, once.
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
//! - [`SPIN`]: a worker that has just moved a packet goes on with its
//!   loop's non-blocking reads until the window has passed since its last
//!   packet, then sleeps. It never calls `sched_yield`: who runs when a
//!   pod wakes on the spinner's CPU is left to the scheduler's wake-up
//!   preemption, and once its traffic stops it sleeps within one window. (The
//!   first version yielded after each empty round; each yield pushed the
//!   spinner's EEVDF deadline a whole slice later, so after a few dozen it
//!   lost the CPU for a slice, 1.4 ms here: busy p99.9 about 2 ms.)
//! - [`LOST_CPU`] and [`BACKOFF`]: an empty round that took longer than
//!   100 us means another task had the CPU (or the host took the vCPU);
//!   the worker then sleeps whenever idle for 100 ms, so on a contended
//!   CPU a worker's polling is cut to about one window per 100 ms.
//!
//! The yielding spin also had every worker ask for a 100 us EEVDF slice
//! (`sched_setattr`), so that a yield cost less deadline; without yields
//! there is nothing for it to do, and it went with them.
//!
//! Measured A-B in one harness run (2026-12-02, release build, 3
//! interleaved rounds x 4 s, sockperf 64 B, nothing else on the machine;
//! one-way p50 x kernel vxlan in the same run, UDP / TCP; README, "Latency"):
//!
//! | | idle p50 | idle p99 | busy p50 | busy p99 |
//! |---|---|---|---|---|
//! | default | 2.4-2.6x / 2.4-2.8x | 2.3-2.9x / 2.1-2.9x | 2.6-3.8x / 2.0x | 2.3-2.6x / 2.1-2.5x |
//! | 20 us | 0.9-2.0x / 1.1-2.0x | 1.6-2.3x / 2.1-2.6x | 4.0-4.5x / 2.2-2.6x | 3.5-3.9x / 3.0-3.5x |
//! | 50 us | 1.2-1.3x / 1.4-1.6x | 2.0-2.4x / 2.2-2.8x | 2.7-3.2x / 1.6-1.8x | 6.1-6.9x / 4.9-5.4x |
//!
//! With 50 us every idle-node p50 but one (weft udp over TCP, 1.59x) is
//! inside the 1.5x goal; on a busy node (two `nice -n 19` busy loops on
//! the two vCPUs) no window brings the p50 under 2x over UDP, and the p99
//! doubles: the ping-pong's four threads (two pods, two workers) and the
//! busy loops share two vCPUs, and a spinning worker holds a CPU a pod
//! needs. Throughput stayed within the runs' ranges (tcp1: udp 9.36 ->
//! 9.58, vxlan 10.67 -> 9.83, wireguard 4.18 -> 4.38 Gbit/s; tcp4, a
//! third run: 8.88 -> 9.20, 9.12 -> 9.01, 3.12 -> 3.45), and with no
//! traffic nothing spins (0.12-0.37 % of a core per node either way).
//!
//! **Off by default** ([`SPIN_US`] is 0), because a busy node's p99 is
//! worse with it; a node whose pods are latency-bound and whose CPU is not
//! contended opts in with `WEFT_ENGINE_SPIN_US=50` in weftd's environment
//! (read once per worker at start; 0 turns it off).

use std::time::{Duration, Instant};

/// How long a worker polls on after its last packet before it sleeps (0: off;
/// `WEFT_ENGINE_SPIN_US`).
pub(crate) const SPIN: Duration = Duration::from_micros(SPIN_US);
const SPIN_US: u64 = 0;

/// An empty round longer than this means the worker lost its CPU while it
/// polled: another task wanted it (or the host took the vCPU). An empty
/// round is two or three non-blocking syscalls, a few microseconds;
/// a pod's turn between two rounds (the reply the window waits for) is a
/// few syscalls more; a CPU-bound task that takes the CPU keeps it for its
/// slice (1.4 ms on these two vCPUs).
pub(crate) const LOST_CPU: Duration = Duration::from_micros(100);

/// How long a worker that lost its CPU while polling sleeps whenever idle,
/// as if [`SPIN`] were 0: on a contended CPU a worker polls about one
/// window per backoff.
pub(crate) const BACKOFF: Duration = Duration::from_millis(100);

/// A worker's idle state.
#[derive(Debug)]
pub(crate) struct Idle {
    spin: Duration,
    /// When the worker last moved a packet, while its spin window is open.
    last: Option<Instant>,
    /// When the previous round ended, unless it slept.
    prev: Option<Instant>,
    /// No polling before this (the worker lost its CPU while polling).
    quiet_until: Option<Instant>,
}

impl Idle {
    /// Called by a worker at start: [`SPIN`], or `WEFT_ENGINE_SPIN_US`
    /// (microseconds) when set.
    pub(crate) fn new() -> Idle {
        let spin = std::env::var("WEFT_ENGINE_SPIN_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(SPIN, Duration::from_micros);
        Idle::with_spin(spin)
    }

    fn with_spin(spin: Duration) -> Idle {
        Idle {
            spin,
            last: None,
            prev: None,
            quiet_until: None,
        }
    }

    /// Ends one round of a worker's loop: `worked` says whether it moved
    /// anything; `sleep` is its blocking wait, called when the round moved
    /// nothing and the worker does not poll on.
    pub(crate) fn end_round(&mut self, worked: bool, sleep: impl FnOnce()) {
        if self.spin.is_zero() {
            if !worked {
                sleep();
            }
            return;
        }
        if self.polls_on(Instant::now(), worked) {
            return;
        }
        sleep();
        self.prev = None;
    }

    /// The policy at `now`, after a round that `worked` or not: whether
    /// the worker goes on without sleeping.
    fn polls_on(&mut self, now: Instant, worked: bool) -> bool {
        let prev = self.prev.replace(now);
        if worked {
            self.last = Some(now);
            return true;
        }
        if prev.is_some_and(|p| now.saturating_duration_since(p) > LOST_CPU) {
            self.quiet_until = Some(now + BACKOFF);
        }
        let quiet = self.quiet_until.is_some_and(|q| now < q);
        let open = self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.spin);
        if open && !quiet {
            return true;
        }
        self.last = None;
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn polls_after_work_then_sleeps() {
        let t0 = Instant::now();
        let mut idle = Idle::with_spin(50 * US);
        assert!(!idle.polls_on(t0, false), "no traffic yet: sleep");
        idle.prev = None;
        assert!(idle.polls_on(t0 + 10 * US, true), "a packet: go on");
        assert!(
            idle.polls_on(t0 + 12 * US, false),
            "inside the window: poll on"
        );
        assert!(
            idle.polls_on(t0 + 40 * US, false),
            "a local reply's turn is not a lost CPU"
        );
        assert!(!idle.polls_on(t0 + 61 * US, false), "window passed: sleep");
    }

    #[test]
    fn a_lost_cpu_stops_polling_for_the_backoff() {
        let t0 = Instant::now();
        let mut idle = Idle::with_spin(50 * US);
        assert!(idle.polls_on(t0, true));
        let late = t0 + LOST_CPU + 2 * US;
        assert!(
            !idle.polls_on(late, false),
            "an empty round that lost the CPU: sleep"
        );
        idle.prev = None;
        assert!(idle.polls_on(late + US, true));
        assert!(
            !idle.polls_on(late + 2 * US, false),
            "backing off: sleep when idle"
        );
        idle.prev = None;
        let after = late + BACKOFF + US;
        assert!(idle.polls_on(after, true));
        assert!(idle.polls_on(after + US, false), "backoff over: poll again");
    }

    #[test]
    fn a_long_busy_round_is_not_a_lost_cpu() {
        let t0 = Instant::now();
        let mut idle = Idle::with_spin(50 * US);
        assert!(idle.polls_on(t0, true));
        let t1 = t0 + 10 * LOST_CPU;
        assert!(
            idle.polls_on(t1, true),
            "a round that moved a lot took long"
        );
        assert!(idle.polls_on(t1 + US, false), "still polling");
    }

    #[test]
    fn spin_zero_sleeps_whenever_idle() {
        let mut slept = 0;
        let mut never = Idle::with_spin(Duration::ZERO);
        never.end_round(true, || slept += 1);
        assert_eq!(slept, 0);
        never.end_round(false, || slept += 1);
        assert_eq!(slept, 1);
        let mut spin = Idle::with_spin(Duration::from_secs(60));
        spin.end_round(true, || slept += 1);
        spin.end_round(false, || slept += 1);
        assert_eq!(slept, 1, "inside the window: no sleep");
    }
}
