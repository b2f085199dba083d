//! One chaos run from start to verdict: build the rig, wait until it has
//! converged, start the workload, alternate scheduler and sampler ticks for
//! the duration, undo every fault, remove the phantoms, keep the workload
//! running for a quiet period ([`QUIET`] s, longer than every bound), judge,
//! tear down and check that nothing was left behind.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::process::Command;
use std::time::Duration;

use super::faults::{KINDS, Scheduler};
use super::now;
use super::rig::Rig;
use super::sample::{CONVERGE_BOUND, Sampler, mismatch};
use super::verdict::{self, Bounds, Run};
use super::workload::{PodRef, Workload};

/// The quiet period after the last fault.
pub const QUIET: f64 = CONVERGE_BOUND + 5.0;
const TICK: f64 = 1.0;

/// How a run goes.
#[derive(Debug, Clone, Copy)]
pub struct Config {
    /// The scheduler's seed.
    pub seed: u64,
    /// Seconds of faults.
    pub duration: f64,
    /// Mean seconds between fault starts.
    pub mean_gap: f64,
    /// The bounds judged.
    pub bounds: Bounds,
    /// Inject every kind this machine can at least once (kinds not drawn
    /// yet go first); a kind never injected is then a violation.
    pub cover: bool,
}

/// What a run found.
#[derive(Debug)]
pub struct Outcome {
    /// Broken invariants (empty: the run passed).
    pub violations: Vec<String>,
    /// The report.
    pub report: String,
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// SIGINT/SIGTERM end the fault phase early; the run still undoes its
/// faults, judges, reports and tears down (a Ctrl-C on a long run leaves
/// nothing behind).
fn catch_signals() {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe).
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
}

/// Parses `1h`, `30m`, `90s` or plain seconds.
pub fn parse_duration(s: &str) -> Option<f64> {
    let s = s.trim();
    let (num, unit) = match s.char_indices().last()? {
        (i, 'h') => (&s[..i], 3600.0),
        (i, 'm') => (&s[..i], 60.0),
        (i, 's') => (&s[..i], 1.0),
        _ => (s, 1.0),
    };
    num.parse::<f64>().ok().map(|n| n * unit)
}

fn host_state() -> BTreeSet<String> {
    let mut set = BTreeSet::new();
    for args in [
        &["-o", "link", "show"][..],
        &["route", "show", "table", "all"],
        &["rule", "show"],
        &["xfrm", "state"],
        &["xfrm", "policy"],
    ] {
        let out = Command::new("ip").args(args).output().expect("spawn ip");
        for l in String::from_utf8_lossy(&out.stdout).lines() {
            // Link lines carry counters and state; keep the name only.
            let l = if args[1] == "link" {
                l.split(':').nth(1).unwrap_or(l).trim().to_string()
            } else {
                l.trim().to_string()
            };
            set.insert(format!("{} {l}", args.join(" ")));
        }
    }
    set
}

/// Runs one chaos run.
pub fn run(cfg: Config) -> Outcome {
    eprintln!(
        "chaos seed: {} (replay with CHAOS_SEED={}), {:.0} s of faults, one every {:.1} s on average",
        cfg.seed, cfg.seed, cfg.duration, cfg.mean_gap
    );
    let before = host_state();
    catch_signals();
    let mut rig = Rig::start();
    let prefixes: Vec<String> = rig
        .clusters
        .iter()
        .filter_map(|c| c.c.nodes[0].ns.name().split('-').next().map(str::to_string))
        .collect();
    let pods: Vec<PodRef> = rig
        .clusters
        .iter()
        .enumerate()
        .flat_map(|(ci, cc)| {
            cc.c.pods.iter().map(move |p| PodRef {
                cluster: ci,
                node: p.node,
                ns: p.ns.path(),
                ip: p.ip.clone(),
            })
        })
        .collect();
    let mut sched = Scheduler::new(cfg.seed, cfg.mean_gap, cfg.cover);
    for (k, why) in &sched.skipped {
        eprintln!("chaos: fault kind {k} skipped: {why}");
    }
    let mut sampler = Sampler::new(cfg.bounds.converge);
    for ci in 0..rig.clusters.len() {
        let ok = (0..120).any(|_| {
            std::thread::sleep(Duration::from_millis(500));
            mismatch(&rig.clusters[ci], ci, &sched).is_none()
        });
        assert!(
            ok,
            "{} never converged before the run: {:?}",
            rig.clusters[ci].name,
            mismatch(&rig.clusters[ci], ci, &sched)
        );
    }
    let work = Workload::start(&pods);
    let from = warm_up(&work, &pods);
    let t0 = now();
    let mut next_report = t0 + 60.0;
    while now() - t0 < cfg.duration && !STOP.load(std::sync::atomic::Ordering::Relaxed) {
        let t = now();
        sched.step(&mut rig, TICK);
        sampler.tick(&mut rig, &mut sched);
        if now() > next_report {
            next_report += 60.0;
            let g = work.rec.lock().expect("records");
            let failed = g.reqs.iter().filter(|q| !q.ok).count();
            eprintln!(
                "chaos {:8.1}s progress: {} faults, {} requests ({failed} failed), {} violations",
                now(),
                sched.done.len(),
                g.reqs.len(),
                sampler.violations.len() + sched.violations.len()
            );
        }
        std::thread::sleep(Duration::from_secs_f64((TICK - (now() - t)).max(0.05)));
    }
    let faulted = now() - t0;
    sched.drain(&mut rig);
    sched.clear_phantoms(&mut rig);
    let quiet = now();
    while now() - quiet < QUIET {
        let t = now();
        sampler.tick(&mut rig, &mut sched);
        std::thread::sleep(Duration::from_secs_f64((TICK - (now() - t)).max(0.05)));
    }
    let end = now();
    let rec = work.stop();
    let logs = rig
        .clusters
        .iter()
        .flat_map(|cc| (0..cc.c.nodes.len()).map(move |n| (cc.name.to_string(), n, cc.all_logs(n))))
        .collect();
    let r = Run {
        faults: &sched.done,
        pods: &pods,
        rec: &rec,
        res: &sampler.res,
        logs,
        end,
        from,
    };
    let (mut violations, mut report) = verdict::judge(&r, cfg.bounds);
    if cfg.cover {
        for k in sched.uncovered() {
            violations.push(format!("fault kind {k} was never injected"));
        }
    }
    violations.append(&mut sched.violations);
    violations.append(&mut sampler.violations);
    for (ci, kind, t) in sampler.unconverged() {
        violations.push(format!(
            "{}: never converged after {kind} ended at {t:.1}s: {:?}",
            rig.clusters[*ci].name,
            sampler.last_mismatch.get(ci)
        ));
    }
    summary(&cfg, faulted, &sched, &sampler, &mut report);
    // Mounts live under the clusters' work dirs (tmpfs, read-only binds).
    let dirs: Vec<String> = rig
        .clusters
        .iter()
        .map(|c| c.c.work().display().to_string())
        .collect();
    drop(rig);
    let _ = writeln!(
        report,
        "CPU (this process and every reaped child: weftd, etcd, tools): {:.0} core-seconds over {:.0} s, {:.2} cores",
        cpu_secs(),
        now(),
        cpu_secs() / now()
    );
    leftovers(&before, &prefixes, &dirs, &mut violations);
    eprintln!("chaos report (seed {}):\n{report}", cfg.seed);
    Outcome { violations, report }
}

fn summary(cfg: &Config, faulted: f64, s: &Scheduler, sm: &Sampler, out: &mut String) {
    let _ = writeln!(
        out,
        "seed {}, {faulted:.0} s of faults ({:.0} s asked for)",
        cfg.seed, cfg.duration
    );
    let mut by: Vec<(&str, usize)> = KINDS
        .iter()
        .map(|k| (*k, s.done.iter().filter(|f| f.kind == *k).count()))
        .collect();
    by.retain(|(_, n)| *n > 0);
    let _ = writeln!(out, "faults: {} in all: {by:?}", s.done.len());
    for (k, why) in &s.skipped {
        let _ = writeln!(out, "not injected: {k}: {why}");
    }
    let _ = writeln!(
        out,
        "phantom churn: {} store writes, {} refused",
        s.churn.0, s.churn.1
    );
    let _ = writeln!(
        out,
        "documented exits: own lease deleted → exit 0: {}; started on a garbage own lease → exit 1: {}",
        sm.documented_exits, sm.garbage_exits
    );
    let mut by_kind: std::collections::BTreeMap<&str, Vec<f64>> = Default::default();
    for (k, t) in &sm.converge {
        by_kind.entry(k).or_default().push(*t);
    }
    let per: Vec<String> = by_kind
        .iter()
        .map(|(k, v)| {
            format!(
                "{k} {:.1}/{:.1}",
                verdict::pct(v, 0.5),
                verdict::pct(v, 0.99)
            )
        })
        .collect();
    let _ = writeln!(out, "convergence p50/p99 by kind (s): {}", per.join(", "));
    let conv: Vec<f64> = sm.converge.iter().map(|c| c.1).collect();
    let _ = writeln!(
        out,
        "convergence after a fault: {} measured, p50 {:.1} s, p99 {:.1} s, max {:.1} s",
        conv.len(),
        verdict::pct(&conv, 0.5),
        verdict::pct(&conv, 0.99),
        verdict::pct(&conv, 1.0)
    );
}

fn leftovers(before: &BTreeSet<String>, prefixes: &[String], dirs: &[String], v: &mut Vec<String>) {
    std::thread::sleep(Duration::from_millis(500));
    let ns = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    for l in String::from_utf8_lossy(&ns.stdout).lines() {
        if prefixes.iter().any(|p| l.starts_with(&format!("{p}-"))) {
            v.push(format!("left behind: namespace {l}"));
        }
    }
    for l in host_state().difference(before) {
        let ours = ["flannel", "cni0", "weft", "xfrm"]
            .iter()
            .any(|w| l.contains(w))
            || prefixes.iter().any(|p| l.contains(p.as_str()));
        if ours {
            v.push(format!("left behind on the host: {l}"));
        }
    }
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    for l in mounts.lines() {
        if dirs.iter().any(|d| l.contains(d.as_str())) {
            v.push(format!("left behind: mount {l}"));
        }
    }
}

/// User + system CPU seconds of this process and its reaped children.
fn cpu_secs() -> f64 {
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    [libc::RUSAGE_SELF, libc::RUSAGE_CHILDREN]
        .into_iter()
        .map(|who| {
            // SAFETY: getrusage writes one rusage into the zeroed value we pass.
            let mut u: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: as above; `u` is a valid, writable rusage.
            unsafe { libc::getrusage(who, &mut u) };
            tv(u.ru_utime) + tv(u.ru_stime)
        })
        .sum()
}

/// Waits (up to 60 s) until every pod pair has had one request through,
/// then 3 s more; returns when judging starts.
fn warm_up(work: &Workload, pods: &[PodRef]) -> f64 {
    let pairs = pods
        .iter()
        .enumerate()
        .flat_map(|(a, pa)| {
            pods.iter()
                .enumerate()
                .filter(move |(b, pb)| *b != a && pb.cluster == pa.cluster)
                .map(move |(b, _)| (a, b))
        })
        .collect::<BTreeSet<_>>();
    let start = now();
    while now() - start < 60.0 {
        let g = work.rec.lock().expect("records");
        let ok: BTreeSet<(usize, usize)> = g
            .reqs
            .iter()
            .filter(|q| q.ok)
            .map(|q| (q.from, q.to))
            .collect();
        drop(g);
        if pairs.is_subset(&ok) {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::sleep(Duration::from_secs(3));
    eprintln!(
        "chaos {:8.1}s warm-up done ({:.1} s): every pod pair answered",
        now(),
        now() - start - 3.0
    );
    now()
}
