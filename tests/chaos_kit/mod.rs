//! The chaos harness (issue 22): three weft clusters side by side under a
//! workload that never stops, a seeded fault scheduler, and invariants
//! checked continuously and at the end. See ARCHITECTURE.md ("Tests") and
//! README.md ("Reliability").
//!
//! - [`rig`]: the clusters (etcd + vxlan, embedded store on a tmpfs +
//!   WireGuard, etcd + udp), their daemons and stores, everything removed
//!   on drop;
//! - [`workload`]: echo servers in every pod, a request loop per ordered pod
//!   pair, long-lived TCP streams, phantom-lease churn;
//! - [`faults`]: the fault kinds and the scheduler;
//! - [`sample`]: what is sampled every tick (routes against leases, subnets,
//!   daemon exits, RSS/fds/threads);
//! - [`verdict`]: the invariants over what was recorded, and the report;
//! - [`run`]: one run from start to verdict, and the teardown check.

pub mod faults;
pub mod rig;
pub mod run;
pub mod sample;
mod selftest;
pub mod verdict;
pub mod workload;

use std::sync::OnceLock;
use std::time::Instant;

/// Seconds since the run started (one clock for every record).
pub fn now() -> f64 {
    static T0: OnceLock<Instant> = OnceLock::new();
    T0.get_or_init(Instant::now).elapsed().as_secs_f64()
}

/// A small deterministic generator (SplitMix64): the same seed gives the
/// same fault schedule.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator started at `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n` > 0).
    pub fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next_u64() % n.max(1) as u64).unwrap_or(0)
    }

    /// A duration in seconds, uniform in `lo..hi`.
    pub fn secs(&mut self, lo: f64, hi: f64) -> f64 {
        let unit = (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64;
        lo + (hi - lo) * unit
    }
}

/// Which nodes a fault touches: cluster index and node indices in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// Index into [`rig::Rig::clusters`].
    pub cluster: usize,
    /// Node indices in that cluster (every node for store-wide faults).
    pub nodes: Vec<usize>,
}

/// One injected fault, as recorded.
#[derive(Debug, Clone)]
pub struct FaultRecord {
    /// Its kind (see [`faults::Kind`]).
    pub kind: &'static str,
    /// What it touched.
    pub scope: Scope,
    /// When it started and ended (seconds since the run started); the end
    /// is when the harness undid it (restart, SIGCONT, remount, ...).
    pub start: f64,
    /// See `start`.
    pub end: f64,
    /// A line for the log.
    pub what: String,
}
