use std::net::SocketAddr;
use std::time::Duration;

use super::super::sim::{Outcome, Pair};
use super::*;
use crate::antispoof::AntiSpoofing::Strict;

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

/// Node 1 (index 0) asks node 2, whose address is its server.
fn asking_pair() -> Pair {
    let p = Pair::connect(Now::read());
    for n in &p.nodes {
        n.core.disco.set_enabled(true);
    }
    let server = p.nodes[1].addr;
    p.nodes[0].core.disco.set_servers(vec![server]);
    p
}

/// Node 0's request (its first datagram after a round).
fn ask(p: &mut Pair, nonce: [u8; 16]) -> Vec<u8> {
    p.nodes[0].io.clear();
    let now = p.now;
    assert!(p.nodes[0].core.disco_due(now));
    let server = p.nodes[1].addr;
    let n = &mut p.nodes[0];
    assert_eq!(n.core.disco_ask(now, nonce, &mut n.io), 1);
    assert_eq!(n.io.sent[0].0, server);
    n.io.datagram(0).to_vec()
}

#[test]
fn off_by_default_a_request_is_dropped_and_nothing_is_asked() {
    let mut p = Pair::connect(Now::read());
    p.nodes[0].core.disco.set_servers(vec![p.nodes[1].addr]);
    assert!(!p.nodes[0].core.disco_due(p.now));
    let mut req = [0u8; LEN];
    Disco::Request { nonce: [5; 16] }.write(&mut req);
    p.nodes[1].io.clear();
    let got = p.receive(1, &req, addr("203.0.113.9:4000"), Strict);
    assert_eq!(got, Outcome::Drop(DropReason::Malformed));
    assert!(p.nodes[1].io.sent.is_empty());
}

#[test]
fn a_node_learns_the_address_it_is_seen_from() {
    let mut p = asking_pair();
    let req = ask(&mut p, [1; 16]);
    // Through a NAT: node 2 sees the request from the NAT's address.
    let nat = addr("203.0.113.9:40001");
    p.nodes[1].io.clear();
    assert_eq!(p.receive(1, &req, nat, Strict), Outcome::Done(1));
    let (to, _) = p.nodes[1].io.sent[0].clone();
    assert_eq!(to, nat);
    let answer = p.nodes[1].io.datagram(0).to_vec();
    assert_eq!(answer.len(), req.len(), "no amplification");
    let server = p.nodes[1].addr;
    assert_eq!(p.receive(0, &answer, server, Strict), Outcome::Done(0));
    let (seen, _) = p.nodes[0].core.disco.seen().expect("published");
    assert_eq!(SocketAddr::V4(seen), nat);
    assert_eq!(p.nodes[1].core.disco.answered(), 1);
    // The next round waits SLOW once an answer is known.
    assert!(!p.nodes[0].core.disco_due(p.now));
    p.advance(FAST);
    assert!(!p.nodes[0].core.disco_due(p.now));
    p.advance(SLOW);
    assert!(p.nodes[0].core.disco_due(p.now));
}

#[test]
fn forged_answers_change_nothing() {
    let mut p = asking_pair();
    let id = p.peer_id(0);
    let before = p.nodes[0].core.endpoint(id);
    ask(&mut p, [2; 16]);
    let server = p.nodes[1].addr;
    let liar = addr("198.51.100.66:51820");
    let forged = |nonce| {
        let mut b = [0u8; LEN];
        let seen = addr("198.51.100.66:9");
        Disco::Answer { nonce, seen }.write(&mut b);
        b
    };
    // A guessed nonce from the server's address, the right one from elsewhere.
    for (nonce, src) in [([3; 16], server), ([2; 16], liar)] {
        let got = p.receive(0, &forged(nonce), src, Strict);
        assert_eq!(got, Outcome::Drop(DropReason::Malformed));
    }
    assert_eq!(p.nodes[0].core.disco.seen(), None);
    assert_eq!(p.nodes[0].core.endpoint(id), before, "a peer never moves");
    // A request from anywhere is answered but moves no peer either.
    let mut req = [0u8; LEN];
    Disco::Request { nonce: [4; 16] }.write(&mut req);
    assert_eq!(p.receive(0, &req, liar, Strict), Outcome::Done(1));
    assert_eq!(p.nodes[0].core.endpoint(id), before);
}

#[test]
fn another_worker_hands_discovery_to_worker_0() {
    let p = Pair::connect(Now::read());
    let shared = Arc::new(Discovery::default());
    shared.set_enabled(true);
    let mut req = [0u8; LEN];
    Disco::Request { nonce: [6; 16] }.write(&mut req);
    let mut io = super::super::sim::Wire::new(4096);
    let got = receive(&req, p.nodes[1].addr, 1, &shared, p.now, &mut io);
    assert!(matches!(
        got,
        Rx::HandOff {
            to: 0,
            vouched: None
        }
    ));
    // Garbage with the first byte is dropped, never answered.
    let got = receive(&[FIRST; 10], p.nodes[1].addr, 0, &shared, p.now, &mut io);
    assert!(matches!(got, Rx::Drop(DropReason::Malformed)));
    assert!(io.sent.is_empty());
}

#[test]
fn stopped_handshakes_bring_the_fast_round_back() {
    let mut p = asking_pair();
    let req = ask(&mut p, [8; 16]);
    p.nodes[1].io.clear();
    let nat = addr("203.0.113.9:40001");
    assert_eq!(p.receive(1, &req, nat, Strict), Outcome::Done(1));
    let answer = p.nodes[1].io.datagram(0).to_vec();
    let server = p.nodes[1].addr;
    assert_eq!(p.receive(0, &answer, server, Strict), Outcome::Done(0));
    p.advance(FAST);
    assert!(!p.nodes[0].core.disco_due(p.now), "SLOW once answered");
    p.advance(SLOW);
    p.nodes[0].core.disco.hurry();
    ask(&mut p, [9; 16]);
    p.advance(FAST);
    assert!(p.nodes[0].core.disco_due(p.now), "FAST while hurried");
}

#[test]
fn a_node_registers_with_relays_and_notes_only_their_acks() {
    use crate::path::wg::relay::{Relay, Verdict, registration};
    use crate::wire::disco::ACK_LEN;
    let mut p = asking_pair();
    let relay_at = addr("192.0.2.11:51830");
    let secret = [4u8; 32];
    let relay_pub = [6u8; 32];
    let rsecret = relay_pub; // the relay's private key in this test
    let rpublic =
        boringtun::x25519::PublicKey::from(&boringtun::x25519::StaticSecret::from(rsecret))
            .to_bytes();
    let msg = registration(&secret, &rpublic, 1);
    p.nodes[0]
        .core
        .disco
        .set_relays(vec![Registration { to: relay_at, msg }]);
    p.nodes[0].io.clear();
    let now = p.now;
    let n = &mut p.nodes[0];
    // The first round: a registration and a discovery request.
    assert_eq!(n.core.disco_ask(now, [1; 16], &mut n.io), 2);
    assert_eq!(n.io.sent[0].0, relay_at);
    let sent = n.io.datagram(0).to_vec();
    assert_eq!(sent, msg);
    // The relay takes it (the key is a member) and acks.
    let mine = boringtun::x25519::PublicKey::from(&boringtun::x25519::StaticSecret::from(secret))
        .to_bytes();
    let mut r = Relay::new(rsecret, None, now.mono);
    let mut ack = [0u8; ACK_LEN];
    let src = addr("198.51.100.2:40001");
    assert_eq!(
        r.datagram(&sent, src, now.mono, &[mine], &mut ack),
        Verdict::Ack
    );
    assert_eq!(n.core.disco.relay_ack(relay_at), None);
    // An ack from elsewhere, or echoing another MAC, is nothing.
    let other = addr("192.0.2.66:51830");
    assert_eq!(
        p.receive(0, &ack, other, Strict),
        Outcome::Drop(DropReason::Malformed)
    );
    let mut bad = ack;
    bad[20] ^= 1;
    assert_eq!(
        p.receive(0, &bad, relay_at, Strict),
        Outcome::Drop(DropReason::Malformed)
    );
    assert_eq!(p.nodes[0].core.disco.relay_ack(relay_at), None);
    assert_eq!(p.receive(0, &ack, relay_at, Strict), Outcome::Done(0));
    assert!(p.nodes[0].core.disco.relay_ack(relay_at).is_some());
    // The next registration REGISTER_EVERY later (with discovery's FAST
    // round: it has no answer yet).
    assert!(!p.nodes[0].core.disco_due(p.now));
    p.advance(REGISTER_EVERY);
    assert!(p.nodes[0].core.disco_due(p.now));
    p.nodes[0].io.clear();
    let now = p.now;
    let n = &mut p.nodes[0];
    assert_eq!(n.core.disco_ask(now, [2; 16], &mut n.io), 2);
    assert_eq!(n.io.sent[0].0, relay_at);
    assert_eq!(n.io.datagram(0), &msg[..]);
}

#[test]
fn servers_that_never_answer_are_asked_ever_less_often() {
    assert_eq!(
        (0..8).map(|u| backoff(u).as_secs()).collect::<Vec<_>>(),
        vec![1, 2, 4, 8, 16, 30, 30, 30]
    );
    let mut p = asking_pair();
    // Unanswered rounds: the waits between them grow to the cap.
    let mut waits = Vec::new();
    ask(&mut p, [1; 16]);
    for round in 2..=8u8 {
        let mut waited = Duration::ZERO;
        while !p.nodes[0].core.disco_due(p.now) {
            p.advance(Duration::from_millis(500));
            waited += Duration::from_millis(500);
        }
        waits.push(waited.as_secs());
        ask(&mut p, [round; 16]);
    }
    assert_eq!(waits, vec![1, 2, 4, 8, 16, 30, 30]);
    // New servers start over; rounds that ask no one do not count.
    let server = p.nodes[1].addr;
    p.nodes[0]
        .core
        .disco
        .set_servers(vec![server, addr("192.0.2.77:51820")]);
    while !p.nodes[0].core.disco_due(p.now) {
        p.advance(Duration::from_millis(500));
    }
    let now = p.now;
    let n = &mut p.nodes[0];
    assert_eq!(n.core.disco_ask(now, [4; 16], &mut n.io), 2);
    p.advance(FAST);
    assert!(p.nodes[0].core.disco_due(p.now), "FAST with new servers");
    p.nodes[0].core.disco.set_servers(Vec::new());
    for _ in 0..5 {
        p.advance(FAST);
        assert!(p.nodes[0].core.disco_due(p.now), "no servers: no backoff");
        let now = p.now;
        let n = &mut p.nodes[0];
        assert_eq!(n.core.disco_ask(now, [3; 16], &mut n.io), 0);
    }
    p.nodes[0].core.disco.set_servers(vec![server]);
    // An answer brings the normal rounds back (SLOW once answered).
    let req = ask_again(&mut p);
    p.nodes[1].io.clear();
    let nat = addr("203.0.113.9:40001");
    assert_eq!(p.receive(1, &req, nat, Strict), Outcome::Done(1));
    let answer = p.nodes[1].io.datagram(0).to_vec();
    let server = p.nodes[1].addr;
    assert_eq!(p.receive(0, &answer, server, Strict), Outcome::Done(0));
    p.advance(SLOW);
    assert!(p.nodes[0].core.disco_due(p.now));
    // Hurried with answers coming: FAST again.
    p.nodes[0].core.disco.hurry();
    let req = ask_again(&mut p);
    p.nodes[1].io.clear();
    assert_eq!(p.receive(1, &req, nat, Strict), Outcome::Done(1));
    let answer = p.nodes[1].io.datagram(0).to_vec();
    assert_eq!(p.receive(0, &answer, server, Strict), Outcome::Done(0));
    p.nodes[0].core.disco.hurry();
    ask_again(&mut p);
    p.advance(FAST);
    assert!(
        p.nodes[0].core.disco_due(p.now),
        "FAST: the last round was answered"
    );
}

/// Waits for the next round and asks.
fn ask_again(p: &mut Pair) -> Vec<u8> {
    while !p.nodes[0].core.disco_due(p.now) {
        p.advance(Duration::from_millis(500));
    }
    ask(p, [0x77; 16])
}

/// The backend-neutral receive side the vxlan and udp engines run on every
/// worker (`udp/nat.rs`): a keepalive is taken silently, a request is
/// answered with its own length, and an answer counts only for the nonce
/// worker 0's round set, from a server asked, whichever worker it reaches.
#[test]
fn any_worker_handles_keepalives_requests_and_answers() {
    use crate::wire::disco::KEEPALIVE_MSG;
    let shared = Arc::new(Discovery::default());
    shared.set_enabled(true);
    let server = addr("192.0.2.1:8472");
    shared.set_servers(vec![server]);
    let now = Now::read();
    let mut out = super::super::sim::Wire::new(4096);
    let nat = addr("203.0.113.9:40001");
    let got = handle(&KEEPALIVE_MSG, nat, &shared, now, &mut out);
    assert_eq!(got, Handled::Taken);
    assert!(out.sent.is_empty(), "a keepalive is never answered");
    let mut req = [0u8; LEN];
    Disco::Request { nonce: [1; 16] }.write(&mut req);
    assert_eq!(handle(&req, nat, &shared, now, &mut out), Handled::Answered);
    assert_eq!(out.sent.len(), 1);
    assert_eq!(out.sent[0].0, nat);
    assert_eq!(out.datagram(0).len(), LEN, "no amplification");
    out.clear();
    let mut answer = [0u8; LEN];
    Disco::Answer {
        nonce: [2; 16],
        seen: nat,
    }
    .write(&mut answer);
    // Before any round: refused.
    assert_eq!(handle(&answer, server, &shared, now, &mut out), Handled::No);
    assert_eq!(shared.seen(), None);
    // Worker 0's round draws nonce [2; 16].
    let mut asker = Asker::new(Arc::clone(&shared), now.mono);
    assert!(asker.due(now));
    assert_eq!(asker.ask(now, [2; 16], &mut out), 1);
    out.clear();
    // The right nonce from elsewhere, then from the server.
    let liar = addr("198.51.100.66:8472");
    assert_eq!(handle(&answer, liar, &shared, now, &mut out), Handled::No);
    assert_eq!(shared.seen(), None);
    assert_eq!(
        handle(&answer, server, &shared, now, &mut out),
        Handled::Taken
    );
    assert!(out.sent.is_empty());
    assert_eq!(shared.seen().map(|(a, _)| SocketAddr::V4(a)), Some(nat));
    // Worker 0 notes it: the next round waits SLOW.
    assert!(!asker.due(now));
}
