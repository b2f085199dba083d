//! The peer table: an immutable snapshot the control plane swaps atomically.
//!
//! Workers `load()` the current `Arc<PeerTable>` once per batch and never wait
//! on the control plane. Lookups allocate nothing: destination lookup is a
//! longest-prefix match over one hash map per distinct prefix length (a flannel
//! network has one), source validation is a hash lookup of the outer address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use ipnet::IpNet;

/// A remote node, as the daemon derives it from a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The node's pod subnet (lease `Subnet`, or `IPv6Subnet` for a v6 engine).
    pub subnet: IpNet,
    /// The node's underlay address (lease `PublicIP` / `PublicIPv6`).
    pub endpoint: IpAddr,
    /// The node's VTEP MAC (VXLAN only; lease `BackendData.VtepMAC`).
    pub vtep_mac: Option<[u8; 6]>,
}

/// One resolved peer entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Subnet behind the peer.
    pub subnet: IpNet,
    /// Where to send (endpoint address, engine port).
    pub dst: SocketAddr,
    /// Inner Ethernet destination (VXLAN); zero when unknown.
    pub mac: [u8; 6],
}

/// Immutable routing + anti-spoofing table.
#[derive(Debug, Default)]
pub struct PeerTable {
    entries: Vec<Entry>,
    /// (prefix length, masked network -> entry index), longest prefix first.
    v4: Vec<(u8, HashMap<u32, usize>)>,
    v6: Vec<(u8, HashMap<u128, usize>)>,
    /// Outer source address -> entry indices of that endpoint.
    by_endpoint: HashMap<IpAddr, Vec<usize>>,
}

fn mask4(a: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        a & (u32::MAX << (32 - u32::from(len)))
    }
}

fn mask6(a: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        a & (u128::MAX << (128 - u32::from(len)))
    }
}

impl PeerTable {
    /// Builds a table; every peer is reached on `port`. Later duplicates of a subnet win.
    pub fn new(peers: &[Peer], port: u16) -> Self {
        let mut t = PeerTable::default();
        for p in peers {
            let subnet = p.subnet.trunc();
            let idx = t.entries.len();
            t.entries.push(Entry {
                subnet,
                dst: SocketAddr::new(p.endpoint, port),
                mac: p.vtep_mac.unwrap_or([0; 6]),
            });
            match subnet {
                IpNet::V4(n) => {
                    let len = n.prefix_len();
                    let key = u32::from(n.network());
                    match t.v4.iter_mut().find(|(l, _)| *l == len) {
                        Some((_, m)) => {
                            m.insert(key, idx);
                        }
                        None => t.v4.push((len, HashMap::from([(key, idx)]))),
                    }
                }
                IpNet::V6(n) => {
                    let len = n.prefix_len();
                    let key = u128::from(n.network());
                    match t.v6.iter_mut().find(|(l, _)| *l == len) {
                        Some((_, m)) => {
                            m.insert(key, idx);
                        }
                        None => t.v6.push((len, HashMap::from([(key, idx)]))),
                    }
                }
            }
            t.by_endpoint.entry(p.endpoint).or_default().push(idx);
        }
        t.v4.sort_by_key(|e| std::cmp::Reverse(e.0));
        t.v6.sort_by_key(|e| std::cmp::Reverse(e.0));
        t
    }

    /// Number of peers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, in insertion order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Longest-prefix match for an IPv4 destination.
    #[inline]
    pub fn lookup_v4(&self, dst: [u8; 4]) -> Option<&Entry> {
        let a = u32::from_be_bytes(dst);
        self.v4
            .iter()
            .find_map(|(len, m)| m.get(&mask4(a, *len)))
            .and_then(|&i| self.entries.get(i))
    }

    /// Longest-prefix match for an IPv6 destination.
    #[inline]
    pub fn lookup_v6(&self, dst: [u8; 16]) -> Option<&Entry> {
        let a = u128::from_be_bytes(dst);
        self.v6
            .iter()
            .find_map(|(len, m)| m.get(&mask6(a, *len)))
            .and_then(|&i| self.entries.get(i))
    }

    /// Entry indices whose endpoint is `outer_src` (empty when unknown).
    #[inline]
    pub fn endpoint_entries(&self, outer_src: IpAddr) -> &[usize] {
        self.by_endpoint.get(&outer_src).map_or(&[], Vec::as_slice)
    }

    /// Whether `inner_src` lies in the subnet of one of `entries`.
    #[inline]
    pub fn src_allowed(&self, entries: &[usize], inner_src: IpAddr) -> bool {
        entries.iter().any(|&i| {
            self.entries
                .get(i)
                .is_some_and(|e| e.subnet.contains(&inner_src))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(s: &str, ep: &str) -> Peer {
        Peer {
            subnet: s.parse().expect("cidr"),
            endpoint: ep.parse().expect("ip"),
            vtep_mac: Some([2, 0, 0, 0, 0, 1]),
        }
    }

    #[test]
    fn longest_prefix_wins_and_misses_are_none() {
        let t = PeerTable::new(
            &[
                peer("10.244.0.0/16", "192.0.2.9"),
                peer("10.244.2.0/24", "192.0.2.2"),
                peer("fd00:2::/64", "2001:db8::2"),
            ],
            8472,
        );
        assert_eq!(
            t.lookup_v4([10, 244, 2, 7]).map(|e| e.dst),
            Some("192.0.2.2:8472".parse().expect("sa"))
        );
        assert_eq!(
            t.lookup_v4([10, 244, 3, 7]).map(|e| e.dst),
            Some("192.0.2.9:8472".parse().expect("sa"))
        );
        assert!(t.lookup_v4([10, 245, 0, 1]).is_none());
        let v6: std::net::Ipv6Addr = "fd00:2::5".parse().expect("v6");
        assert!(t.lookup_v6(v6.octets()).is_some());
        assert!(t.lookup_v6([0; 16]).is_none());
    }

    #[test]
    fn anti_spoofing_lookups() {
        let t = PeerTable::new(&[peer("10.244.2.0/24", "192.0.2.2")], 8285);
        let e = t.endpoint_entries("192.0.2.2".parse().expect("ip"));
        assert_eq!(e.len(), 1);
        assert!(t.src_allowed(e, "10.244.2.9".parse().expect("ip")));
        assert!(!t.src_allowed(e, "10.244.3.9".parse().expect("ip")));
        assert!(
            t.endpoint_entries("192.0.2.3".parse().expect("ip"))
                .is_empty()
        );
    }

    #[test]
    fn host_bits_are_masked() {
        let t = PeerTable::new(&[peer("10.244.2.7/24", "192.0.2.2")], 8285);
        assert!(t.lookup_v4([10, 244, 2, 200]).is_some());
    }
}
