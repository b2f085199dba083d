use super::*;
use crate::test_util::*;
use crate::wire::vnet::VnetHdr;

/// Places packets in an arena with a 22-byte gap before each (as after VXLAN decap).
fn arena_of(pkts: &[Vec<u8>]) -> (Vec<u8>, Vec<(usize, usize)>) {
    let mut a = Vec::new();
    let mut pos = Vec::new();
    for p in pkts {
        a.extend_from_slice(&[0xee; 22]);
        pos.push((a.len(), p.len()));
        a.extend_from_slice(p);
    }
    (a, pos)
}

/// Runs GRO over the packets; returns each TUN write as (vnet header, packet bytes).
fn run(pkts: &[Vec<u8>]) -> Vec<(VnetHdr, Vec<u8>)> {
    let (mut a, pos) = arena_of(pkts);
    let mut g = Gro::new(1500);
    for (s, l) in pos {
        assert_eq!(g.push(&a, s, l), Pushed::Queued);
    }
    let mut out = Vec::new();
    g.flush(&mut a, |iov| {
        let bytes: Vec<u8> = iov.iter().flat_map(|s| s.iter().copied()).collect();
        let h = VnetHdr::parse(&bytes).expect("hdr");
        out.push((h, bytes[vnet::HEADER_LEN..].to_vec()));
    });
    assert!(g.is_empty());
    out
}

/// Completes the NEEDS_CSUM partial checksum like the kernel would, then checks everything.
fn kernel_view(h: &VnetHdr, mut pkt: Vec<u8>) -> (u32, u8, Vec<u8>) {
    if h.flags & vnet::F_NEEDS_CSUM != 0 {
        crate::offload::gso::complete_checksum(&mut pkt, h.csum_start.into(), h.csum_offset.into())
            .expect("csum");
    }
    check_tcp(&pkt)
}

fn flow(n: usize, mss: usize, last: usize, seq0: u32) -> (Vec<Vec<u8>>, Vec<u8>) {
    let mut pkts = Vec::new();
    let mut all = Vec::new();
    let mut seq = seq0;
    for i in 0..n {
        let len = if i + 1 == n { last } else { mss };
        let d = payload(len, i as u32 + seq0);
        pkts.push(tcp4([10, 244, 1, 2], [10, 244, 2, 3], seq, &d, i + 1 == n));
        all.extend_from_slice(&d);
        seq += len as u32;
    }
    (pkts, all)
}

#[test]
fn adjacent_segments_become_one_super_packet() {
    let (pkts, all) = flow(4, 1400, 600, 5000);
    let w = run(&pkts);
    assert_eq!(w.len(), 1);
    let (h, pkt) = w[0].clone();
    assert_eq!(h.flags, vnet::F_NEEDS_CSUM);
    assert_eq!(h.gso_type, vnet::GSO_TCPV4);
    assert_eq!(h.gso_size, 1400);
    assert_eq!(h.hdr_len, 20 + 32);
    assert_eq!((h.csum_start, h.csum_offset), (20, 16));
    assert_eq!(usize::from(u16::from_be_bytes([pkt[2], pkt[3]])), pkt.len());
    let (seq, flags, pl) = kernel_view(&h, pkt);
    assert_eq!(seq, 5000);
    assert_ne!(flags & tcp::PSH, 0, "PSH of the last segment is kept");
    assert_eq!(pl, all);
}

#[test]
fn gso_then_gro_round_trips() {
    let data = payload(20000, 9);
    let sp = tcp6(1, &data, false);
    let mut out = vec![0; 30000];
    let segs = crate::offload::gso::tcp_segment(&sp, 1200, 0, &mut out).expect("gso");
    let pkts: Vec<Vec<u8>> = (0..segs.count)
        .map(|i| out[segs.range(i)].to_vec())
        .collect();
    let w = run(&pkts);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0.gso_type, vnet::GSO_TCPV6);
    let (_, _, pl) = kernel_view(&w[0].0, w[0].1.clone());
    assert_eq!(pl, data);
}

#[test]
fn gaps_flows_and_non_data_keep_order() {
    let (a, _) = flow(3, 1000, 1000, 0);
    let mut pkts = vec![a[0].clone(), a[2].clone(), a[1].clone()]; // seq gap: no merge across it
    let w = run(&pkts);
    assert_eq!(w.len(), 3);
    assert!(w.iter().all(|(h, _)| h.gso_type == vnet::GSO_NONE));

    // Two interleaved flows each coalesce; order of first appearance is kept.
    let (f1, _) = flow(3, 1000, 1000, 0);
    let mut f2 = Vec::new();
    for i in 0..3u32 {
        f2.push(tcp4(
            [10, 244, 1, 9],
            [10, 244, 2, 3],
            100 + i * 1000,
            &payload(1000, i),
            false,
        ));
    }
    pkts = vec![
        f1[0].clone(),
        f2[0].clone(),
        f1[1].clone(),
        f2[1].clone(),
        f1[2].clone(),
        f2[2].clone(),
    ];
    let w = run(&pkts);
    assert_eq!(w.len(), 2);
    assert_eq!(&w[0].1[12..16], &[10, 244, 1, 2]);
    assert_eq!(&w[1].1[12..16], &[10, 244, 1, 9]);

    // A UDP packet passes through alone.
    let w = run(&[udp4([1, 1, 1, 1], [2, 2, 2, 2], 9, &[1, 2, 3])]);
    assert_eq!(w.len(), 1);
    assert_eq!(w[0].0, VnetHdr::default());
}

#[test]
fn corrupted_segment_is_not_merged() {
    let (mut pkts, _) = flow(3, 1000, 1000, 0);
    let l = pkts[1].len();
    pkts[1][l - 1] ^= 0xff;
    let w = run(&pkts);
    // The first stays alone (its successor is bad), the bad one alone, the third alone.
    assert_eq!(w.len(), 3);
    assert_eq!(
        w[1].1, pkts[1],
        "the corrupt segment is handed to the kernel untouched"
    );
}

#[test]
fn limits_split_items() {
    let (pkts, all) = flow(60, 1400, 1400, 0);
    let w = run(&pkts);
    assert!(w.len() >= 2, "64 KiB limit");
    let mut joined = Vec::new();
    for (h, p) in w {
        assert!(p.len() <= 65535);
        joined.extend(kernel_view(&h, p).2);
    }
    assert_eq!(joined, all);
}

#[test]
fn full_table_asks_for_flush() {
    let mut g = Gro::new(1500);
    let p = udp4([1, 1, 1, 1], [2, 2, 2, 2], 9, &[1, 2, 3]);
    for _ in 0..MAX_ITEMS {
        assert_eq!(g.push(&p, 0, p.len()), Pushed::Queued);
    }
    assert_eq!(g.push(&p, 0, p.len()), Pushed::Full);
}

#[test]
fn partial_checksums_from_offloading_senders_are_marked() {
    // What a kernel vxlan sender on a veth underlay puts on the wire: pseudo-header sum only.
    let (mut pkts, all) = flow(3, 1000, 500, 0);
    for p in &mut pkts {
        let ps = crate::wire::checksum::pseudo_v4(&p[12..16], &p[16..20], 6, (p.len() - 20) as u32);
        p[36..38].copy_from_slice(&(ps as u16).to_be_bytes());
        assert_eq!(crate::offload::partial_checksum(p), Some((20, 16)));
    }
    let w = run(&pkts);
    assert_eq!(w.len(), 1, "partial segments still coalesce");
    assert_eq!(kernel_view(&w[0].0, w[0].1.clone()).2, all);
    // A single one is written with NEEDS_CSUM so the kernel accepts it.
    let w = run(&pkts[..1]);
    assert_eq!(
        (w[0].0.flags, w[0].0.csum_start, w[0].0.csum_offset),
        (vnet::F_NEEDS_CSUM, 20, 16)
    );
    kernel_view(&w[0].0, w[0].1.clone());
    // A complete checksum is not mistaken for a partial one.
    let (full, _) = flow(1, 10, 10, 0);
    assert_eq!(crate::offload::partial_checksum(&full[0]), None);
}

#[test]
fn oversize_single_packet_becomes_gso() {
    // A 20 kB segment (a kernel peer's GSO train delivered whole over veth).
    let data = payload(20000, 11);
    let p = tcp4([10, 244, 2, 2], [10, 244, 1, 2], 9, &data, false);
    let w = run(&[p]);
    assert_eq!(w.len(), 1);
    let h = w[0].0;
    assert_eq!(
        (h.gso_type, h.gso_size, h.flags),
        (vnet::GSO_TCPV4, 1500 - 52, vnet::F_NEEDS_CSUM)
    );
    assert_eq!(kernel_view(&h, w[0].1.clone()).2, data);
}
