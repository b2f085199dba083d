//! The userspace WireGuard path (`wg_input`), through the engine's own core
//! (`weft_engine::path::wg`) on an in-memory pair of nodes
//! (`path::wg::sim::Pair`): node 1's `tun_tx` encrypts, node 2's
//! `datagram` decrypts, checks AllowedIPs, answers handshakes behind its
//! gate (MAC1, cookies under load) and follows roaming endpoints. No copy
//! of engine logic: the oracles below only say what must come out.

use std::cell::RefCell;
use std::net::SocketAddr;

use weft_engine::AntiSpoofing;
use weft_engine::encap::DropReason;
use weft_engine::path::wg::sim::{Got, Outcome, Pair};
use weft_engine::path::wg::{Now, Out};
use weft_engine::wire::{ipv4, ipv6, vnet};

/// A roamed source of node 1 (mode 1, flag bit 3).
const ROAMED: &str = "198.51.100.7:40000";
/// Handshake initiation and response sizes; MAC2 is an initiation's last 16 bytes.
const INIT_LEN: usize = 148;
const MAC2_AT: usize = INIT_LEN - 16;

thread_local! {
    /// A connected pair, built once per thread; data only moves its counters.
    static PAIR: RefCell<Pair> = RefCell::new(Pair::connect(Now::read()));
}

/// Input: a mode byte, then
/// - mode 0 (`mode % 4`): one datagram received by node 2 from node 1's
///   address: junk never decrypts, is never answered with data, and moves
///   no endpoint.
/// - mode 1: records `len (u16 LE) | flags | pos (u16 LE) | val | plaintext`.
///   Node 1 sends each plaintext as a TUN read; flag bit 0 sets the IP
///   length field to the plaintext's length; bit 2 XORs the datagram byte
///   at `pos % len` with `val` (at least 1), else bit 1 truncates it to
///   `pos % len` bytes, and the modified datagram must be dropped; bit 3
///   delivers from another address. The genuine datagram must come out as
///   exactly the plaintext cut to its IP length (or be dropped as malformed
///   or spoofed), move node 2's endpoint for node 1 to its source, and be
///   refused as a replay the second time.
/// - mode 2: `flags | pos (u16 LE) | val`: a fresh initiation from node 1,
///   modified as in mode 1 when flag bit 0 is set; flag bit 1 puts node 2
///   under load. Unmodified (or modified in MAC2 only) it is answered with
///   a handshake response, or under load a cookie reply; modified
///   elsewhere it is dropped.
/// - mode 3: a TUN read with a virtio-net header (GSO) sent by node 1:
///   every datagram it becomes decrypts at node 2.
pub fn wg_input(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 4 {
        0 => PAIR.with(|p| junk(&mut p.borrow_mut(), rest)),
        1 => PAIR.with(|p| packets(&mut p.borrow_mut(), rest)),
        2 => handshake(rest),
        _ => PAIR.with(|p| tun_read(&mut p.borrow_mut(), rest)),
    }
}

/// Node 2 receives `d` from `src` (as sent by node 1).
fn receive(p: &mut Pair, d: &[u8], src: SocketAddr) -> Got {
    let w = &mut p.nodes[0].io;
    w.clear();
    w.room(d.len(), 1)[..d.len()].copy_from_slice(d);
    w.push(p.nodes[1].addr, d.len());
    let got = p.deliver_from(0, src, AntiSpoofing::Strict);
    p.nodes[1].io.clear();
    got
}

fn junk(p: &mut Pair, d: &[u8]) {
    let id = p.peer_id(1);
    let before = p.nodes[1].core.endpoint(id);
    let src = p.nodes[0].addr;
    let got = receive(p, d, src);
    assert!(got.delivered.is_empty(), "junk decrypted: {got:?}");
    assert_eq!(
        p.nodes[1].core.endpoint(id),
        before,
        "junk moved the endpoint"
    );
}

/// What node 2 must deliver for plaintext `p`: its IP packet cut to the
/// length field, if that is a whole IP packet.
fn expected(p: &[u8]) -> Option<&[u8]> {
    let len = match p.first().map(|b| b >> 4) {
        Some(4) if p.len() >= ipv4::HEADER_LEN => usize::from(u16::from_be_bytes([p[2], p[3]])),
        Some(6) if p.len() >= ipv6::HEADER_LEN => {
            ipv6::HEADER_LEN + usize::from(u16::from_be_bytes([p[4], p[5]]))
        }
        _ => return None,
    };
    let min = if p[0] >> 4 == 4 {
        ipv4::HEADER_LEN
    } else {
        ipv6::HEADER_LEN
    };
    (len >= min && len <= p.len()).then(|| &p[..len])
}

/// Sets the IP length field to the packet's length.
fn fix_ip_len(p: &mut [u8]) {
    match p.first().map(|b| b >> 4) {
        Some(4) if p.len() >= ipv4::HEADER_LEN => {
            let len = u16::try_from(p.len()).unwrap_or(u16::MAX);
            p[2..4].copy_from_slice(&len.to_be_bytes());
        }
        Some(6) if p.len() >= ipv6::HEADER_LEN => {
            let len = u16::try_from(p.len() - ipv6::HEADER_LEN).unwrap_or(u16::MAX);
            p[4..6].copy_from_slice(&len.to_be_bytes());
        }
        _ => {}
    }
}

fn packets(p: &mut Pair, mut rest: &[u8]) {
    let id = p.peer_id(1);
    let roamed: SocketAddr = ROAMED.parse().expect("address");
    while rest.len() >= 6 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 6);
        let (flags, pos, val) = (rest[2], u16::from_le_bytes([rest[3], rest[4]]), rest[5]);
        let mut plain = rest[6..6 + len].to_vec();
        rest = &rest[6 + len..];
        if flags & 1 != 0 {
            fix_ip_len(&mut plain);
        }
        let mut read = plain.clone();
        p.nodes[0].io.clear();
        if p.send(0, &mut read, false).is_err() {
            assert!(p.nodes[0].io.sent.is_empty(), "a refused read was sent");
            continue;
        }
        let d = p.nodes[0].io.datagram(0).to_vec();
        assert_eq!(d.len(), read.len() + 32, "ciphertext is plaintext + 32");
        let src = if flags & 8 != 0 {
            roamed
        } else {
            p.nodes[0].addr
        };
        if flags & 6 != 0 {
            let mut bad = d.clone();
            let at = usize::from(pos) % bad.len();
            if flags & 4 != 0 {
                bad[at] ^= val.max(1);
            } else {
                bad.truncate(at.max(1));
            }
            let before = p.nodes[1].core.endpoint(id);
            let got = receive(p, &bad, src);
            assert!(
                got.delivered.is_empty(),
                "a modified datagram was delivered"
            );
            assert_eq!(
                p.nodes[1].core.endpoint(id),
                before,
                "a forgery moved the endpoint"
            );
        }
        let got = receive(p, &d, src);
        match (expected(&read), got.delivered.first()) {
            (Some(want), Some(out)) => assert_eq!(&out[..], want, "plaintext changed"),
            (_, Some(out)) => panic!("delivered a non-packet: {out:?}"),
            (_, None) => assert!(
                got.dropped
                    .iter()
                    .all(|r| matches!(r, DropReason::Malformed | DropReason::SpoofedSource)),
                "a genuine datagram was dropped: {got:?}"
            ),
        }
        if !got.delivered.is_empty() {
            assert_eq!(p.nodes[1].core.endpoint(id), Some(src), "no roaming");
        }
        let again = receive(p, &d, src);
        assert_eq!(again.dropped, vec![DropReason::Replay], "a replay passed");
    }
}

fn handshake(rest: &[u8]) {
    let [flags, p0, p1, val, ..] = *rest else {
        return;
    };
    let mut p = Pair::new(Now::read());
    let mut d = p.initiation(0);
    let at = usize::from(u16::from_le_bytes([p0, p1])) % d.len();
    let modified = flags & 1 != 0;
    if modified {
        d[at] ^= val.max(1);
    }
    let under_load = flags & 2 != 0;
    if under_load {
        p.overload(1);
    }
    p.initiation(1);
    let genuine = !modified || at >= MAC2_AT;
    let src = p.nodes[0].addr;
    let r = p.receive(1, &d, src, AntiSpoofing::Strict);
    let io = &p.nodes[1].io;
    let answer = io.sent.first().map(|_| io.datagram(0).to_vec());
    match (r, answer) {
        (Outcome::Done(0), Some(a)) => {
            assert!(genuine && !under_load, "answered a bad initiation");
            assert_eq!((a.len(), a[0]), (92, 2), "not a handshake response");
            assert_eq!(a[8..12], d[4..8], "response to another sender index");
        }
        (Outcome::Drop(DropReason::Handshake), Some(c)) => {
            assert!(genuine && under_load, "cookie reply to a bad initiation");
            assert_eq!((c.len(), c[0]), (64, 3), "not a cookie reply");
            assert_eq!(c[4..8], d[4..8], "cookie reply to another sender index");
        }
        (r, a) => assert!(!genuine && a.is_none(), "genuine initiation: {r:?}, {a:?}"),
    }
}

fn tun_read(p: &mut Pair, read: &[u8]) {
    if read.len() < vnet::HEADER_LEN {
        return;
    }
    let mut read = read.to_vec();
    p.nodes[0].io.clear();
    if p.send(0, &mut read, true).is_err() {
        return;
    }
    let got = p.deliver(0, AntiSpoofing::Off);
    assert!(
        got.dropped
            .iter()
            .all(|r| !matches!(r, DropReason::DecryptFailure | DropReason::Replay)),
        "our own datagrams did not decrypt: {got:?}"
    );
}

/// `disco_msg`: a datagram on a backend port that its own parser refused
/// (WireGuard's, VXLAN's, flannel-UDP's), as endpoint discovery parses it
/// (`wire::disco::Disco::parse`, `wire::disco::is_keepalive`) and as every
/// backend's receive side decides it (`path::wg::disco::handle`, docs/nat.md).
/// What parses starts with the first byte the receive path checks and
/// writes back to exactly the same 48 bytes (the format has one encoding
/// per message). Only a request is answered, with one datagram to its
/// source of its own length; a keepalive is taken without an answer; with
/// no nonce outstanding nothing is published.
pub fn disco_msg(data: &[u8]) {
    use weft_engine::path::wg::disco::{Discovery, Handled, handle};
    use weft_engine::wire::disco::{Disco, KEEPALIVE_LEN, LEN, is_keepalive, maybe};

    /// What `handle` sent.
    struct Sent {
        room: [u8; 128],
        to: Vec<(SocketAddr, usize)>,
    }
    impl Out for Sent {
        fn room(&mut self, len: usize, _: usize) -> &mut [u8] {
            &mut self.room[..len.min(128)]
        }
        fn push(&mut self, to: SocketAddr, len: usize) {
            self.to.push((to, len));
        }
    }

    if is_keepalive(data) {
        assert!(maybe(data), "a keepalive without the first byte");
        assert_eq!(data.len(), KEEPALIVE_LEN);
    }
    let d = Discovery::default();
    d.set_enabled(true);
    let server: SocketAddr = "192.0.2.1:8472".parse().expect("addr");
    d.set_servers(vec![server]);
    let src: SocketAddr = "198.51.100.7:40001".parse().expect("addr");
    let mut sent = Sent {
        room: [0; 128],
        to: Vec::new(),
    };
    let h = handle(data, src, &d, Now::read(), &mut sent);
    assert_eq!(d.seen(), None, "published with no nonce outstanding");
    match h {
        Handled::Answered => {
            assert!(matches!(Disco::parse(data), Ok(Disco::Request { .. })));
            assert_eq!(sent.to, vec![(src, data.len())], "one answer, same length");
        }
        Handled::Taken => {
            assert!(is_keepalive(data), "taken without a nonce: {data:?}");
            assert!(sent.to.is_empty(), "a keepalive answered");
        }
        Handled::No => assert!(sent.to.is_empty(), "sent for nothing"),
    }
    let Ok(m) = Disco::parse(data) else {
        return;
    };
    assert!(maybe(data), "parsed without the first byte");
    let mut out = [0xa5u8; LEN + 8];
    assert_eq!(m.write(&mut out), Some(LEN));
    assert_eq!(&out[..LEN], data, "written differently");
    assert_eq!(Disco::parse(&out[..LEN]), Ok(m));
}

/// `relay_msg`: a datagram on a relay's port (`wire::disco::RelayMsg::parse`
/// and `path::wg::relay::Relay::datagram`, docs/nat.md "Relays"), given to
/// a relay where node A is registered. What parses as a relay message
/// writes back to the same bytes; nothing from an address no node
/// registered from is forwarded (no reflector), nothing from A goes back to
/// A, and nothing forwarded is larger than what came.
pub fn relay_msg(data: &[u8]) {
    use std::time::Instant;
    use weft_engine::WgSecret;
    use weft_engine::path::wg::relay::{Relay, Verdict, registration};
    use weft_engine::wire::disco::{ACK_LEN, RelayMsg, maybe};
    if let Ok(m) = RelayMsg::parse(data) {
        assert!(maybe(data), "parsed without the first byte");
        let mut out = [0xa5u8; 80];
        let n = m.write(&mut out).expect("room for any relay message");
        assert_eq!(&out[..n], data, "written differently");
    }
    let (relay, a, b) = ([1u8; 32], [2u8; 32], [3u8; 32]);
    let members = [WgSecret(a).public_key(), WgSecret(b).public_key()];
    let now = Instant::now();
    let mut r = Relay::new(relay, Some(1), now);
    let mut ack = [0u8; ACK_LEN];
    let a_at: SocketAddr = "198.51.100.2:40001".parse().expect("addr");
    let b_at: SocketAddr = "203.0.113.2:50002".parse().expect("addr");
    let stranger: SocketAddr = "192.0.2.66:51820".parse().expect("addr");
    let pub_r = WgSecret(relay).public_key();
    assert_eq!(
        r.datagram(&registration(&a, &pub_r, 1), a_at, now, &members, &mut ack),
        Verdict::Ack
    );
    assert_eq!(
        r.datagram(&registration(&b, &pub_r, 1), b_at, now, &members, &mut ack),
        Verdict::Ack
    );
    let v = r.datagram(data, stranger, now, &members, &mut ack);
    assert!(
        !matches!(v, Verdict::Forward(_)),
        "reflected for a stranger: {v:?}"
    );
    match r.datagram(data, a_at, now, &members, &mut ack) {
        Verdict::Forward(to) => assert_ne!(to, a_at, "sent back to its sender"),
        Verdict::Ack => assert!(ACK_LEN < data.len(), "an ack amplifies"),
        Verdict::Drop(_) => {}
    }
}

/// `direct_msg`: a datagram on the WireGuard port that parses as a direct
/// probe or ack (`wire::direct::DirectMsg::parse` and
/// `path::wg::direct::Direct::datagram`, docs/nat.md "Back to direct"),
/// given to a node that answers member A's probes and probes A at `nat`.
/// What parses writes back to the same bytes; only A's validly MACed probe
/// is answered, never by more bytes than came; only the expected ack from
/// the address probed counts.
pub fn direct_msg(data: &[u8]) {
    use weft_engine::WgSecret;
    use weft_engine::path::wg::direct::{Answer, Direct, Probe, pair_key};
    use weft_engine::wire::direct::{DirectMsg, Kind, LEN};
    use weft_engine::wire::disco::maybe;
    let Ok(m) = DirectMsg::parse(data) else {
        return;
    };
    assert!(maybe(data), "parsed without the first byte");
    let mut out = [0xa5u8; LEN + 8];
    assert_eq!(m.write(&mut out), Some(LEN));
    assert_eq!(&out[..LEN], data, "written differently");
    let (a, b) = ([2u8; 32], [3u8; 32]);
    let (pa, pb) = (WgSecret(a).public_key(), WgSecret(b).public_key());
    let key = pair_key(&b, &pa);
    let nat: SocketAddr = "203.0.113.9:40001".parse().expect("addr");
    let stranger: SocketAddr = "192.0.2.66:51820".parse().expect("addr");
    let d = Direct::default();
    d.set_members(pb, vec![(pa, key)]);
    let probe = Probe::new(&b, &pa, &key, nat, 7);
    d.set_probes(vec![probe]);
    let mut ack = [0u8; LEN];
    match d.datagram(&m, data, stranger, 1, &mut ack) {
        Answer::Ack => {
            assert_eq!(m.kind, Kind::Probe);
            assert_eq!(m.key, pa, "answered a stranger's key");
            let real = Probe::new(&a, &pb, &key, nat, m.counter);
            assert_eq!(&real.msg[..], data, "answered a forged probe");
            assert!(ack.len() <= data.len(), "an ack amplifies");
            assert_eq!(ack, real.ack);
        }
        Answer::Acked => panic!("an ack counted from an address not probed"),
        Answer::Drop => {}
    }
    if d.datagram(&m, data, nat, 2, &mut ack) == Answer::Acked {
        assert_eq!(&probe.ack[..], data, "a forged ack counted");
    }
}
