//! Userspace IPIP between two engines in network namespaces (root): raw
//! `IPPROTO_IPIP` sockets on a veth/bridge underlay, ping (incl. DF pings of
//! exactly the MTU) and TCP both ways, with and without TUN offloads; the
//! outer packets on the wire (protocol 4, outer addresses, TTL inherited, no
//! extra header); packets that would exceed the underlay MTU are refused,
//! not fragmented; and hand-made IPIP packets (unknown outer source, spoofed
//! inner source, malformed) are dropped and counted.

mod common;

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;
use socket2::{Domain, Protocol, SockAddr, Socket, Type};
use weft_engine::{Encap, Engine, EngineConfig, Stats};

const DEV: &str = "flannel.ipip";
const MTU: u16 = 1480;

fn ipip_cfg(n: usize, offload: bool) -> EngineConfig {
    EngineConfig {
        tun_name: DEV.into(),
        encap: Encap::Ipip,
        local_addr: IpAddr::from([192, 0, 2, u8::try_from(n).expect("small")]),
        tun_addr: None,
        mtu: MTU,
        workers: 2,
        offload,
        anti_spoof: true,
        tunnel_tap: None,
    }
}

/// Two nodes, each engine configured like flannel's ipip device (`/32`
/// address, MTU ext − 20, one route per peer).
fn two_nodes(test: &str, offload: bool) -> (Topo, Vec<Engine>) {
    let t = Topo::new(test, 2);
    let engines: Vec<Engine> = (1..=2)
        .map(|n| {
            let e = start_engine(&t.node(n), ipip_cfg(n, offload));
            e.set_peers(peers_for(n, 2, &[], false));
            assert_eq!(e.tun_name(), DEV);
            e
        })
        .collect();
    for n in 1..=2 {
        let m = 3 - n;
        t.ip(n, &["addr", "add", &format!("10.244.{n}.0/32"), "dev", DEV]);
        t.ip(n, &["link", "set", DEV, "mtu", &MTU.to_string(), "up"]);
        t.ip(
            n,
            &["route", "add", &format!("10.244.{m}.0/24"), "dev", DEV],
        );
    }
    (t, engines)
}

fn wait_stats(e: &Engine, what: &str, f: impl Fn(&Stats) -> bool) {
    assert!(wait_for(10, || f(&e.stats())), "{what}: {:?}", e.stats());
}

fn traffic(test: &str, offload: bool) {
    let (mut t, engines) = two_nodes(test, offload);
    assert!(t.ping_eventually(1, "10.244.2.2", &[]), "pod 1 -> pod 2");
    assert!(t.ping_eventually(2, "10.244.1.2", &[]), "pod 2 -> pod 1");
    let size = (MTU - 28).to_string();
    assert!(
        t.ping(1, "10.244.2.2", &["-M", "do", "-s", &size]),
        "MTU-sized DF ping"
    );
    let over = (MTU - 27).to_string();
    assert!(
        !t.ping(1, "10.244.2.2", &["-M", "do", "-s", &over]),
        "one byte over the MTU must not pass with DF"
    );
    // Without DF the sender's kernel fragments the inner packet to the TUN MTU.
    assert!(
        t.ping(1, "10.244.2.2", &["-M", "dont", "-s", "3000"]),
        "fragmented inner packets"
    );
    t.iperf(1, 2, false);
    t.iperf(2, 1, false);
    for e in &engines {
        let s = e.stats();
        assert!(s.tx_packets > 1000 && s.rx_packets > 1000, "{s:?}");
        let d = s.drops;
        assert_eq!(
            d.malformed + d.unknown_peer + d.spoofed_source + d.mtu + d.udp_send_error + d.io_error,
            0,
            "{s:?}"
        );
        if offload && e.offloads().tun_tso {
            assert!(
                s.batching.gso_super_packets > 0,
                "TSO super-packets were segmented: {s:?}"
            );
        }
    }
    for e in engines {
        e.stop();
    }
    assert!(
        !try_sh(&["ip", "-n", &t.node(1), "link", "show", DEV]),
        "tun gone after stop"
    );
}

#[test]
fn ipip_ping_and_tcp_with_offloads() {
    if !require_root_and_tun() {
        return;
    }
    traffic("ii", true);
}

#[test]
fn ipip_ping_and_tcp_without_offloads() {
    if !require_root_and_tun() {
        return;
    }
    traffic("in", false);
}

/// What tcpdump on the underlay sees: IPv4 protocol 4 from node 1 to node 2,
/// outer TTL = inner TTL, and the inner ICMP packet right behind the outer header.
#[test]
fn ipip_wire_format() {
    if !require_root_and_tun() {
        return;
    }
    let (t, _engines) = two_nodes("iw", true);
    assert!(t.ping_eventually(1, "10.244.2.2", &[]));
    let node2 = t.node(2);
    let dump = Command::new("ip")
        .args([
            "netns",
            "exec",
            &node2,
            "tcpdump",
            "-n",
            "-v",
            "-x",
            "-c",
            "1",
            "-i",
            "eth0",
            "ip proto 4",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tcpdump");
    std::thread::sleep(Duration::from_millis(800));
    // TTL 33, DSCP 0x2e with ECN ECT(1): tos 0xb9.
    assert!(
        t.ping(1, "10.244.2.2", &["-t", "33", "-Q", "0xb9", "-M", "do"]),
        "ping with TTL 33"
    );
    let out = dump.wait_with_output().expect("tcpdump output");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    // Outer: tos = the inner ECN bits only, ttl 32 (the pod's 33 minus node 1's
    // forwarding hop), DF copied, proto 4.
    assert!(
        text.contains("192.0.2.1 > 192.0.2.2"),
        "outer addresses: {text}"
    );
    assert!(
        text.contains("IP (tos 0x1,ECT(1), ttl 32, ")
            && text.contains("flags [DF], proto IPIP (4)")
            && text.contains("IP (tos 0xb9,ECT(1), ttl 32, "),
        "outer ttl and protocol: {text}"
    );
    assert!(
        text.contains("10.244.1.2 > 10.244.2.2: ICMP echo request"),
        "inner packet: {text}"
    );
    let hex: String = text
        .lines()
        .filter(|l| l.trim_start().starts_with("0x"))
        .flat_map(|l| {
            l.split_whitespace()
                .skip(1)
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect();
    // Inner IPv4 header starts at byte 20 (hex offset 40): no extra header.
    assert!(hex.len() > 48, "hex dump: {text}");
    assert_eq!(&hex[..2], "45", "outer version/ihl: {hex}");
    assert_eq!(
        &hex[40..42],
        "45",
        "inner header right after the outer one: {hex}"
    );
}

/// An outer packet larger than the underlay MTU is refused, DF or not:
/// with the TUN MTU raised above ext − 20, full-size packets are counted as
/// `mtu` drops and never leave (the kernel does not fragment them).
#[test]
fn ipip_oversize_outer_packets_are_not_sent() {
    if !require_root_and_tun() {
        return;
    }
    let (t, engines) = two_nodes("im", false);
    assert!(t.ping_eventually(1, "10.244.2.2", &[]));
    t.ip(1, &["link", "set", DEV, "mtu", "1500"]);
    let before = engines[1].stats().rx_packets;
    assert!(
        !t.ping(1, "10.244.2.2", &["-M", "do", "-s", "1472"]),
        "1500-byte inner packet with DF"
    );
    wait_stats(&engines[0], "DF oversize counted", |s| s.drops.mtu >= 2);
    assert!(
        !t.ping(1, "10.244.2.2", &["-M", "dont", "-s", "1472", "-c", "1"]),
        "1500-byte inner packet without DF"
    );
    wait_stats(&engines[0], "non-DF oversize counted", |s| s.drops.mtu >= 3);
    assert_eq!(
        engines[1].stats().rx_packets,
        before,
        "nothing oversize arrived at node 2"
    );
    assert!(
        t.ping(1, "10.244.2.2", &["-s", "1452"]),
        "packets that fit still pass"
    );
}

/// Hand-made IPIP packets sent to node 1 from node 2's namespace through an
/// `IPPROTO_RAW` socket (any outer source).
#[test]
fn ipip_bad_packets_are_dropped_and_counted() {
    if !require_root_and_tun() {
        return;
    }
    let (t, engines) = two_nodes("ib", true);
    assert!(t.ping_eventually(2, "10.244.1.2", &[]));
    let e = &engines[0];
    let base = e.stats();
    let inner = |src: [u8; 4]| {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ipv4(src, [10, 244, 1, 2], 64)
            .udp(5000, 9)
            .write(&mut v, b"weft-ipip-test")
            .expect("inner");
        v
    };
    let send = |outer_src: [u8; 4], payload: Vec<u8>| {
        let node = t.node(2);
        in_netns(&node, move || {
            let total = u16::try_from(20 + payload.len()).expect("len");
            let mut p = vec![0x45, 0, 0, 0, 0, 1, 0x40, 0, 64, 4, 0, 0];
            p[2..4].copy_from_slice(&total.to_be_bytes());
            p.extend_from_slice(&outer_src);
            p.extend_from_slice(&[192, 0, 2, 1]);
            p.extend_from_slice(&payload);
            let s = Socket::new(
                Domain::IPV4,
                Type::RAW,
                Some(Protocol::from(libc::IPPROTO_RAW)),
            )
            .expect("raw socket");
            let to = SockAddr::from(SocketAddr::from((Ipv4Addr::new(192, 0, 2, 1), 0)));
            s.send_to(&p, &to).expect("send");
        });
    };
    // Unknown outer source (on the underlay's prefix, so routing accepts it).
    send([192, 0, 2, 77], inner([10, 244, 2, 9]));
    wait_stats(e, "unknown outer source", |s| {
        s.drops.unknown_peer > base.drops.unknown_peer
    });
    // Known peer, inner source outside its subnet.
    send([192, 0, 2, 2], inner([10, 244, 3, 9]));
    wait_stats(e, "spoofed inner source", |s| {
        s.drops.spoofed_source > base.drops.spoofed_source
    });
    // Known peer, inner packet truncated / not IPv4 / a bare outer header.
    let mut short = inner([10, 244, 2, 9]);
    short.truncate(24);
    send([192, 0, 2, 2], short);
    let mut v6 = inner([10, 244, 2, 9]);
    v6[0] = 0x60;
    send([192, 0, 2, 2], v6);
    send([192, 0, 2, 2], Vec::new());
    wait_stats(e, "malformed", |s| {
        s.drops.malformed >= base.drops.malformed + 3
    });
    // A good one still passes (and is counted once although two workers listen).
    let rx = e.stats().rx_packets;
    send([192, 0, 2, 2], inner([10, 244, 2, 9]));
    wait_stats(e, "valid packet delivered", |s| s.rx_packets == rx + 1);
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(e.stats().rx_packets, rx + 1, "delivered exactly once");
    let s = e.stats();
    assert_eq!(s.drops.unknown_peer, base.drops.unknown_peer + 1, "{s:?}");
    assert_eq!(
        s.drops.spoofed_source,
        base.drops.spoofed_source + 1,
        "{s:?}"
    );
    assert_eq!(s.drops.malformed, base.drops.malformed + 3, "{s:?}");
}
