//! Criterion benches of the engine's per-packet work, one group per path, with
//! `Throughput::Bytes` over 64, 1400 and 8950-byte packets:
//! flannel-UDP and VXLAN encap/decap, userspace segmentation (GSO) of a 64 KiB
//! TCP super-packet into segments of that size, userspace coalescing (GRO) of
//! such segments, checksum completion of a packet the TUN hands over with a
//! partial checksum (and the detection of such packets arriving from the
//! wire), and the checksum kernel underneath them all. The `path_*` groups
//! time the workers' own per-packet steps (`weft_engine::path`): a 64 KiB
//! TUN super-packet (TCP for GSO, UDP for USO) routed, cut and headed into
//! the arena, and the train it becomes decapsulated, checked and coalesced.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weft_benches::{
    LOCAL, PEER, SIZES, peer_tables, tcp_packet, tcp_super_read, udp_packet, udp_super_read,
};
use weft_engine::AntiSpoofing;
use weft_engine::encap::{Codec, VXLAN_HEADROOM, Vxlan};
use weft_engine::offload::{self, gro::Gro, gso};
use weft_engine::path::{gather, rx, tx};
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

fn vxlan_codecs() -> (Codec, Codec) {
    let v = |local_mac| Codec::Vxlan(Vxlan { vni: 1, local_mac });
    (v(LOCAL), v(PEER))
}

/// The transmit step of a 64 KiB super-packet read: `udp_plan` + `udp_write`
/// (copied into the arena), and for TCP `udp_plan` + `udp_gather` (not copied).
fn path_tx(c: &mut Criterion) {
    let mut g = c.benchmark_group("path_tx_64k");
    let (peers, _) = peer_tables();
    let (vxlan, _) = vxlan_codecs();
    let mut arena = vec![0; 1 << 20];
    for size in SIZES {
        let cases = [
            ("vxlan_tcp", vxlan, tcp_super_read(size)),
            ("flannel_tcp", Codec::FlannelUdp, tcp_super_read(size)),
            ("vxlan_udp", vxlan, udp_super_read(size)),
        ];
        for (name, codec, read) in cases {
            g.throughput(Throughput::Bytes(read.len() as u64));
            g.bench_function(BenchmarkId::new(name, size), |b| {
                let mut read = read.clone();
                b.iter(|| {
                    read[10 + 8] = 64; // keep flannel-UDP's TTL from running out
                    let plan =
                        tx::udp_plan(&codec, &peers, black_box(&mut read), true, arena.len())
                            .expect("plan");
                    black_box(tx::udp_write(&codec, &plan, &read, &mut arena).expect("write"))
                })
            });
        }
        // The same TCP read, gathered: header blocks written, the payload
        // summed where it lies (what the worker sends since issue 32).
        let read = tcp_super_read(size);
        g.throughput(Throughput::Bytes(read.len() as u64));
        g.bench_function(BenchmarkId::new("vxlan_tcp_gathered", size), |b| {
            let mut read = read.clone();
            b.iter(|| {
                let plan = tx::udp_plan(&vxlan, &peers, black_box(&mut read), true, arena.len())
                    .expect("plan");
                black_box(gather::udp_gather(&vxlan, &plan, &read, &mut arena).expect("gather"))
            })
        });
    }
    g.finish();
}

/// The receive step of the train a 64 KiB super-packet became: `rx::udp`
/// (strict anti-spoofing) per segment, GRO push, one flush.
fn path_rx(c: &mut Criterion) {
    let mut g = c.benchmark_group("path_rx_train");
    let (peers1, peers2) = peer_tables();
    let (tx_codec, rx_codec) = vxlan_codecs();
    let from = peers2.endpoint_entries([192, 0, 2, 1].into());
    for mss in SIZES {
        let mut read = tcp_super_read(mss);
        let plan = tx::udp_plan(&tx_codec, &peers1, &mut read, true, 1 << 20).expect("plan");
        let mut train = vec![0; plan.need];
        let out = tx::udp_write(&tx_codec, &plan, &read, &mut train).expect("write");
        train.truncate(out.segs.total_len());
        let mut gro = Gro::new(9100);
        g.throughput(Throughput::Bytes(out.inner_bytes() as u64));
        g.bench_function(BenchmarkId::new("vxlan_strict", mss), |b| {
            b.iter_batched_ref(
                || train.clone(),
                |a| {
                    for seg in rx::train(a.len(), out.segs.stride) {
                        let off = seg.start;
                        let d =
                            rx::udp(&rx_codec, AntiSpoofing::Strict, &peers2, from, &mut a[seg])
                                .expect("decap");
                        let _ = gro.push(a, off + d.inner.start, d.inner.len());
                    }
                    let mut writes = 0;
                    gro.flush(a, |_| writes += 1);
                    black_box(writes)
                },
                BatchSize::LargeInput,
            );
        });
        // The same train from an IPv6 underlay: the outer UDP checksum was
        // the kernel's to check, so the inner one is trusted, not summed.
        let v6: std::net::IpAddr = "2001:db8::1".parse().expect("v6");
        g.bench_function(BenchmarkId::new("vxlan_strict_v6_outer", mss), |b| {
            b.iter_batched_ref(
                || train.clone(),
                |a| {
                    for seg in rx::train(a.len(), out.segs.stride) {
                        let off = seg.start;
                        let d = rx::udp_from(
                            &rx_codec,
                            AntiSpoofing::Strict,
                            &peers2,
                            (v6, from),
                            &mut a[seg],
                        )
                        .expect("decap");
                        let _ = gro.push(a, off + d.inner.start, d.inner.len());
                    }
                    let mut writes = 0;
                    gro.flush(a, |_| writes += 1);
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
    path_tx,
    path_rx,
    checksum_offload,
    checksums
);
criterion_main!(benches);
