use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::time::{Duration, Instant};

use weft_engine::path::wg::disco::{FAST, SLOW};
use weft_engine::wire::disco::{Disco, LEN};

use super::*;

fn v4(s: &str) -> SocketAddrV4 {
    s.parse().expect("addr")
}

/// RFC 1071 by the book, independent of the engine's checksum code.
fn rfc1071(words: &[u8]) -> u16 {
    let mut acc: u32 = 0;
    for c in words.chunks(2) {
        let w = u16::from_be_bytes([c[0], *c.get(1).unwrap_or(&0)]);
        acc += u32::from(w);
    }
    while acc > 0xffff {
        acc = (acc & 0xffff) + (acc >> 16);
    }
    !(acc as u16)
}

#[test]
fn the_udp_header_carries_the_listen_port_and_a_valid_checksum() {
    let (src, dst) = (v4("10.12.0.2:51820"), v4("192.0.2.1:51820"));
    let mut payload = [0u8; LEN];
    Disco::Request { nonce: [0x5a; 16] }
        .write(&mut payload)
        .expect("room");
    let mut out = [0u8; 64];
    let n = udp_datagram(src, dst, &payload, &mut out).expect("room");
    assert_eq!(n, 8 + LEN);
    assert_eq!(&out[0..2], &51820u16.to_be_bytes(), "source port");
    assert_eq!(&out[2..4], &51820u16.to_be_bytes(), "destination port");
    assert_eq!(&out[4..6], &(n as u16).to_be_bytes(), "length");
    assert_eq!(&out[8..n], &payload[..], "payload");
    // Pseudo-header + datagram (checksum included) sums to zero.
    let mut all = Vec::new();
    all.extend_from_slice(&src.ip().octets());
    all.extend_from_slice(&dst.ip().octets());
    all.extend_from_slice(&[0, 17]);
    all.extend_from_slice(&(n as u16).to_be_bytes());
    all.extend_from_slice(&out[..n]);
    assert_eq!(rfc1071(&all), 0, "checksum verifies");
    assert_ne!(&out[6..8], &[0, 0], "a checksum is sent");
    assert_eq!(udp_datagram(src, dst, &payload, &mut [0u8; 40]), None);
}

/// An IPv4 header + UDP datagram `src` → `dst` with `payload`.
fn packet(src: SocketAddrV4, dst: SocketAddrV4, payload: &[u8]) -> Vec<u8> {
    let mut udp = vec![0u8; 8 + payload.len()];
    udp_datagram(src, dst, payload, &mut udp).expect("room");
    let total = (20 + udp.len()) as u16;
    let mut ip = vec![0x45, 0, 0, 0, 0, 1, 0, 0, 64, 17, 0, 0];
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&src.ip().octets());
    ip.extend_from_slice(&dst.ip().octets());
    ip.extend_from_slice(&udp);
    ip
}

#[test]
fn received_packets_are_parsed_as_untrusted() {
    let (src, dst) = (v4("203.0.113.9:40001"), v4("192.0.2.1:51820"));
    let good = packet(src, dst, &[0xd1; LEN]);
    assert_eq!(parse_ipv4_udp(&good, 51820), Ok((src, &[0xd1u8; LEN][..])));
    assert_eq!(parse_ipv4_udp(&good, 51821), Err(PacketError::OtherPort));
    // Every truncation and every single-byte change is an error or a
    // datagram inside the packet, never a panic.
    for n in 0..good.len() {
        assert!(parse_ipv4_udp(&good[..n], 51820).is_err(), "{n} bytes");
    }
    for at in 0..good.len() {
        for v in [0u8, 0x0f, 0x40, 0x4f, 0xff] {
            let mut b = good.clone();
            b[at] = v;
            if let Ok((_, p)) = parse_ipv4_udp(&b, 51820) {
                assert!(p.len() <= LEN);
            }
        }
    }
    let mut frag = good.clone();
    frag[6] = 0x20; // more fragments
    assert_eq!(parse_ipv4_udp(&frag, 51820), Err(PacketError::Fragment));
    let mut tcp = good.clone();
    tcp[9] = 6;
    assert_eq!(parse_ipv4_udp(&tcp, 51820), Err(PacketError::Malformed));
    let mut options = good.clone();
    options[0] = 0x46;
    assert!(parse_ipv4_udp(&options, 51820).is_err(), "header says 24");
}

#[test]
fn rounds_follow_the_engine_s_timing() {
    let t0 = Instant::now();
    let mut r = Rounds::new(t0);
    assert!(r.due(t0));
    r.start(t0, [1; 16], true);
    assert_eq!(r.next(), t0 + FAST);
    // Unanswered rounds back off: 1, 2, 4 s ...
    r.start(t0 + FAST, [2; 16], true);
    assert_eq!(r.next(), t0 + FAST + 2 * FAST);
    // Only the outstanding nonce from a server counts.
    let t = t0 + 3 * FAST;
    assert!(!r.answer([1; 16], true, t), "an old nonce");
    assert!(!r.answer([2; 16], false, t), "not from a server asked");
    assert!(r.answer([2; 16], true, t));
    assert_eq!(r.next(), t + SLOW);
    r.start(t + SLOW, [3; 16], true);
    assert_eq!(r.next(), t + 2 * SLOW, "answered: the slow round");
    // Nobody asked: no backoff counted.
    let mut quiet = Rounds::new(t0);
    quiet.start(t0, [4; 16], false);
    quiet.start(t0 + FAST, [5; 16], false);
    assert_eq!(quiet.next(), t0 + 2 * FAST);
}

/// A UDP socket on 127.0.0.1 standing in for a kernel WireGuard device's
/// listen socket, with a read timeout.
fn wg_stand_in() -> (UdpSocket, u16) {
    let s = UdpSocket::bind("127.0.0.1:0").expect("bind");
    s.set_read_timeout(Some(Duration::from_secs(2)))
        .expect("timeout");
    let port = s.local_addr().expect("addr").port();
    (s, port)
}

#[test]
fn the_filter_keeps_only_discovery_to_the_listen_port() {
    let (dev, port) = wg_stand_in();
    let (other, other_port) = wg_stand_in();
    let raw = open(port).expect("raw UDP socket (run as root)");
    let tx = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut req = [0u8; LEN];
    Disco::Request { nonce: [7; 16] }
        .write(&mut req)
        .expect("room");
    let mut wg = req;
    wg[0] = 1; // a WireGuard initiation's first byte
    tx.send_to(&wg, ("127.0.0.1", port)).expect("send");
    tx.send_to(&req, ("127.0.0.1", other_port)).expect("send");
    tx.send_to(&req, ("127.0.0.1", port)).expect("send");
    // The raw socket's first datagram is the third: the filter dropped
    // the first two.
    let mut b = [0u8; 256];
    let n = (&raw).read(&mut b).expect("a datagram for the raw socket");
    let (src, payload) = parse_ipv4_udp(&b[..n], port).expect("UDP to the port");
    assert_eq!(payload, &req[..]);
    assert_eq!(src.port(), tx.local_addr().expect("addr").port());
    let again = (&raw).read(&mut b);
    assert!(again.is_err(), "nothing else: {again:?}");
    // The device's socket still got both of its datagrams, the other one its own.
    for want in [&wg, &req] {
        let (n, _) = dev.recv_from(&mut b).expect("the device's datagram");
        assert_eq!(&b[..n], &want[..]);
    }
    let (n, _) = other.recv_from(&mut b).expect("the other port's datagram");
    assert_eq!(&b[..n], &req[..]);
}

#[test]
fn two_nodes_discover_each_other_from_their_listen_ports() {
    let (dev_a, port_a) = wg_stand_in();
    let (dev_b, port_b) = wg_stand_in();
    let a = KernelDisco::start(port_a).expect("start a");
    let b = KernelDisco::start(port_b).expect("start b");
    let server = SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port_b));
    let t0 = Instant::now();
    a.set_servers(&[server]);
    while a.seen().is_none() {
        assert!(t0.elapsed() < Duration::from_secs(5), "no answer");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(
        a.seen(),
        Some(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port_a)),
        "seen from its listen port"
    );
    assert!(b.answered() >= 1);
    assert_eq!(a.answered(), 0);
    assert_eq!(b.seen(), None, "b asked nobody");
    // The "devices" got the request and the answer too (the kernel's
    // WireGuard drops them as unknown message types).
    let mut buf = [0u8; 128];
    let (n, from) = dev_b.recv_from(&mut buf).expect("request at b's port");
    assert_eq!(n, LEN);
    assert_eq!(from.port(), port_a, "sent from a's listen port");
    assert!(matches!(Disco::parse(&buf[..n]), Ok(Disco::Request { .. })));
    let (n, from) = dev_a.recv_from(&mut buf).expect("answer at a's port");
    assert_eq!(from.port(), port_b, "answered from b's listen port");
    let want = Some(SocketAddr::V4(SocketAddrV4::new(
        Ipv4Addr::LOCALHOST,
        port_a,
    )));
    match Disco::parse(&buf[..n]) {
        Ok(Disco::Answer { seen, .. }) => assert_eq!(Some(seen), want),
        other => panic!("not an answer: {other:?}"),
    }
    println!("discovery on loopback: {:?}", t0.elapsed());
    drop(a);
    drop(b);
}
