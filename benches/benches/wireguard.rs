//! Criterion benches of the WireGuard path's per-packet work (boringtun `Tunn`
//! with an established session, caller-owned buffers as the engine uses
//! them): encapsulation and decapsulation of 64, 1400 and 8950-byte packets,
//! and the engine's TX shape for one 64 KiB TCP super-packet: userspace GSO
//! into 1380-byte segments, then one `encapsulate` per segment into an arena.

use std::hint::black_box;

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weft_engine::offload::gso;

const SIZES: [usize; 3] = [64, 1400, 8950];

fn pair() -> (Tunn, Tunn) {
    let (a, b) = (StaticSecret::from([1u8; 32]), StaticSecret::from([2u8; 32]));
    let (pa, pb) = (PublicKey::from(&a), PublicKey::from(&b));
    let mut ta = Tunn::new(a, pb, None, None, 1, None);
    let mut tb = Tunn::new(b, pa, None, None, 2, None);
    let (mut x, mut y) = (vec![0u8; 2048], vec![0u8; 2048]);
    let init = match ta.format_handshake_initiation(&mut x, false) {
        TunnResult::WriteToNetwork(p) => p.to_vec(),
        r => panic!("{r:?}"),
    };
    let resp = match tb.decapsulate(None, &init, &mut y) {
        TunnResult::WriteToNetwork(p) => p.to_vec(),
        r => panic!("{r:?}"),
    };
    let ka = match ta.decapsulate(None, &resp, &mut x) {
        TunnResult::WriteToNetwork(p) => p.to_vec(),
        r => panic!("{r:?}"),
    };
    let _ = tb.decapsulate(None, &ka, &mut y);
    (ta, tb)
}

fn packet(size: usize) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([10, 244, 1, 2], [10, 244, 2, 3], 64)
        .udp(1000, 2000)
        .write(&mut v, &vec![0xab; size.saturating_sub(28)])
        .expect("build");
    v
}

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
        let (mut ta, mut tb) = pair();
        let pkt = packet(size);
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
    let (mut ta, _) = pair();
    let sp = super_packet();
    let mut seg = vec![0u8; 2 * 65536];
    let mut arena = vec![0u8; 1 << 20];
    g.throughput(Throughput::Bytes(sp.len() as u64));
    g.bench_function("gso+encap 64KiB", |bch| {
        bch.iter(|| {
            let s = gso::tcp_segment(black_box(&sp), 1380, 0, &mut seg).expect("segment");
            let mut pos = 0;
            for i in 0..s.count {
                let len = if i + 1 == s.count {
                    s.last_len
                } else {
                    s.stride
                };
                let src = &seg[i * s.stride..i * s.stride + len];
                if let TunnResult::WriteToNetwork(o) =
                    ta.encapsulate(src, &mut arena[pos..pos + len + 32])
                {
                    pos += o.len();
                }
            }
            pos
        })
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
