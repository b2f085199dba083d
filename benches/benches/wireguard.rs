//! Criterion benches of the WireGuard path through the engine's own core
//! (`weft_engine::path::wg`, on the in-memory pair `path::wg::sim::Pair`
//! with an established session): what the workers run per packet.
//!
//! - `encap/<size>`: one TUN read of a UDP packet of 64, 1400 or 8950 bytes
//!   through `Core::tun_tx` (route, encrypt into the caller's buffer).
//! - `decap/<size>`: one datagram through `Core::datagram` (decrypt into
//!   the plaintext arena, AllowedIPs, roaming); the datagrams are sealed
//!   ahead in batches (the replay window refuses repeats).
//! - `tun_tx gso 64KiB`: a 64 KiB TCP super-packet cut into 1368-byte
//!   segments in place and encrypted (MTU 1420).
//! - `rx 64KiB`: its datagrams decrypted, with `trust_tcp_checksum` as the
//!   worker does before GRO.

use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weft_benches::{SIZES, tcp_super_read, udp_packet};
use weft_engine::AntiSpoofing;
use weft_engine::path::wg::seg::trust_tcp_checksum;
use weft_engine::path::wg::sim::Pair;
use weft_engine::path::wg::{Now, Rx};

/// TCP payload per segment at the flannel-wg MTU of 1420 (IPv4, timestamps).
const MSS: usize = 1368;

/// Node 1's datagrams of one `send`, as owned buffers.
fn sealed(p: &mut Pair, read: &[u8], vnet_hdr: bool) -> Vec<Vec<u8>> {
    let mut r = read.to_vec();
    p.nodes[0].out.clear();
    p.send(0, &mut r, vnet_hdr).expect("sent");
    let n = p.nodes[0].out.sent.len();
    let out = (0..n)
        .map(|i| p.nodes[0].out.datagram(i).to_vec())
        .collect();
    p.nodes[0].out.clear();
    out
}

/// Node 2 receives `d`; the delivered length.
fn receive(p: &mut Pair, d: &[u8], trust: bool) -> usize {
    let src = p.nodes[0].addr;
    let now = p.now;
    let n = &mut p.nodes[1];
    let t = std::sync::Arc::clone(&n.table);
    let r = n.core.datagram(
        &t,
        AntiSpoofing::Strict,
        d,
        src,
        None,
        &mut n.plain,
        now,
        &mut n.out,
    );
    match r {
        Rx::Deliver { len, .. } => {
            if trust {
                trust_tcp_checksum(&mut n.plain[..len]);
            }
            len
        }
        r => panic!("{r:?}"),
    }
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("wireguard");
    for size in SIZES {
        let mut p = Pair::connect(Now::read());
        let pkt = udp_packet(size);
        let mut read = pkt.clone();
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_with_input(BenchmarkId::new("encap", size), &pkt, |bch, pkt| {
            bch.iter(|| {
                read.copy_from_slice(pkt);
                p.nodes[0].out.clear();
                p.send(0, black_box(&mut read), false).expect("sent");
            })
        });
        g.bench_with_input(BenchmarkId::new("decap", size), &pkt, |bch, pkt| {
            let mut wire: Vec<Vec<u8>> = Vec::new();
            let mut i = 0;
            bch.iter(|| {
                if i == wire.len() {
                    wire = (0..1024).flat_map(|_| sealed(&mut p, pkt, false)).collect();
                    i = 0;
                }
                i += 1;
                receive(&mut p, black_box(&wire[i - 1]), false)
            })
        });
    }
    let mut p = Pair::connect(Now::read());
    let sp = tcp_super_read(MSS);
    let mut read = sp.clone();
    g.throughput(Throughput::Bytes((sp.len() - 10) as u64));
    g.bench_function("tun_tx gso 64KiB", |bch| {
        bch.iter(|| {
            read.copy_from_slice(&sp);
            p.nodes[0].out.clear();
            p.send(0, black_box(&mut read), true).expect("sent");
        })
    });
    let p = std::cell::RefCell::new(p);
    g.bench_function("rx 64KiB", |bch| {
        bch.iter_batched_ref(
            || sealed(&mut p.borrow_mut(), &sp, true),
            |wire| {
                let mut p = p.borrow_mut();
                wire.iter().map(|d| receive(&mut p, d, true)).sum::<usize>()
            },
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
