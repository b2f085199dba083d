//! The node watcher: one task per manager runs kube-runtime's watcher over
//! all nodes (it relists after `410 Gone` and re-watches after connection
//! loss, with backoff) and turns node changes into lease events.
//!
//! [`State`] is the sans-IO part: it holds the last seen lease of every
//! managed peer node, the own node and the subscriber, and returns the events
//! a change implies. Peers whose backend type differs from ours are invisible
//! (a type change reads as a removal). The own node is never reported; once
//! the own lease is known it is part of every snapshot.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::mpsc;

use super::Annotations;
use super::node;
use crate::lease::{Lease, LeaseEvent};

/// Everything the watcher task and the manager share.
#[derive(Debug)]
pub(super) struct State {
    ann: Annotations,
    own_name: String,
    v4: bool,
    v6: bool,
    /// The own Node object, as last seen.
    pub own_node: Option<Node>,
    /// The own lease, once acquired.
    pub own_lease: Option<Lease>,
    /// Every managed peer's lease (all backend types), by node name.
    peers: BTreeMap<String, Lease>,
    /// Nodes of a list in progress.
    init: Option<Vec<Node>>,
    /// Where events go.
    subscriber: Option<mpsc::Sender<LeaseEvent>>,
    /// The unreadable `weft-nat` value last logged for each node (logged
    /// once, until it changes).
    bad_nat: BTreeMap<String, String>,
}

impl State {
    pub fn new(ann: Annotations, own_name: String, v4: bool, v6: bool) -> State {
        State {
            ann,
            own_name,
            v4,
            v6,
            own_node: None,
            own_lease: None,
            peers: BTreeMap::new(),
            init: None,
            subscriber: None,
            bad_nat: BTreeMap::new(),
        }
    }

    /// Leases of other backend types are invisible once ours is known.
    fn visible(&self, l: &Lease) -> bool {
        self.own_lease
            .as_ref()
            .is_none_or(|o| o.attrs.backend_type == l.attrs.backend_type)
    }

    /// The current snapshot: visible peers plus the own lease.
    pub fn snapshot(&self) -> Vec<Lease> {
        let mut all: Vec<Lease> = self
            .peers
            .values()
            .filter(|l| self.visible(l))
            .cloned()
            .collect();
        all.extend(self.own_lease.clone());
        all
    }

    /// Replaces the subscriber with a new channel that starts with a snapshot.
    pub fn subscribe(&mut self, depth: usize) -> mpsc::Receiver<LeaseEvent> {
        let (tx, rx) = mpsc::channel(depth.max(1));
        // A fresh channel always has room for its first message.
        let _ = tx.try_send(LeaseEvent::Snapshot(self.snapshot()));
        self.subscriber = Some(tx);
        rx
    }

    fn lease_of(&mut self, n: &Node) -> Option<Lease> {
        self.check_nat(n);
        match node::node_to_lease(n, &self.ann, self.v4, self.v6) {
            Ok(l) => l,
            Err(e) => {
                tracing::info!("Error turning node {:?} to lease: {e}", node::name(n));
                None
            }
        }
    }

    /// Logs a node's unreadable `weft-nat` value once (the lease reads it
    /// as no field).
    fn check_nat(&mut self, n: &Node) {
        let name = node::name(n);
        match node::weft_nat(n, &self.ann) {
            Err(v) if self.bad_nat.get(name) != Some(&v) => {
                tracing::warn!(
                    "node {name:?}: ignoring annotation {}={v:?}: not a WeftNAT object",
                    self.ann.weft_nat
                );
                self.bad_nat.insert(name.to_string(), v);
            }
            Err(_) => {}
            Ok(_) => {
                self.bad_nat.remove(name);
            }
        }
    }

    /// A node was added or changed.
    pub fn apply(&mut self, n: Node) -> Vec<LeaseEvent> {
        let name = node::name(&n).to_string();
        if name == self.own_name {
            self.own_node = Some(n);
            return Vec::new();
        }
        let new = self.lease_of(&n);
        self.set_peer(name, new)
    }

    /// A node was deleted.
    pub fn delete(&mut self, n: &Node) -> Vec<LeaseEvent> {
        let name = node::name(n).to_string();
        if name == self.own_name {
            self.own_node = None;
            return Vec::new();
        }
        self.set_peer(name, None)
    }

    fn set_peer(&mut self, name: String, new: Option<Lease>) -> Vec<LeaseEvent> {
        let old = match &new {
            Some(l) => self.peers.insert(name, l.clone()),
            None => self.peers.remove(&name),
        };
        let old = old.filter(|l| self.visible(l));
        let new = new.filter(|l| self.visible(l));
        match (old, new) {
            (Some(o), Some(n)) if o == n => Vec::new(),
            (Some(o), Some(n)) if o.key() != n.key() => {
                vec![LeaseEvent::Removed(o), LeaseEvent::Added(n)]
            }
            (_, Some(n)) => vec![LeaseEvent::Added(n)],
            (Some(o), None) => vec![LeaseEvent::Removed(o)],
            (None, None) => Vec::new(),
        }
    }

    /// A (re)list starts.
    pub fn init(&mut self) {
        self.init = Some(Vec::new());
    }

    /// A node of the list in progress.
    pub fn init_apply(&mut self, n: Node) {
        self.init.get_or_insert_with(Vec::new).push(n);
    }

    /// The list is complete: it replaces everything known; one snapshot.
    pub fn init_done(&mut self) -> Vec<LeaseEvent> {
        let nodes = self.init.take().unwrap_or_default();
        self.own_node = None;
        self.peers.clear();
        for n in nodes {
            let name = node::name(&n).to_string();
            if name == self.own_name {
                self.own_node = Some(n);
            } else if let Some(l) = self.lease_of(&n) {
                self.peers.insert(name, l);
            }
        }
        vec![LeaseEvent::Snapshot(self.snapshot())]
    }

    /// Who gets the events just returned.
    pub fn subscriber(&self) -> Option<mpsc::Sender<LeaseEvent>> {
        self.subscriber.clone()
    }
}

/// Locks the state; a panic elsewhere must not wedge the daemon.
pub(super) fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs the watcher until aborted. `synced` turns true after the first list.
pub(super) async fn run(
    api: Api<Node>,
    state: Arc<Mutex<State>>,
    synced: tokio::sync::watch::Sender<bool>,
) {
    tracing::info!("Starting kube subnet manager");
    let mut stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(item) = stream.next().await {
        let ev = match item {
            Ok(ev) => ev,
            Err(e) => {
                tracing::warn!("node watch: {e}; retrying");
                continue;
            }
        };
        let (events, tx) = {
            let mut st = lock(&state);
            let events = match ev {
                watcher::Event::Init => {
                    st.init();
                    Vec::new()
                }
                watcher::Event::InitApply(n) => {
                    st.init_apply(n);
                    Vec::new()
                }
                watcher::Event::InitDone => {
                    let events = st.init_done();
                    synced.send_replace(true);
                    events
                }
                watcher::Event::Apply(n) => st.apply(n),
                watcher::Event::Delete(n) => st.delete(&n),
            };
            (events, st.subscriber())
        };
        let Some(tx) = tx else { continue };
        for e in events {
            if tx.send(e).await.is_err() {
                break;
            }
        }
    }
}

#[cfg(test)]
#[path = "watch_tests.rs"]
mod tests;
