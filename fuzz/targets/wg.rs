//! The userspace WireGuard receive path (`wg_input`): the worker's
//! `on_datagram`, `initiator`, AllowedIPs check (`path::rx::wg`) and `deliver` into GRO,
//! over a fixed pair of boringtun `Tunn`s with an established session.
//! Checks that only genuine packets decrypt, to exactly what was sent, once;
//! that genuine handshake initiations are answered and others dropped; and
//! GRO's byte accounting (the `gro` target's checks, from `engine.rs`).

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr};

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use weft_engine::AntiSpoofing;
use weft_engine::encap::DropReason;
use weft_engine::offload::gro::{Gro, Pushed};
use weft_engine::path::rx;
use weft_engine::peers::{Peer, PeerTable, WgPeer};
use weft_engine::wg::seg::trust_tcp_checksum;
use weft_engine::wg::{HANDSHAKE_RATE_LIMIT, MIN_DST, OVERHEAD, classify, receiver_id};
use weft_engine::wire::{checksum, ipv4, ipv6};

use super::engine::{Record, TCP_CSUM, be16_at, flush_checked, ip_layout, pseudo_sum};

/// Static private keys of the fuzzed pair: the remote peer sends, we receive.
const WG_SENDER: [u8; 32] = [0x11; 32];
const WG_RECEIVER: [u8; 32] = [0x22; 32];
/// A second peer of our table (its subnet is not the sender's).
const WG_OTHER: [u8; 32] = [0x33; 32];
const WG_PSK: [u8; 32] = [0x44; 32];
/// The id the sender's engine gave us (upper 24 bits of its receiver indices).
const WG_SENDER_ID: u32 = 0x00_0abc;
/// The sender's underlay address.
const WG_SRC: IpAddr = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
const WG_PORT: u16 = 51820;
/// flannel-wg's TUN MTU on a 1500-byte underlay.
const WG_MTU: usize = 1420;
/// Handshake initiation and response sizes; MAC2 is an initiation's last 16 bytes.
const WG_INIT_LEN: usize = 148;
const WG_RESP_LEN: usize = 92;
const WG_COOKIE_LEN: usize = 64;
const WG_MAC2_AT: usize = WG_INIT_LEN - 16;

fn wg_public(secret: [u8; 32]) -> PublicKey {
    PublicKey::from(&StaticSecret::from(secret))
}

/// The pair with an established session, our peer table, and our GRO table:
/// built once per thread. Only genuine data packets change the receiving
/// `Tunn` (its replay window moves on), and handshakes go to a fresh
/// responder, so every input behaves the same whatever ran before it.
struct Wg {
    /// The remote peer's side: encrypts what mode 1 feeds.
    send: Tunn,
    /// Our side, as the owner worker holds it.
    recv: Tunn,
    table: PeerTable,
    /// Our id for the sender (upper 24 bits of our receiver indices).
    id: u32,
    /// The sender's AllowedIPs.
    allowed: Vec<weft_engine::ipnet::IpNet>,
    /// A genuine handshake initiation from the sender (MAC1 for our key).
    init: Vec<u8>,
    gro: Gro,
}

impl Wg {
    fn new() -> Self {
        let sender = wg_public(WG_SENDER);
        let peer = |subnet: &str, last: u8, key: PublicKey| Peer {
            subnet: subnet.parse().expect("subnet"),
            endpoint: IpAddr::V4(Ipv4Addr::new(192, 0, 2, last)),
            vtep_mac: None,
            wireguard: Some(WgPeer {
                public_key: key.to_bytes(),
                port: WG_PORT,
                psk: Some(WG_PSK),
                keepalive: 0,
            }),
        };
        let peers = [
            peer("10.244.1.0/24", 1, sender),
            peer("fc00:0:0:1::/64", 1, sender),
            peer("10.244.2.0/24", 2, wg_public(WG_OTHER)),
        ];
        let table = PeerTable::new(&peers, WG_PORT);
        let id = table
            .wg_by_key(&sender.to_bytes())
            .expect("sender in the table")
            .id;
        let allowed = table.wg_by_id(id).expect("sender by id").allowed.clone();
        assert_ne!(id, WG_SENDER_ID);
        let mut send = Tunn::new(
            StaticSecret::from(WG_SENDER),
            wg_public(WG_RECEIVER),
            Some(WG_PSK),
            None,
            WG_SENDER_ID,
            None,
        );
        let mut recv = wg_responder(id);
        let mut buf = vec![0u8; 2048];
        let init = match send.format_handshake_initiation(&mut buf, false) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            _ => panic!("no handshake initiation"),
        };
        let resp = match recv.decapsulate(Some(WG_SRC), &init, &mut buf) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            _ => panic!("no handshake response"),
        };
        let keepalive = match send.decapsulate(None, &resp, &mut buf) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            _ => panic!("no keepalive after the handshake"),
        };
        assert!(matches!(
            recv.decapsulate(Some(WG_SRC), &keepalive, &mut buf),
            TunnResult::Done
        ));
        Wg {
            send,
            recv,
            table,
            id,
            allowed,
            init,
            gro: Gro::new(WG_MTU),
        }
    }
}

/// Our `Tunn` for the sender, as the worker creates it for peer `id`.
fn wg_responder(id: u32) -> Tunn {
    Tunn::new(
        StaticSecret::from(WG_RECEIVER),
        wg_public(WG_SENDER),
        Some(WG_PSK),
        None,
        id,
        None,
    )
}

thread_local! {
    static WG: RefCell<Wg> = RefCell::new(Wg::new());
}

/// What a received datagram led to (modes 0 and 2).
#[derive(Debug)]
enum Rx {
    Drop(DropReason),
    /// A cookie reply (the rate limiter is under load).
    Cookie(Vec<u8>),
    /// An answer from the peer's `Tunn` (a handshake response).
    Answer(Vec<u8>),
    Done,
}

/// The worker's `initiator` step: MAC1 (and under load MAC2, else a cookie
/// reply), then the initiator's static key and its id in the table.
fn wg_initiator(rl: &RateLimiter, table: &PeerTable, d: &[u8]) -> Result<u32, Rx> {
    let mut cookie = [0u8; WG_COOKIE_LEN];
    let pkt = match rl.verify_packet(Some(WG_SRC), d, &mut cookie) {
        Ok(Packet::HandshakeInit(h)) => h,
        Ok(_) => return Err(Rx::Drop(DropReason::Malformed)),
        Err(TunnResult::WriteToNetwork(c)) => return Err(Rx::Cookie(c.to_vec())),
        Err(TunnResult::Err(e)) => return Err(Rx::Drop(classify(&e))),
        Err(_) => return Err(Rx::Drop(DropReason::Malformed)),
    };
    let secret = StaticSecret::from(WG_RECEIVER);
    let public = PublicKey::from(&secret);
    match parse_handshake_anon(&secret, &public, &pkt) {
        Ok(half) => match table.wg_by_key(&half.peer_static_public) {
            Some(w) => Ok(w.id),
            None => Err(Rx::Drop(DropReason::UnknownKey)),
        },
        Err(e) => Err(Rx::Drop(classify(&e))),
    }
}

/// The worker's `on_datagram` for one datagram from the sender's address,
/// with a rate limiter allowing `limit` handshakes.
fn wg_datagram(wg: &mut Wg, d: &[u8], limit: u64) -> Rx {
    if d.is_empty() {
        return Rx::Drop(DropReason::Malformed);
    }
    let (id, initiation) = match receiver_id(d) {
        Some(id) => (id, false),
        None => {
            let rl = RateLimiter::new(&wg_public(WG_RECEIVER), limit);
            match wg_initiator(&rl, &wg.table, d) {
                Ok(id) => (id, true),
                Err(rx) => return rx,
            }
        }
    };
    if id != wg.id {
        return Rx::Drop(DropReason::UnknownKey);
    }
    let mut buf = vec![0u8; d.len().max(MIN_DST)];
    let mut fresh;
    let tunn = if initiation {
        fresh = wg_responder(id);
        &mut fresh
    } else {
        &mut wg.recv
    };
    match tunn.decapsulate(Some(WG_SRC), d, &mut buf) {
        TunnResult::Done => Rx::Done,
        TunnResult::Err(e) => Rx::Drop(classify(&e)),
        TunnResult::WriteToNetwork(p) => Rx::Answer(p.to_vec()),
        TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => {
            panic!("a datagram nobody encrypted was decrypted")
        }
    }
}

/// What boringtun makes of a decrypted plaintext (no padding is added on
/// send; the IP header's length cuts what comes out).
#[derive(Debug, PartialEq, Eq)]
enum Inner {
    Keepalive,
    Packet(usize, IpAddr),
    Invalid,
}

fn expected_inner(p: &[u8]) -> Inner {
    let (len, src) = match p.first().map(|b| b >> 4) {
        None => return Inner::Keepalive,
        Some(4) if p.len() >= ipv4::HEADER_LEN => {
            let src: [u8; 4] = p[12..16].try_into().expect("4 bytes");
            (usize::from(be16_at(p, 2)), IpAddr::from(src))
        }
        Some(6) if p.len() >= ipv6::HEADER_LEN => {
            let src: [u8; 16] = p[8..24].try_into().expect("16 bytes");
            (
                ipv6::HEADER_LEN + usize::from(be16_at(p, 4)),
                IpAddr::from(src),
            )
        }
        _ => return Inner::Invalid,
    };
    if len > p.len() {
        Inner::Invalid
    } else {
        Inner::Packet(len, src)
    }
}

/// Sets the IP length field to the packet's length (and the IPv4 header checksum).
fn fix_ip_len(p: &mut [u8]) {
    match p.first().map(|b| b >> 4) {
        Some(4) if p.len() >= ipv4::HEADER_LEN => {
            let len = u16::try_from(p.len()).unwrap_or(u16::MAX);
            p[2..4].copy_from_slice(&len.to_be_bytes());
            let hl = usize::from(p[0] & 0x0f) * 4;
            if hl >= ipv4::HEADER_LEN && hl <= p.len() {
                p[10..12].fill(0);
                let c = checksum::checksum(&p[..hl]);
                p[10..12].copy_from_slice(&c.to_be_bytes());
            }
        }
        Some(6) if p.len() >= ipv6::HEADER_LEN => {
            let len = u16::try_from(p.len() - ipv6::HEADER_LEN).unwrap_or(u16::MAX);
            p[4..6].copy_from_slice(&len.to_be_bytes());
        }
        _ => {}
    }
}

/// `trust_tcp_checksum` may only replace the TCP checksum, by the partial
/// (pseudo-header) sum.
fn check_trusted(before: &[u8], after: &[u8]) {
    if before == after {
        return;
    }
    let (ip_hl, proto) = ip_layout(after).expect("trusted a non-IP packet");
    assert_eq!(proto, ipv4::PROTO_TCP, "trusted a non-TCP packet");
    let field = ip_hl + TCP_CSUM..ip_hl + TCP_CSUM + 2;
    for (i, (a, b)) in before.iter().zip(after).enumerate() {
        assert!(
            a == b || field.contains(&i),
            "trust_tcp_checksum changed byte {i} outside the TCP checksum"
        );
    }
    let ps = pseudo_sum(after, ip_hl, ipv4::PROTO_TCP);
    assert_eq!(
        u32::from(be16_at(after, ip_hl + TCP_CSUM)),
        ps,
        "trusted checksum is not the pseudo-header sum"
    );
}

/// The userspace WireGuard receive path (the worker's `on_datagram`,
/// `initiator`, AllowedIPs check and `deliver` into GRO) against a fixed
/// pair of `Tunn`s with an established session. Input: a mode byte, then
/// - mode 0 (`mode % 3`): a datagram received from the sender's address:
///   `receiver_id`, for initiations MAC1 and the initiator's static key, then
///   `decapsulate`. Nothing may decrypt or be answered.
/// - mode 1: records `len (u16 LE) | flags | pos (u16 LE) | val | plaintext`.
///   Each plaintext is encrypted by the sender; flag bit 0 makes the harness
///   set the IP length field (and IPv4 header checksum) to the plaintext's
///   length; bit 2 XORs the ciphertext byte at `pos % len` with `val` (at
///   least 1), else bit 1 truncates the ciphertext to `pos % len` bytes (at
///   least 1); the modified datagram is decapsulated first and must fail.
///   Then the genuine one must come out as exactly the plaintext, cut by its
///   IP length (boringtun adds no padding), a replay must fail, the
///   AllowedIPs check must match the sender's subnets, and allowed packets
///   go through `trust_tcp_checksum` and GRO push/flush, which must lose or
///   duplicate no byte (the `gro` target's checks).
/// - mode 2: `flags | pos (u16 LE) | val`: a genuine handshake initiation,
///   modified as in mode 1 when flag bit 0 is set; flag bit 1 puts the rate
///   limiter under load. Unmodified (or modified in MAC2 only) it must be
///   answered with a handshake response, or under load a cookie reply;
///   modified elsewhere it must be dropped.
pub fn wg_input(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    WG.with(|wg| {
        let wg = &mut *wg.borrow_mut();
        match mode % 3 {
            0 => {
                let rx = wg_datagram(wg, rest, HANDSHAKE_RATE_LIMIT);
                assert!(matches!(rx, Rx::Drop(_)), "junk was not dropped: {rx:?}");
            }
            1 => wg_packets(wg, rest),
            _ => wg_handshake(wg, rest),
        }
    });
}

fn wg_handshake(wg: &mut Wg, rest: &[u8]) {
    let [flags, p0, p1, val, ..] = *rest else {
        return;
    };
    let mut d = wg.init.clone();
    let at = usize::from(u16::from_le_bytes([p0, p1])) % d.len();
    let modified = flags & 1 != 0;
    if modified {
        d[at] ^= val.max(1);
    }
    let under_load = flags & 2 != 0;
    let genuine = !modified || at >= WG_MAC2_AT;
    let rx = wg_datagram(wg, &d, if under_load { 0 } else { HANDSHAKE_RATE_LIMIT });
    match rx {
        Rx::Answer(r) => {
            assert!(genuine && !under_load, "answered a bad initiation");
            assert_eq!(r.len(), WG_RESP_LEN);
            assert_eq!(r[0], 2);
            assert_eq!(r[8..12], d[4..8], "response to another sender index");
            assert_eq!(receiver_id(&r), Some(WG_SENDER_ID));
            let ours = u32::from_le_bytes(r[4..8].try_into().expect("4 bytes"));
            assert_eq!(ours >> 8, wg.id, "our sender index lacks the peer id");
        }
        Rx::Cookie(c) => {
            assert!(genuine && under_load, "cookie reply to a bad initiation");
            assert_eq!(c.len(), WG_COOKIE_LEN);
            assert_eq!(c[0], 3);
            assert_eq!(c[4..8], d[4..8], "cookie reply to another sender index");
            assert_eq!(receiver_id(&c), Some(WG_SENDER_ID));
        }
        Rx::Drop(_) | Rx::Done => assert!(!genuine, "a genuine initiation was dropped: {rx:?}"),
    }
}

/// One mode-1 record.
struct Plain<'a> {
    flags: u8,
    pos: u16,
    val: u8,
    bytes: &'a [u8],
}

fn wg_packets(wg: &mut Wg, mut rest: &[u8]) {
    let mut plains = Vec::new();
    while rest.len() >= 6 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 6);
        plains.push(Plain {
            flags: rest[2],
            pos: u16::from_le_bytes([rest[3], rest[4]]),
            val: rest[5],
            bytes: &rest[6..6 + len],
        });
        rest = &rest[6 + len..];
    }
    // The worker's plaintext arena: decapsulate writes at `plain_pos`.
    let total: usize = plains.iter().map(|p| p.bytes.len() + OVERHEAD).sum();
    let mut arena = vec![0u8; total + MIN_DST];
    let mut plain_pos = 0;
    let mut records = Vec::new();
    let mut bytes_out = 0;
    let mut scratch = vec![0u8; total + MIN_DST];
    assert!(wg.gro.is_empty());
    for pl in &plains {
        let mut p = pl.bytes.to_vec();
        if pl.flags & 1 != 0 {
            fix_ip_len(&mut p);
        }
        let mut ct = vec![0u8; (p.len() + OVERHEAD).max(MIN_DST)];
        let n = match wg.send.encapsulate(&p, &mut ct) {
            TunnResult::WriteToNetwork(c) => c.len(),
            _ => panic!("an established session did not encrypt"),
        };
        ct.truncate(n);
        assert_eq!(n, p.len() + OVERHEAD, "ciphertext is not plaintext + 32");
        assert_eq!(ct[0], 4);
        assert_eq!(
            receiver_id(&ct),
            Some(wg.id),
            "data not addressed to our id"
        );
        if pl.flags & 6 != 0 {
            let mut bad = ct.clone();
            let at = usize::from(pl.pos) % bad.len();
            if pl.flags & 4 != 0 {
                bad[at] ^= pl.val.max(1);
            } else {
                bad.truncate(at.max(1));
            }
            let dst = &mut arena[plain_pos..];
            if let r @ (TunnResult::WriteToTunnelV4(..)
            | TunnResult::WriteToTunnelV6(..)
            | TunnResult::WriteToNetwork(_)
            | TunnResult::Done) = wg.recv.decapsulate(Some(WG_SRC), &bad, dst)
            {
                panic!(
                    "a modified data packet was accepted (at {at}): {}",
                    tunn_result_name(&r)
                );
            }
        }
        let expect = expected_inner(&p);
        let dst = &mut arena[plain_pos..];
        let dst_at = dst.as_ptr() as usize;
        let plain = |q: &[u8], a: IpAddr| {
            assert_eq!(
                q.as_ptr() as usize,
                dst_at,
                "plaintext not at the buffer start"
            );
            Inner::Packet(q.len(), a)
        };
        let got = match wg.recv.decapsulate(Some(WG_SRC), &ct, dst) {
            TunnResult::WriteToTunnelV4(q, a) => plain(q, IpAddr::V4(a)),
            TunnResult::WriteToTunnelV6(q, a) => plain(q, IpAddr::V6(a)),
            TunnResult::Done => Inner::Keepalive,
            TunnResult::Err(e) => {
                assert_eq!(classify(&e), DropReason::Malformed, "genuine packet: {e:?}");
                Inner::Invalid
            }
            TunnResult::WriteToNetwork(_) => panic!("a data packet was answered"),
        };
        assert_eq!(got, expect, "decapsulate disagrees with the plaintext");
        match wg.recv.decapsulate(Some(WG_SRC), &ct, &mut scratch) {
            TunnResult::Err(e) => assert_eq!(classify(&e), DropReason::Replay, "replay: {e:?}"),
            r => panic!("a replayed packet was accepted: {}", tunn_result_name(&r)),
        }
        let Inner::Packet(len, src) = got else {
            continue;
        };
        let start = plain_pos;
        assert!(arena[start..start + len] == p[..len], "plaintext changed");
        let min = if src.is_ipv4() {
            ipv4::HEADER_LEN
        } else {
            ipv6::HEADER_LEN
        };
        let allowed = wg.allowed.iter().any(|n| n.contains(&src));
        let off = rx::wg(AntiSpoofing::Off, &wg.table, wg.id, src, len);
        let strict = rx::wg(AntiSpoofing::Strict, &wg.table, wg.id, src, len);
        if len < min {
            // Malformed: the worker never writes it to the TUN.
            assert_eq!(strict.err(), Some(DropReason::Malformed));
            assert_eq!(off.err(), Some(DropReason::Malformed));
            continue;
        }
        assert!(off.is_ok(), "anti-spoofing off dropped {src}");
        match strict {
            // No subnet of this table nests in another peer's.
            Ok(from) => assert!(allowed && from.is_some(), "AllowedIPs let {src} in"),
            Err(r) => {
                assert_eq!(r, DropReason::SpoofedSource);
                assert!(!allowed, "AllowedIPs check refused {src}");
                continue;
            }
        }
        plain_pos += len;
        let before = arena[start..start + len].to_vec();
        trust_tcp_checksum(&mut arena[start..start + len]);
        check_trusted(&before, &arena[start..start + len]);
        records.push(Record {
            start,
            len,
            pushed: arena[start..start + len].to_vec(),
        });
        if wg.gro.push(&arena, start, len) == Pushed::Full {
            bytes_out += flush_checked(&mut wg.gro, &mut arena, &records, WG_MTU);
            assert_eq!(wg.gro.push(&arena, start, len), Pushed::Queued);
        }
    }
    bytes_out += flush_checked(&mut wg.gro, &mut arena, &records, WG_MTU);
    let bytes_in: usize = records.iter().map(|r| r.len).sum();
    assert_eq!(bytes_out, bytes_in, "GRO lost or duplicated bytes");
    let _ = wg.gro.take_coalesced();
}

fn tunn_result_name(r: &TunnResult<'_>) -> &'static str {
    match r {
        TunnResult::Done => "Done",
        TunnResult::Err(_) => "Err",
        TunnResult::WriteToNetwork(_) => "WriteToNetwork",
        TunnResult::WriteToTunnelV4(..) => "WriteToTunnelV4",
        TunnResult::WriteToTunnelV6(..) => "WriteToTunnelV6",
    }
}
