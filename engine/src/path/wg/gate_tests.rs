use std::time::Instant;

use super::*;

const PUBLIC: [u8; 32] = [9; 32];

fn gate(load: &Arc<Load>) -> Gate {
    Gate::new(&PUBLIC, [7; 64], Arc::clone(load))
}

/// A handshake initiation with a valid MAC1 for `PUBLIC` and the MAC2 of
/// `cookie` (zero without one), from sender index `sender`.
fn initiation(sender: u32, cookie: Option<[u8; 16]>) -> [u8; 148] {
    let mut m = [0u8; 148];
    m[0] = msg::INITIATION;
    m[4..8].copy_from_slice(&sender.to_le_bytes());
    m[8..40].fill(0x5a);
    let k = hash(LABEL_MAC1, &PUBLIC);
    let mac1 = mac(&k, &[&m[..116]]);
    m[116..132].copy_from_slice(&mac1);
    if let Some(c) = cookie {
        let mac2 = mac(&c, &[&m[..132]]);
        m[132..].copy_from_slice(&mac2);
    }
    m
}

/// What an initiator learns from our cookie reply (the paper's decryption).
fn open_cookie(reply: &[u8; 64], mac1: &[u8]) -> [u8; 16] {
    let key = hash(LABEL_COOKIE, &PUBLIC);
    let aead = <XChaCha20Poly1305 as chacha20poly1305::KeyInit>::new(&key.into());
    let mut c = [0u8; 16];
    c.copy_from_slice(&reply[32..48]);
    aead.decrypt_in_place_detached(
        GenericArray::from_slice(&reply[8..32]),
        mac1,
        &mut c,
        GenericArray::from_slice(&reply[48..64]),
    )
    .expect("a cookie reply we can open");
    c
}

fn check(g: &mut Gate, m: &[u8; 148], src: SocketAddr, now: Instant) -> (Verdict, [u8; 64]) {
    let mut reply = [0u8; 64];
    let msg = Message::new_checked(&m[..]).expect("initiation");
    (g.check(&msg, src, now, &mut reply), reply)
}

/// Pushes the engine-wide load over [`UNDER_LOAD`] at `now`.
fn overload(g: &mut Gate, now: Instant) {
    let junk: SocketAddr = "198.51.100.99:1".parse().expect("addr");
    for _ in 0..=UNDER_LOAD {
        let _ = check(g, &initiation(1, None), junk, now);
    }
}

#[test]
fn mac1_then_cookies_only_under_load() {
    let now = Instant::now();
    let load = Arc::new(Load::new(now));
    let mut g = gate(&load);
    let src: SocketAddr = "192.0.2.7:51820".parse().expect("addr");
    let m = initiation(42, None);
    assert_eq!(check(&mut g, &m, src, now).0, Verdict::Pass);
    let mut bad = m;
    bad[120] ^= 1;
    assert_eq!(
        check(&mut g, &bad, src, now).0,
        Verdict::Drop(DropReason::DecryptFailure)
    );
    overload(&mut g, now);
    let (v, reply) = check(&mut g, &m, src, now);
    assert_eq!(v, Verdict::Cookie);
    assert_eq!(&reply[..8], &[3, 0, 0, 0, 42, 0, 0, 0]);
    let cookie = open_cookie(&reply, &m[116..132]);
    let with = initiation(42, Some(cookie));
    assert_eq!(check(&mut g, &with, src, now).0, Verdict::Pass);
    // The load decays: a second later without handshakes, no cookie needed.
    let later = now + Duration::from_millis(2100);
    assert_eq!(check(&mut g, &m, src, later).0, Verdict::Pass);
}

/// The paper binds a cookie to the source address and port; boringtun
/// 0.7's cookie covered the address only, so another port (another host
/// behind the same NAT) could use it. Fails when the port leaves the MAC.
#[test]
fn a_cookie_is_bound_to_address_and_port() {
    let now = Instant::now();
    let load = Arc::new(Load::new(now));
    let mut g = gate(&load);
    let src: SocketAddr = "192.0.2.7:51820".parse().expect("addr");
    overload(&mut g, now);
    let m = initiation(42, None);
    let (_, reply) = check(&mut g, &m, src, now);
    let cookie = open_cookie(&reply, &m[116..132]);
    let with = initiation(42, Some(cookie));
    assert_eq!(check(&mut g, &with, src, now).0, Verdict::Pass);
    let other_port: SocketAddr = "192.0.2.7:51821".parse().expect("addr");
    assert_eq!(check(&mut g, &with, other_port, now).0, Verdict::Cookie);
    let other_ip: SocketAddr = "192.0.2.8:51820".parse().expect("addr");
    assert_eq!(check(&mut g, &with, other_ip, now).0, Verdict::Cookie);
    // The secret changes every two minutes: an old cookie earns a new reply.
    let later = now + COOKIE_SECRET_AGE + Duration::from_secs(1);
    overload(&mut g, later);
    assert_eq!(check(&mut g, &with, src, later).0, Verdict::Cookie);
}

/// Under load, one source with valid cookies gets the kernel's burst of 5
/// and then 20 per second, and its flood leaves another source's
/// handshakes alone. Fails with boringtun 0.7's limiter, where a valid
/// cookie always passed.
#[test]
fn each_source_has_its_own_token_bucket_under_load() {
    let now = Instant::now();
    let load = Arc::new(Load::new(now));
    let mut g = gate(&load);
    overload(&mut g, now);
    let cookie_for = |g: &mut Gate, src: SocketAddr| {
        let m = initiation(1, None);
        let (_, reply) = check(g, &m, src, now);
        initiation(1, Some(open_cookie(&reply, &m[116..132])))
    };
    let attacker: SocketAddr = "203.0.113.5:40000".parse().expect("addr");
    let peer: SocketAddr = "192.0.2.2:51820".parse().expect("addr");
    let flood = cookie_for(&mut g, attacker);
    let legit = cookie_for(&mut g, peer);
    let passed = (0..1000)
        .filter(|_| check(&mut g, &flood, attacker, now).0 == Verdict::Pass)
        .count();
    assert_eq!(passed as u64, PER_SOURCE_BURST);
    assert_eq!(
        check(&mut g, &flood, attacker, now).0,
        Verdict::Drop(DropReason::RateLimited)
    );
    assert_eq!(check(&mut g, &legit, peer, now).0, Verdict::Pass);
    // Tokens come back at 20 per second.
    let t = now + Duration::from_millis(100);
    let passed = (0..100)
        .filter(|_| check(&mut g, &flood, attacker, t).0 == Verdict::Pass)
        .count();
    assert_eq!(passed, 2);
    // IPv6 sources share a bucket per /64.
    let a: SocketAddr = "[fd00:1::1]:1".parse().expect("v6");
    let b: SocketAddr = "[fd00:1::2]:1".parse().expect("v6");
    let (fa, fb) = (cookie_for(&mut g, a), cookie_for(&mut g, b));
    let passed = (0..10)
        .filter(|i| {
            let (m, s) = if i % 2 == 0 { (&fa, a) } else { (&fb, b) };
            check(&mut g, m, s, now).0 == Verdict::Pass
        })
        .count();
    assert_eq!(passed as u64, PER_SOURCE_BURST);
}

#[test]
fn the_source_table_is_bounded_and_reuses_idle_slots() {
    let mut b = Buckets::new();
    let ip = |i: u32| IpAddr::from(std::net::Ipv4Addr::from(0x0a00_0000 + i));
    let t = NS;
    let admitted = (0..(SOURCES as u32 * 2))
        .filter(|&i| b.allow(ip(i), t))
        .count();
    assert!(admitted <= SOURCES, "{admitted} sources in {SOURCES} slots");
    assert!(admitted > SOURCES / 2, "only {admitted} sources admitted");
    // A second later every bucket is idle and full: the slots are free again.
    assert!(b.allow(ip(SOURCES as u32 * 3), t + 2 * NS));
}
