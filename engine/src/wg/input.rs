//! Pure steps of the WireGuard receive path, shared by the worker and the
//! fuzz harness (`fuzz/targets/engine.rs`, target `wg_input`). The other
//! steps it calls directly are [`super::receiver_id`] (which worker owns a
//! datagram), [`super::classify`] (drop reason of a boringtun error) and
//! [`super::seg::trust_tcp_checksum`].

use std::net::IpAddr;

use crate::peers::{Entry, PeerTable};

/// The AllowedIPs check of a packet that WireGuard peer `id` sent from inner
/// source `inner_src`: whether the source is inside one of the peer's
/// subnets, and the table entry whose per-peer counters count the packet
/// (the longest-prefix match, when that entry is the peer's own; `None` when
/// a more specific subnet belongs to another peer or the source is not
/// allowed at all).
pub fn source_allowed(table: &PeerTable, id: u32, inner_src: IpAddr) -> (bool, Option<&Entry>) {
    let from = table.wg_src_entry(id, inner_src);
    let allowed = from.is_some()
        || table
            .wg_by_id(id)
            .is_some_and(|w| w.allowed.iter().any(|n| n.contains(&inner_src)));
    (allowed, from)
}

/// Whether a decrypted packet of `len` bytes from inner source `inner_src`
/// holds at least its IP header (boringtun cuts the plaintext to the inner
/// total length, which a peer may set below the header length).
pub fn holds_ip_header(inner_src: IpAddr, len: usize) -> bool {
    match inner_src {
        IpAddr::V4(_) => len >= crate::wire::ipv4::HEADER_LEN,
        IpAddr::V6(_) => len >= crate::wire::ipv6::HEADER_LEN,
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;
    use crate::peers::{Peer, WgPeer};

    fn peer(subnet: &str, endpoint: [u8; 4], key: u8) -> Peer {
        Peer {
            subnet: subnet.parse().expect("subnet"),
            endpoint: IpAddr::from(endpoint),
            vtep_mac: None,
            wireguard: Some(WgPeer {
                public_key: [key; 32],
                port: 51820,
                psk: None,
                keepalive: 0,
            }),
        }
    }

    #[test]
    fn source_must_be_in_the_peers_allowed_ips() {
        let table = PeerTable::new(
            &[
                peer("10.244.1.0/24", [192, 0, 2, 1], 1),
                peer("fd00:244:1::/64", [192, 0, 2, 1], 1),
                peer("10.244.2.0/24", [192, 0, 2, 2], 2),
                // A more specific subnet of another peer inside peer 1's.
                peer("10.244.1.128/25", [192, 0, 2, 3], 3),
            ],
            51820,
        );
        let id = |k: u8| table.wg_by_key(&[k; 32]).expect("peer").id;
        let (a, b) = (id(1), id(2));
        assert_ne!(a, b);
        let v4 = |d: u8| IpAddr::from(Ipv4Addr::new(10, 244, 1, d));

        let (ok, from) = source_allowed(&table, a, v4(5));
        assert!(ok);
        assert_eq!(
            from.map(|e| e.subnet.to_string()),
            Some("10.244.1.0/24".into())
        );
        let (ok, from) = source_allowed(&table, a, "fd00:244:1::7".parse().expect("v6"));
        assert!(ok);
        assert_eq!(
            from.map(|e| e.subnet.to_string()),
            Some("fd00:244:1::/64".into())
        );
        // Inside peer 1's AllowedIPs, but counted on nobody's entry.
        assert!(source_allowed(&table, a, v4(200)).0);
        assert!(source_allowed(&table, a, v4(200)).1.is_none());
        // Another peer's subnet, outside every subnet, an unknown id.
        assert!(!source_allowed(&table, b, v4(5)).0);
        assert!(source_allowed(&table, b, v4(5)).1.is_none());
        assert!(!source_allowed(&table, a, "10.244.3.1".parse().expect("v4")).0);
        assert!(!source_allowed(&table, a, "fd00:244:2::1".parse().expect("v6")).0);
        assert!(!source_allowed(&table, 0xff_fff0, v4(5)).0);
        assert!(source_allowed(&table, b, "10.244.2.9".parse().expect("v4")).0);
    }

    #[test]
    fn packets_shorter_than_their_ip_header_are_refused() {
        let v4 = IpAddr::from([10, 244, 2, 3]);
        let v6: IpAddr = "fd00::1".parse().expect("v6");
        assert!(!holds_ip_header(v4, 0) && !holds_ip_header(v4, 19));
        assert!(holds_ip_header(v4, 20));
        assert!(!holds_ip_header(v6, 39) && holds_ip_header(v6, 40));
    }
}
