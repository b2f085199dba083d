//! [`super::tap`]: the header block a tunnel TAP frame starts with.

use std::net::Ipv4Addr;

use super::tap::{self, BLOCK_LEN, TapSide};
use super::tests::{read, table, vxlan};
use super::tx;
use crate::encap::{Codec, VXLAN_HEADROOM};
use crate::test_util::{payload, tcp4, tcp6};
use crate::wire::{checksum, vnet};

const SIDE: TapSide = TapSide {
    tap_mac: [2, 0, 0, 0, 0, 0xaa],
    local: Ipv4Addr::new(192, 0, 2, 1),
};

fn partial(gso_type: u8, size: u16, csum_start: u16) -> vnet::VnetHdr {
    vnet::VnetHdr {
        flags: vnet::F_NEEDS_CSUM,
        gso_type,
        hdr_len: 0,
        gso_size: size,
        csum_start,
        csum_offset: 16,
    }
}

#[test]
fn a_tcp_super_packet_gets_one_block_the_kernel_can_segment() {
    let sp = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(10_000, 1),
        true,
    );
    let mut r = read(partial(vnet::GSO_TCPV4, 1398, 20), &sp);
    let codec = vxlan([2, 0, 0, 0, 1, 1]);
    let t = table();
    let plan = tx::udp_plan(&codec, &t, &mut r, true, 1 << 20).expect("plan");
    let ip = r[plan.pkt.start..].to_vec();
    let mut out = [0u8; BLOCK_LEN];
    let n = tap::tunnel_header(&codec, &plan, &ip, SIDE, (50000, 7), &mut out).expect("taken");
    assert_eq!(n, BLOCK_LEN);
    let h = vnet::VnetHdr::parse(&out).expect("vnet");
    let frame = &out[vnet::TUNNEL_HEADER_LEN..];
    let le = |i: usize| usize::from(u16::from_le_bytes([out[i], out[i + 1]]));
    let (outer_th, inner_nh) = (le(20), le(22));
    // The offsets point at the outer UDP header and the inner IP header.
    assert_eq!(
        frame[outer_th - 20],
        0x45,
        "outer IPv4 before the UDP header"
    );
    assert_eq!(&frame[outer_th + 2..outer_th + 4], &8472u16.to_be_bytes());
    assert_eq!(&frame[outer_th..outer_th + 2], &50000u16.to_be_bytes());
    assert_eq!(
        inner_nh,
        frame.len(),
        "the inner IP packet follows the block"
    );
    assert_eq!(ip[0], 0x45);
    assert_eq!(h.gso_type, vnet::GSO_TCPV4 | vnet::GSO_UDP_TUNNEL_IPV4);
    assert_eq!(h.flags, vnet::F_NEEDS_CSUM);
    assert_eq!(usize::from(h.gso_size), 1398);
    assert_eq!(usize::from(h.csum_start), inner_nh + 20);
    assert_eq!(h.csum_offset, 16);
    assert_eq!(
        usize::from(h.hdr_len),
        inner_nh + 20 + 32,
        "IP + TCP with timestamps"
    );
    // Outer Ethernet to the TAP, IPv4 from this node to the peer, valid sum.
    assert_eq!(&frame[..6], &SIDE.tap_mac);
    assert_ne!(&frame[6..12], &SIDE.tap_mac);
    let o = &frame[14..34];
    assert_eq!(checksum::checksum(o), 0, "outer IPv4 checksum");
    assert_eq!(
        usize::from(u16::from_be_bytes([o[2], o[3]])),
        20 + 8 + VXLAN_HEADROOM + ip.len()
    );
    assert_eq!(&o[4..6], &7u16.to_be_bytes());
    assert_eq!(o[9], 17);
    assert_eq!(&o[12..16], &[192, 0, 2, 1]);
    assert_eq!(&o[16..20], &[192, 0, 2, 2]);
    let u = &frame[34..42];
    assert_eq!(
        usize::from(u16::from_be_bytes([u[4], u[5]])),
        8 + VXLAN_HEADROOM + ip.len()
    );
    // The VXLAN header and inner Ethernet are the ones the socket path writes.
    let mut sock_hdr = [0u8; VXLAN_HEADROOM];
    codec.write_header(&mut sock_hdr, plan.entry.mac, 4);
    assert_eq!(&frame[42..], &sock_hdr);
    assert_eq!(tap::segments(&ip, 20, 1398), (8, ip.len() + 7 * 52));
}

#[test]
fn everything_else_stays_on_the_sockets() {
    let codec = vxlan([2, 0, 0, 0, 1, 1]);
    let t = table();
    let mut out = [0u8; BLOCK_LEN];
    let sp = tcp4([10, 244, 1, 2], [10, 244, 2, 3], 1, &payload(5000, 1), true);
    let taken = |codec: &Codec, hdr: vnet::VnetHdr, pkt: &[u8], out: &mut [u8]| {
        let mut r = read(hdr, pkt);
        let plan = tx::udp_plan(codec, &t, &mut r, true, 1 << 20).expect("plan");
        let ip = r[plan.pkt.start..].to_vec();
        tap::tunnel_header(codec, &plan, &ip, SIDE, (1, 1), out).is_some()
    };
    assert!(taken(
        &codec,
        partial(vnet::GSO_TCPV4, 1398, 20),
        &sp,
        &mut out
    ));
    // flannel-UDP, a single packet, no partial checksum, IPv6 inside, a short buffer.
    assert!(!taken(
        &Codec::FlannelUdp,
        partial(vnet::GSO_TCPV4, 1398, 20),
        &sp,
        &mut out
    ));
    assert!(!taken(
        &codec,
        partial(vnet::GSO_NONE, 0, 20),
        &sp,
        &mut out
    ));
    let mut no_csum = partial(vnet::GSO_TCPV4, 1398, 20);
    no_csum.flags = 0;
    assert!(!taken(&codec, no_csum, &sp, &mut out));
    let sp6 = tcp6(1, &payload(5000, 2), false);
    assert!(!taken(
        &codec,
        partial(vnet::GSO_TCPV6, 1000, 40),
        &sp6,
        &mut out
    ));
    assert!(!taken(
        &codec,
        partial(vnet::GSO_TCPV4, 1398, 20),
        &sp,
        &mut out[..BLOCK_LEN - 1]
    ));
    // An inner packet one byte over what one outer IPv4 length can carry.
    let big = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(tap::MAX_INNER - 51, 3),
        true,
    );
    assert!(!taken(
        &codec,
        partial(vnet::GSO_TCPV4, 1398, 20),
        &big,
        &mut out
    ));
    let fits = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(tap::MAX_INNER - 52, 3),
        true,
    );
    assert!(taken(
        &codec,
        partial(vnet::GSO_TCPV4, 1398, 20),
        &fits,
        &mut out
    ));
}

/// The table of [`table`] with the peer 10.244.2.0/24 marked (or not) as
/// taking UDP-tunnel GSO datagrams whole.
fn flannel_table(whole: bool) -> crate::peers::PeerTable {
    let mut p = super::tests::peer("10.244.2.0/24", [192, 0, 2, 2]);
    p.tunnel_gso = whole;
    crate::peers::PeerTable::new(&[p], 8285)
}

#[test]
fn flannel_udp_gets_the_block_without_tunnel_header_only_toward_weft_peers() {
    let sp = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(10_000, 1),
        true,
    );
    let mut out = [0u8; BLOCK_LEN];
    // A peer not marked (flanneld, or weft without WeftGSO): the sockets.
    let t = flannel_table(false);
    let mut r = read(partial(vnet::GSO_TCPV4, 1398, 20), &sp);
    let plan = tx::udp_plan(&Codec::FlannelUdp, &t, &mut r, true, 1 << 20).expect("plan");
    let ip = r[plan.pkt.start..].to_vec();
    assert!(tap::tunnel_header(&Codec::FlannelUdp, &plan, &ip, SIDE, (1, 1), &mut out).is_none());

    let t = flannel_table(true);
    let mut r = read(partial(vnet::GSO_TCPV4, 1398, 20), &sp);
    let plan = tx::udp_plan(&Codec::FlannelUdp, &t, &mut r, true, 1 << 20).expect("plan");
    let ip = r[plan.pkt.start..].to_vec();
    assert_eq!(
        ip[8], 63,
        "flannel-UDP's TTL decrement happened in the plan"
    );
    let n = tap::tunnel_header(&Codec::FlannelUdp, &plan, &ip, SIDE, (50000, 7), &mut out)
        .expect("taken");
    assert_eq!(n, BLOCK_LEN - VXLAN_HEADROOM);
    let h = vnet::VnetHdr::parse(&out).expect("vnet");
    let frame = &out[vnet::TUNNEL_HEADER_LEN..n];
    let le = |i: usize| usize::from(u16::from_le_bytes([out[i], out[i + 1]]));
    let (outer_th, inner_nh) = (le(20), le(22));
    assert_eq!(outer_th, 14 + 20);
    assert_eq!(
        inner_nh,
        outer_th + 8,
        "the inner IP header follows the UDP header"
    );
    assert_eq!(inner_nh, frame.len());
    assert_eq!(h.gso_type, vnet::GSO_TCPV4 | vnet::GSO_UDP_TUNNEL_IPV4);
    assert_eq!(usize::from(h.csum_start), inner_nh + 20);
    assert_eq!(usize::from(h.hdr_len), inner_nh + 20 + 32);
    let o = &frame[14..34];
    assert_eq!(checksum::checksum(o), 0, "outer IPv4 checksum");
    assert_eq!(
        usize::from(u16::from_be_bytes([o[2], o[3]])),
        20 + 8 + ip.len()
    );
    let u = &frame[34..42];
    assert_eq!(&u[2..4], &8285u16.to_be_bytes(), "the peer's flannel port");
    assert_eq!(usize::from(u16::from_be_bytes([u[4], u[5]])), 8 + ip.len());

    // flannel-UDP's larger limit: 22 bytes more inner packet than VXLAN's.
    assert_eq!(tap::max_inner(0), tap::MAX_INNER + VXLAN_HEADROOM);
    let big = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 3],
        1,
        &payload(tap::max_inner(0) - 52, 3),
        true,
    );
    let mut r = read(partial(vnet::GSO_TCPV4, 1398, 20), &big);
    let plan = tx::udp_plan(&Codec::FlannelUdp, &t, &mut r, true, 1 << 20).expect("plan");
    let ip = r[plan.pkt.start..].to_vec();
    assert!(tap::tunnel_header(&Codec::FlannelUdp, &plan, &ip, SIDE, (1, 1), &mut out).is_some());
}
