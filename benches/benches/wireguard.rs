//! Criterion benches of the WireGuard path through the engine's own core
//! (`weft_engine::path::wg`, on the in-memory pair `path::wg::sim::Pair`
//! with an established session): what the workers run per packet.
//!
//! - `encap/<size>`: one TUN read of a UDP packet of 64, 1400 or 8950 bytes
//!   through `Core::tun_tx` (route, encrypt into the caller's buffer).
//! - `decap/<size>`: one datagram through `Core::datagram` (decrypt into
//!   the plaintext room, AllowedIPs, roaming); each is sealed outside the
//!   timing (the replay window refuses repeats).
//! - `tun_tx gso 64KiB`: a 64 KiB TCP super-packet cut into 1368-byte
//!   segments in place and encrypted (MTU 1420).
//! - `rx 64KiB`: its datagrams as one `UDP_GRO` train through
//!   `Core::train`, each TCP checksum marked trusted as for a TUN with
//!   virtio-net headers.

use std::cell::RefCell;
use std::hint::black_box;

use criterion::{BatchSize, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use weft_benches::{SIZES, tcp_super_read, udp_packet};
use weft_engine::AntiSpoofing;
use weft_engine::path::wg::Now;
use weft_engine::path::wg::sim::{Outcome, Pair};

/// TCP payload per segment at the flannel-wg MTU of 1420 (IPv4, timestamps).
const MSS: usize = 1368;

/// Node 1's datagram for the TUN read `read` (one packet), as an owned buffer.
fn sealed(p: &mut Pair, read: &[u8]) -> Vec<u8> {
    let mut r = read.to_vec();
    p.nodes[0].io.clear();
    p.send(0, &mut r, false).expect("sent");
    p.nodes[0].io.datagram(0).to_vec()
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
                p.nodes[0].io.clear();
                p.send(0, black_box(&mut read), false).expect("sent");
            })
        });
        let p = RefCell::new(p);
        g.bench_with_input(BenchmarkId::new("decap", size), &pkt, |bch, pkt| {
            bch.iter_batched_ref(
                || sealed(&mut p.borrow_mut(), pkt),
                |d| {
                    let mut p = p.borrow_mut();
                    let src = p.nodes[0].addr;
                    let r = p.receive(1, black_box(d), src, AntiSpoofing::Strict);
                    assert!(matches!(r, Outcome::Deliver(_)), "{r:?}");
                },
                BatchSize::SmallInput,
            )
        });
    }
    let p = RefCell::new(Pair::connect(Now::read()));
    let sp = tcp_super_read(MSS);
    let mut read = sp.clone();
    g.throughput(Throughput::Bytes((sp.len() - 10) as u64));
    g.bench_function("tun_tx gso 64KiB", |bch| {
        bch.iter(|| {
            let mut p = p.borrow_mut();
            read.copy_from_slice(&sp);
            p.nodes[0].io.clear();
            p.send(0, black_box(&mut read), true).expect("sent");
        })
    });
    g.bench_function("rx 64KiB", |bch| {
        bch.iter_batched(
            || {
                let mut p = p.borrow_mut();
                p.nodes[0].io.clear();
                p.nodes[1].io.clear();
                read.copy_from_slice(&sp);
                p.send(0, &mut read, true).expect("sent");
            },
            |()| p.borrow_mut().receive_train(0, true),
            BatchSize::PerIteration,
        )
    });
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
