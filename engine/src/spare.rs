//! Whether the node has CPU to spare for the workers' poll-on window
//! (`idle.rs`). In the default mode (`WEFT_ENGINE_SPIN_US` unset or `auto`)
//! a sampler thread opens the window only while the node's CPUs would
//! otherwise sit idle; the workers read its verdict with one relaxed load
//! per round and never talk to it.
//!
//! The sampler probes: every [`PERIOD`] of the wall clock (so that all
//! engines on a machine probe at once) it closes the window for
//! [`PROBE`] and reads how much of the node's CPU was idle meanwhile
//! (`/proc/stat`, all CPUs, idle + iowait). Measured with the window open,
//! the figure would lie either way: the workers' polling hides idle CPU,
//! and counting weftd's own CPU as spare makes low-priority busy loops look
//! like spare CPU (they fill whatever the workers leave, and give it back
//! when a worker polls). With the window closed, idle CPU is what the node
//! does not use. The window then stays open until the next probe if at
//! least [`spare`]'s threshold was idle: a quarter of the node's CPUs
//! (on a large node many workers may poll at once). Measured in the
//! harness (two nodes on two vCPUs, sockperf ping-pong through weft udp):
//! 0.94-1.02 cores idle with the window closed, 0.00-0.04 beside the two
//! `nice -n 19` busy loops of the busy case, so half a core of two
//! separates them with room either way. A one-CPU node never polls: a
//! polling worker would hold the CPU the pod needs for its reply.
//!
//! Costs: the window is closed an eighth of the time, so about 1 in 8
//! requests of a steady stream takes the sleeping path (a p50 of about
//! 35 us in the harness, below the polling path's p99 of about 50); two
//! `/proc/stat` reads per [`PERIOD`]; a node that becomes busy keeps
//! polling for at most one [`PERIOD`] (the lost-CPU backoff of hand-set
//! windows, `idle::LOST_CPU`, is off behind the gate: on an idle node it
//! fired 20-41 times per 4 s ping-pong and cost more than it saved).
//!
//! Shorter probes (30 ms every 4 s, the window closed 0.75 % of the time)
//! brought the idle p50 with fast wake-ups from 1.9-2.5x kernel vxlan to
//! 1.5-1.7x in one run and left the p99 alone. Not in: `/proc/stat` counts
//! in 10 ms ticks (6 ticks over two CPUs against a threshold of 1.5), a
//! busy node would keep polling for up to 4 s, and the finer source,
//! cpuidle's per-state `time`, counts an idle period only once it ends (a
//! CPU halted through the whole probe would look busy).
//!
//! Under a CPU quota (cgroup v2 `cpu.max` other than `max`, or v1
//! `cpu.cfs_quota_us` other than -1) the window stays closed: polling
//! would spend the quota and get weftd throttled.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// How often the sampler probes.
const PERIOD: Duration = Duration::from_secs(1);
/// How long a probe closes the window: 25 clock ticks over two CPUs, so
/// one tick is 8 % of a core, against a threshold of half a core.
const PROBE: Duration = Duration::from_millis(125);

/// Why the CPU times could not be read.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
enum StatError {
    #[error("no aggregate `cpu` line")]
    NoCpuLine,
    #[error("`cpu` line field {0} is not a number")]
    BadField(usize),
    #[error("`cpu` line has {0} fields, want at least 4")]
    Short(usize),
}

/// The node's CPU times since boot, summed over its CPUs, in clock ticks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuTimes {
    /// Every state but guest time (already counted in user and nice).
    total: u64,
    /// Idle and iowait.
    idle: u64,
    /// `cpuN` lines.
    cpus: u32,
}

/// Parses `/proc/stat`.
fn parse_stat(text: &str) -> Result<CpuTimes, StatError> {
    let line = text
        .lines()
        .find(|l| l.starts_with("cpu "))
        .ok_or(StatError::NoCpuLine)?;
    let mut f = [0u64; 8];
    let mut n = 0;
    for (i, v) in line.split_whitespace().skip(1).take(8).enumerate() {
        f[i] = v.parse().map_err(|_| StatError::BadField(i + 1))?;
        n = i + 1;
    }
    if n < 4 {
        return Err(StatError::Short(n));
    }
    let cpus = text
        .lines()
        .filter(|l| {
            l.strip_prefix("cpu")
                .is_some_and(|r| r.starts_with(|c: char| c.is_ascii_digit()))
        })
        .count();
    Ok(CpuTimes {
        total: f.iter().fold(0u64, |a, &v| a.saturating_add(v)),
        idle: f[3].saturating_add(f[4]),
        cpus: u32::try_from(cpus).unwrap_or(u32::MAX),
    })
}

/// The idle CPU between samples `a` and `b`, in cores; none when no time
/// passed.
fn idle_cores(a: &CpuTimes, b: &CpuTimes) -> Option<f64> {
    let total = b.total.saturating_sub(a.total);
    (total > 0).then(|| b.idle.saturating_sub(a.idle) as f64 * f64::from(b.cpus) / total as f64)
}

/// Whether `idle` cores of a node of `cpus` are enough to poll on: a
/// quarter of the node's CPUs, on a node of two CPUs or more.
fn spare(idle: f64, cpus: u32) -> bool {
    cpus >= 2 && idle >= f64::from(cpus) / 4.0
}

/// Whether a cgroup v2 `cpu.max` sets a quota.
fn has_quota(cpu_max: &str) -> bool {
    cpu_max
        .split_whitespace()
        .next()
        .is_some_and(|q| q != "max")
}

/// Whether a cgroup v1 `cpu.cfs_quota_us` sets a quota (-1: none).
fn has_v1_quota(cfs_quota_us: &str) -> bool {
    cfs_quota_us.trim().parse::<i64>().is_ok_and(|q| q > 0)
}

/// The CPU quota of weftd's cgroup (v2 `cpu.max`, or v1
/// `cpu.cfs_quota_us` of the hierarchy holding the cpu controller), if any.
fn quota() -> Option<String> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':').skip(1);
        let (ctrl, path) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
        let read = |file: String| std::fs::read_to_string(file).ok();
        if ctrl.is_empty() {
            if let Some(m) = read(format!("/sys/fs/cgroup{path}/cpu.max"))
                && has_quota(&m)
            {
                return Some(format!("cpu.max {}", m.trim()));
            }
        } else if ctrl.split(',').any(|c| c == "cpu") {
            let q = read(format!("/sys/fs/cgroup/{ctrl}{path}/cpu.cfs_quota_us"))
                .or_else(|| read(format!("/sys/fs/cgroup/cpu{path}/cpu.cfs_quota_us")));
            if let Some(q) = q
                && has_v1_quota(&q)
            {
                return Some(format!("cpu.cfs_quota_us {}", q.trim()));
            }
        }
    }
    None
}

/// Why the window stays closed for good, if it does: weftd's cgroup has
/// a CPU quota, or `/proc/stat` cannot be read.
fn unavailable() -> Option<String> {
    if let Some(q) = quota() {
        return Some(format!("weftd's cgroup has a CPU quota ({q})"));
    }
    read().err().map(|e| format!("/proc/stat: {e}"))
}

fn read() -> Result<CpuTimes, String> {
    let text = std::fs::read_to_string("/proc/stat").map_err(|e| e.to_string())?;
    parse_stat(&text).map_err(|e| e.to_string())
}

/// The sampler thread's loop: probes every [`PERIOD`] and sets `gate` to
/// whether the window may open, until `stop` (the engine unparks it).
fn run(gate: &AtomicBool, stop: &AtomicBool) {
    let mut open = false;
    loop {
        if !pause(to_next_period(SystemTime::now()), stop) {
            return;
        }
        gate.store(false, Ordering::Relaxed);
        let a = read();
        if !pause(PROBE, stop) {
            return;
        }
        let (idle, cpus) = match (a, read()) {
            (Ok(a), Ok(b)) => (idle_cores(&a, &b).unwrap_or(0.0), b.cpus),
            _ => (0.0, 0),
        };
        let now = spare(idle, cpus);
        tracing::trace!(idle, "probe");
        if now != open {
            tracing::debug!(open = now, idle, "poll-on window");
            open = now;
        }
        gate.store(open, Ordering::Relaxed);
    }
}

/// How long from `now` to the next multiple of [`PERIOD`] of the wall
/// clock: every engine on a machine probes at once, so that none counts
/// another's polling as busy CPU (the harness runs two nodes on one).
fn to_next_period(now: SystemTime) -> Duration {
    let p = PERIOD.as_nanos();
    let t = now
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_nanos();
    Duration::from_nanos(u64::try_from(p - t % p).unwrap_or(0))
}

/// Sleeps for `d` unless `stop` is set first; whether it slept all of it.
fn pause(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    while !stop.load(Ordering::Relaxed) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return true;
        }
        std::thread::park_timeout(left);
    }
    false
}

/// Starts the sampler thread for `gate`, unless the window is unavailable:
/// it then stays closed, and the reason is logged once and returned.
pub(crate) fn start(
    gate: &Arc<AtomicBool>,
    stop: &Arc<AtomicBool>,
) -> Result<std::thread::JoinHandle<()>, String> {
    let (g, s) = (gate.clone(), stop.clone());
    let started = match unavailable() {
        Some(why) => Err(why),
        None => std::thread::Builder::new()
            .name("weft-cpu".into())
            .spawn(move || run(&g, &s))
            .map_err(|e| format!("no sampler thread: {e}")),
    };
    if let Err(why) = &started {
        tracing::info!("the engine's poll-on window stays off: {why}");
    }
    started
}

#[cfg(test)]
mod tests {
    use super::*;

    const STAT: &str = "cpu  100 5 50 800 20 1 2 3 0 0\n\
                        cpu0 50 2 25 400 10 1 1 2 0 0\n\
                        cpu1 50 3 25 400 10 0 1 1 0 0\n\
                        intr 1234\nctxt 99\n";

    #[test]
    fn parses_the_aggregate_line() {
        let t = parse_stat(STAT).expect("a stat");
        assert_eq!(
            t,
            CpuTimes {
                total: 981,
                idle: 820,
                cpus: 2
            }
        );
        let old = parse_stat("cpu  1 2 3 4\ncpu0 1 2 3 4\n").expect("four fields");
        assert_eq!((old.total, old.idle, old.cpus), (10, 4, 1));
    }

    #[test]
    fn bad_stat_is_an_error_not_a_panic() {
        assert_eq!(parse_stat(""), Err(StatError::NoCpuLine));
        assert_eq!(parse_stat("cpu0 1 2 3 4\n"), Err(StatError::NoCpuLine));
        assert_eq!(parse_stat("cpu  1 2 x 4\n"), Err(StatError::BadField(3)));
        assert_eq!(parse_stat("cpu  1 2 3\n"), Err(StatError::Short(3)));
        assert_eq!(parse_stat("cpu \n"), Err(StatError::Short(0)));
        let huge = format!("cpu  {m} {m} {m} {m} {m}\n", m = u64::MAX);
        assert_eq!(parse_stat(&huge).map(|t| t.total), Ok(u64::MAX));
    }

    /// [`spare`] between samples `a` and `b`.
    fn spare_cores(a: &CpuTimes, b: &CpuTimes) -> bool {
        idle_cores(a, b).is_some_and(|idle| spare(idle, b.cpus))
    }

    fn t(total: u64, idle: u64, cpus: u32) -> CpuTimes {
        CpuTimes { total, idle, cpus }
    }

    #[test]
    fn spare_needs_half_a_core_of_two() {
        let a = t(1000, 500, 2);
        assert!(spare_cores(&a, &t(1050, 513, 2)), "half a core idle");
        assert!(!spare_cores(&a, &t(1050, 512, 2)), "just under half");
        assert!(!spare_cores(&a, &t(1050, 500, 2)), "busy loops on both");
        assert!(!spare_cores(&a, &t(1025, 525, 1)), "one idle CPU of one");
        assert!(!spare_cores(&a, &a), "no time passed");
        assert!(!spare_cores(&a, &t(900, 400, 2)), "counters went back");
    }

    #[test]
    fn a_large_node_needs_a_quarter_of_its_cpus_idle() {
        let a = t(0, 0, 64);
        // 64 CPUs x 25 ticks: 16 idle cores are 400 ticks.
        assert!(spare_cores(&a, &t(1600, 400, 64)));
        assert!(!spare_cores(&a, &t(1600, 399, 64)), "15.96 idle cores");
    }

    #[test]
    fn cpu_max_quota() {
        assert!(!has_quota("max 100000\n"));
        assert!(has_quota("50000 100000\n"));
        assert!(!has_quota(""));
        assert!(!has_v1_quota("-1\n"));
        assert!(has_v1_quota("50000\n"));
        assert!(!has_v1_quota("junk"));
    }

    #[test]
    fn probes_start_on_the_wall_clock_period() {
        let at = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(to_next_period(at(4_000_300)), Duration::from_millis(700));
        assert_eq!(to_next_period(at(4_000_000)), PERIOD);
        assert_eq!(to_next_period(UNIX_EPOCH - PERIOD), PERIOD);
    }

    #[test]
    fn an_unpark_ends_the_pause_when_stopped() {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let (tx, rx) = std::sync::mpsc::channel();
        let h = std::thread::spawn(move || tx.send(pause(Duration::from_secs(600), &s)));
        std::thread::sleep(Duration::from_millis(50));
        stop.store(true, Ordering::Relaxed);
        h.thread().unpark();
        let slept = rx.recv_timeout(Duration::from_secs(60));
        assert_eq!(slept, Ok(false), "stopped, not slept out");
    }
}
