//! Criterion benches of the WireGuard path's per-packet work (boringtun `Tunn`
//! with an established session, caller-owned buffers as the engine uses
//! them): encapsulation and decapsulation of 64, 1400 and 8950-byte packets,
//! and the engine's shapes for one 64 KiB TCP super-packet cut into 1368-byte
//! segments (MTU 1420). TX: `gso copy+encap` cuts into a scratch buffer, then
//! `encapsulate`s each segment into an arena (the engine before in-place
//! segmentation); `gso in place+encap` is what the engine does now. RX:
//! `decap+verify` decrypts the segments and verifies each inner TCP checksum
//! (what GRO did), `decap+trust` marks them partial instead (the engine now).

use std::hint::black_box;

use boringtun::noise::TunnResult;
use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weft_benches::{SIZES, udp_packet, wg_pair};
use weft_engine::offload::gso;
use weft_engine::wg::seg::{segment_in_place, trust_tcp_checksum};
use weft_engine::wire::checksum;

/// TCP payload per segment at the flannel-wg MTU of 1420 (IPv4, timestamps).
const MSS: usize = 1368;

fn super_packet() -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([10, 244, 1, 2], [10, 244, 2, 3], 64)
        .tcp(40000, 5201, 1, 500)
        .ack(1)
        .write(&mut v, &vec![0x5a; 65000])
        .expect("build");
    v
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("wireguard");
    for size in SIZES {
        let (mut ta, mut tb) = wg_pair();
        let pkt = udp_packet(size);
        let mut out = vec![0u8; size + 64];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("encap", size), &pkt, |bch, p| {
            bch.iter(|| match ta.encapsulate(black_box(p), &mut out) {
                TunnResult::WriteToNetwork(o) => o.len(),
                _ => 0,
            })
        });
        // Decap needs fresh counters: pre-encrypt a window's worth and cycle
        // through new batches (the replay window rejects repeats).
        let mut plain = vec![0u8; size + 64];
        g.bench_with_input(BenchmarkId::new("decap", size), &pkt, |bch, p| {
            let mut wire: Vec<Vec<u8>> = Vec::new();
            let mut i = 0;
            bch.iter(|| {
                if i == wire.len() {
                    wire = (0..1024)
                        .map(|_| match ta.encapsulate(p, &mut out) {
                            TunnResult::WriteToNetwork(o) => o.to_vec(),
                            r => panic!("{r:?}"),
                        })
                        .collect();
                    i = 0;
                }
                i += 1;
                match tb.decapsulate(None, black_box(&wire[i - 1]), &mut plain) {
                    TunnResult::WriteToTunnelV4(o, _) => o.len(),
                    _ => 0,
                }
            })
        });
    }
    let (mut ta, mut tb) = wg_pair();
    let sp = super_packet();
    let mut seg = vec![0u8; 2 * 65536];
    let mut arena = vec![0u8; 1 << 20];
    g.throughput(Throughput::Bytes(sp.len() as u64));
    g.bench_function("gso copy+encap 64KiB", |bch| {
        bch.iter(|| {
            let s = gso::tcp_segment(black_box(&sp), MSS, 0, &mut seg).expect("segment");
            let mut pos = 0;
            for i in 0..s.count {
                let src = &seg[s.range(i)];
                let len = src.len();
                if let TunnResult::WriteToNetwork(o) =
                    ta.encapsulate(src, &mut arena[pos..pos + len + 32])
                {
                    pos += o.len();
                }
            }
            pos
        })
    });
    let mut work = sp.clone();
    g.bench_function("gso in place+encap 64KiB", |bch| {
        bch.iter(|| {
            work.copy_from_slice(&sp);
            let mut pos = 0;
            let _ = segment_in_place(black_box(&mut work), MSS, |src| {
                if let TunnResult::WriteToNetwork(o) =
                    ta.encapsulate(src, &mut arena[pos..pos + src.len() + 32])
                {
                    pos += o.len();
                }
            });
            pos
        })
    });
    // One super-packet's worth of datagrams, re-encrypted per batch (replay window).
    let mut seal = || {
        let mut wire = Vec::new();
        let n = gso::tcp_segment(&sp, MSS, 0, &mut seg).expect("segment");
        for i in 0..n.count {
            let src = &seg[n.range(i)];
            let mut out = vec![0u8; src.len() + 32];
            if let TunnResult::WriteToNetwork(o) = ta.encapsulate(src, &mut out) {
                wire.push(o.to_vec());
            }
        }
        wire
    };
    let mut plain = vec![0u8; 2048];
    for trust in [false, true] {
        let name = if trust {
            "decap+trust 64KiB"
        } else {
            "decap+verify 64KiB"
        };
        g.bench_function(name, |bch| {
            bch.iter_batched_ref(
                &mut seal,
                |wire| {
                    let mut ok = 0usize;
                    for d in wire.iter() {
                        if let TunnResult::WriteToTunnelV4(p, _) =
                            tb.decapsulate(None, d, &mut plain)
                        {
                            if trust {
                                trust_tcp_checksum(p);
                                ok += usize::from(p[36]);
                            } else {
                                let len = u32::try_from(p.len() - 20).unwrap_or(0);
                                let ps = checksum::pseudo_v4(&p[12..16], &p[16..20], 6, len);
                                let s = checksum::combine(ps, checksum::sum(&p[20..]));
                                ok += usize::from(s == 0xffff);
                            }
                        }
                    }
                    ok
                },
                BatchSize::PerIteration,
            )
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
