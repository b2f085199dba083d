use std::net::IpAddr;

use super::rx::{self, Delivery};
use super::tx::{self, Refusal, Shape};
use crate::AntiSpoofing;
use crate::encap::{Codec, DropReason, VXLAN_HEADROOM, Vxlan};
use crate::peers::{Peer, PeerTable};
use crate::test_util::{payload, tcp4, tcp6, udp4};
use crate::wire::vnet::{self, VnetHdr};

const MAC: [u8; 6] = [2, 0, 0, 0, 2, 1];
const ARENA: usize = 1 << 20;

pub(super) fn peer(subnet: &str, endpoint: [u8; 4]) -> Peer {
    Peer {
        subnet: subnet.parse().expect("subnet"),
        endpoint: IpAddr::from(endpoint),
        vtep_mac: Some(MAC),
        nat: None,
        wireguard: None,
        tunnel_gso: false,
    }
}

/// Node 2 (10.244.2.0/24, fd00:2::/32) and node 1 (10.244.1.0/24, fd00:1::/32) as peers.
pub(super) fn table() -> PeerTable {
    PeerTable::new(
        &[
            peer("10.244.2.0/24", [192, 0, 2, 2]),
            peer("fd00:2::/32", [192, 0, 2, 2]),
            peer("10.244.1.0/24", [192, 0, 2, 1]),
            peer("fd00:1::/32", [192, 0, 2, 1]),
        ],
        8472,
    )
}

pub(super) fn vxlan(mac: [u8; 6]) -> Codec {
    Codec::Vxlan(Vxlan {
        vni: 1,
        local_mac: mac,
    })
}

/// A TUN read with a virtio-net header.
pub(super) fn read(hdr: VnetHdr, pkt: &[u8]) -> Vec<u8> {
    let mut r = hdr.to_bytes().to_vec();
    r.extend_from_slice(pkt);
    r
}

fn gso(gso_type: u8, size: u16) -> VnetHdr {
    VnetHdr {
        gso_type,
        gso_size: size,
        ..VnetHdr::default()
    }
}

/// Plans and writes `r`, then decapsulates every datagram on node 2 (which
/// receives from node 1's address); returns the inner packets.
fn send_and_receive(codec: Codec, r: &mut [u8]) -> Vec<Vec<u8>> {
    let t = table();
    let plan = tx::udp_plan(&codec, &t, r, true, ARENA).expect("plan");
    assert_eq!(plan.entry.dst.ip(), IpAddr::from([192, 0, 2, 2]));
    let mut arena = vec![0; plan.need];
    let out = tx::udp_write(&codec, &plan, r, &mut arena).expect("write");
    assert!(out.count() < plan.datagrams);
    assert!(out.segs.total_len() <= plan.need);
    let rx_codec = match codec {
        Codec::Vxlan(_) => vxlan(MAC),
        c => c,
    };
    let from = t.endpoint_entries(IpAddr::from([192, 0, 2, 1]));
    let mut inner = Vec::new();
    for i in 0..out.count() {
        let d = &mut arena[out.range(i)];
        let got = rx::udp(&rx_codec, AntiSpoofing::Strict, &t, from, d).expect("our datagram");
        assert!(got.from.is_some() && !got.unexpected);
        inner.push(d[got.inner].to_vec());
    }
    let total: usize = inner.iter().map(Vec::len).sum();
    assert_eq!(total, out.inner_bytes(), "{} datagrams", out.count());
    inner
}

#[test]
fn a_tcp_super_packet_leaves_as_vxlan_segments_that_decapsulate() {
    let sp = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(10_000, 1),
        true,
    );
    let mut r = read(gso(vnet::GSO_TCPV4, 1400), &sp);
    let inner = send_and_receive(vxlan([2, 0, 0, 0, 1, 1]), &mut r);
    assert_eq!(inner.len(), 10_000usize.div_ceil(1400));
    let sp6 = tcp6(1, &payload(5000, 2), false);
    let mut r = read(gso(vnet::GSO_TCPV6, 1000), &sp6);
    assert_eq!(send_and_receive(vxlan([2, 0, 0, 0, 1, 1]), &mut r).len(), 5);
}

#[test]
fn a_udp_super_packet_is_cut_by_uso() {
    let sp = udp4([10, 244, 1, 2], [10, 244, 2, 3], 64, &payload(4000, 3));
    let mut r = read(gso(vnet::GSO_UDP_L4, 1000), &sp);
    let inner = send_and_receive(Codec::FlannelUdp, &mut r);
    assert_eq!(inner.len(), 4);
    for p in &inner {
        assert_eq!(p[8], 62, "TTL decremented on send and on receive");
        assert_eq!(usize::from(u16::from_be_bytes([p[2], p[3]])), p.len());
    }
}

#[test]
fn one_packet_is_copied_behind_the_headroom() {
    let p = udp4([10, 244, 1, 2], [10, 244, 2, 3], 64, &payload(300, 4));
    let mut r = read(VnetHdr::default(), &p);
    let codec = vxlan([2, 0, 0, 0, 1, 1]);
    let t = table();
    let plan = tx::udp_plan(&codec, &t, &mut r, true, ARENA).expect("plan");
    assert_eq!((plan.need, plan.datagrams), (VXLAN_HEADROOM + p.len(), 1));
    let mut arena = vec![0; plan.need];
    let out = tx::udp_write(&codec, &plan, &r, &mut arena).expect("write");
    assert!(!out.cut);
    assert_eq!(&arena[VXLAN_HEADROOM..], &p[..]);
    assert_eq!(out.inner_bytes(), p.len());
}

#[test]
fn refusals_carry_their_reason() {
    let t = table();
    let codec = vxlan([2, 0, 0, 0, 1, 1]);
    let nowhere = udp4([10, 244, 1, 2], [10, 9, 9, 9], 64, &[1; 10]);
    let mut r = read(VnetHdr::default(), &nowhere);
    let refused = |c: &Codec, r: &mut [u8]| tx::udp_plan(c, &t, r, true, ARENA).err();
    assert_eq!(
        refused(&codec, &mut r),
        Some(Refusal::Drop(DropReason::NoRoute))
    );
    let got = refused(&Codec::FlannelUdp, &mut r);
    assert_eq!(
        got,
        Some(Refusal::Unreachable {
            start: vnet::HEADER_LEN
        })
    );
    assert_eq!(got.map(Refusal::reason), Some(DropReason::NoRoute));
    let mut short = vec![0u8; vnet::HEADER_LEN + 10];
    short[vnet::HEADER_LEN] = 0x45;
    assert_eq!(
        refused(&codec, &mut short),
        Some(DropReason::Malformed.into())
    );
    let big = udp4([10, 244, 1, 2], [10, 244, 2, 3], 64, &payload(65_470, 5));
    let mut r = read(VnetHdr::default(), &big);
    assert_eq!(refused(&codec, &mut r), Some(DropReason::Mtu.into()));
    let sp = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(10_000, 1),
        true,
    );
    let mut r = read(gso(vnet::GSO_TCPV4, 1400), &sp);
    assert_eq!(
        tx::udp_plan(&codec, &t, &mut r, true, 4096).err(),
        Some(DropReason::Mtu.into()),
        "more than the arena"
    );
}

#[test]
fn shapes_follow_the_vnet_header_and_the_encapsulation() {
    let of = |t, s, cuts| Shape::of(&gso(t, s), cuts);
    assert_eq!(
        of(vnet::GSO_TCPV4, 1400, tx::IPIP_CUTS),
        Ok(Shape::Tcp(1400))
    );
    assert_eq!(
        of(vnet::GSO_TCPV4 | vnet::GSO_ECN, 9, tx::UDP_CUTS),
        Ok(Shape::Tcp(9))
    );
    assert_eq!(
        of(vnet::GSO_TCPV6, 1400, tx::IPIP_CUTS),
        Err(DropReason::Malformed)
    );
    assert_eq!(
        of(vnet::GSO_UDP_L4, 1400, tx::UDP_CUTS),
        Ok(Shape::Udp(1400))
    );
    assert_eq!(
        of(vnet::GSO_UDP_L4, 1400, tx::WG_CUTS),
        Err(DropReason::Malformed)
    );
    assert_eq!(
        of(vnet::GSO_TCPV4, 0, tx::UDP_CUTS),
        Err(DropReason::Malformed)
    );
    assert_eq!(of(vnet::GSO_NONE, 0, tx::UDP_CUTS), Ok(Shape::Single(None)));
    let csum = VnetHdr {
        flags: vnet::F_NEEDS_CSUM,
        csum_start: 20,
        csum_offset: 6,
        ..VnetHdr::default()
    };
    assert_eq!(
        Shape::of(&csum, tx::WG_CUTS),
        Ok(Shape::Single(Some((20, 6))))
    );
}

#[test]
fn ipip_routes_ipv4_to_ipv4_endpoints_only() {
    let t = PeerTable::new(
        &[
            peer("10.244.2.0/24", [192, 0, 2, 2]),
            Peer {
                endpoint: "2001:db8::3".parse().expect("ip"),
                ..peer("10.244.3.0/24", [0; 4])
            },
        ],
        0,
    );
    let p = tcp4([10, 244, 1, 2], [10, 244, 2, 3], 1, &payload(100, 6), true);
    let mut r = read(VnetHdr::default(), &p);
    let plan = tx::ipip_plan(&t, &mut r, true, ARENA).expect("plan");
    let tx::Outer::Ipip { dst, params: outer } = plan.outer else {
        panic!("not an ipip plan: {:?}", plan.outer)
    };
    assert_eq!(
        (dst, plan.headroom, plan.need),
        ([192, 0, 2, 2].into(), 0, p.len())
    );
    assert_eq!((outer.ttl, outer.df), (64, p[6] & 0x40 != 0));
    let to_v6 = tcp4([10, 244, 1, 2], [10, 244, 3, 3], 1, &[1; 10], true);
    let mut r = read(VnetHdr::default(), &to_v6);
    assert_eq!(
        tx::ipip_plan(&t, &mut r, true, ARENA).err(),
        Some(DropReason::NoRoute)
    );
    let mut r = read(VnetHdr::default(), &tcp6(1, &[1; 10], true));
    assert_eq!(
        tx::ipip_plan(&t, &mut r, true, ARENA).err(),
        Some(DropReason::NoRoute)
    );
    let mut r = read(VnetHdr::default(), &[0x60, 0, 0]);
    assert_eq!(
        tx::ipip_plan(&t, &mut r, true, ARENA).err(),
        Some(DropReason::NoRoute)
    );
    assert_eq!(
        tx::ipip_plan(&t, &mut [0; 4], true, ARENA).err(),
        Some(DropReason::Malformed)
    );
}

#[test]
fn received_datagrams_are_checked_by_their_sources() {
    let t = table();
    let codec = Codec::FlannelUdp;
    let node1 = t.endpoint_entries(IpAddr::from([192, 0, 2, 1]));
    let stranger: &[usize] = &[];
    let check = |mode, outer: &[usize], src: [u8; 4]| {
        let mut d = udp4(src, [10, 244, 2, 3], 64, &[7; 20]);
        rx::udp(&codec, mode, &t, outer, &mut d)
            .map(|d: Delivery<'_>| (d.from.map(|e| e.subnet), d.unexpected))
    };
    let n1 = Some("10.244.1.0/24".parse().expect("net"));
    let (strict, subnet, off) = (
        AntiSpoofing::Strict,
        AntiSpoofing::Subnet,
        AntiSpoofing::Off,
    );
    let (spoofed, unknown) = (DropReason::SpoofedSource, DropReason::UnknownPeer);
    let cases = [
        (strict, node1, [10, 244, 1, 9], Ok((n1, false))),
        (strict, node1, [10, 244, 2, 9], Err(spoofed)),
        (strict, stranger, [10, 244, 1, 9], Err(unknown)),
        (subnet, stranger, [10, 244, 1, 9], Ok((n1, true))),
        (subnet, stranger, [10, 9, 9, 9], Err(unknown)),
        (off, stranger, [10, 9, 9, 9], Ok((None, false))),
    ];
    for (mode, outer, src, want) in cases {
        assert_eq!(
            check(mode, outer, src),
            want,
            "{mode}, inner source {src:?}"
        );
    }
    let mut empty = [];
    assert_eq!(
        rx::udp(&codec, AntiSpoofing::Strict, &t, stranger, &mut empty).err(),
        Some(DropReason::UnknownPeer)
    );
    assert_eq!(
        rx::udp(&codec, AntiSpoofing::Off, &t, stranger, &mut empty).err(),
        Some(DropReason::Malformed)
    );
}

#[test]
fn trains_split_at_the_stride() {
    let segs: Vec<_> = rx::train(10, 4).collect();
    assert_eq!(segs, [0..4, 4..8, 8..10]);
    assert_eq!(rx::train(0, 4).count(), 0);
    assert_eq!(
        rx::train(3, 0).count(),
        3,
        "a zero stride cannot loop forever"
    );
}

#[test]
fn the_flow_hash_follows_addresses_and_ports() {
    let a = udp4([10, 244, 1, 2], [10, 244, 2, 3], 64, &[1; 10]);
    let mut b = a.clone();
    b[8] = 9; // TTL: not part of the flow
    assert_eq!(tx::flow_hash(&a), tx::flow_hash(&b));
    b[21] ^= 1; // source port
    assert_ne!(tx::flow_hash(&a), tx::flow_hash(&b));
    assert_eq!(tx::flow_hash(&[]), tx::flow_hash(&[0x45; 3]));
}

/// The gathered transmit step puts the same bytes on the wire as the
/// copying one: header block + payload slice = the copied datagram, for
/// both encapsulations, both IP versions (VXLAN), odd sizes and one short segment.
#[test]
fn gathered_datagrams_equal_the_copied_ones() {
    let t = table();
    let sup4 = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        77,
        &payload(60_001, 9),
        true,
    );
    let sup6 = tcp6(5, &payload(9_000, 3), false);
    for codec in [Codec::FlannelUdp, vxlan(MAC)] {
        for (sup, ty) in [(&sup4, vnet::GSO_TCPV4), (&sup6, vnet::GSO_TCPV6)] {
            if ty == vnet::GSO_TCPV6 && matches!(codec, Codec::FlannelUdp) {
                continue; // flannel-UDP carries IPv4 only
            }
            for size in [536u16, 1398, 1448, 8000] {
                let mut r = read(gso(ty, size), sup);
                let plan = tx::udp_plan(&codec, &t, &mut r, true, ARENA).expect("plan");
                let mut arena = vec![0; plan.need];
                let want = tx::udp_write(&codec, &plan, &r, &mut arena).expect("write");
                let mut hdrs = vec![0; ARENA];
                let g = super::gather::udp_gather(&codec, &plan, &r, &mut hdrs)
                    .expect("gather")
                    .expect("gathered");
                assert_eq!(g.count, want.count(), "size {size}");
                let ip = &r[plan.pkt.start..];
                for i in 0..g.count {
                    let mut got = hdrs[g.header(i)].to_vec();
                    got.extend_from_slice(&ip[g.payload(i)]);
                    assert_eq!(got, arena[want.range(i)], "size {size} segment {i}");
                }
            }
        }
    }
}

/// Cuts into more segments than a gathered send carries go the copying way.
#[test]
fn super_packets_of_tiny_segments_are_not_gathered() {
    let t = table();
    let sup = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(20_000, 1),
        false,
    );
    let mut r = read(gso(vnet::GSO_TCPV4, 100), &sup);
    let plan = tx::udp_plan(&Codec::FlannelUdp, &t, &mut r, true, ARENA).expect("plan");
    let mut hdrs = vec![0; ARENA];
    let g = super::gather::udp_gather(&Codec::FlannelUdp, &plan, &r, &mut hdrs).expect("ok");
    assert!(g.is_none(), "200 segments gathered");
}

/// Over an IPv6 underlay (the kernel verified the mandatory UDP checksum)
/// the inner TCP checksum is marked trusted (partial); over IPv4, where
/// the outer checksum may be zero, it is left for GRO to verify.
#[test]
fn inner_checksums_are_trusted_only_where_the_outer_one_was_checked() {
    let pkt = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        9,
        &payload(1000, 4),
        false,
    );
    let mut dgram = vec![0u8; VXLAN_HEADROOM];
    vxlan([2, 0, 0, 0, 1, 1]).write_header(&mut dgram, MAC, 4);
    dgram.extend_from_slice(&pkt);
    for (src, trusted) in [("192.0.2.1", false), ("2001:db8::1", true)] {
        let src: IpAddr = src.parse().expect("addr");
        let mut node1 = peer("10.244.1.0/24", [192, 0, 2, 1]);
        node1.endpoint = src;
        let t = PeerTable::new(&[node1], 8472);
        let mut d = dgram.clone();
        let from = t.endpoint_entries(src);
        let got = rx::udp_from(&vxlan(MAC), AntiSpoofing::Strict, &t, (src, from), &mut d)
            .expect("delivered");
        let inner = &d[got.inner];
        assert_eq!(
            crate::offload::partial_checksum(inner).is_some(),
            trusted,
            "from {src}"
        );
        assert_eq!(inner[..36], pkt[..36], "only the checksum changes");
        assert_eq!(inner[38..], pkt[38..], "only the checksum changes");
    }
}
