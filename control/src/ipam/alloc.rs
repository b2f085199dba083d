//! The pod address allocator: pure state, no I/O (persistence is
//! [`super::state`], serialisation is the server's owner thread).
//!
//! Contract:
//! - Allocations are keyed by `(containerID, ifname)`; allocating an existing
//!   key returns the same addresses (idempotent), releasing an unknown key is
//!   a no-op.
//! - An allocation takes one address from each family the node's lease has
//!   (v4 and/or v6), or none at all: if one family is exhausted, nothing is
//!   taken.
//! - Usable IPv4 addresses: the lease subnet without its network address
//!   (`.0`), its first host (`.1`, kept free so that the node can switch back
//!   to bridge mode, where it is `cni0`'s gateway; flannel writes it as
//!   `FLANNEL_SUBNET`) and its broadcast address (the last one). IPv6: without
//!   the subnet-router anycast address (`::`) and `::1` (the same reason).
//!   Subnets too small for that have no usable address.
//! - New addresses are searched from the one after the last address handed
//!   out, wrapping around (as host-local does), so a released address is not
//!   handed out again soon.
//! - Allocations outside the current lease subnets (the node came back with
//!   another lease) stay held until released; they are never handed out.
//! - [`Allocator::allocate_avoiding`] also skips addresses someone else holds
//!   (host-local's allocations on the same node, see [`super::host_local`]).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use weft_compat::ipam::{Allocation, Key};

/// Why an allocation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Every usable address of a family is taken.
    #[error("no free address left in {0}")]
    Exhausted(String),
    /// The lease has neither an IPv4 nor an IPv6 subnet.
    #[error("the node's lease has no subnet to allocate from")]
    NoSubnet,
    /// Restored state holds one address twice or one key twice.
    #[error("duplicate {0} in the allocations")]
    Duplicate(String),
}

/// The allocator: the lease subnets, the allocations and the search cursors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Allocator {
    subnet: Option<Ipv4Net>,
    ipv6_subnet: Option<Ipv6Net>,
    by_key: BTreeMap<Key, Allocation>,
    used4: BTreeSet<Ipv4Addr>,
    used6: BTreeSet<Ipv6Addr>,
    last4: Option<Ipv4Addr>,
    last6: Option<Ipv6Addr>,
}

// === impl Allocator ===

impl Allocator {
    /// An empty allocator for the node's lease subnets.
    pub fn new(subnet: Option<Ipv4Net>, ipv6_subnet: Option<Ipv6Net>) -> Allocator {
        Allocator {
            subnet: subnet.map(|s| s.trunc()),
            ipv6_subnet: ipv6_subnet.map(|s| s.trunc()),
            ..Allocator::default()
        }
    }

    /// Restores allocations and cursors (from the state file); fails on a
    /// duplicate key or address, which would mean an address handed out twice.
    pub fn restore(
        mut self,
        allocations: Vec<Allocation>,
        last4: Option<Ipv4Addr>,
        last6: Option<Ipv6Addr>,
    ) -> Result<Allocator, AllocError> {
        for a in allocations {
            if self.by_key.contains_key(&a.key()) {
                return Err(AllocError::Duplicate(format!(
                    "attachment {}/{}",
                    a.container_id, a.ifname
                )));
            }
            if let Some(ip) = a.ipv4
                && !self.used4.insert(ip)
            {
                return Err(AllocError::Duplicate(format!("address {ip}")));
            }
            if let Some(ip) = a.ipv6
                && !self.used6.insert(ip)
            {
                return Err(AllocError::Duplicate(format!("address {ip}")));
            }
            self.by_key.insert(a.key(), a);
        }
        self.last4 = last4;
        self.last6 = last6;
        Ok(self)
    }

    /// The IPv4 lease subnet.
    pub fn subnet(&self) -> Option<Ipv4Net> {
        self.subnet
    }

    /// The IPv6 lease subnet.
    pub fn ipv6_subnet(&self) -> Option<Ipv6Net> {
        self.ipv6_subnet
    }

    /// The search cursors (last addresses handed out), for persistence.
    pub fn cursors(&self) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
        (self.last4, self.last6)
    }

    /// Every allocation, ordered by key.
    pub fn list(&self) -> Vec<Allocation> {
        self.by_key.values().cloned().collect()
    }

    /// How many attachments hold addresses.
    pub fn len(&self) -> usize {
        self.by_key.len()
    }

    /// Whether no attachment holds an address.
    pub fn is_empty(&self) -> bool {
        self.by_key.is_empty()
    }

    /// The allocation of `key`, if any.
    pub fn get(&self, key: &Key) -> Option<&Allocation> {
        self.by_key.get(key)
    }

    /// Allocates addresses for `key`, or returns the ones it already holds.
    /// The flag says whether the state changed (and must be persisted).
    pub fn allocate(&mut self, key: &Key) -> Result<(Allocation, bool), AllocError> {
        self.allocate_avoiding(key, &BTreeSet::new())
    }

    /// [`Allocator::allocate`], never handing out an address in `avoid`.
    pub fn allocate_avoiding(
        &mut self,
        key: &Key,
        avoid: &BTreeSet<IpAddr>,
    ) -> Result<(Allocation, bool), AllocError> {
        if let Some(a) = self.by_key.get(key) {
            return Ok((a.clone(), false));
        }
        if self.subnet.is_none() && self.ipv6_subnet.is_none() {
            return Err(AllocError::NoSubnet);
        }
        let ipv4 = match self.subnet {
            Some(net) => Some(
                self.next4(net, avoid)
                    .ok_or_else(|| AllocError::Exhausted(net.to_string()))?,
            ),
            None => None,
        };
        let ipv6 = match self.ipv6_subnet {
            Some(net) => Some(
                self.next6(net, avoid)
                    .ok_or_else(|| AllocError::Exhausted(net.to_string()))?,
            ),
            None => None,
        };
        let a = Allocation {
            container_id: key.container_id.clone(),
            ifname: key.ifname.clone(),
            ipv4,
            ipv6,
        };
        if let Some(ip) = ipv4 {
            self.used4.insert(ip);
            self.last4 = Some(ip);
        }
        if let Some(ip) = ipv6 {
            self.used6.insert(ip);
            self.last6 = Some(ip);
        }
        self.by_key.insert(key.clone(), a.clone());
        Ok((a, true))
    }

    /// Releases `key`'s addresses; `None` if it held none.
    pub fn release(&mut self, key: &Key) -> Option<Allocation> {
        let a = self.by_key.remove(key)?;
        if let Some(ip) = a.ipv4 {
            self.used4.remove(&ip);
        }
        if let Some(ip) = a.ipv6 {
            self.used6.remove(&ip);
        }
        Some(a)
    }

    fn next4(&self, net: Ipv4Net, avoid: &BTreeSet<IpAddr>) -> Option<Ipv4Addr> {
        let base = u128::from(u32::from(net.network()));
        let size = 1u128 << (32 - net.prefix_len());
        // .0, .1 and the broadcast address are not handed out.
        let range = usable(base, size, 3)?;
        let last = self.last4.map(|ip| u128::from(u32::from(ip)));
        let used = |v: u128| {
            u32::try_from(v).map_or(true, |v| {
                let ip = Ipv4Addr::from(v);
                self.used4.contains(&ip) || avoid.contains(&IpAddr::V4(ip))
            })
        };
        let v = search(range, last, self.used4.len() + avoid.len(), used)?;
        u32::try_from(v).ok().map(Ipv4Addr::from)
    }

    fn next6(&self, net: Ipv6Net, avoid: &BTreeSet<IpAddr>) -> Option<Ipv6Addr> {
        let base = u128::from(net.network());
        let bits = 128 - u32::from(net.prefix_len());
        let size = if bits == 128 {
            u128::MAX
        } else {
            1u128 << bits
        };
        // `::` and `::1` are not handed out; there is no broadcast address.
        let range = usable(base, size, 2)?;
        let last = self.last6.map(u128::from);
        let used = |v: u128| {
            let ip = Ipv6Addr::from(v);
            self.used6.contains(&ip) || avoid.contains(&IpAddr::V6(ip))
        };
        search(range, last, self.used6.len() + avoid.len(), used).map(Ipv6Addr::from)
    }
}

/// The usable range `[base + 2, end]` of a block of `size` addresses, where
/// `reserved` counts the two low addresses plus a broadcast address if 3.
fn usable(base: u128, size: u128, reserved: u128) -> Option<(u128, u128)> {
    if size <= reserved {
        return None;
    }
    let first = base + 2;
    let end = if reserved == 3 {
        base + size - 2
    } else {
        base + (size - 1)
    };
    Some((first, end))
}

/// The first free address after `last` in `range`, wrapping around; gives up
/// after `used + 1` probes (at most that many can be taken).
fn search(
    (first, end): (u128, u128),
    last: Option<u128>,
    used_count: usize,
    used: impl Fn(u128) -> bool,
) -> Option<u128> {
    let span = end - first;
    let start = match last {
        Some(l) if l >= first && l < end => l + 1,
        _ => first,
    };
    let probes = u128::try_from(used_count)
        .unwrap_or(u128::MAX)
        .saturating_add(1);
    let mut v = start;
    let mut n: u128 = 0;
    while n <= span && n < probes {
        if !used(v) {
            return Some(v);
        }
        v = if v == end { first } else { v + 1 };
        n += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: &str) -> Key {
        Key {
            container_id: id.into(),
            ifname: "eth0".into(),
        }
    }

    fn v4(net: &str) -> Allocator {
        Allocator::new(Some(net.parse().expect("net")), None)
    }

    #[test]
    fn skips_network_gateway_and_broadcast_and_is_idempotent() {
        let mut a = v4("10.244.3.0/24");
        let (first, changed) = a.allocate(&key("a")).expect("alloc");
        assert!(changed);
        assert_eq!(first.ipv4, Some("10.244.3.2".parse().expect("ip")));
        let (again, changed) = a.allocate(&key("a")).expect("alloc");
        assert!(!changed);
        assert_eq!(again, first);
        let mut seen = BTreeSet::new();
        seen.insert(first.ipv4.expect("v4"));
        for i in 1..253 {
            let (x, _) = a.allocate(&key(&format!("p{i}"))).expect("alloc");
            assert!(seen.insert(x.ipv4.expect("v4")), "duplicate {x:?}");
        }
        assert_eq!(seen.len(), 253);
        assert!(!seen.contains(&"10.244.3.0".parse().expect("ip")));
        assert!(!seen.contains(&"10.244.3.1".parse().expect("ip")));
        assert!(!seen.contains(&"10.244.3.255".parse().expect("ip")));
        assert_eq!(
            a.allocate(&key("full")),
            Err(AllocError::Exhausted("10.244.3.0/24".into()))
        );
        // Releasing one makes exactly that one available.
        let freed = a.release(&key("p100")).expect("held");
        assert_eq!(a.release(&key("p100")), None, "release is idempotent");
        let (x, _) = a.allocate(&key("full")).expect("alloc");
        assert_eq!(x.ipv4, freed.ipv4);
    }

    #[test]
    fn released_addresses_are_not_reused_at_once() {
        let mut a = v4("10.244.3.0/24");
        let (x, _) = a.allocate(&key("a")).expect("alloc");
        a.release(&key("a"));
        let (y, _) = a.allocate(&key("b")).expect("alloc");
        assert_ne!(x.ipv4, y.ipv4, "the cursor moves on");
        assert_eq!(y.ipv4, Some("10.244.3.3".parse().expect("ip")));
    }

    #[test]
    fn dual_stack_all_or_nothing() {
        let mut a = Allocator::new(
            Some("10.244.3.0/30".parse().expect("net")),
            Some("fd00:1::/64".parse().expect("net")),
        );
        let (x, _) = a.allocate(&key("a")).expect("alloc");
        assert_eq!(x.ipv4, Some("10.244.3.2".parse().expect("ip")));
        assert_eq!(x.ipv6, Some("fd00:1::2".parse().expect("ip")));
        // The /30 has one usable address: b gets nothing, not even IPv6.
        assert!(matches!(
            a.allocate(&key("b")),
            Err(AllocError::Exhausted(_))
        ));
        assert_eq!(a.len(), 1);
        let v6only = Allocator::new(None, Some("fd00:2::/127".parse().expect("net")))
            .allocate(&key("c"))
            .map(|(a, _)| a);
        assert!(v6only.is_err(), "a /127 has no usable address");
        assert_eq!(
            Allocator::default().allocate(&key("x")),
            Err(AllocError::NoSubnet)
        );
    }

    #[test]
    fn restore_rejects_duplicates_and_keeps_foreign_addresses() {
        let alloc = |id: &str, ip: &str| Allocation {
            container_id: id.into(),
            ifname: "eth0".into(),
            ipv4: Some(ip.parse().expect("ip")),
            ipv6: None,
        };
        let dup_ip = v4("10.244.3.0/24").restore(
            vec![alloc("a", "10.244.3.2"), alloc("b", "10.244.3.2")],
            None,
            None,
        );
        assert_eq!(
            dup_ip,
            Err(AllocError::Duplicate("address 10.244.3.2".into()))
        );
        let dup_key = v4("10.244.3.0/24").restore(
            vec![alloc("a", "10.244.3.2"), alloc("a", "10.244.3.3")],
            None,
            None,
        );
        assert!(matches!(dup_key, Err(AllocError::Duplicate(_))));
        // An allocation from an older lease stays held; the cursor continues.
        let mut a = v4("10.244.3.0/24")
            .restore(
                vec![alloc("old", "10.244.9.7"), alloc("a", "10.244.3.2")],
                Some("10.244.3.2".parse().expect("ip")),
                None,
            )
            .expect("restore");
        assert_eq!(a.len(), 2);
        let (x, _) = a.allocate(&key("n")).expect("alloc");
        assert_eq!(x.ipv4, Some("10.244.3.3".parse().expect("ip")));
        assert!(a.get(&key("old")).is_some());
    }

    #[test]
    fn search_wraps_and_terminates() {
        // Cursor at the end wraps to the first address.
        let used = |v: u128| v == 5;
        assert_eq!(search((2, 6), Some(6), 1, used), Some(2));
        assert_eq!(search((2, 6), Some(4), 1, used), Some(6));
        assert_eq!(search((2, 2), None, 0, |_| false), Some(2));
        assert_eq!(search((2, 3), None, 2, |_| true), None);
        // A huge range with few used addresses needs few probes.
        assert_eq!(search((0, u128::MAX - 1), Some(10), 0, |_| false), Some(11));
    }
}
