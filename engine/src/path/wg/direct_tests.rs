use std::net::SocketAddr;

use super::super::sim::{KEYS, Outcome, Pair};
use super::*;
use crate::WgSecret;
use crate::antispoof::AntiSpoofing::Strict;

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

/// Two nodes with discovery on, each answering the other's probes; node 0
/// has one probe for node 1 at `nat` (node 1's punched endpoint).
fn probing(nat: SocketAddr, counter: u64) -> Pair {
    let p = Pair::connect(Now::read());
    let (a, b) = (
        WgSecret(KEYS[0]).public_key(),
        WgSecret(KEYS[1]).public_key(),
    );
    let key = pair_key(&KEYS[0], &b);
    assert_eq!(key, pair_key(&KEYS[1], &a), "both ends derive one key");
    for (i, n) in p.nodes.iter().enumerate() {
        n.core.disco.set_enabled(true);
        let (own, other) = if i == 0 { (a, b) } else { (b, a) };
        n.core.disco.direct.set_members(own, vec![(other, key)]);
    }
    let probe = Probe::new(&KEYS[0], &b, &key, nat, counter);
    p.nodes[0].core.disco.direct.set_probes(vec![probe]);
    p
}

/// Node 0 sends its current set; the probe.
fn send(p: &mut Pair) -> Vec<u8> {
    let now = p.now;
    let n = &mut p.nodes[0];
    n.io.clear();
    assert!(n.core.disco_due(now), "a new set is due at once");
    let sent = n.core.disco_ask(now, [0; 16], &mut n.io);
    let probes: Vec<_> = (0..n.io.sent.len())
        .filter(|i| n.io.datagram(*i).len() == LEN)
        .collect();
    assert_eq!(probes.len(), 1, "{sent} sent");
    n.io.datagram(probes[0]).to_vec()
}

#[test]
fn a_probe_is_acked_to_its_source_and_the_ack_proves_the_path() {
    let nat = addr("203.0.113.9:40001");
    let mut p = probing(nat, 1000);
    let probe = send(&mut p);
    // Sent once per set.
    let n = &mut p.nodes[0];
    n.io.clear();
    n.core.disco_ask(p.now, [0; 16], &mut n.io);
    assert!(n.io.sent.iter().all(|(_, r)| r.len() != LEN), "sent again");
    // Node 1 sees it from node 0's NAT and answers there, as long.
    let from = addr("198.51.100.7:51820");
    p.nodes[1].io.clear();
    assert_eq!(p.receive(1, &probe, from, Strict), Outcome::Done(1));
    let (to, _) = p.nodes[1].io.sent[0].clone();
    assert_eq!(to, from);
    let ack = p.nodes[1].io.datagram(0).to_vec();
    assert_eq!(ack.len(), probe.len(), "no amplification");
    assert_eq!(p.nodes[1].core.disco.direct.answered(), 1);
    let a = WgSecret(KEYS[0]).public_key();
    assert!(p.nodes[1].core.disco.direct.probed(&a).is_some());
    // The ack counts only from the address probed.
    let d = &p.nodes[0].core.disco.direct;
    assert_eq!(d.acked(nat), None);
    let other = addr("203.0.113.9:40002");
    let got = p.receive(0, &ack, other, Strict);
    assert_eq!(got, Outcome::Drop(DropReason::Malformed));
    assert_eq!(p.nodes[0].core.disco.direct.acked(nat), None);
    assert_eq!(p.receive(0, &ack, nat, Strict), Outcome::Done(0));
    assert!(p.nodes[0].core.disco.direct.acked(nat).is_some());
    // A new set forgets the old acks.
    p.nodes[0].core.disco.direct.set_probes(Vec::new());
    assert_eq!(p.nodes[0].core.disco.direct.acked(nat), None);
}

#[test]
fn forged_replayed_and_unknown_probes_are_dropped_unanswered() {
    let nat = addr("203.0.113.9:40001");
    let mut p = probing(nat, 2000);
    let probe = send(&mut p);
    let from = addr("198.51.100.7:51820");
    let mut bad_mac = probe.clone();
    bad_mac[60] ^= 1;
    let mut bad_counter = probe.clone();
    bad_counter[47] ^= 1;
    // A stranger's key (public keys are public), correctly formed.
    let stranger = [0x77u8; 32];
    let b = WgSecret(KEYS[1]).public_key();
    let sk = pair_key(&stranger, &b);
    let foreign = Probe::new(&stranger, &b, &sk, nat, 3000).msg;
    for (what, d) in [
        ("bad MAC", &bad_mac[..]),
        ("counter changed", &bad_counter[..]),
        ("not a member", &foreign[..]),
    ] {
        p.nodes[1].io.clear();
        let got = p.receive(1, d, from, Strict);
        assert_eq!(got, Outcome::Drop(DropReason::Malformed), "{what}");
        assert!(p.nodes[1].io.sent.is_empty(), "{what} answered");
    }
    p.nodes[1].io.clear();
    assert_eq!(p.receive(1, &probe, from, Strict), Outcome::Done(1));
    let ack = p.nodes[1].io.datagram(0).to_vec();
    // The same probe again, from anywhere: a replay, not answered.
    for src in [from, addr("192.0.2.66:9")] {
        p.nodes[1].io.clear();
        let got = p.receive(1, &probe, src, Strict);
        assert_eq!(got, Outcome::Drop(DropReason::Malformed));
        assert!(p.nodes[1].io.sent.is_empty());
    }
    // Node 1 probes nothing: an ack (even a valid one for node 0) is dropped.
    let got = p.receive(1, &ack, nat, Strict);
    assert_eq!(got, Outcome::Drop(DropReason::Malformed));
    // New members keep the counters of the keys they keep.
    let a = WgSecret(KEYS[0]).public_key();
    let key = pair_key(&KEYS[1], &a);
    p.nodes[1].core.disco.direct.set_members(b, vec![(a, key)]);
    let got = p.receive(1, &probe, from, Strict);
    assert_eq!(
        got,
        Outcome::Drop(DropReason::Malformed),
        "replay after set"
    );
    // Discovery off: nothing is answered.
    p.nodes[1].core.disco.set_enabled(false);
    p.nodes[0]
        .core
        .disco
        .direct
        .set_probes(vec![Probe::new(&KEYS[0], &b, &key, nat, 9000)]);
    let next = send(&mut p);
    let got = p.receive(1, &next, from, Strict);
    assert_eq!(got, Outcome::Drop(DropReason::Malformed));
}

#[test]
fn counters_are_taken_once_in_any_order_within_the_window() {
    let mut st = (0, 0);
    let mut take = |c: u64| match fresh(st.0, st.1, c) {
        Some(next) => {
            st = next;
            true
        }
        None => false,
    };
    assert!(take(1000));
    assert!(!take(1000), "replay");
    // One round's two probes out of order.
    assert!(take(3001));
    assert!(take(3000));
    assert!(!take(3000) && !take(3001), "replays");
    assert!(!take(1000), "an old one");
    // The window: WINDOW below the largest, once each.
    assert!(take(3001 + WINDOW));
    assert!(take(3002), "WINDOW - 1 below");
    assert!(!take(3001), "taken before");
    assert!(!take(3000), "below the window");
    assert!(take(10_000));
    assert!(!take(10_000 - WINDOW - 1));
    assert!(take(10_000 - WINDOW));
    assert!(!take(10_000 - WINDOW));
}
