//! Deterministic in-memory pipeline between two engines' packet paths, no
//! root needed: node 1's transmit step ([`tx::udp_plan`], [`tx::udp_write`])
//! routes a TUN super-packet, segments it (userspace GSO) and heads each
//! segment (VXLAN or flannel-UDP) in its arena, the "wire" concatenates them
//! into one UDP-GRO train as the receiving socket would hand it over, node 2's
//! receive step ([`rx::udp`], strict anti-spoofing) decaps and checks every
//! segment, and userspace GRO coalesces them into one TUN write that must
//! carry exactly the original byte stream. The same calls the workers make,
//! without their sockets. WireGuard runs the same way through its core on
//! an in-memory pair of engines (`path::wg::sim::Pair`).

use std::io::IoSlice;
use std::net::IpAddr;

use weft_engine::AntiSpoofing;
use weft_engine::encap::{Codec, Vxlan};
use weft_engine::offload::gro::{Gro, Pushed};
use weft_engine::offload::gso;
use weft_engine::path::{rx, tx};
use weft_engine::peers::{Peer, PeerTable};
use weft_engine::wire::vnet::{self, VnetHdr};

/// Node 2's VTEP MAC.
const MAC2: [u8; 6] = [2, 0, 0, 0, 2, 1];
const NODE1: [u8; 4] = [192, 0, 2, 1];
const NODE2: [u8; 4] = [192, 0, 2, 2];

fn super_packet(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([10, 244, 1, 2], [10, 244, 2, 2], 64)
        .tcp(40000, 5201, 12345, 1000)
        .ack(1)
        .write(&mut v, payload)
        .expect("build");
    v
}

/// A TUN read: a virtio-net header asking for TCP segments that fit `mtu`,
/// and a TCP super-packet carrying `payload`.
fn tcp_read(mtu: usize, payload: &[u8]) -> Vec<u8> {
    let hdr = VnetHdr {
        gso_type: vnet::GSO_TCPV4,
        gso_size: u16::try_from(mtu - 40).expect("mss"),
        ..VnetHdr::default()
    };
    let mut read = hdr.to_bytes().to_vec();
    read.extend_from_slice(&super_packet(payload));
    read
}

/// A node's peer table: the other node's subnet and address.
fn table(subnet: &str, endpoint: [u8; 4], mac: [u8; 6]) -> PeerTable {
    let peer = Peer {
        subnet: subnet.parse().expect("subnet"),
        endpoint: IpAddr::from(endpoint),
        vtep_mac: Some(mac),
        nat: None,
        wireguard: None,
        tunnel_gso: false,
    };
    PeerTable::new(&[peer], 8472)
}

fn pipeline(
    tx_codec: Codec,
    rx_codec: Codec,
    mtu: usize,
    payload_len: usize,
    lose: Option<usize>,
) -> (Vec<(VnetHdr, Vec<u8>)>, Vec<u8>) {
    let data: Vec<u8> = (0..payload_len).map(|i| (i * 7 % 251) as u8).collect();
    let mut read = tcp_read(mtu, &data);
    // Node 1.
    let peers1 = table("10.244.2.0/24", NODE2, MAC2);
    let plan = tx::udp_plan(&tx_codec, &peers1, &mut read, true, 1 << 20).expect("plan");
    assert_eq!(plan.entry.dst.ip(), IpAddr::from(NODE2));
    let mut arena = vec![0; plan.need];
    let out = tx::udp_write(&tx_codec, &plan, &read, &mut arena).expect("segment");
    assert!(out.cut);
    // The UDP GRO train: segments back to back, stride = the segments' stride.
    let mut wire = Vec::new();
    for i in (0..out.count()).filter(|i| Some(*i) != lose) {
        wire.extend_from_slice(&arena[out.range(i)]);
    }
    // Node 2.
    let peers2 = table("10.244.1.0/24", NODE1, [2, 0, 0, 0, 1, 1]);
    let from = peers2.endpoint_entries(IpAddr::from(NODE1));
    let mut gro = Gro::new(mtu);
    for seg in rx::train(wire.len(), out.segs.stride) {
        let off = seg.start;
        let d = rx::udp(
            &rx_codec,
            AntiSpoofing::Strict,
            &peers2,
            from,
            &mut wire[seg],
        )
        .expect("decap");
        assert!(d.from.is_some() && !d.unexpected);
        let (start, len) = (off + d.inner.start, d.inner.len());
        assert_eq!(gro.push(&wire, start, len), Pushed::Queued);
    }
    let mut writes = Vec::new();
    gro.flush(&mut wire, |iov: &[IoSlice<'_>]| {
        let b: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
        writes.push((
            VnetHdr::parse(&b).expect("vnet"),
            b[vnet::HEADER_LEN..].to_vec(),
        ));
    });
    (writes, data)
}

fn tcp_payload(h: &VnetHdr, mut pkt: Vec<u8>) -> Vec<u8> {
    if h.flags & vnet::F_NEEDS_CSUM != 0 {
        gso::complete_checksum(&mut pkt, h.csum_start.into(), h.csum_offset.into()).expect("csum");
    }
    let s = etherparse::SlicedPacket::from_ip(&pkt).expect("parse");
    let Some(etherparse::TransportSlice::Tcp(t)) = s.transport else {
        panic!("tcp")
    };
    let Some(etherparse::NetSlice::Ipv4(ip)) = s.net else {
        panic!("v4")
    };
    let h4 = ip.header().to_header();
    assert_eq!(h4.calc_header_checksum(), h4.header_checksum);
    assert_eq!(
        t.calc_checksum_ipv4(h4.source, h4.destination).expect("c"),
        t.checksum()
    );
    t.payload().to_vec()
}

fn vxlan(local_mac: [u8; 6]) -> Codec {
    Codec::Vxlan(Vxlan { vni: 1, local_mac })
}

#[test]
fn vxlan_super_packet_arrives_as_one_write() {
    let (w, data) = pipeline(vxlan([2, 0, 0, 0, 1, 1]), vxlan(MAC2), 1450, 60000, None);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0.gso_type, vnet::GSO_TCPV4);
    assert_eq!(tcp_payload(&w[0].0, w[0].1.clone()), data);
}

#[test]
fn flannel_udp_super_packet_loses_two_ttl() {
    let (w, data) = pipeline(Codec::FlannelUdp, Codec::FlannelUdp, 1472, 30000, None);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].1[8], 62, "TTL decremented on send and on receive");
    assert_eq!(tcp_payload(&w[0].0, w[0].1.clone()), data);
}

#[test]
fn a_lost_segment_splits_the_train_but_keeps_order() {
    let (w, data) = pipeline(vxlan([2, 0, 0, 0, 1, 1]), vxlan(MAC2), 1450, 20000, Some(5));
    assert_eq!(w.len(), 2, "one write before the hole, one after");
    let mut got = tcp_payload(&w[0].0, w[0].1.clone());
    assert_eq!(got.len(), 5 * 1410);
    got.extend(tcp_payload(&w[1].0, w[1].1.clone()));
    let mut want = data[..5 * 1410].to_vec();
    want.extend_from_slice(&data[6 * 1410..]);
    assert_eq!(got, want);
}

/// WireGuard, two engines' cores in process (as quinn tests its
/// endpoints): node 1's `Core::tun_tx` cuts and seals a TCP super-packet,
/// the wire hands node 2 the datagrams as one UDP-GRO train, node 2's
/// `Core::train` opens each (AllowedIPs, strict; the checksum marked
/// trusted for the TUN's virtio-net header) into its plaintext room, and
/// GRO makes one TUN write of exactly the original stream. The handshake
/// that precedes it is the cores' own.
#[test]
fn wireguard_pair_carries_a_super_packet_as_one_write() {
    use weft_engine::path::wg::Now;
    use weft_engine::path::wg::sim::Pair;

    let mut p = Pair::connect(Now::read());
    let mtu = 1420;
    let data: Vec<u8> = (0..50_000).map(|i| (i * 13 % 251) as u8).collect();
    let mut read = tcp_read(mtu, &data);
    p.send(0, &mut read, true).expect("sent");
    p.receive_train(0, true);
    let [a, b] = &mut p.nodes;
    assert!(a.io.sent.iter().all(|s| s.0 == b.addr));
    assert_eq!(b.io.delivered.len(), a.io.sent.len(), "{:?}", b.io.dropped);
    let mut gro = Gro::new(mtu);
    let delivered = b.io.delivered.clone();
    let arena = b.io.plain();
    for r in delivered {
        assert_eq!(gro.push(arena, r.start, r.len()), Pushed::Queued);
    }
    let mut writes = Vec::new();
    gro.flush(arena, |iov: &[IoSlice<'_>]| {
        let b: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
        writes.push((
            VnetHdr::parse(&b).expect("vnet"),
            b[vnet::HEADER_LEN..].to_vec(),
        ));
    });
    assert_eq!(writes.len(), 1);
    assert_eq!(writes[0].0.gso_type, vnet::GSO_TCPV4);
    assert_eq!(tcp_payload(&writes[0].0, writes[0].1.clone()), data);
}
