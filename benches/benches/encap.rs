//! Criterion benches of the engine's per-packet work, one group per path, with
//! `Throughput::Bytes` over 64, 1400 and 8950-byte packets:
//! flannel-UDP and VXLAN encap/decap, userspace segmentation (GSO) of a 64 KiB
//! TCP super-packet into segments of that size, userspace coalescing (GRO) of
//! such segments, checksum completion of a packet the TUN hands over with a
//! partial checksum (and the detection of such packets arriving from the
//! wire), and the checksum kernel underneath them all.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weft_benches::{LOCAL, PEER, SIZES, tcp_packet, udp_packet};
use weft_engine::encap::{Codec, VXLAN_HEADROOM, Vxlan};
use weft_engine::offload::{self, gro::Gro, gso};
use weft_engine::wire::checksum;

fn flannel_udp(c: &mut Criterion) {
    let mut g = c.benchmark_group("flannel_udp");
    for size in SIZES {
        let pkt = udp_packet(size);
        g.throughput(Throughput::Bytes(pkt.len() as u64));
        g.bench_with_input(BenchmarkId::new("encap", size), &pkt, |b, pkt| {
            let mut buf = pkt.clone();
            b.iter(|| {
                buf[8] = 64; // keep the TTL from running out
                let r = Codec::FlannelUdp.prepare_inner(black_box(&mut buf));
                black_box(r)
            });
        });
        g.bench_with_input(BenchmarkId::new("decap", size), &pkt, |b, pkt| {
            let mut buf = pkt.clone();
            b.iter(|| {
                buf[8] = 64;
                black_box(Codec::FlannelUdp.decap(black_box(&mut buf)))
            });
        });
    }
    g.finish();
}

fn vxlan(c: &mut Criterion) {
    let mut g = c.benchmark_group("vxlan");
    let tx = Codec::Vxlan(Vxlan {
        vni: 1,
        local_mac: LOCAL,
    });
    let rx = Codec::Vxlan(Vxlan {
        vni: 1,
        local_mac: PEER,
    });
    for size in SIZES {
        let pkt = udp_packet(size);
        let mut buf = vec![0; VXLAN_HEADROOM + pkt.len()];
        buf[VXLAN_HEADROOM..].copy_from_slice(&pkt);
        g.throughput(Throughput::Bytes(pkt.len() as u64));
        g.bench_function(BenchmarkId::new("encap", size), |b| {
            let mut buf = buf.clone();
            b.iter(|| {
                let (hdr, inner) = buf.split_at_mut(VXLAN_HEADROOM);
                let _ = tx.prepare_inner(black_box(inner));
                tx.write_header(black_box(hdr), PEER, 4);
            });
        });
        tx.write_header(&mut buf[..VXLAN_HEADROOM], PEER, 4);
        g.bench_function(BenchmarkId::new("decap", size), |b| {
            let mut buf = buf.clone();
            b.iter(|| black_box(rx.decap(black_box(&mut buf))));
        });
    }
    g.finish();
}

fn segmentation(c: &mut Criterion) {
    let mut g = c.benchmark_group("gso_tcp_segment_64k");
    let sp = tcp_packet(1, 65535 - 52);
    let mut out = vec![0; 1 << 20];
    for mss in SIZES {
        g.throughput(Throughput::Bytes(sp.len() as u64));
        g.bench_function(BenchmarkId::new("vxlan_headroom", mss), |b| {
            b.iter(|| {
                black_box(gso::tcp_segment(
                    black_box(&sp),
                    mss,
                    VXLAN_HEADROOM,
                    &mut out,
                ))
            })
        });
    }
    g.finish();
}

fn coalescing(c: &mut Criterion) {
    let mut g = c.benchmark_group("gro_coalesce");
    for mss in SIZES {
        // One recvmmsg worth of segments of one flow, 22-byte gaps as after VXLAN decap.
        let n = (65535 / (mss + 52)).clamp(2, 64);
        let mut arena = Vec::new();
        let mut pos = Vec::new();
        for i in 0..n {
            let p = tcp_packet(1 + (i * mss) as u32, mss);
            arena.extend_from_slice(&[0; 22]);
            pos.push((arena.len(), p.len()));
            arena.extend_from_slice(&p);
        }
        let bytes: usize = pos.iter().map(|p| p.1).sum();
        let mut gro = Gro::new(9100);
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(BenchmarkId::new("push_flush", mss), |b| {
            // flush() rewrites the head's headers, so every iteration gets a fresh copy.
            b.iter_batched_ref(
                || arena.clone(),
                |a| {
                    for &(s, l) in &pos {
                        let _ = gro.push(a, s, l);
                    }
                    let mut writes = 0;
                    gro.flush(a, |iov| writes += iov.len());
                    assert_eq!(writes, n + 1, "all segments coalesced into one write");
                    black_box(writes)
                },
                BatchSize::LargeInput,
            );
        });
    }
    g.finish();
}

fn checksum_offload(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum_offload");
    for size in SIZES {
        // A TCP packet of `size` bytes (the 64-byte one carries 12 payload bytes).
        let mut pkt = tcp_packet(1, size.saturating_sub(52).max(1));
        let (start, off) = offload::partial_checksum(&pkt).unwrap_or((20, 16));
        g.throughput(Throughput::Bytes(pkt.len() as u64));
        g.bench_function(BenchmarkId::new("complete", size), |b| {
            b.iter(|| black_box(gso::complete_checksum(black_box(&mut pkt), start, off)))
        });
        g.bench_function(BenchmarkId::new("detect_partial", size), |b| {
            b.iter(|| black_box(offload::partial_checksum(black_box(&pkt))))
        });
    }
    g.finish();
}

fn checksums(c: &mut Criterion) {
    let mut g = c.benchmark_group("checksum");
    for size in SIZES {
        let data = vec![0x33u8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(BenchmarkId::new("sum", size), |b| {
            b.iter(|| black_box(checksum::sum(black_box(&data))))
        });
    }
    g.finish();
}

criterion_group!(
    benches,
    flannel_udp,
    vxlan,
    segmentation,
    coalescing,
    checksum_offload,
    checksums
);
criterion_main!(benches);
