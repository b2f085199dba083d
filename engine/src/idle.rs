//! The workers' idle policy: when a worker sleeps. A worker that has just
//! moved a packet polls on for a short window before it sleeps in `poll`,
//! while the node has CPU to spare (`spare.rs` decides, once a second);
//! otherwise, and whenever polling costs it its CPU, it sleeps as soon as
//! a round moved nothing. Its one caller is the run loop every
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
//! - [`AUTO_WINDOW`]: a worker that has just moved a packet goes on with
//!   its loop's non-blocking reads until 50 us have passed since its last
//!   packet, then sleeps. It never calls `sched_yield`: who runs when a
//!   pod wakes on the spinner's CPU is left to the scheduler's wake-up
//!   preemption, and once its traffic stops it sleeps within one window.
//!   (The first version yielded after each empty round; each yield pushed
//!   the spinner's EEVDF deadline a whole slice later, so after a few dozen
//!   it lost the CPU for a slice, 1.4 ms here: busy p99.9 about 2 ms.)
//! - The gate ([`Spin`]): the window opens only while `spare.rs`'s sampler
//!   found a quarter of the node's CPUs idle with it closed. A fixed window
//!   measured A-B (below) showed why: on an idle node 50 us brings the p50
//!   near the kernel's, on a busy one it doubles the p99, because the
//!   spinner holds a CPU a pod needs; the backoff (next) was in place in
//!   that run and did not prevent it.
//! - [`LOST_CPU`] and [`BACKOFF`], for a window set by hand only (it has no
//!   gate): an empty round that took longer than 100 us means another task
//!   had the CPU (or the host took the vCPU); the worker then sleeps
//!   whenever idle for 100 ms, so on a contended CPU a worker's polling is
//!   cut to about one window per 100 ms. Behind the gate it did more harm
//!   than good: on an idle node it fired 20-41 times in each 4 s ping-pong
//!   (the `poll_backoffs` counter), each time dropping the window for
//!   100 ms, and the gate already closes the window on a busy node. Without
//!   it, A-B in one run (the last table below), the idle p50 went from
//!   0.50-0.67x to 0.31-0.44x kernel vxlan (one case 1.14x) and the idle
//!   p99 from 1.47-1.74x to 1.13-1.46x; the busy rows did not change (the
//!   gate was closed). What the gate leaves to a pod that starts using the
//!   CPU is at most one sampling period of windows.
//!
//! `WEFT_ENGINE_SPIN_US` in weftd's environment overrides the default
//! (`auto`): `0` never polls, a number is a window in microseconds that is
//! always open (with the backoff). Read once, when an engine starts.
//!
//! Fixed windows, measured A-B in one harness run (2026-12-02, release
//! build, 3 interleaved rounds x 4 s, sockperf 64 B, nothing else on the
//! machine; one-way p50 x kernel vxlan in the same run, UDP / TCP, for
//! weft udp, userspace vxlan and userspace WireGuard; README, "Latency"):
//!
//! | | idle p50 | idle p99 | busy p50 | busy p99 |
//! |---|---|---|---|---|
//! | 0 (no window) | 2.4-2.6x / 2.4-2.8x | 2.3-2.9x / 2.1-2.9x | 2.6-3.8x / 2.0x | 2.3-2.6x / 2.1-2.5x |
//! | 20 us | 0.9-2.0x / 1.1-2.0x | 1.6-2.3x / 2.1-2.6x | 4.0-4.5x / 2.2-2.6x | 3.5-3.9x / 3.0-3.5x |
//! | 50 us | 1.2-1.3x / 1.4-1.6x | 2.0-2.4x / 2.2-2.8x | 2.7-3.2x / 1.6-1.8x | 6.1-6.9x / 4.9-5.4x |
//!
//! Throughput stayed within the runs' ranges with 50 us (tcp1: udp 9.36 ->
//! 9.58, vxlan 10.67 -> 9.83, wireguard 4.18 -> 4.38 Gbit/s; tcp4, a
//! third run: 8.88 -> 9.20, 9.12 -> 9.01, 3.12 -> 3.45), and with no
//! traffic nothing polls (0.12-0.37 % of a core per node either way).
//!
//! The gated default against no window (`0`), A-B in a later run, same
//! conditions:
//!
//! | | idle p50 | idle p99 | busy p50 | busy p99 |
//! |---|---|---|---|---|
//! | 0 (no window) | 2.3-2.4x / 2.1-2.3x | 2.1-2.3x / 1.9-2.4x | 2.2-3.1x / 1.8-2.9x | 1.6-2.5x / 1.6-2.7x |
//! | default | 1.2-1.3x / 1.1-1.6x | 1.8-2.2x / 1.6-2.2x | 2.3-3.3x / 2.1-2.5x | 1.9-2.7x / 2.0-2.5x |
//!
//! On the busy node the gate stayed closed, so both rows there are the
//! same code and differ by the rounds' spread. tcp1 throughput: udp 9.16
//! -> 9.82, vxlan 8.70 -> 8.82, wireguard 3.72 -> 4.39 Gbit/s; idle CPU
//! 0.12-0.25 % of a core per node. A second idle-only run put the
//! default's p50 at 1.4-1.7x and p99 at 1.9-2.6x, and windows of 50 us
//! (always open) and 100 us at 1.1-1.5x / 1.8-2.5x and 1.3-1.7x /
//! 1.6-3.1x: 50 us stays.
//!
//! The gate without the backoff (now the default) against with it, A-B in
//! one run (2026-12-02, later, same conditions; this run's kernel vxlan:
//! idle p50 53 / 59 us, busy 7.0 / 7.9 us):
//!
//! | | idle p50 | idle p99 | busy p50 | busy p99 |
//! |---|---|---|---|---|
//! | with backoff | 0.58-0.67x / 0.50-0.66x | 1.50-1.57x / 1.47-1.74x | 4.3-10.1x / 5.5-7.7x | 2.9-3.9x / 2.1-2.8x |
//! | without | 0.31-0.44x / 0.31-1.14x | 1.13-1.33x / 1.35-1.46x | 6.0-7.2x / 5.7-7.7x | 2.4-3.1x / 2.5-3.0x |
//!
//! Per round trip on the idle node, both nodes together, the workers slept
//! 0.7-1.6 times with the backoff (median 1.2) and 0.5-1.8 without (median
//! 0.75); on the busy node 3.3-4.0 either way (the gate closed: no empty
//! round polled). tcp1 stayed within the rounds' spread (the gate is
//! mostly closed under a bulk stream on two vCPUs).
//!
//! With fast wake-ups (the harness's `HALTPOLL_NS=200000`: idle vCPUs poll
//! before they halt; kernel vxlan's idle p50 9-12 us) the default is
//! 1.4-2.5x kernel vxlan at the idle p50 and 2.3-4.0x at p99, where no
//! window is 2.4x and 2.0-2.1x: what is left is the engine's own two kernel
//! passes per direction, not wake-ups. Polling at `SCHED_IDLE` (a worker
//! switches to it for its window, so that a woken pod preempts it at once)
//! was measured there and was worse at every percentile (p50 2.3-2.9x,
//! p99 2.9-3.9x): not in. Other windows there, A-B against 50 us: 20 us
//! lost at p50 (2.8-3.6x against 1.9-2.3x), 100 and 200 us raised the p99
//! from 2.1-2.8x to 3.2-3.7x and 4.2-5.8x. In the harness both nodes share
//! two vCPUs, so the more a worker polls, the more it holds a CPU a pod or
//! the other node's worker waits for.
//!
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::stats::{Ctr, Local};

/// The window of the default mode, while the node has CPU to spare
/// (`spare.rs`).
pub(crate) const AUTO_WINDOW: Duration = Duration::from_micros(50);

/// An empty round longer than this, in a window set by hand, means the
/// worker lost its CPU while it polled: another task wanted it (or the host
/// took the vCPU). An empty round is two or three non-blocking syscalls, a
/// few microseconds; a pod's turn between two rounds (the reply the window
/// waits for) is a few syscalls more; a CPU-bound task that takes the CPU
/// keeps it for its slice (1.4 ms on these two vCPUs).
pub(crate) const LOST_CPU: Duration = Duration::from_micros(100);

/// How long a worker that lost its CPU while polling sleeps whenever idle,
/// as if the window were closed: on a contended CPU a worker polls about
/// one window per backoff.
pub(crate) const BACKOFF: Duration = Duration::from_millis(100);

/// The poll-on window of an engine's workers: how long, and whether it is
/// open now.
#[derive(Debug, Clone)]
pub(crate) struct Spin {
    window: Duration,
    /// The default mode's gate, set by the sampler (`spare.rs`); none: a
    /// window set by hand, always open.
    gate: Option<Arc<AtomicBool>>,
}

impl Spin {
    /// From `WEFT_ENGINE_SPIN_US`: unset or `auto`, [`AUTO_WINDOW`] behind
    /// a closed gate for the sampler to open; `0`, no window; a number,
    /// that many microseconds, always open.
    pub(crate) fn parse(v: Option<&str>) -> Result<Spin, &'static str> {
        match v.map(str::trim) {
            None | Some("auto") => Ok(Spin {
                window: AUTO_WINDOW,
                gate: Some(Arc::new(AtomicBool::new(false))),
            }),
            Some(us) => us.parse().map(Spin::fixed).map_err(
                |_| "WEFT_ENGINE_SPIN_US must be `auto` or a window in microseconds (0: off)",
            ),
        }
    }

    /// A window of `us` microseconds, always open (0: off).
    pub(crate) fn fixed(us: u64) -> Spin {
        Spin {
            window: Duration::from_micros(us),
            gate: None,
        }
    }

    /// The gate the sampler sets, in the default mode.
    pub(crate) fn gate(&self) -> Option<&Arc<AtomicBool>> {
        self.gate.as_ref()
    }

    /// What the window is doing now (the gate as the sampler left it).
    pub(crate) fn report(&self) -> PollWindow {
        match &self.gate {
            _ if self.window.is_zero() => PollWindow::Off,
            None => PollWindow::Fixed(self.window),
            Some(g) => PollWindow::Auto {
                window: self.window,
                open: g.load(Ordering::Relaxed),
            },
        }
    }

    fn open(&self) -> bool {
        !self.window.is_zero() && self.gate.as_ref().is_none_or(|g| g.load(Ordering::Relaxed))
    }
}

/// What an engine's poll-on window is doing, for status and logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollWindow {
    /// `WEFT_ENGINE_SPIN_US=0`: workers sleep as soon as a round moved
    /// nothing.
    Off,
    /// A window set by hand (`WEFT_ENGINE_SPIN_US`), always open.
    Fixed(Duration),
    /// The default: `window` after a worker's last packet, `open` while
    /// the node has CPU to spare.
    Auto { window: Duration, open: bool },
    /// The default, closed for good: why (a CPU quota, no `/proc/stat`).
    Unavailable(String),
}

impl std::fmt::Display for PollWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PollWindow::Off => write!(f, "off"),
            PollWindow::Fixed(w) => write!(f, "{} us, always open", w.as_micros()),
            PollWindow::Auto { window, open: true } => {
                write!(f, "auto, open ({} us)", window.as_micros())
            }
            PollWindow::Auto { open: false, .. } => write!(f, "auto, closed (no idle CPU seen)"),
            PollWindow::Unavailable(why) => write!(f, "off: {why}"),
        }
    }
}

/// A worker's idle state.
#[derive(Debug)]
pub(crate) struct Idle {
    spin: Spin,
    /// When the worker last moved a packet, while its spin window is open.
    last: Option<Instant>,
    /// When the previous round ended, unless it slept.
    prev: Option<Instant>,
    /// No polling before this (the worker lost its CPU while polling).
    quiet_until: Option<Instant>,
}

impl Idle {
    /// A worker's state at start, with its engine's window.
    pub(crate) fn new(spin: Spin) -> Idle {
        Idle {
            spin,
            last: None,
            prev: None,
            quiet_until: None,
        }
    }

    /// Ends one round of a worker's loop: `worked` says whether it moved
    /// anything; `sleep` is its blocking wait, called when the round moved
    /// nothing and the worker does not poll on. Counts sleeps, empty rounds
    /// polled on and backoffs in `ctr`.
    pub(crate) fn end_round(&mut self, worked: bool, ctr: &mut Local, sleep: impl FnOnce()) {
        self.end_round_at(Instant::now, worked, ctr, sleep);
    }

    /// [`Idle::end_round`] with the clock it reads when the window is open.
    fn end_round_at(
        &mut self,
        now: impl FnOnce() -> Instant,
        worked: bool,
        ctr: &mut Local,
        sleep: impl FnOnce(),
    ) {
        if !self.spin.open() {
            if !worked {
                ctr.add(Ctr::Sleeps, 1);
                sleep();
                self.prev = None;
                self.last = None;
            }
            return;
        }
        let quiet_until = self.quiet_until;
        let on = self.polls_on(now(), worked);
        // `polls_on` moves `quiet_until` only when a backoff starts.
        ctr.add(
            Ctr::PollBackoffs,
            u64::from(self.quiet_until != quiet_until),
        );
        if on {
            ctr.add(Ctr::PollRounds, u64::from(!worked));
            return;
        }
        ctr.add(Ctr::Sleeps, 1);
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
        let quiet = self.quiet_until.is_some_and(|q| now < q);
        let guarded = self.spin.gate.is_none();
        if guarded && !quiet && prev.is_some_and(|p| now.saturating_duration_since(p) > LOST_CPU) {
            self.quiet_until = Some(now + BACKOFF);
            self.last = None;
            return false;
        }
        let open = self
            .last
            .is_some_and(|t| now.saturating_duration_since(t) < self.spin.window);
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
        let mut idle = Idle::new(Spin::fixed(50));
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
        let mut idle = Idle::new(Spin::fixed(50));
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
    fn backoffs_and_polled_rounds_are_counted() {
        let (mut ctr, mut slept) = (Local::default(), 0);
        let mut idle = Idle::new(Spin::fixed(50));
        let t0 = Instant::now();
        idle.end_round_at(|| t0, true, &mut ctr, || slept += 1);
        idle.end_round_at(|| t0 + US, false, &mut ctr, || slept += 1);
        let late = t0 + LOST_CPU + 2 * US;
        idle.end_round_at(|| late, false, &mut ctr, || slept += 1);
        let counted =
            |c: &Local| [Ctr::PollRounds, Ctr::PollBackoffs, Ctr::Sleeps].map(|k| c.get(k));
        assert_eq!(counted(&ctr), [1, 1, 1]);
        idle.end_round_at(|| late + US, true, &mut ctr, || slept += 1);
        let later = late + LOST_CPU + 2 * US;
        idle.end_round_at(|| later, false, &mut ctr, || slept += 1);
        assert_eq!(counted(&ctr), [1, 1, 2], "backing off: one backoff");
        assert_eq!(slept, 2);
    }

    #[test]
    fn behind_the_gate_a_lost_cpu_does_not_back_off() {
        let auto = Spin::parse(None).expect("unset is auto");
        auto.gate().expect("a gate").store(true, Ordering::Relaxed);
        // A window longer than LOST_CPU, so that only the backoff could stop it.
        let mut idle = Idle::new(Spin {
            window: Duration::from_secs(60),
            ..auto
        });
        let t0 = Instant::now();
        assert!(idle.polls_on(t0, true));
        let late = t0 + LOST_CPU + 2 * US;
        assert!(
            idle.polls_on(late, false),
            "the gate decides, not a slow round"
        );
        assert_eq!(idle.quiet_until, None, "no backoff");
    }

    #[test]
    fn a_long_busy_round_is_not_a_lost_cpu() {
        let t0 = Instant::now();
        let mut idle = Idle::new(Spin::fixed(50));
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
        let (mut slept, mut ctr) = (0, Local::default());
        let mut never = Idle::new(Spin::fixed(0));
        never.end_round(true, &mut ctr, || slept += 1);
        assert_eq!(slept, 0);
        never.end_round(false, &mut ctr, || slept += 1);
        assert_eq!(slept, 1);
        let mut spin = Idle::new(Spin::fixed(60_000_000));
        let t0 = Instant::now();
        spin.end_round_at(|| t0, true, &mut ctr, || slept += 1);
        spin.end_round_at(|| t0 + US, false, &mut ctr, || slept += 1);
        assert_eq!(slept, 1, "inside the window: no sleep");
        assert_eq!((ctr.get(Ctr::Sleeps), ctr.get(Ctr::PollRounds)), (1, 1));
    }

    #[test]
    fn the_default_window_waits_for_its_gate() {
        let auto = Spin::parse(None).expect("unset is auto");
        assert_eq!(auto.window, AUTO_WINDOW);
        let gate = auto.gate().expect("auto has a gate").clone();
        assert!(!gate.load(Ordering::Relaxed), "closed until a probe");
        // A long window, so that the test does not depend on timing.
        let spin = Spin {
            window: Duration::from_secs(60),
            ..auto
        };
        let mut idle = Idle::new(spin);
        let t0 = Instant::now();
        let (mut slept, mut ctr) = (0, Local::default());
        idle.end_round_at(|| t0, true, &mut ctr, || slept += 1);
        idle.end_round_at(|| t0, false, &mut ctr, || slept += 1);
        assert_eq!(slept, 1, "gate closed: sleep as soon as idle");
        gate.store(true, Ordering::Relaxed);
        idle.end_round_at(|| t0, true, &mut ctr, || slept += 1);
        idle.end_round_at(|| t0 + US, false, &mut ctr, || slept += 1);
        assert_eq!(slept, 1, "gate open: poll on");
    }

    #[test]
    fn the_variable_picks_the_mode() {
        assert!(Spin::parse(Some("auto")).expect("auto").gate().is_some());
        let fixed = Spin::parse(Some(" 20 ")).expect("a number");
        assert_eq!((fixed.window, fixed.gate().is_none()), (20 * US, true));
        assert!(!Spin::parse(Some("0")).expect("zero").open());
        assert!(Spin::parse(Some("fast")).is_err());
        assert!(Spin::parse(Some("-5")).is_err());
    }

    #[test]
    fn reports_what_the_window_does() {
        assert_eq!(Spin::fixed(0).report().to_string(), "off");
        assert_eq!(Spin::fixed(20).report().to_string(), "20 us, always open");
        let auto = Spin::parse(None).expect("unset is auto");
        assert_eq!(auto.report().to_string(), "auto, closed (no idle CPU seen)");
        auto.gate().expect("a gate").store(true, Ordering::Relaxed);
        assert_eq!(auto.report().to_string(), "auto, open (50 us)");
    }
}
