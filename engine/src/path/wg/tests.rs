use std::net::SocketAddr;
use std::time::Duration;

use super::sim::{Pair, Wire};
use super::*;
use crate::test_util::{payload, tcp4, udp4};
use crate::wire::vnet::{self, VnetHdr};

const A: [u8; 4] = [10, 244, 1, 2];
const B: [u8; 4] = [10, 244, 2, 3];

fn now() -> Now {
    Now::read()
}

#[test]
fn two_cores_shake_hands_and_carry_packets_both_ways() {
    let mut p = Pair::connect(now());
    let mut pkt = udp4(A, B, 64, &payload(1000, 1));
    let want = pkt.clone();
    p.send(0, &mut pkt, false).expect("sent");
    assert_eq!(p.nodes[0].out.sent.len(), 1);
    assert_eq!(p.nodes[0].out.sent[0].0.port(), 51820);
    let got = p.deliver(0, AntiSpoofing::Strict);
    assert_eq!(got.delivered, vec![want]);
    let mut back = udp4(B, A, 64, &payload(10, 2));
    p.send(1, &mut back, false).expect("sent");
    assert_eq!(p.deliver(1, AntiSpoofing::Strict).delivered.len(), 1);
}

#[test]
fn a_super_packet_is_cut_and_sealed_into_one_equal_size_run() {
    let mut p = Pair::connect(now());
    let data = payload(20000, 3);
    let pkt = tcp4(A, B, 1, &data, false);
    let hdr = VnetHdr {
        gso_type: vnet::GSO_TCPV4,
        gso_size: 1368,
        ..VnetHdr::default()
    };
    let mut read = hdr.to_bytes().to_vec();
    read.extend_from_slice(&pkt);
    p.send(0, &mut read, true).expect("sent");
    let sent = &p.nodes[0].out.sent;
    assert_eq!(sent.len(), 20000usize.div_ceil(1368));
    let stride = sent[0].1.len();
    assert!(sent[..sent.len() - 1].iter().all(|s| s.1.len() == stride));
    assert!(sent.windows(2).all(|w| w[0].1.end == w[1].1.start));
    let got = p.deliver(0, AntiSpoofing::Strict);
    let mut stream = Vec::new();
    for g in &got.delivered {
        stream.extend_from_slice(&crate::test_util::check_tcp(g).2);
    }
    assert_eq!(stream, data);
}

#[test]
fn packets_wait_for_the_handshake_and_follow_it() {
    let mut p = Pair::new(now());
    for n in &mut p.nodes {
        let t = Arc::clone(&n.table);
        n.core.follow(&t, p.now, &mut n.out);
    }
    assert_eq!(p.nodes[0].out.datagram(0)[0], 1, "a greeting initiation");
    // Node 1 sends before the handshake completes: boringtun queues it.
    let mut pkt = udp4(A, B, 64, &payload(100, 4));
    let want = pkt.clone();
    p.send(0, &mut pkt, false).expect("queued");
    assert_eq!(p.nodes[0].out.sent.len(), 1, "nothing but the initiation");
    let got = p.settle();
    assert_eq!(got[1].delivered, vec![want], "the queued packet arrived");
}

#[test]
fn the_endpoint_follows_authenticated_packets_only() {
    let mut p = Pair::connect(now());
    let id = p.peer_id(1);
    let roamed: SocketAddr = "198.51.100.7:40000".parse().expect("addr");
    let mut pkt = udp4(A, B, 64, &[1; 20]);
    p.send(0, &mut pkt, false).expect("sent");
    // A forged copy from elsewhere moves nothing.
    p.nodes[0].out.datagram_mut(0)[20] ^= 1;
    let got = p.deliver_from(0, roamed, AntiSpoofing::Strict);
    assert_eq!(got.dropped, vec![DropReason::DecryptFailure]);
    assert_eq!(p.nodes[1].core.endpoint(id), Some(p.nodes[0].addr));
    let mut pkt = udp4(A, B, 64, &[1; 20]);
    p.send(0, &mut pkt, false).expect("sent");
    let got = p.deliver_from(0, roamed, AntiSpoofing::Strict);
    assert_eq!(got.delivered.len(), 1);
    assert_eq!(p.nodes[1].core.endpoint(id), Some(roamed));
}

#[test]
fn replays_and_spoofed_sources_are_dropped() {
    let mut p = Pair::connect(now());
    let mut pkt = udp4(A, B, 64, &[2; 30]);
    p.send(0, &mut pkt, false).expect("sent");
    let d = p.nodes[0].out.datagram(0).to_vec();
    assert_eq!(p.deliver(0, AntiSpoofing::Strict).delivered.len(), 1);
    let src = p.nodes[0].addr;
    let n = &mut p.nodes[1];
    let t = Arc::clone(&n.table);
    let r = n.core.datagram(
        &t,
        AntiSpoofing::Strict,
        &d,
        src,
        None,
        &mut n.plain,
        p.now,
        &mut n.out,
    );
    assert!(matches!(r, Rx::Drop(DropReason::Replay)), "{r:?}");
    // Node 1 sends from a source outside its AllowedIPs.
    let mut spoofed = udp4([10, 244, 9, 9], B, 64, &[3; 30]);
    p.send(0, &mut spoofed, false).expect("sent");
    let got = p.deliver(0, AntiSpoofing::Strict);
    assert_eq!(got.dropped, vec![DropReason::SpoofedSource]);
    p.send(0, &mut udp4([10, 244, 9, 9], B, 64, &[3; 30]), false)
        .expect("sent");
    assert_eq!(p.deliver(0, AntiSpoofing::Off).delivered.len(), 1);
}

/// The kernel accepts a packet up to 8192 - 64 counters behind the newest
/// one; boringtun 0.7 accepted 1024. Fails without the patched window.
#[test]
fn the_replay_window_is_the_kernels() {
    const WINDOW: usize = 8192 - 64;
    let mut p = Pair::connect(now());
    let mut sealed = Vec::new();
    for i in 0..=WINDOW {
        let mut pkt = udp4(A, B, 64, &(i as u32).to_le_bytes());
        p.send(0, &mut pkt, false).expect("sent");
        sealed.push(p.nodes[0].out.datagram(0).to_vec());
        p.nodes[0].out.clear();
    }
    let src = p.nodes[0].addr;
    let n = &mut p.nodes[1];
    let t = Arc::clone(&n.table);
    let mut rx = |d: &[u8]| {
        n.core.datagram(
            &t,
            AntiSpoofing::Strict,
            d,
            src,
            None,
            &mut n.plain,
            p.now,
            &mut n.out,
        )
    };
    assert!(matches!(rx(&sealed[WINDOW]), Rx::Deliver { .. }));
    assert!(
        matches!(rx(&sealed[0]), Rx::Deliver { .. }),
        "a packet {WINDOW} behind the newest is inside the window"
    );
    assert!(matches!(rx(&sealed[0]), Rx::Drop(DropReason::Replay)));
}

/// A session stops at REJECT_AFTER_MESSAGES (the nonce must never wrap):
/// the sender refuses, the receiver rejects. boringtun 0.7 enforced
/// neither (and a peer's counter of 2^64 - 1 overflowed its window).
#[test]
fn a_session_ends_at_its_message_limit() {
    const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);
    let mut p = Pair::connect(now());
    let id = p.peer_id(0);
    let tunn = p.nodes[0].core.tunn(id).expect("session");
    tunn.debug_set_sending_counter(REJECT_AFTER_MESSAGES - 1);
    let mut pkt = udp4(A, B, 64, &[4; 30]);
    p.send(0, &mut pkt, false).expect("the last message");
    assert_eq!(p.deliver(0, AntiSpoofing::Strict).delivered.len(), 1);
    let mut pkt = udp4(A, B, 64, &[4; 30]);
    let r = p.send(0, &mut pkt, false);
    assert!(
        p.nodes[0].out.sent.iter().all(|s| s.1.len() == 148),
        "no data message past the limit: {r:?}"
    );
}

#[test]
fn initiations_go_to_the_sources_gate_worker_then_the_owner() {
    let mut p = Pair::new(now());
    let t = Arc::clone(&p.nodes[0].table);
    let mut out = Wire::new(4096);
    p.nodes[0].core.follow(&t, p.now, &mut out);
    let init = out.datagram(0).to_vec();
    // Node 2 as worker 0 of 3: the initiation's gate worker and owner are computed.
    let load = Arc::new(Load::new(p.now.mono));
    let table = Arc::clone(&p.nodes[1].table);
    let src = p.nodes[0].addr;
    let gw = gate_worker(src.ip(), 3);
    let ow = owner(p.peer_id(1), 3);
    let mut plain = vec![0; 2048];
    for me in 0..3 {
        let mut c = Core::new(Config {
            me,
            workers: 3,
            secret: super::sim::KEYS[1],
            seed: [5; 64],
            load: Arc::clone(&load),
            now: p.now.mono,
        });
        c.follow(&table, p.now, &mut Wire::new(4096));
        let mut out = Wire::new(4096);
        let r = c.datagram(
            &table,
            AntiSpoofing::Strict,
            &init,
            src,
            None,
            &mut plain,
            p.now,
            &mut out,
        );
        match r {
            Rx::HandOff { to, vouched: None } => assert!(me != gw && to == gw, "{me}: {r:?}"),
            Rx::HandOff {
                to,
                vouched: Some(id),
            } => {
                assert!(
                    me == gw && me != ow && to == ow && id == p.peer_id(1),
                    "{me}: {r:?}"
                )
            }
            Rx::Done { .. } => {
                assert!(me == gw && me == ow, "{me}: {r:?}");
                assert_eq!(out.datagram(0)[0], 2, "a handshake response");
            }
            r => panic!("worker {me}: {r:?}"),
        }
        if me == ow {
            let mut out = Wire::new(4096);
            let r = c.datagram(
                &table,
                AntiSpoofing::Strict,
                &init,
                src,
                Some(p.peer_id(1)),
                &mut plain,
                p.now,
                &mut out,
            );
            assert!(matches!(r, Rx::Done { .. }), "{r:?}");
        }
    }
}

#[test]
fn under_load_an_initiation_earns_a_cookie_and_the_retry_passes() {
    let mut p = Pair::new(now());
    let load = Arc::new(Load::new(p.now.mono));
    // Node 2's gate sees more than the engine's handshake budget this second.
    let junk = p.nodes[1].addr;
    for _ in 0..=gate::UNDER_LOAD {
        load.note(p.now.mono);
    }
    let _ = junk;
    p.nodes[1].core = Core::new(Config {
        me: 0,
        workers: 1,
        secret: super::sim::KEYS[1],
        seed: [9; 64],
        load,
        now: p.now.mono,
    });
    let t = Arc::clone(&p.nodes[1].table);
    p.nodes[1].core.follow(&t, p.now, &mut Wire::new(4096));
    let t = Arc::clone(&p.nodes[0].table);
    p.nodes[0].core.follow(&t, p.now, &mut p.nodes[0].out);
    let got = p.deliver(0, AntiSpoofing::Strict);
    assert_eq!(got.dropped, vec![DropReason::Handshake]);
    assert_eq!(p.nodes[1].out.datagram(0)[0], 3, "a cookie reply");
    p.deliver(1, AntiSpoofing::Strict);
    // The retry (boringtun's timer: REKEY_TIMEOUT) carries MAC2 and passes.
    let id = p.peer_id(0);
    let mut out = Wire::new(4096);
    let tunn = p.nodes[0].core.tunn(id).expect("session");
    let len = match tunn.format_handshake_initiation(out.room(148), true) {
        TunnResult::WriteToNetwork(d) => d.len(),
        _ => panic!("no retry"),
    };
    out.push(p.nodes[1].addr, len);
    p.nodes[0].out = out;
    p.deliver(0, AntiSpoofing::Strict);
    assert_eq!(p.nodes[1].out.datagram(0)[0], 2, "a handshake response");
    p.advance(Duration::from_millis(10));
}
