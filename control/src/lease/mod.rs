//! Subnet leases: the unit of state every lease store shares with flannel.
//!
//! A lease binds a node (its `PublicIP`) to a subnet of the cluster network. The
//! value stored for it is flannel's `LeaseAttrs` JSON ([`attrs`]); the key is
//! flannel's subnet key `a.b.c.d-len[&v6-len6]` ([`key`]).

pub mod attrs;
pub mod key;
pub mod nat;
pub mod watcher;

use std::time::SystemTime;

use ipnet::{Ipv4Net, Ipv6Net};

pub use attrs::LeaseAttrs;
pub use key::SubnetKey;
pub use nat::NatAttrs;

/// One node's lease, as read from (or written to) a lease store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// The node's IPv4 subnet (`None` when the network is IPv6 only).
    pub subnet: Option<Ipv4Net>,
    /// The node's IPv6 subnet, when IPv6 is enabled.
    pub ipv6_subnet: Option<Ipv6Net>,
    /// What the node published about itself.
    pub attrs: LeaseAttrs,
    /// When the lease runs out; `None` for a reservation (no TTL).
    pub expiration: Option<SystemTime>,
}

impl Lease {
    /// The store key of this lease.
    pub fn key(&self) -> SubnetKey {
        SubnetKey {
            v4: self.subnet,
            v6: self.ipv6_subnet,
        }
    }
}

/// A change in the set of leases, as every lease store reports it.
///
/// A store first sends a [`LeaseEvent::Snapshot`] with every lease it holds, then
/// incremental events. After a reconnect, compaction or watch expiry it sends a
/// new `Snapshot`: consumers rebuild their state from it (see [`watcher`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    /// The complete current set of leases.
    Snapshot(Vec<Lease>),
    /// A lease was created or its attributes changed.
    Added(Lease),
    /// A lease was deleted or expired. Only the subnets are meaningful.
    Removed(Lease),
}
