//! Turns a store's event stream into the add/remove changes a backend applies
//! (flannel's `LeaseWatcher`, pkg/lease/lease.go): a [`LeaseEvent::Snapshot`]
//! is diffed against what the backend already has, and events about the
//! node's own lease are dropped.
//!
//! The leases are kept behind `Arc`s so that publishing the set
//! ([`LeaseWatcher::shared`], what `weft status` lists) copies pointers, not
//! 5,000 leases.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{Lease, LeaseEvent, SubnetKey};

/// One change for a backend to apply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Program (or re-program) this peer.
    Add(Lease),
    /// Forget this peer.
    Remove(Lease),
}

impl Change {
    /// The peer's lease.
    pub fn lease(&self) -> &Lease {
        match self {
            Change::Add(l) | Change::Remove(l) => l,
        }
    }
}

/// The set of peer leases a backend currently has, keyed by subnet.
#[derive(Debug, Default)]
pub struct LeaseWatcher {
    own: Option<SubnetKey>,
    leases: BTreeMap<SubnetKey, Arc<Lease>>,
}

impl LeaseWatcher {
    /// A watcher that ignores the lease with key `own` (the node's own lease).
    pub fn new(own: SubnetKey) -> Self {
        LeaseWatcher {
            own: Some(own),
            leases: BTreeMap::new(),
        }
    }

    /// The peers currently known, in subnet order.
    pub fn leases(&self) -> impl Iterator<Item = &Lease> {
        self.leases.values().map(|l| &**l)
    }

    /// The known peer with key `key`.
    pub fn get(&self, key: &SubnetKey) -> Option<&Lease> {
        self.leases.get(key).map(|l| &**l)
    }

    /// The keys of every known peer, in subnet order.
    pub fn keys(&self) -> impl Iterator<Item = &SubnetKey> {
        self.leases.keys()
    }

    /// The known peers as one shareable list, in subnet order.
    pub fn shared(&self) -> Arc<[Arc<Lease>]> {
        self.leases.values().cloned().collect()
    }

    /// Applies one store event and returns the changes it implies.
    pub fn apply(&mut self, event: LeaseEvent) -> Vec<Change> {
        match event {
            LeaseEvent::Snapshot(all) => self.reset(all),
            LeaseEvent::Added(l) => self.add(l).into_iter().collect(),
            LeaseEvent::Removed(l) => self.remove(&l.key()).into_iter().collect(),
        }
    }

    fn is_own(&self, key: &SubnetKey) -> bool {
        // flannel's sameSubnet: equal v4 subnets (and v6 when both have one).
        match &self.own {
            Some(own) => {
                own.v4 == key.v4 && (own.v6.is_none() || key.v6.is_none() || own.v6 == key.v6)
            }
            None => false,
        }
    }

    fn add(&mut self, lease: Lease) -> Option<Change> {
        let key = lease.key();
        if self.is_own(&key) {
            return None;
        }
        match self.leases.get(&key) {
            Some(old) if old.attrs == lease.attrs => {
                // Only the expiry moved (a renewal): nothing to reprogram.
                self.leases.insert(key, Arc::new(lease));
                None
            }
            _ => {
                self.leases.insert(key, Arc::new(lease.clone()));
                Some(Change::Add(lease))
            }
        }
    }

    fn remove(&mut self, key: &SubnetKey) -> Option<Change> {
        self.leases
            .remove(key)
            .map(|l| Change::Remove(Arc::unwrap_or_clone(l)))
    }

    fn reset(&mut self, all: Vec<Lease>) -> Vec<Change> {
        let mut changes = Vec::new();
        let fresh: BTreeMap<SubnetKey, Lease> = all
            .into_iter()
            .filter(|l| !self.is_own(&l.key()))
            .map(|l| (l.key(), l))
            .collect();
        let gone: Vec<SubnetKey> = self
            .leases
            .keys()
            .filter(|k| !fresh.contains_key(k))
            .copied()
            .collect();
        for k in gone {
            changes.extend(self.remove(&k));
        }
        for (_, l) in fresh {
            changes.extend(self.add(l));
        }
        changes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseAttrs;

    fn lease(s: &str, ip: [u8; 4]) -> Lease {
        let key: SubnetKey = s.parse().expect("key");
        Lease {
            subnet: key.v4,
            ipv6_subnet: key.v6,
            attrs: LeaseAttrs {
                public_ip: ip.into(),
                ..Default::default()
            },
            expiration: None,
        }
    }

    #[test]
    fn snapshot_diffs_and_skips_own_lease() {
        let own: SubnetKey = "10.244.1.0-24".parse().expect("key");
        let mut w = LeaseWatcher::new(own);
        let a = lease("10.244.2.0-24", [192, 0, 2, 2]);
        let b = lease("10.244.3.0-24", [192, 0, 2, 3]);
        let me = lease("10.244.1.0-24", [192, 0, 2, 1]);
        let ch = w.apply(LeaseEvent::Snapshot(vec![a.clone(), me.clone(), b.clone()]));
        assert_eq!(ch, vec![Change::Add(a.clone()), Change::Add(b.clone())]);
        // b disappears, a is unchanged, c appears.
        let c = lease("10.244.4.0-24", [192, 0, 2, 4]);
        let ch = w.apply(LeaseEvent::Snapshot(vec![a.clone(), c.clone()]));
        assert_eq!(ch, vec![Change::Remove(b), Change::Add(c)]);
        assert_eq!(w.apply(LeaseEvent::Added(me)), vec![]);
    }

    #[test]
    fn changed_attrs_reprogram_and_renewals_do_not() {
        let mut w = LeaseWatcher::new("10.244.1.0-24".parse().expect("key"));
        let a = lease("10.244.2.0-24", [192, 0, 2, 2]);
        assert_eq!(
            w.apply(LeaseEvent::Added(a.clone())),
            vec![Change::Add(a.clone())]
        );
        let mut renewed = a.clone();
        renewed.expiration = Some(std::time::SystemTime::UNIX_EPOCH);
        assert_eq!(w.apply(LeaseEvent::Added(renewed)), vec![]);
        let moved = lease("10.244.2.0-24", [192, 0, 2, 9]);
        assert_eq!(
            w.apply(LeaseEvent::Added(moved.clone())),
            vec![Change::Add(moved)]
        );
        assert_eq!(w.apply(LeaseEvent::Removed(a.clone())).len(), 1);
        assert_eq!(w.apply(LeaseEvent::Removed(a)), vec![]);
    }
}
