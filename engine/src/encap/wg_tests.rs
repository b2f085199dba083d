use std::net::Ipv4Addr;

use super::*;
use crate::WgSecret;
use crate::peers::{Peer, WgPeer};

#[test]
fn base64_round_trips_and_matches_wg() {
    // RFC 7748 section 6.1 (Alice's key pair).
    let alice_priv = [
        0x77, 0x07, 0x6d, 0x0a, 0x73, 0x18, 0xa5, 0x7d, 0x3c, 0x16, 0xc1, 0x72, 0x51, 0xb2, 0x66,
        0x45, 0xdf, 0x4c, 0x2f, 0x87, 0xeb, 0xc0, 0x99, 0x2a, 0xb1, 0x77, 0xfb, 0xa5, 0x1d, 0xb9,
        0x2c, 0x2a,
    ];
    let alice_pub = [
        0x85, 0x20, 0xf0, 0x09, 0x89, 0x30, 0xa7, 0x54, 0x74, 0x8b, 0x7d, 0xdc, 0xb4, 0x3e, 0xf7,
        0x5a, 0x0d, 0xbf, 0x3a, 0x0d, 0x26, 0x38, 0x1a, 0xf4, 0xeb, 0xa4, 0xa9, 0x8e, 0xaa, 0x9b,
        0x4e, 0x6a,
    ];
    assert_eq!(WgSecret(alice_priv).public_key(), alice_pub);
    let s = key_to_base64(&alice_pub);
    assert_eq!(s, "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=");
    assert_eq!(key_from_base64(&s), Some(alice_pub));
    for k in [[0u8; 32], [0xff; 32]] {
        assert_eq!(key_from_base64(&key_to_base64(&k)), Some(k));
    }
    assert_eq!(key_from_base64(&format!("{s}\n")), None);
    assert_eq!(key_from_base64(&s[..43]), None);
    assert_eq!(key_from_base64(&s.replace('h', "*")), None);
    assert!(!format!("{:?}", WgSecret(alice_priv)).contains("dwdtCnMYpX08FsFyUbJm"));
}

#[test]
fn owner_matches_the_steering_byte() {
    // Receiver index = id << 8 | session; byte 1 (LE) is id & 0xff.
    for id in [1u32, 2, 255, 256, 257, 0x12_3456] {
        let ridx = (id << 8) | 7;
        let b = ridx.to_le_bytes()[1];
        for n in 1..5 {
            assert_eq!(owner(id, n), usize::from(b) % n);
        }
    }
    assert_eq!(steering_program(2)[3].k, 2);
}

fn peer(subnet: &str, endpoint: [u8; 4], key: u8) -> Peer {
    Peer {
        subnet: subnet.parse().expect("subnet"),
        endpoint: IpAddr::from(endpoint),
        vtep_mac: None,
        nat: None,
        wireguard: Some(WgPeer {
            public_key: [key; 32],
            port: 51820,
            psk: None,
            keepalive: 0,
        }),
        tunnel_gso: false,
    }
}

/// Cryptokey routing: the source's longest-prefix match must be the
/// peer's. Fails with the old check (any of the peer's own subnets), which
/// let peer 1 send from peer 3's nested subnet.
#[test]
fn source_must_route_back_to_the_sending_peer() {
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
    let (a, b, c) = (id(1), id(2), id(3));
    let v4 = |d: u8| IpAddr::from(Ipv4Addr::new(10, 244, 1, d));
    let subnet = |e: Option<&Entry>| e.map(|e| e.subnet.to_string());
    assert_eq!(
        subnet(source_allowed(&table, a, v4(5))),
        Some("10.244.1.0/24".into())
    );
    assert_eq!(
        subnet(source_allowed(
            &table,
            a,
            "fd00:244:1::7".parse().expect("v6")
        )),
        Some("fd00:244:1::/64".into())
    );
    // Inside peer 1's /24 but routed to peer 3: peer 3's, not peer 1's.
    assert!(source_allowed(&table, a, v4(200)).is_none());
    assert!(source_allowed(&table, c, v4(200)).is_some());
    // Another peer's subnet, outside every subnet, an unknown id.
    assert!(source_allowed(&table, b, v4(5)).is_none());
    assert!(source_allowed(&table, a, "10.244.3.1".parse().expect("v4")).is_none());
    assert!(source_allowed(&table, a, "fd00:244:2::1".parse().expect("v6")).is_none());
    assert!(source_allowed(&table, 0xff_fff0, v4(5)).is_none());
    assert!(source_allowed(&table, b, "10.244.2.9".parse().expect("v4")).is_some());
}

#[test]
fn packets_shorter_than_their_ip_header_are_refused() {
    let v4 = IpAddr::from([10, 244, 2, 3]);
    let v6: IpAddr = "fd00::1".parse().expect("v6");
    assert!(!holds_ip_header(v4, 0) && !holds_ip_header(v4, 19));
    assert!(holds_ip_header(v4, 20));
    assert!(!holds_ip_header(v6, 39) && holds_ip_header(v6, 40));
}
