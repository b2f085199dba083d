//! Deterministic in-memory pipeline between two engines' sans-IO halves, no
//! root needed: node 1 segments a TUN super-packet (userspace GSO), heads each
//! segment (VXLAN or flannel-UDP), the "wire" concatenates them into one
//! UDP-GRO train as the receiving socket would hand it over, node 2 decaps
//! every segment and coalesces them (userspace GRO) into one TUN write that
//! must carry exactly the original byte stream.

use std::io::IoSlice;

use weft_engine::encap::{Codec, Vxlan};
use weft_engine::offload::gro::{Gro, Pushed};
use weft_engine::offload::gso;
use weft_engine::wire::vnet::{self, VnetHdr};

fn super_packet(payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([10, 244, 1, 2], [10, 244, 2, 2], 64)
        .tcp(40000, 5201, 12345, 1000)
        .ack(1)
        .write(&mut v, payload)
        .expect("build");
    v
}

fn pipeline(
    tx: Codec,
    rx: Codec,
    mtu: usize,
    payload_len: usize,
    lose: Option<usize>,
) -> (Vec<(VnetHdr, Vec<u8>)>, Vec<u8>) {
    let data: Vec<u8> = (0..payload_len).map(|i| (i * 7 % 251) as u8).collect();
    let mut sp = super_packet(&data);
    tx.prepare_inner(&mut sp).expect("prepare");
    let mss = mtu - 40;
    let headroom = tx.headroom();
    let mut arena = vec![0; gso::required_len(&sp, mss, headroom).expect("len")];
    let segs = gso::tcp_segment(&sp, mss, headroom, &mut arena).expect("segment");
    let mut wire = Vec::new(); // the UDP GRO train: segments back to back, stride = segs.stride
    for i in 0..segs.count {
        let s = i * segs.stride;
        let len = if i + 1 == segs.count {
            segs.last_len
        } else {
            segs.stride
        };
        tx.write_header(&mut arena[s..s + headroom], [2, 0, 0, 0, 2, 1], 4);
        if Some(i) != lose {
            wire.extend_from_slice(&arena[s..s + len]);
        }
    }
    let mut gro = Gro::new(mtu);
    let mut off = 0;
    while off < wire.len() {
        let len = segs.stride.min(wire.len() - off);
        let r = rx.decap(&mut wire[off..off + len]).expect("decap");
        assert_eq!(
            gro.push(&wire, off + r.start, r.end - r.start),
            Pushed::Queued
        );
        off += len;
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

#[test]
fn vxlan_super_packet_arrives_as_one_write() {
    let tx = Codec::Vxlan(Vxlan {
        vni: 1,
        local_mac: [2, 0, 0, 0, 1, 1],
    });
    let rx = Codec::Vxlan(Vxlan {
        vni: 1,
        local_mac: [2, 0, 0, 0, 2, 1],
    });
    let (w, data) = pipeline(tx, rx, 1450, 60000, None);
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
    let tx = Codec::Vxlan(Vxlan {
        vni: 1,
        local_mac: [2, 0, 0, 0, 1, 1],
    });
    let rx = Codec::Vxlan(Vxlan {
        vni: 1,
        local_mac: [2, 0, 0, 0, 2, 1],
    });
    let (w, data) = pipeline(tx, rx, 1450, 20000, Some(5));
    assert_eq!(w.len(), 2, "one write before the hole, one after");
    let mut got = tcp_payload(&w[0].0, w[0].1.clone());
    assert_eq!(got.len(), 5 * 1410);
    got.extend(tcp_payload(&w[1].0, w[1].1.clone()));
    let mut want = data[..5 * 1410].to_vec();
    want.extend_from_slice(&data[6 * 1410..]);
    assert_eq!(got, want);
}
