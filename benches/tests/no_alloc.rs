//! The per-packet path allocates nothing: a counting global allocator around
//! every encapsulation, decapsulation, segmentation and coalescing call the
//! engine's workers make per packet (flannel-UDP, VXLAN, IPIP, WireGuard's
//! `Tunn`, userspace GSO/GRO and checksum completion, the gathered transmit
//! step, the tunnel TAP's header block, and the packet path's steps that
//! call them, `weft_engine::path`),
//! in the steady state
//! (after one warm-up call, with the caller-owned buffers the workers keep).
//!
//! Counting is per thread (a thread-local switch and a thread-local count),
//! so tests running on the harness's other threads cannot disturb it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use weft_benches::{
    LOCAL, PEER, SIZES, ipip_packet, peer_tables, tcp_packet, tcp_super_read, udp_packet,
    udp_super_read,
};
use weft_engine::AntiSpoofing;
use weft_engine::encap::{Codec, VXLAN_HEADROOM, Vxlan};
use weft_engine::offload::{self, gro::Gro, gso};
use weft_engine::path::{gather, rx, tap, tx};
use weft_engine::wire::vnet;

struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

fn note() {
    if COUNTING.with(Cell::get) {
        ALLOCS.with(|a| a.set(a.get() + 1));
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments
// unchanged, so `System`'s guarantees are ours; counting touches only an
// const-initialised thread-locals (which do not allocate).
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: same contract as our caller's (non-zero-sized `layout`).
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note();
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` was allocated by `System` (through us) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Allocations made on this thread while `f` runs `n` times (after one warm-up run).
fn allocations(n: usize, mut f: impl FnMut()) -> usize {
    f();
    let before = ALLOCS.with(Cell::get);
    COUNTING.with(|c| c.set(true));
    for _ in 0..n {
        f();
    }
    COUNTING.with(|c| c.set(false));
    ALLOCS.with(Cell::get) - before
}

#[test]
fn flannel_udp_encap_decap_allocate_nothing() {
    for size in SIZES {
        let mut buf = udp_packet(size);
        let n = allocations(100, || {
            buf[8] = 64;
            assert!(Codec::FlannelUdp.prepare_inner(&mut buf).is_ok());
            assert!(Codec::FlannelUdp.decap(&mut buf).is_ok());
        });
        assert_eq!(n, 0, "flannel-udp, {size}-byte packets");
    }
}

#[test]
fn vxlan_encap_decap_allocate_nothing() {
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
        let n = allocations(100, || {
            let (hdr, inner) = buf.split_at_mut(VXLAN_HEADROOM);
            inner[8] = 64;
            assert!(tx.prepare_inner(inner).is_ok());
            tx.write_header(hdr, PEER, 4);
            assert!(rx.decap(&mut buf).is_ok());
        });
        assert_eq!(n, 0, "vxlan, {size}-byte packets");
    }
}

#[test]
fn ipip_encap_decap_allocate_nothing() {
    for size in SIZES {
        let mut buf = ipip_packet(&udp_packet(size));
        let n = allocations(100, || {
            assert!(weft_engine::ipip::outer_params(&buf[20..]).is_some());
            assert!(weft_engine::ipip::decap(&mut buf).is_ok());
        });
        assert_eq!(n, 0, "ipip, {size}-byte packets");
    }
}

#[test]
fn gso_segmentation_and_checksum_completion_allocate_nothing() {
    let sp = tcp_packet(1, 65535 - 52);
    let mut out = vec![0; 1 << 20];
    for mss in SIZES {
        let n = allocations(20, || {
            let segs = gso::tcp_segment(&sp, mss, VXLAN_HEADROOM, &mut out).expect("segment");
            assert!(segs.count >= 1);
        });
        assert_eq!(n, 0, "tcp_segment, gso_size {mss}");
    }
    for size in SIZES {
        let mut pkt = tcp_packet(1, size.saturating_sub(52).max(1));
        let n = allocations(100, || {
            let (start, off) = offload::partial_checksum(&pkt).unwrap_or((20, 16));
            assert!(gso::complete_checksum(&mut pkt, start, off).is_ok());
        });
        assert_eq!(n, 0, "checksum completion, {size}-byte packets");
    }
}

#[test]
fn gro_coalescing_allocates_nothing() {
    for mss in SIZES {
        let count = (65535 / (mss + 52)).clamp(2, 64);
        let (mut arena, mut pos) = (Vec::new(), Vec::new());
        for i in 0..count {
            let p = tcp_packet(1 + u32::try_from(i * mss).expect("seq"), mss);
            arena.extend_from_slice(&[0; 22]);
            pos.push((arena.len(), p.len()));
            arena.extend_from_slice(&p);
        }
        let pristine = arena.clone();
        let mut gro = Gro::new(9100);
        let mut writes = 0;
        let n = allocations(20, || {
            arena.copy_from_slice(&pristine);
            for &(s, l) in &pos {
                let _ = gro.push(&arena, s, l);
            }
            gro.flush(&mut arena, |iov| writes += iov.len());
        });
        assert_eq!(n, 0, "gro push+flush, gso_size {mss}");
        assert!(writes > 0, "gro wrote something");
    }
}

/// The WireGuard core's steps as the worker takes them
/// (`path::wg::Core`, an established session): a TUN read encrypted into
/// the caller's buffer, the datagrams received as one train (decrypted,
/// checked and delivered), a TCP super-packet cut in place and sealed;
/// and the timer tick of a quiet session.
#[test]
fn wireguard_core_steps_allocate_nothing() {
    use weft_engine::path::wg::sim::Pair;
    use weft_engine::path::wg::{Now, TIMER_TICK};
    let mut p = Pair::connect(Now::read());
    let n = allocations(100, || {
        p.advance(TIMER_TICK);
        p.tick();
    });
    assert_eq!(n, 0, "wireguard, timer ticks");
    let step = |p: &mut Pair, read: &mut [u8], vnet_hdr: bool| {
        p.nodes[0].io.clear();
        p.nodes[1].io.clear();
        p.send(0, read, vnet_hdr).expect("sent");
        p.receive_train(0, vnet_hdr);
        let [a, b] = &p.nodes;
        assert_eq!(b.io.delivered.len(), a.io.sent.len(), "{:?}", b.io.dropped);
    };
    for size in SIZES {
        let pkt = udp_packet(size);
        let mut read = pkt.clone();
        let n = allocations(100, || {
            read.copy_from_slice(&pkt);
            step(&mut p, &mut read, false);
        });
        assert_eq!(n, 0, "wireguard, {size}-byte packets");
    }
    let sp = tcp_super_read(1368);
    let mut read = sp.clone();
    let n = allocations(10, || {
        read.copy_from_slice(&sp);
        step(&mut p, &mut read, true);
    });
    assert_eq!(n, 0, "wireguard, a 64 KiB super-packet");
}

/// The workers' own per-packet steps (`weft_engine::path`): route, cut and
/// head a TCP (GSO) or UDP (USO) super-packet into the arena, then receive,
/// check and coalesce the train it became; IPIP's transmit and receive steps.
#[test]
fn packet_path_steps_allocate_nothing() {
    let (peers1, peers2) = peer_tables();
    let v = |local_mac| Codec::Vxlan(Vxlan { vni: 1, local_mac });
    let (tx_codec, rx_codec) = (v(LOCAL), v(PEER));
    let from = peers2.endpoint_entries([192, 0, 2, 1].into());
    let mut arena = vec![0u8; 1 << 20];
    let mut hdrs = vec![0u8; 64 << 10];
    let mut gro = Gro::new(9100);
    for size in [1400, 8950] {
        for mut read in [tcp_super_read(size), udp_super_read(size)] {
            let n = allocations(10, || {
                let plan =
                    tx::udp_plan(&tx_codec, &peers1, &mut read, true, arena.len()).expect("plan");
                let g = gather::udp_gather(&tx_codec, &plan, &read, &mut hdrs).expect("gather");
                assert_eq!(g.is_some(), matches!(plan.shape, tx::Shape::Tcp(_)));
                let out = tx::udp_write(&tx_codec, &plan, &read, &mut arena).expect("write");
                let train = &mut arena[..out.segs.total_len()];
                for seg in rx::train(train.len(), out.segs.stride) {
                    let off = seg.start;
                    let d = rx::udp(
                        &rx_codec,
                        AntiSpoofing::Strict,
                        &peers2,
                        from,
                        &mut train[seg],
                    )
                    .expect("decap");
                    let _ = gro.push(train, off + d.inner.start, d.inner.len());
                }
                gro.flush(train, |_| {});
            });
            assert_eq!(n, 0, "vxlan path, {size}-byte segments");
        }
        // The tunnel TAP's header block, VXLAN and flannel-UDP.
        let side = tap::TapSide {
            tap_mac: [2, 0, 0, 0, 0, 0xaa],
            local: [192, 0, 2, 1].into(),
        };
        let mut block = [0u8; tap::BLOCK_LEN];
        for codec in [tx_codec, Codec::FlannelUdp] {
            // 30 KB with a partial checksum, as a pod's stack hands it over.
            let hdr = vnet::VnetHdr {
                flags: vnet::F_NEEDS_CSUM,
                gso_type: vnet::GSO_TCPV4,
                gso_size: u16::try_from(size).expect("mss"),
                csum_start: 20,
                csum_offset: 16,
                ..vnet::VnetHdr::default()
            };
            let mut read = hdr.to_bytes().to_vec();
            read.extend_from_slice(&tcp_packet(1, 30_000));
            let n = allocations(10, || {
                let plan =
                    tx::udp_plan(&codec, &peers1, &mut read, true, arena.len()).expect("plan");
                let ip = &read[plan.pkt.start..];
                let n = tap::tunnel_header(&codec, &plan, ip, side, (1, 1), &mut block);
                assert!(n.is_some(), "the TAP takes the super-packet");
            });
            assert_eq!(n, 0, "tunnel TAP header, {size}-byte segments");
        }
        let mut read = tcp_super_read(size);
        let inner = tcp_packet(1, size);
        let mut pkt = ipip_packet(&inner);
        let n = allocations(10, || {
            let plan = tx::ipip_plan(&peers1, &mut read, true, arena.len()).expect("plan");
            tx::write(&plan, &read, &mut arena).expect("write");
            rx::ipip(AntiSpoofing::Strict, &peers2, &mut pkt).expect("ipip rx");
        });
        assert_eq!(n, 0, "ipip path, {size}-byte segments");
    }
}

#[test]
fn the_counter_sees_allocations() {
    let n = allocations(3, || {
        std::hint::black_box(Vec::<u8>::with_capacity(std::hint::black_box(100)));
    });
    assert_eq!(n, 3, "one allocation per run is counted");
}
