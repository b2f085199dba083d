use super::*;
use crate::wire::wg::{COOKIE_REPLY_LEN, INITIATION_LEN, RESPONSE_LEN};

fn public(secret: &[u8; 32]) -> [u8; 32] {
    x25519::PublicKey::from(&x25519::StaticSecret::from(*secret)).to_bytes()
}

const R: [u8; 32] = [1; 32];
const A: [u8; 32] = [2; 32];
const B: [u8; 32] = [3; 32];

fn addr(s: &str) -> SocketAddr {
    s.parse().expect("addr")
}

/// An initiation from `sender` whose MAC1 is made for `to`'s key.
fn initiation(sender: u32, to: &[u8; 32]) -> Vec<u8> {
    let mut d = vec![0u8; INITIATION_LEN];
    d[0] = msg::INITIATION;
    d[4..8].copy_from_slice(&sender.to_le_bytes());
    let m = mac(&hash(LABEL_MAC1, to), &[&d[..INITIATION_LEN - 32]]);
    d[INITIATION_LEN - 32..INITIATION_LEN - 16].copy_from_slice(&m);
    d
}

fn response(sender: u32, receiver: u32) -> Vec<u8> {
    let mut d = vec![0u8; RESPONSE_LEN];
    d[0] = msg::RESPONSE;
    d[4..8].copy_from_slice(&sender.to_le_bytes());
    d[8..12].copy_from_slice(&receiver.to_le_bytes());
    d
}

fn data(receiver: u32, len: usize) -> Vec<u8> {
    let mut d = vec![0u8; len];
    d[0] = msg::DATA;
    d[4..8].copy_from_slice(&receiver.to_le_bytes());
    d
}

struct T {
    r: Relay,
    now: Instant,
    members: Vec<[u8; 32]>,
    ack: [u8; ACK_LEN],
}

impl T {
    fn new(mbit: Option<u64>) -> T {
        let now = Instant::now();
        T {
            r: Relay::new(R, mbit, now),
            now,
            members: vec![public(&A), public(&B)],
            ack: [0; ACK_LEN],
        }
    }
    fn send(&mut self, d: &[u8], src: &str) -> Verdict {
        let members = self.members.clone();
        self.r
            .datagram(d, addr(src), self.now, &members, &mut self.ack)
    }
    /// A and B registered, then a handshake through the relay.
    fn paired(&mut self) {
        assert_eq!(
            self.send(&registration(&A, &public(&R), 10), A_AT),
            Verdict::Ack
        );
        assert_eq!(
            self.send(&registration(&B, &public(&R), 10), B_AT),
            Verdict::Ack
        );
        let v = self.send(&initiation(0x100, &public(&B)), A_AT);
        assert_eq!(v, Verdict::Forward(addr(B_AT)));
        let v = self.send(&response(0x200, 0x100), B_AT);
        assert_eq!(v, Verdict::Forward(addr(A_AT)));
    }
}

const A_AT: &str = "198.51.100.2:40001";
const B_AT: &str = "203.0.113.2:50002";
const EVE: &str = "192.0.2.66:51820";

#[test]
fn registered_pairs_are_forwarded_by_mac1_and_learned_indices() {
    let mut t = T::new(None);
    t.paired();
    assert_eq!(
        t.send(&data(0x200, 100), A_AT),
        Verdict::Forward(addr(B_AT))
    );
    assert_eq!(
        t.send(&data(0x100, 100), B_AT),
        Verdict::Forward(addr(A_AT))
    );
    let mut cookie = data(0x100, COOKIE_REPLY_LEN);
    cookie[0] = msg::COOKIE_REPLY;
    assert_eq!(t.send(&cookie, B_AT), Verdict::Forward(addr(A_AT)));
    // An index is a pair's: B's index from A's side only.
    assert_eq!(
        t.send(&data(0x200, 100), B_AT),
        Verdict::Drop(RelayDrop::NoRoute)
    );
    assert_eq!(t.r.stats.forwarded, 5);
    assert_eq!(t.r.registered(), 2);
}

#[test]
fn the_relay_is_no_reflector_for_unregistered_sources() {
    let mut t = T::new(None);
    t.paired();
    for d in [
        initiation(0x300, &public(&B)),
        data(0x200, 100),
        response(1, 0x100),
    ] {
        assert_eq!(t.send(&d, EVE), Verdict::Drop(RelayDrop::Unregistered));
    }
    // An initiation for no registered key goes nowhere.
    let v = t.send(&initiation(0x300, &public(&[9; 32])), A_AT);
    assert_eq!(v, Verdict::Drop(RelayDrop::NoRoute));
    assert_eq!(
        t.send(&[0xd1, 0, 1], A_AT),
        Verdict::Drop(RelayDrop::Malformed)
    );
}

#[test]
fn only_members_with_their_key_register_and_replays_do_not_move_them() {
    let mut t = T::new(None);
    let stranger = [7u8; 32];
    let v = t.send(&registration(&stranger, &public(&R), 1), EVE);
    assert_eq!(v, Verdict::Drop(RelayDrop::Refused), "no lease has its key");
    let mut forged = registration(&A, &public(&R), 5);
    forged[60] ^= 1;
    assert_eq!(
        t.send(&forged, EVE),
        Verdict::Drop(RelayDrop::Refused),
        "bad MAC"
    );
    // A registration made for another relay does not verify here.
    let other = registration(&A, &public(&[8; 32]), 5);
    assert_eq!(t.send(&other, EVE), Verdict::Drop(RelayDrop::Refused));
    let reg = registration(&A, &public(&R), 5);
    assert_eq!(t.send(&reg, A_AT), Verdict::Ack);
    assert_eq!(
        RelayMsg::parse(&t.ack),
        Ok(RelayMsg::Ack {
            counter: 5,
            mac: reg[48..64].try_into().expect("mac")
        })
    );
    assert!(t.ack.len() < reg.len(), "no amplification");
    assert_eq!(t.send(&reg, A_AT), Verdict::Ack, "a refresh");
    assert_eq!(
        t.send(&reg, EVE),
        Verdict::Drop(RelayDrop::Refused),
        "replay"
    );
    // The node moves with a newer counter (its NAT mapping changed).
    let moved = "198.51.100.2:40999";
    assert_eq!(
        t.send(&registration(&A, &public(&R), 6), moved),
        Verdict::Ack
    );
    assert_eq!(
        t.send(&data(1, 64), A_AT),
        Verdict::Drop(RelayDrop::Unregistered)
    );
}

#[test]
fn a_full_index_table_gives_up_its_least_recently_used() {
    let mut t = T::new(None);
    t.paired();
    // 0x200 (B's, from the pairing) and 1023 more from A's initiations.
    let senders: Vec<u32> = (0..MAX_SESSIONS as u32 - 2).map(|k| 0x1000 + k).collect();
    for s in &senders {
        t.now += Duration::from_millis(1);
        let v = t.send(&initiation(*s, &public(&B)), A_AT);
        assert_eq!(v, Verdict::Forward(addr(B_AT)));
    }
    assert_eq!(t.r.sessions.len(), MAX_SESSIONS);
    // Every one is found (B's datagrams to A's indices, A's to B's).
    for s in &senders {
        assert_eq!(t.send(&data(*s, 64), B_AT), Verdict::Forward(addr(A_AT)));
    }
    assert_eq!(t.send(&data(0x200, 64), A_AT), Verdict::Forward(addr(B_AT)));
    // One more: the least recently used (A's first index, 0x100) goes.
    t.now += Duration::from_millis(1);
    let v = t.send(&initiation(0x9999, &public(&B)), A_AT);
    assert_eq!(v, Verdict::Forward(addr(B_AT)));
    assert_eq!(t.r.sessions.len(), MAX_SESSIONS);
    assert_eq!(
        t.send(&data(0x100, 64), B_AT),
        Verdict::Drop(RelayDrop::NoRoute)
    );
    assert_eq!(
        t.send(&data(0x9999, 64), B_AT),
        Verdict::Forward(addr(A_AT))
    );
    assert_eq!(
        t.send(&data(senders[0], 64), B_AT),
        Verdict::Forward(addr(A_AT))
    );
}

#[test]
fn quiet_nodes_expire() {
    let mut t = T::new(None);
    t.paired();
    t.now += NODE_TTL + Duration::from_secs(1);
    assert_eq!(
        t.send(&data(0x200, 100), A_AT),
        Verdict::Drop(RelayDrop::Unregistered)
    );
}

#[test]
fn over_the_limit_is_dropped_and_counted() {
    // 1 Mbit/s: 125,000 B/s, a burst of 65,536 B.
    let mut t = T::new(Some(1));
    t.paired();
    let big = data(0x200, 1400);
    let mut sent = 0;
    for _ in 0..100 {
        if t.send(&big, A_AT) == Verdict::Forward(addr(B_AT)) {
            sent += 1;
        }
    }
    assert!((45..=47).contains(&sent), "{sent} datagrams in the burst");
    assert_eq!(t.r.stats.limited, 100 - sent);
    // A second refills 125,000 bytes (the bucket holds 65,536).
    t.now += Duration::from_secs(1);
    assert_eq!(t.send(&big, A_AT), Verdict::Forward(addr(B_AT)));
}

#[test]
fn both_ends_derive_the_same_key() {
    assert_eq!(
        registration_key(&A, &public(&R)),
        registration_key(&R, &public(&A))
    );
}

#[test]
fn forged_registrations_cannot_crowd_real_nodes_out() {
    // More members than slots; a forger sends a bad registration for each.
    let mut t = T::new(None);
    let secrets: Vec<[u8; 32]> = (0..MAX_NODES as u8 + 8).map(|i| [i + 10; 32]).collect();
    t.members = secrets.iter().map(public).collect();
    t.members.push(public(&A));
    for s in &secrets {
        let mut forged = registration(s, &public(&R), 1);
        forged[63] ^= 1;
        assert_eq!(t.send(&forged, EVE), Verdict::Drop(RelayDrop::Refused));
    }
    // A real node still registers at once.
    assert_eq!(
        t.send(&registration(&A, &public(&R), 1), A_AT),
        Verdict::Ack
    );
    assert_eq!(t.r.registered(), 1);
}

#[test]
fn key_agreements_are_bounded_per_second() {
    let mut t = T::new(None);
    let secrets: Vec<[u8; 32]> = (0..DH_PER_SEC + 1).map(|i| [i as u8 ^ 0x80; 32]).collect();
    t.members = secrets.iter().map(public).collect();
    t.members.push(public(&A));
    for s in &secrets[..DH_PER_SEC as usize] {
        let mut forged = registration(s, &public(&R), 1);
        forged[63] ^= 1;
        assert_eq!(t.send(&forged, EVE), Verdict::Drop(RelayDrop::Refused));
    }
    // The budget is spent: even a real node waits for the next second.
    let reg = registration(&A, &public(&R), 1);
    assert_eq!(t.send(&reg, A_AT), Verdict::Drop(RelayDrop::Refused));
    t.now += Duration::from_secs(1);
    assert_eq!(t.send(&reg, A_AT), Verdict::Ack);
}

/// Per-datagram cost with the tables full: 64 nodes registered, 1024
/// indices learned, data datagrams to indices spread over all of them.
/// Run: `cargo test --release -p weft-engine --lib relay_lookup_cost --
/// --ignored --nocapture` (docs/nat.md has the figures).
#[test]
#[ignore = "timing; run by hand in release"]
fn relay_lookup_cost() {
    let now = Instant::now();
    let mut r = Relay::new(R, None, now);
    let secrets: Vec<[u8; 32]> = (0..MAX_NODES as u8).map(|i| [i + 10; 32]).collect();
    let members: Vec<[u8; 32]> = secrets.iter().map(public).collect();
    let at = |i: usize| SocketAddr::from(([198, 51, 100, i as u8 + 1], 40000 + i as u16));
    let mut ack = [0; ACK_LEN];
    for (i, s) in secrets.iter().enumerate() {
        let v = r.datagram(
            &registration(s, &public(&R), 1),
            at(i),
            now,
            &members,
            &mut ack,
        );
        assert_eq!(v, Verdict::Ack);
    }
    // 1024 indices: node i's initiation to node i+1 teaches (i+1, sender).
    let n = MAX_NODES;
    let learned: Vec<(usize, u32)> = (0..MAX_SESSIONS)
        .map(|k| {
            let (from, to) = (k % n, (k + 1) % n);
            let sender = 0x1000 + k as u32 * 7919;
            let v = r.datagram(
                &initiation(sender, &members[to]),
                at(from),
                now,
                &members,
                &mut ack,
            );
            assert_eq!(v, Verdict::Forward(at(to)));
            (to, sender)
        })
        .collect();
    let mut d = data(0, 1400);
    let rounds = 50;
    // Nine batches; the smallest and the median (the machine is shared).
    let mut per: Vec<f64> = (0..9)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..rounds {
                for (to, sender) in &learned {
                    d[4..8].copy_from_slice(&sender.to_le_bytes());
                    let v = r.datagram(&d, at(*to), now, &members, &mut ack);
                    assert!(matches!(v, Verdict::Forward(_)));
                }
            }
            t.elapsed().as_nanos() as f64 / (rounds * learned.len()) as f64
        })
        .collect();
    per.sort_by(f64::total_cmp);
    println!(
        "relay: {:.1} ns (min) / {:.1} ns (median of 9) per data datagram, 64 nodes and 1024 indices learned",
        per[0], per[4]
    );
}
