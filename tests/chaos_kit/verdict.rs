//! The invariants over what a run recorded, and its report.
//!
//! - A failed request between pods is excused only while a fault touches
//!   one of their nodes: from [`LEAD`] s before it started (a request takes
//!   up to 6 s to fail) to [`Bounds::request`] s after it ended.
//! - A long-lived stream must never break (no fault here may legitimately
//!   reset one: none changes a pod's address; a subnet change is itself a
//!   violation) and must have moved in the last [`FINAL_QUIET`] s.
//! - No weftd log may contain a panic.
//! - Per node, the longest-lived weftd (≥ [`Bounds::min_life`] s) must stay flat:
//!   median of the last fifth minus median of the first fifth (after a
//!   30 s warm-up) within [`Bounds`].

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::FaultRecord;
use super::sample::Res;
use super::workload::{PodRef, Records};

/// A request that fails this long before a fault is blamed on it.
pub const LEAD: f64 = 6.5;
/// Every stream must have echoed within this many seconds of the end.
pub const FINAL_QUIET: f64 = 10.0;

/// The bounds a run is judged by (tests break them on purpose once).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Seconds after a fault's end by which requests must succeed again.
    pub request: f64,
    /// Seconds after a cluster's last fault by which it must have converged.
    pub converge: f64,
    /// RSS growth allowed, KiB.
    pub rss_kib: i64,
    /// Open-fd growth allowed.
    pub fds: i64,
    /// Thread-count growth allowed.
    pub threads: i64,
    /// Seconds (after a 30 s warm-up) a weftd must live for its drift to count.
    pub min_life: f64,
}

/// The bounds of the real runs: two reconcile periods (10 s) for requests.
pub const BOUNDS: Bounds = Bounds {
    request: 20.0,
    converge: super::sample::CONVERGE_BOUND,
    rss_kib: 16 * 1024,
    fds: 12,
    threads: 6,
    min_life: 90.0,
};

/// Bounds nothing can meet: `CHAOS_TIGHT=1` proves each check can fail.
pub const TIGHT: Bounds = Bounds {
    request: 0.0,
    converge: 0.0,
    rss_kib: -1,
    fds: -1,
    threads: -1,
    min_life: 5.0,
};

/// Input to [`judge`].
pub struct Run<'a> {
    /// Every fault.
    pub faults: &'a [FaultRecord],
    /// The pods.
    pub pods: &'a [PodRef],
    /// The workload's records.
    pub rec: &'a Records,
    /// Resource samples per (cluster, node, pid).
    pub res: &'a BTreeMap<(usize, usize, u32), Vec<Res>>,
    /// weftd logs per (cluster name, node).
    pub logs: Vec<(String, usize, String)>,
    /// When the run ended.
    pub end: f64,
    /// Requests before this (the warm-up: every pair's first contact,
    /// WireGuard handshakes) are not judged.
    pub from: f64,
}

fn touches(f: &FaultRecord, p: &PodRef) -> bool {
    f.scope.cluster == p.cluster && f.scope.nodes.contains(&p.node)
}

fn median(mut v: Vec<u64>) -> u64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Percentile `q` (0..1) of `v`.
pub fn pct(v: &[f64], q: f64) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let i = ((v.len() - 1) as f64 * q).round() as usize;
    v[i]
}

/// Checks the invariants; returns (violations, report text).
pub fn judge(r: &Run<'_>, b: Bounds) -> (Vec<String>, String) {
    let mut v = Vec::new();
    let mut out = String::new();
    // Requests.
    let reqs: Vec<_> = r.rec.reqs.iter().filter(|q| q.t >= r.from).collect();
    let failed: Vec<_> = reqs.iter().filter(|q| !q.ok).collect();
    let _ = writeln!(
        out,
        "requests: {} sent, {} failed",
        reqs.len(),
        failed.len()
    );
    let mut unexcused = 0;
    for q in &failed {
        let (a, z) = (&r.pods[q.from], &r.pods[q.to]);
        let excused = r.faults.iter().any(|f| {
            (touches(f, a) || touches(f, z)) && f.start - LEAD <= q.t && q.t <= f.end + b.request
        });
        if !excused {
            unexcused += 1;
            // A stall of this process overlapping the request (it takes up to 6 s).
            let stall = r
                .rec
                .stalls
                .iter()
                .filter(|(t, d)| *t <= q.t + 6.0 && q.t <= t + d)
                .map(|(t, d)| format!("; this process stalled {d:.1} s at {t:.1}s"))
                .next()
                .unwrap_or_default();
            let line = format!(
                "{:.1}s: request pod {} → pod {} (cluster {}) failed ({}) with no fault touching their nodes within {} s{stall}",
                q.t,
                q.from,
                q.to,
                a.cluster,
                q.why.unwrap_or("?"),
                b.request
            );
            let _ = writeln!(out, "unexcused: {line}");
            if unexcused <= 10 {
                v.push(line);
            }
        }
    }
    let longest = r.rec.stalls.iter().map(|s| s.1).fold(0.0, f64::max);
    let _ = writeln!(
        out,
        "test process stalls (a 100 ms sleep overslept by > {} s): {}, longest {longest:.1} s",
        super::workload::STALL,
        r.rec.stalls.len()
    );
    if unexcused > 10 {
        v.push(format!("... {unexcused} unexcused failed requests in all"));
    }
    outages(r, b, &mut out);
    // Streams.
    for s in &r.rec.streams {
        let _ = writeln!(
            out,
            "stream pod {} ⇄ pod {}: {} frames echoed, longest stall {:.1} s (ended {:.0} s), {} breaks",
            s.pods.0,
            s.pods.1,
            s.echoed,
            s.max_stall.0,
            s.max_stall.1,
            s.breaks.len()
        );
        for (t, why) in &s.breaks {
            v.push(format!(
                "{t:.1}s: stream pod {} ⇄ pod {} broke: {why}",
                s.pods.0, s.pods.1
            ));
        }
        if r.end - s.last_echo > FINAL_QUIET {
            v.push(format!(
                "stream pod {} ⇄ pod {} silent for the last {:.0} s",
                s.pods.0,
                s.pods.1,
                r.end - s.last_echo
            ));
        }
    }
    // Panics.
    for (c, n, log) in &r.logs {
        if let Some(l) = log.lines().find(|l| l.contains("panicked at")) {
            v.push(format!("{c} n{n}: weftd panicked: {l}"));
        }
    }
    drift(r, b, &mut v, &mut out);
    (v, out)
}

/// Longest outage per fault kind: runs of consecutive failures of one pod
/// pair, blamed on every fault overlapping them.
fn outages(r: &Run<'_>, b: Bounds, out: &mut String) {
    let mut by_pair: BTreeMap<(usize, usize), Vec<(f64, bool)>> = BTreeMap::new();
    for q in r.rec.reqs.iter().filter(|q| q.t >= r.from) {
        by_pair.entry((q.from, q.to)).or_default().push((q.t, q.ok));
    }
    // Every kind overlapping an outage, and (alone) outages one kind explains.
    let mut longest: BTreeMap<&str, f64> = BTreeMap::new();
    let mut alone: BTreeMap<&str, f64> = BTreeMap::new();
    for ((from, to), reqs) in &by_pair {
        let mut run: Option<(f64, f64)> = None;
        for &(t, ok) in reqs.iter().chain(std::iter::once(&(f64::MAX, true))) {
            match (ok, run) {
                (false, None) => run = Some((t, t)),
                (false, Some((s, _))) => run = Some((s, t)),
                (true, Some((s, e))) => {
                    let len = e - s + 0.25;
                    let kinds: BTreeSet<&str> = r
                        .faults
                        .iter()
                        .filter(|f| {
                            (touches(f, &r.pods[*from]) || touches(f, &r.pods[*to]))
                                && f.start - LEAD <= e
                                && s <= f.end + b.request
                        })
                        .map(|f| f.kind)
                        .collect();
                    for k in &kinds {
                        let l = longest.entry(k).or_default();
                        *l = l.max(len);
                    }
                    if let [k] = kinds.iter().collect::<Vec<_>>()[..] {
                        let l = alone.entry(k).or_default();
                        *l = l.max(len);
                    }
                    run = None;
                }
                (true, None) => {}
            }
        }
    }
    let _ = writeln!(
        out,
        "longest request outage by fault kind, any overlap (s): {longest:.1?}"
    );
    let _ = writeln!(
        out,
        "longest request outage by fault kind, that kind alone (s): {alone:.1?}"
    );
}

fn drift(r: &Run<'_>, b: Bounds, v: &mut Vec<String>, out: &mut String) {
    let mut best: BTreeMap<(usize, usize), &Vec<Res>> = BTreeMap::new();
    for ((c, n, _), s) in r.res {
        let life = |s: &Vec<Res>| s.last().map_or(0.0, |l| l.t) - s.first().map_or(0.0, |f| f.t);
        let e = best.entry((*c, *n)).or_insert(s);
        if life(s) > life(e) {
            *e = s;
        }
    }
    for ((c, n), s) in best {
        let t0 = s.first().map_or(0.0, |f| f.t) + 30.0;
        let s: Vec<Res> = s.iter().copied().filter(|x| x.t >= t0).collect();
        let life = s.last().map_or(0.0, |l| l.t) - s.first().map_or(0.0, |f| f.t);
        if life < b.min_life {
            let _ = writeln!(
                out,
                "drift c{c} n{n}: not measured (longest weftd lived {life:.0} s after warm-up)"
            );
            continue;
        }
        let k = (s.len() / 5).max(1);
        let (a, z) = (&s[..k], &s[s.len() - k..]);
        let d = |f: fn(&Res) -> u64| {
            let first = median(a.iter().map(f).collect());
            let last = median(z.iter().map(f).collect());
            (
                first,
                i64::try_from(last).unwrap_or(0) - i64::try_from(first).unwrap_or(0),
            )
        };
        let (rss0, drss) = d(|x| x.rss_kib);
        let (fd0, dfd) = d(|x| x.fds);
        let (th0, dth) = d(|x| x.threads);
        let _ = writeln!(
            out,
            "drift c{c} n{n} over {life:.0} s: RSS {rss0} KiB {drss:+} KiB, fds {fd0} {dfd:+}, threads {th0} {dth:+}"
        );
        if drss > b.rss_kib || dfd > b.fds || dth > b.threads {
            v.push(format!(
                "c{c} n{n}: weftd grew over {life:.0} s: RSS {drss:+} KiB, fds {dfd:+}, threads {dth:+} (bounds {} KiB, {}, {})",
                b.rss_kib, b.fds, b.threads
            ));
        }
    }
}
