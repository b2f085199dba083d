//! Criterion benches of the userspace IPIP path's per-packet work
//! (`weft_engine::ipip`), `Throughput::Bytes` over 64, 1400 and 8950-byte
//! inner packets: the outer header parameters (encap side: the kernel
//! writes the header), decap of a received packet (outer header stripped,
//! checks, ECN), the steering hash the workers' BPF filters compute, and the
//! two batch paths as the workers run them (`weft_engine::path`): a 64 KiB
//! TCP super-packet read routed and segmented for the raw socket
//! (`tx::ipip_plan` + `tx::write`: headroom 0, raw IP has no GSO), and one
//! `recvmmsg` worth of IPIP segments through the receive step (`rx::ipip`,
//! strict anti-spoofing) and coalesced (GRO).

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weft_benches::{SIZES, ipip_packet, peer_tables, tcp_packet, tcp_super_read, udp_packet};
use weft_engine::AntiSpoofing;
use weft_engine::ipip;
use weft_engine::offload::gro::Gro;
use weft_engine::path::{rx, tx};

fn encap_decap(c: &mut Criterion) {
    let mut g = c.benchmark_group("ipip");
    for size in SIZES {
        let inner = udp_packet(size);
        let pkt = ipip_packet(&inner);
        g.throughput(Throughput::Bytes(inner.len() as u64));
        g.bench_with_input(
            BenchmarkId::new("outer_params", size),
            &inner,
            |b, inner| b.iter(|| black_box(ipip::outer_params(black_box(inner)))),
        );
        g.bench_with_input(BenchmarkId::new("decap", size), &pkt, |b, pkt| {
            let mut buf = pkt.clone();
            b.iter(|| {
                let src = ipip::outer_source(black_box(&buf));
                black_box((src, ipip::decap(black_box(&mut buf))))
            })
        });
        g.bench_with_input(BenchmarkId::new("steering_hash", size), &pkt, |b, pkt| {
            b.iter(|| black_box(ipip::steering_hash(black_box(pkt), 4)))
        });
    }
    g.finish();
}

fn tx_super_packet(c: &mut Criterion) {
    let mut g = c.benchmark_group("ipip_tx_gso_64k");
    let (peers, _) = peer_tables();
    let mut out = vec![0; 1 << 20];
    for mss in SIZES {
        let mut read = tcp_super_read(mss);
        g.throughput(Throughput::Bytes(read.len() as u64));
        g.bench_function(BenchmarkId::new("plan_and_segment", mss), |b| {
            b.iter(|| {
                let plan =
                    tx::ipip_plan(&peers, black_box(&mut read), true, out.len()).expect("plan");
                black_box((plan.outer, tx::write(&plan, &read, &mut out)))
            })
        });
    }
    g.finish();
}

fn rx_batch(c: &mut Criterion) {
    let mut g = c.benchmark_group("ipip_rx_decap_gro");
    for mss in SIZES {
        let n = (65535 / (mss + 72)).clamp(2, 32);
        let mut arena = Vec::new();
        let mut pos = Vec::new();
        for i in 0..n {
            let p = ipip_packet(&tcp_packet(1 + (i * mss) as u32, mss));
            pos.push((arena.len(), p.len()));
            arena.extend_from_slice(&p);
        }
        let bytes: usize = pos.iter().map(|p| p.1 - ipip::OVERHEAD).sum();
        let mut gro = Gro::new(9100);
        let (_, peers) = peer_tables();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(BenchmarkId::new("decap_push_flush", mss), |b| {
            b.iter_batched_ref(
                || arena.clone(),
                |a| {
                    for &(s, l) in &pos {
                        let (_, d) = rx::ipip(AntiSpoofing::Strict, &peers, &mut a[s..s + l])
                            .expect("decap");
                        let _ = gro.push(a, s + d.inner.start, d.inner.len());
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

criterion_group!(benches, encap_decap, tx_super_packet, rx_batch);
criterion_main!(benches);
