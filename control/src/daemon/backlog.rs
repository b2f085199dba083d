//! The peer changes the backend has not been given yet: what the main loop
//! accumulates while the backend's task is busy, and the bounded batches it
//! hands it when it is idle.
//!
//! The newest state wins: the backlog holds subnet keys, not changes. A
//! batch is computed when it is sent, from the [`LeaseWatcher`]'s latest
//! lease set against what the backend was last given (`sent`), so a lease
//! that changed ten times while the backend was busy costs one change, and
//! one that came and went costs none. Keys leave in the order they first
//! became dirty (no key waits behind newer ones), at most
//! [`MAX_BATCH`] per batch. Memory is bounded by the number of leases.
//!
//! A lease snapshot (start, watch gap) or a rebuild of the backend is
//! completed by the batch that empties the backlog, which is sent as a
//! snapshot batch (the backend then prunes what no known peer accounts
//! for); until the backend has applied it the node is not
//! [`Backlog::synced`] (`/readyz` says 503).

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use crate::lease::watcher::{Change, LeaseWatcher};
use crate::lease::{Lease, SubnetKey};

/// The most peer changes in one batch. A batch is one `apply` of the
/// backend: on the kernel paths up to three netlink requests per change
/// (~50-150 µs each on a busy 2-core machine, so 256 changes stay under
/// ~0.1 s), on the userspace paths one peer-table build per batch. A switch,
/// a rebuild or a reconcile waits for at most one batch.
pub const MAX_BATCH: usize = 256;

/// See the module docs.
#[derive(Debug, Default)]
pub struct Backlog {
    /// What the backend was last given, by key.
    sent: BTreeMap<SubnetKey, Lease>,
    /// Dirty keys, oldest first, each once.
    order: VecDeque<SubnetKey>,
    /// When each dirty key's first unsent event arrived.
    since: BTreeMap<SubnetKey, Instant>,
    /// A snapshot (or replay) waits for the batch that empties the backlog.
    snapshot: bool,
    /// The backend applied the batch that completed the latest snapshot.
    synced: bool,
}

/// A batch for the backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outgoing {
    /// The changes, in order.
    pub changes: Vec<Change>,
    /// It completes a snapshot: afterwards the backend knows every peer.
    pub snapshot: bool,
    /// When each change's first event arrived (for event-to-route latency).
    pub since: Vec<Instant>,
}

impl Backlog {
    /// An empty backlog, not synced until the first snapshot is applied.
    pub fn new() -> Backlog {
        Backlog::default()
    }

    /// Notes the changes one lease event implied (`snapshot`: it was a
    /// snapshot of every lease), which arrived at `at`.
    pub fn note(&mut self, changes: &[Change], snapshot: bool, at: Instant) {
        for c in changes {
            self.mark(c.lease().key(), at);
        }
        if snapshot {
            self.snapshot = true;
            self.synced = false;
        }
    }

    /// The backend was rebuilt and has no peers: every known one is due again.
    pub fn replay(&mut self, known: &LeaseWatcher, at: Instant) {
        self.sent.clear();
        for k in known.keys() {
            self.mark(*k, at);
        }
        self.snapshot = true;
        self.synced = false;
    }

    fn mark(&mut self, key: SubnetKey, at: Instant) {
        if let std::collections::btree_map::Entry::Vacant(e) = self.since.entry(key) {
            e.insert(at);
            self.order.push_back(key);
        }
    }

    /// The next batch: up to [`MAX_BATCH`] changes that bring the backend
    /// from what it was given to `known`, oldest first; `None` when there is
    /// nothing to send. Counts them as sent.
    pub fn next(&mut self, known: &LeaseWatcher) -> Option<Outgoing> {
        let mut out = Outgoing {
            changes: Vec::new(),
            snapshot: false,
            since: Vec::new(),
        };
        while out.changes.len() < MAX_BATCH {
            let Some(key) = self.order.pop_front() else {
                break;
            };
            let Some(at) = self.since.remove(&key) else {
                continue;
            };
            let change = match (known.get(&key), self.sent.get(&key)) {
                (Some(want), Some(have)) if want.attrs == have.attrs => continue,
                (Some(want), _) => {
                    self.sent.insert(key, want.clone());
                    Change::Add(want.clone())
                }
                (None, Some(_)) => match self.sent.remove(&key) {
                    Some(have) => Change::Remove(have),
                    None => continue,
                },
                (None, None) => continue,
            };
            out.changes.push(change);
            out.since.push(at);
        }
        if self.snapshot && self.order.is_empty() {
            self.snapshot = false;
            out.snapshot = true;
        }
        (out.snapshot || !out.changes.is_empty()).then_some(out)
    }

    /// The backend applied `out` (whatever failed in it was logged).
    pub fn applied(&mut self, out: &Outgoing) {
        if out.snapshot && !self.snapshot {
            self.synced = true;
        }
    }

    /// Whether the backend has applied the latest snapshot (see the module docs).
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// Keys waiting for a batch.
    pub fn len(&self) -> usize {
        self.order.len()
    }

    /// Nothing waits: no key, no snapshot to complete.
    pub fn is_empty(&self) -> bool {
        self.order.is_empty() && !self.snapshot
    }
}

#[cfg(test)]
#[path = "backlog_tests.rs"]
mod tests;
