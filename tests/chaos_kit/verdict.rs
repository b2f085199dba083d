//! The invariants over what a run recorded, and its report.
//!
//! - A failed request between pods is excused only if it ran (from its
//!   start to its failure) while a fault touched one of their nodes, within
//!   that fault kind's own window ([`window`]: from the fault's start, if
//!   the kind may disturb traffic while it lasts, to its measured recovery
//!   time after its end, `faults::recovery`). Kinds that must not disturb
//!   pod traffic at all (an etcd outage, a full store disk) excuse nothing.
//! - A long-lived stream must never break (no fault here may legitimately
//!   reset one: none changes a pod's address; a subnet change is itself a
//!   violation) and must have moved in the last [`FINAL_QUIET`] s.
//! - No weftd log may contain a panic.
//! - Per node, the longest-lived weftd (≥ [`Bounds::min_life`] s on one
//!   dataplane, after a 30 s warm-up) must stay flat: the least-squares
//!   slope of its RSS, fds and threads over that time within [`Bounds`]
//!   (per minute), so that a leak shows however long the run and a step
//!   early in its life does not grow with it.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::FaultRecord;
use super::faults::{STORE_DOWN, recovery};
use super::sample::Res;
use super::workload::{PodRef, Records, Req};

/// Every stream must have echoed within this many seconds of the end.
pub const FINAL_QUIET: f64 = 10.0;

/// The bounds a run is judged by (tests break them on purpose once).
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    /// Whether faults excuse failed requests at all (their windows are
    /// `faults::recovery`'s; [`TIGHT`] excuses none).
    pub excuse: bool,
    /// Seconds after a cluster's last fault by which it must have converged.
    pub converge: f64,
    /// RSS slope allowed, KiB per minute.
    pub rss_kib: f64,
    /// Open-fd slope allowed, per minute.
    pub fds: f64,
    /// Thread-count slope allowed, per minute.
    pub threads: f64,
    /// Seconds (after a 30 s warm-up) a weftd must live for its drift to count.
    pub min_life: f64,
}

/// The bounds of the real runs.
pub const BOUNDS: Bounds = Bounds {
    excuse: true,
    converge: super::sample::CONVERGE_BOUND,
    // Three CI runs of 2026-12-03/04: RSS +7 to +456 KiB a minute, fds
    // +0.00 to +0.06, threads +0.00 (125-127 s each); a leak of 1 MiB, 2 fds
    // or a thread a minute fails.
    rss_kib: 1024.0,
    fds: 2.0,
    threads: 1.0,
    min_life: 90.0,
};

/// Bounds nothing can meet: `CHAOS_TIGHT=1` proves each check can fail.
pub const TIGHT: Bounds = Bounds {
    excuse: false,
    converge: 0.0,
    rss_kib: -1.0,
    fds: -1.0,
    threads: -1.0,
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

/// The end of `f` as the dataplane sees it: for a kind that needs the
/// store to recover, the end of the last store-wide fault of its cluster
/// that overlaps it (each pushing it further).
fn effective_end(f: &FaultRecord, all: &[FaultRecord]) -> f64 {
    let mut end = f.end;
    if recovery(f.kind).needs_store {
        loop {
            let later = all
                .iter()
                .filter(|s| STORE_DOWN.contains(&s.kind) && s.scope.cluster == f.scope.cluster)
                .filter(|s| s.start <= end + recovery(f.kind).after && s.end > end)
                .map(|s| s.end)
                .fold(end, f64::max);
            if later <= end {
                break;
            }
            end = later;
        }
    }
    end
}

/// When `f` may make requests fail: `None` for a kind that must never
/// disturb pod traffic.
pub fn window(f: &FaultRecord, all: &[FaultRecord]) -> Option<(f64, f64)> {
    let r = recovery(f.kind);
    let end = effective_end(f, all) + r.after;
    if r.during {
        Some((f.start, end))
    } else if r.after > 0.0 {
        Some((f.end, end))
    } else {
        None
    }
}

/// Whether a request from `a` to `z` running from `t` to `end` ran inside
/// a window of a fault touching one of the two nodes.
fn excused_by(r: &Run<'_>, a: &PodRef, z: &PodRef, t: f64, end: f64) -> Vec<&'static str> {
    r.faults
        .iter()
        .filter(|f| touches(f, a) || touches(f, z))
        .filter(|f| window(f, r.faults).is_some_and(|(s, e)| s <= end && t <= e))
        .map(|f| f.kind)
        .collect()
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
        let excused = b.excuse && !excused_by(r, a, z, q.t, q.end).is_empty();
        if !excused {
            unexcused += 1;
            // A stall of this process overlapping the request (it takes up to 6 s).
            let stall = r
                .rec
                .stalls
                .iter()
                .filter(|(t, d)| *t <= q.end && q.t <= t + d)
                .map(|(t, d)| format!("; this process stalled {d:.1} s at {t:.1}s"))
                .next()
                .unwrap_or_default();
            let line = format!(
                "{:.1}s: request pod {} → pod {} (cluster {}) failed ({}, at {:.1}s) with no fault touching their nodes within its recovery window{stall}",
                q.t,
                q.from,
                q.to,
                a.cluster,
                q.why.unwrap_or("?"),
                q.end
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
    outages(r, &mut out);
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
fn outages(r: &Run<'_>, out: &mut String) {
    let mut by_pair: BTreeMap<(usize, usize), Vec<&Req>> = BTreeMap::new();
    for q in r.rec.reqs.iter().filter(|q| q.t >= r.from) {
        by_pair.entry((q.from, q.to)).or_default().push(q);
    }
    // Every kind overlapping an outage, and (alone) outages one kind explains.
    let mut longest: BTreeMap<&str, f64> = BTreeMap::new();
    let mut alone: BTreeMap<&str, f64> = BTreeMap::new();
    for ((from, to), reqs) in &by_pair {
        let mut run: Option<(f64, f64)> = None;
        let last = Req {
            t: f64::MAX,
            end: f64::MAX,
            ok: true,
            ..*reqs[0]
        };
        for &&Req { t, end, ok, .. } in reqs.iter().chain(std::iter::once(&&last)) {
            match (ok, run) {
                (false, None) => run = Some((t, end)),
                (false, Some((s, _))) => run = Some((s, end)),
                (true, Some((s, e))) => {
                    let len = e - s;
                    let kinds: BTreeSet<&str> = excused_by(r, &r.pods[*from], &r.pods[*to], s, e)
                        .into_iter()
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
    recoveries(r, out);
}

/// Per kind, how long after a fault's (effective) end requests between two
/// pods still failed: the start of the last failed request of a pair the
/// fault touched and no other fault touched from 6 s before it to 15 s
/// after its end (longer than any kind's recovery). What each kind's
/// `recovery().after` is measured against.
fn recoveries(r: &Run<'_>, out: &mut String) {
    let mut by_kind: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
    for f in r.faults {
        let end = effective_end(f, r.faults);
        let (from, horizon) = (f.start - 6.0, end + 15.0);
        for (a, pa) in r.pods.iter().enumerate() {
            for (z, pz) in r.pods.iter().enumerate() {
                if a == z || pa.cluster != pz.cluster || !(touches(f, pa) || touches(f, pz)) {
                    continue;
                }
                let others = r.faults.iter().any(|g| {
                    !std::ptr::eq(g, f)
                        && (touches(g, pa) || touches(g, pz))
                        && g.start <= horizon
                        && from <= effective_end(g, r.faults) + 15.0
                });
                if others {
                    continue;
                }
                let last = r
                    .rec
                    .reqs
                    .iter()
                    .filter(|q| q.from == a && q.to == z && !q.ok && q.t >= r.from)
                    .filter(|q| q.end >= from && q.t <= horizon)
                    .map(|q| q.t - end)
                    .fold(0.0f64, f64::max);
                let e = by_kind.entry(f.kind).or_default();
                e.0 = e.0.max(last);
                e.1 += 1;
            }
        }
    }
    let per: Vec<String> = by_kind
        .iter()
        .map(|(k, (v, n))| format!("{k} {v:.1} ({n} pairs)"))
        .collect();
    let _ = writeln!(
        out,
        "requests failing after a fault's end, latest start by kind, pairs no other fault touched (s): {}",
        per.join(", ")
    );
}

/// Least-squares slope of `y` over `t`, per minute.
pub fn slope(s: &[Res], y: fn(&Res) -> u64) -> f64 {
    let n = s.len() as f64;
    if s.len() < 2 {
        return 0.0;
    }
    let mt = s.iter().map(|x| x.t).sum::<f64>() / n;
    let my = s.iter().map(|x| y(x) as f64).sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for x in s {
        num += (x.t - mt) * (y(x) as f64 - my);
        den += (x.t - mt) * (x.t - mt);
    }
    if den == 0.0 { 0.0 } else { 60.0 * num / den }
}

/// The longest run of samples on one dataplane, after a 30 s warm-up.
fn settled(s: &[Res]) -> &[Res] {
    let t0 = s.first().map_or(0.0, |f| f.t) + 30.0;
    let s = &s[s.iter().position(|x| x.t >= t0).unwrap_or(s.len())..];
    let span = |r: &[Res]| r.last().map_or(0.0, |l| l.t) - r.first().map_or(0.0, |f| f.t);
    s.chunk_by(|a, b| a.dataplane == b.dataplane)
        .max_by(|a, b| span(a).total_cmp(&span(b)))
        .unwrap_or_default()
}

fn drift(r: &Run<'_>, b: Bounds, v: &mut Vec<String>, out: &mut String) {
    let life = |s: &[Res]| s.last().map_or(0.0, |l| l.t) - s.first().map_or(0.0, |f| f.t);
    let mut best: BTreeMap<(usize, usize), &[Res]> = BTreeMap::new();
    for ((c, n, _), s) in r.res {
        let s = settled(s);
        let e = best.entry((*c, *n)).or_insert(s);
        if life(s) > life(e) {
            *e = s;
        }
    }
    for ((c, n), s) in best {
        let span = life(s);
        if span < b.min_life {
            let _ = writeln!(
                out,
                "drift c{c} n{n}: not measured (longest weftd lived {span:.0} s on one dataplane after warm-up)"
            );
            continue;
        }
        let first = |f: fn(&Res) -> u64| s.first().map_or(0, f);
        let (drss, dfd, dth) = (
            slope(s, |x| x.rss_kib),
            slope(s, |x| x.fds),
            slope(s, |x| x.threads),
        );
        let _ = writeln!(
            out,
            "drift c{c} n{n} over {span:.0} s ({}): RSS {} KiB {drss:+.0} KiB/min, fds {} {dfd:+.2}/min, threads {} {dth:+.2}/min",
            s[0].dataplane,
            first(|x| x.rss_kib),
            first(|x| x.fds),
            first(|x| x.threads),
        );
        if drss > b.rss_kib || dfd > b.fds || dth > b.threads {
            v.push(format!(
                "c{c} n{n}: weftd grew over {span:.0} s: RSS {drss:+.0} KiB/min, fds {dfd:+.2}/min, threads {dth:+.2}/min (bounds {} KiB, {}, {} per minute)",
                b.rss_kib, b.fds, b.threads
            ));
        }
    }
}
