//! Root integration tests: real TUN devices, sockets and kernel stacks in
//! network namespaces. Without root or `/dev/net/tun` they skip (logged), or
//! fail under CI (see `weft_testenv`).

mod common;

use std::net::UdpSocket;

use common::*;
use weft_engine::{Encap, Engine, EngineConfig};

fn vxlan_cfg(n: usize) -> EngineConfig {
    EngineConfig {
        tun_name: "flannel.1".into(),
        encap: Encap::Vxlan {
            vni: 1,
            port: 8472,
            local_mac: mac_of(n),
        },
        tun_addr: None,
        mtu: 1450,
        ..udp_cfg(n)
    }
}

/// Pods on 3 nodes reach each other; MTU-sized DF pings pass; TCP bulk both
/// ways; removing a peer cuts it off and re-adding restores it.
fn three_nodes(test: &str, vxlan: bool, offload: bool) {
    let mut t = Topo::new(test, 3);
    let (dev, mtu) = if vxlan {
        ("flannel.1", 1450u16)
    } else {
        ("flannel0", 1472u16)
    };
    let engines: Vec<Engine> = (1..=3)
        .map(|n| {
            let mut cfg = if vxlan { vxlan_cfg(n) } else { udp_cfg(n) };
            cfg.offload = offload;
            let e = start_engine(&t.node(n), cfg);
            e.set_peers(peers_for(n, 3, &[], vxlan));
            assert_eq!(e.tun_name(), dev);
            e
        })
        .collect();
    // The engine lengthens the TUN transmit queue (the default 500 overflows under load).
    for n in 1..=3 {
        let qlen = sh(&[
            "ip",
            "netns",
            "exec",
            &t.node(n),
            "cat",
            &format!("/sys/class/net/{dev}/tx_queue_len"),
        ]);
        assert_eq!(
            qlen.trim(),
            weft_engine::TUN_TXQUEUELEN.to_string(),
            "node {n} {dev} tx_queue_len"
        );
    }
    for n in 1..=3 {
        if vxlan {
            let others: Vec<usize> = (1..=3).filter(|m| *m != n).collect();
            t.configure_vxlan_tun(n, dev, mtu, &others);
        } else {
            t.configure_udp_tun(n, dev, mtu);
        }
    }
    for a in 1..=3 {
        for b in 1..=3 {
            if a != b {
                assert!(
                    t.ping_eventually(a, &format!("10.244.{b}.2"), &[]),
                    "pod {a} -> pod {b}"
                );
            }
        }
    }
    let size = (mtu - 28).to_string();
    assert!(
        t.ping(1, "10.244.2.2", &["-M", "do", "-s", &size]),
        "MTU-sized DF ping"
    );
    let too_big = (mtu - 27).to_string();
    assert!(
        !t.ping(1, "10.244.2.2", &["-M", "do", "-s", &too_big]),
        "one byte over the MTU must not pass with DF"
    );
    t.iperf(1, 2, false);
    t.iperf(3, 1, true);
    let s = engines[0].stats();
    assert!(s.tx_packets > 1000 && s.rx_packets > 1000, "{s:?}");
    if offload && engines[0].offloads().tun_tso {
        assert!(
            s.batching.gso_super_packets > 0,
            "TSO super-packets were segmented: {s:?}"
        );
    }

    // One report: the totals and every peer joined to its own counters.
    // Per-peer counters move with each packet, a worker's totals once per
    // loop round, so a packet still in flight (a late ACK) can be in the
    // first and not yet in the second: read again once the workers settle.
    let mut settled = None;
    for _ in 0..50 {
        let r = engines[0].report();
        let peer_tx: u64 = r
            .peers
            .iter()
            .map(|p| p.stats.expect("per-peer counters").tx_packets)
            .sum();
        if peer_tx <= r.stats.tx_packets {
            settled = Some((r, peer_tx));
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let (r, peer_tx) = settled.expect("per-peer tx counts never settled under the total");
    assert_eq!(r.peers.len(), 2, "{r:?}");
    assert!(peer_tx > 1000, "{r:?}");

    // Node 3's lease goes away on node 1: pod 1 can no longer reach pod 3.
    engines[0].set_peers(peers_for(1, 3, &[3], vxlan));
    assert!(engines[0].peers().len() == 1);
    let before = engines[0].stats().drops.no_route;
    assert!(
        !t.ping(1, "10.244.3.2", &[]),
        "removed peer still reachable"
    );
    assert!(
        engines[0].stats().drops.no_route > before,
        "no_route counted"
    );
    assert!(t.ping(1, "10.244.2.2", &[]), "other peer unaffected");
    engines[0].set_peers(peers_for(1, 3, &[], vxlan));
    assert!(
        t.ping_eventually(1, "10.244.3.2", &[]),
        "re-added peer reachable"
    );

    for e in engines {
        e.stop();
    }
    // stop() closes every queue: the TUN disappears (within a moment).
    assert!(t.link_gone(1, dev), "tun device must be gone after stop");
}

#[test]
fn udp_three_nodes() {
    if !require_root_and_tun() {
        return;
    }
    three_nodes("u3", false, true);
}

#[test]
fn vxlan_three_nodes() {
    if !require_root_and_tun() {
        return;
    }
    three_nodes("x3", true, true);
}

#[test]
fn vxlan_three_nodes_without_offloads() {
    if !require_root_and_tun() {
        return;
    }
    three_nodes("x3n", true, false);
}

/// flannel-UDP writes an ICMP net-unreachable into the TUN for unrouted destinations.
#[test]
fn udp_icmp_net_unreachable() {
    if !require_root_and_tun() {
        return;
    }
    let t = Topo::new("icmp", 1);
    let e = start_engine(&t.node(1), udp_cfg(1));
    t.configure_udp_tun(1, "flannel0", 1472);
    // A UDP probe (ICMP offenders get no ICMP error) to a subnet without a peer.
    let pod = t.pod(1);
    let got = wait_for(10, || {
        let _ = in_netns(&pod, || {
            let s = UdpSocket::bind("10.244.1.2:0").expect("bind");
            s.send_to(b"probe", "10.244.77.1:9").map(drop)
        });
        e.stats().batching.icmp_sent > 0
    });
    assert!(got, "no ICMP generated: {:?}", e.stats());
    assert!(e.stats().drops.no_route > 0);
}

/// Userspace VXLAN on node 1 against a kernel vxlan device set up exactly as flannel does on node 2.
#[test]
fn vxlan_kernel_interop() {
    if !require_root_and_tun() {
        return;
    }
    for offload in [true, false] {
        let mut t = Topo::new(if offload { "ko" } else { "kn" }, 2);
        let mut cfg = vxlan_cfg(1);
        cfg.offload = offload;
        let e = start_engine(&t.node(1), cfg);
        e.set_peers(peers_for(1, 2, &[], true));
        t.configure_vxlan_tun(1, "flannel.1", 1450, &[2]);
        t.kernel_vxlan(2, &mac_str(2), &[(1, &mac_str(1))]);
        assert!(t.ping_eventually(1, "10.244.2.2", &[]), "weft -> kernel");
        assert!(t.ping_eventually(2, "10.244.1.2", &[]), "kernel -> weft");
        assert!(
            t.ping(1, "10.244.2.2", &["-M", "do", "-s", "1422"]),
            "MTU ping weft -> kernel"
        );
        assert!(
            t.ping(2, "10.244.1.2", &["-M", "do", "-s", "1422"]),
            "MTU ping kernel -> weft"
        );
        t.iperf(1, 2, false);
        t.iperf(2, 1, false);
        let s = e.stats();
        assert_eq!(
            s.drops.wrong_dst_mac + s.drops.bad_vni + s.drops.malformed,
            0,
            "{s:?}"
        );
        e.stop();
    }
}

/// Garbage at the engine's port is dropped and counted by reason; the engine keeps forwarding.
#[test]
fn garbage_is_dropped_and_counted() {
    if !require_root_and_tun() {
        return;
    }
    let t = Topo::new("junk", 2);
    let e = start_engine(&t.node(1), vxlan_cfg(1));
    e.set_peers(peers_for(1, 2, &[], true));
    t.configure_vxlan_tun(1, "flannel.1", 1450, &[2]);
    // Node 2 has no engine: the test sends crafted datagrams from its address.
    let valid_inner = {
        let mut v = Vec::new();
        etherparse::PacketBuilder::ipv4([10, 244, 2, 2], [10, 244, 1, 2], 64)
            .udp(1, 2)
            .write(&mut v, b"hello")
            .expect("build");
        v
    };
    let frame = |vni: u32, dst: [u8; 6], inner: &[u8]| {
        let mut f = vec![0x08, 0, 0, 0];
        f.extend_from_slice(&vni.to_be_bytes()[1..]);
        f.push(0);
        f.extend_from_slice(&dst);
        f.extend_from_slice(&mac_of(2));
        f.extend_from_slice(&[0x08, 0x00]);
        f.extend_from_slice(inner);
        f
    };
    let mut spoofed = valid_inner.clone();
    spoofed[12..16].copy_from_slice(&[10, 244, 9, 9]);
    spoofed[10..12].fill(0);
    let c = weft_engine::wire::checksum::checksum(&spoofed[..20]);
    spoofed[10..12].copy_from_slice(&c.to_be_bytes());
    let mut bad_len = valid_inner.clone();
    bad_len[2..4].copy_from_slice(&5000u16.to_be_bytes());
    let datagrams: Vec<Vec<u8>> = vec![
        vec![],
        vec![0x08],
        vec![0; 7],
        vec![0; 64],                                // no I flag
        frame(2, mac_of(1), &valid_inner),          // bad VNI
        frame(1, [2, 9, 9, 9, 9, 9], &valid_inner), // wrong dst MAC
        frame(1, mac_of(1), &valid_inner[..10]),    // truncated inner
        frame(1, mac_of(1), &bad_len),              // lying length
        frame(1, mac_of(1), &spoofed),              // inner source outside node 2's subnet
        frame(1, mac_of(1), &valid_inner),          // valid
    ];
    let node2 = t.node(2);
    let sent = datagrams.clone();
    in_netns(&node2, move || {
        let s = UdpSocket::bind("192.0.2.2:0").expect("bind");
        for d in &sent {
            s.send_to(d, "192.0.2.1:8472").expect("send");
        }
    });
    let ok = wait_for(10, || {
        let d = e.stats().drops;
        d.bad_vni == 1
            && d.wrong_dst_mac == 1
            && d.spoofed_source == 1
            && d.malformed == 6
            && e.stats().rx_packets == 1
    });
    assert!(ok, "counters: {:?}", e.stats());

    // From an address that is not a peer: every datagram counts as unknown_peer.
    t.ip(2, &["addr", "add", "192.0.2.66/24", "dev", "eth0"]);
    let sent = datagrams.clone();
    in_netns(&node2, move || {
        let s = UdpSocket::bind("192.0.2.66:0").expect("bind");
        for d in &sent {
            s.send_to(d, "192.0.2.1:8472").expect("send");
        }
    });
    assert!(
        wait_for(10, || e.stats().drops.unknown_peer
            == datagrams.len() as u64),
        "{:?}",
        e.stats()
    );
    assert_eq!(e.stats().rx_packets, 1);
    e.stop();
    // The next engine must not attach to the old device (its address is still on).
    assert!(
        t.link_gone(1, "flannel.1"),
        "flannel.1 outlived its engine by 5 s"
    );

    // With anti-spoofing off the spoofed and the stranger's packets are delivered.
    let mut cfg = vxlan_cfg(1);
    cfg.anti_spoof = false;
    let e = start_engine(&t.node(1), cfg);
    e.set_peers(peers_for(1, 2, &[], true));
    t.configure_vxlan_tun(1, "flannel.1", 1450, &[2]);
    let sent = datagrams.clone();
    in_netns(&node2, move || {
        let s = UdpSocket::bind("192.0.2.66:0").expect("bind");
        for d in &sent {
            s.send_to(d, "192.0.2.1:8472").expect("send");
        }
    });
    assert!(
        wait_for(10, || e.stats().rx_packets == 2),
        "{:?}",
        e.stats()
    );
    assert_eq!(
        e.stats().drops.unknown_peer + e.stats().drops.spoofed_source,
        0
    );

    // flannel-UDP: short and TTL-1 packets.
    let u = {
        let mut cfg = udp_cfg(1);
        cfg.tun_name = "flannel9".into();
        start_engine(&t.node(1), cfg)
    };
    u.set_peers(peers_for(1, 2, &[], false));
    let mut ttl1 = valid_inner.clone();
    ttl1[8] = 1;
    let sent = vec![
        vec![0x45; 19],
        vec![0x60; 40],
        ttl1,
        valid_inner.clone(),
        vec![0xff; 3000],
    ];
    in_netns(&node2, move || {
        let s = UdpSocket::bind("192.0.2.2:0").expect("bind");
        for d in &sent {
            s.send_to(d, "192.0.2.1:8285").expect("send");
        }
    });
    let ok = wait_for(10, || {
        let s = u.stats();
        s.drops.malformed == 3 && s.drops.ttl_expired == 1 && s.rx_packets == 1
    });
    assert!(ok, "{:?}", u.stats());
    drop(t);
}

/// Dual stack as flannel's vxlan backend runs it: a v4 engine (`flannel.1`) and
/// a v6 engine with a v6 underlay (`flannel-v6.1`) side by side on each node.
#[test]
fn vxlan_dual_stack() {
    if !require_root_and_tun() {
        return;
    }
    let mut t = Topo::new("ds", 2);
    let mut engines = Vec::new();
    for n in 1..=2usize {
        let m = 3 - n;
        let node = t.node(n);
        sh(&[
            "ip",
            "netns",
            "exec",
            &node,
            "sysctl",
            "-qw",
            "net.ipv6.conf.all.forwarding=1",
        ]);
        t.ip(
            n,
            &[
                "addr",
                "add",
                &format!("2001:db8::{n}/64"),
                "dev",
                "eth0",
                "nodad",
            ],
        );
        t.ip(
            n,
            &[
                "addr",
                "add",
                &format!("fd00:10:244:{n}::1/64"),
                "dev",
                "cni0",
                "nodad",
            ],
        );
        let pod = t.pod(n);
        sh(&[
            "ip",
            "-n",
            &pod,
            "addr",
            "add",
            &format!("fd00:10:244:{n}::2/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        sh(&[
            "ip",
            "-n",
            &pod,
            "-6",
            "route",
            "add",
            "default",
            "via",
            &format!("fd00:10:244:{n}::1"),
        ]);

        let v4 = start_engine(&node, vxlan_cfg(n));
        v4.set_peers(peers_for(n, 2, &[], true));
        t.configure_vxlan_tun(n, "flannel.1", 1450, &[m]);
        let mac6 = [0x02, 0, 0, 6, u8::try_from(n).expect("small"), 1];
        let peer_mac6 = [0x02, 0, 0, 6, u8::try_from(m).expect("small"), 1];
        let cfg6 = EngineConfig {
            tun_name: "flannel-v6.1".into(),
            encap: Encap::Vxlan {
                vni: 1,
                port: 8472,
                local_mac: mac6,
            },
            local_addr: format!("2001:db8::{n}").parse().expect("v6"),
            mtu: 1430,
            ..vxlan_cfg(n)
        };
        let v6 = start_engine(&node, cfg6);
        v6.set_peers(vec![weft_engine::Peer {
            subnet: format!("fd00:10:244:{m}::/64").parse().expect("cidr"),
            endpoint: format!("2001:db8::{m}").parse().expect("v6"),
            vtep_mac: Some(peer_mac6),
            nat: None,
            wireguard: None,
            tunnel_gso: false,
        }]);
        t.ip(
            n,
            &[
                "addr",
                "add",
                &format!("fd00:10:244:{n}::/128"),
                "dev",
                "flannel-v6.1",
                "nodad",
            ],
        );
        t.ip(n, &["link", "set", "flannel-v6.1", "mtu", "1430", "up"]);
        t.ip(
            n,
            &[
                "-6",
                "route",
                "add",
                &format!("fd00:10:244:{m}::/64"),
                "dev",
                "flannel-v6.1",
            ],
        );
        engines.push((v4, v6));
    }
    assert!(t.ping_eventually(1, "10.244.2.2", &[]), "v4");
    assert!(
        t.ping_eventually(1, "fd00:10:244:2::2", &[]),
        "v6 pod 1 -> 2"
    );
    assert!(
        t.ping_eventually(2, "fd00:10:244:1::2", &[]),
        "v6 pod 2 -> 1"
    );
    assert!(
        t.ping(1, "fd00:10:244:2::2", &["-M", "do", "-s", "1382"]),
        "v6 MTU-sized ping"
    );
    // TCP bulk over v6 inner + v6 underlay.
    let pod2 = t.pod(2);
    t.spawn(&[
        "ip",
        "netns",
        "exec",
        &pod2,
        "iperf3",
        "-s",
        "-1",
        "-B",
        "fd00:10:244:2::2",
    ]);
    let pod1 = t.pod(1);
    let ok = wait_for(30, || {
        try_sh(&[
            "ip",
            "netns",
            "exec",
            &pod1,
            "iperf3",
            "-c",
            "fd00:10:244:2::2",
            "-t",
            "2",
            "--connect-timeout",
            "2000",
        ])
    });
    assert!(ok, "v6 iperf3");
    let s6 = engines[0].1.stats();
    assert!(s6.tx_packets > 1000, "{s6:?}");
    assert_eq!(engines[0].0.tun_name(), "flannel.1");
    assert_eq!(engines[0].1.tun_name(), "flannel-v6.1");
}

/// USO: a UDP socket sending with `UDP_SEGMENT` through the TUN hands the
/// engine one UDP super-packet, which it cuts into datagrams (userspace USO)
/// that a kernel vxlan peer accepts: every datagram reaches the pod behind it
/// intact, so lengths and checksums are right.
#[test]
fn uso_super_packets_are_cut_for_a_kernel_vxlan_peer() {
    const SEG: usize = 1200;
    const SEGS: usize = 20;
    if !require_root_and_tun() {
        return;
    }
    let t = Topo::new("uso", 2);
    let e = start_engine(&t.node(1), vxlan_cfg(1));
    e.set_peers(peers_for(1, 2, &[], true));
    t.configure_vxlan_tun(1, "flannel.1", 1450, &[2]);
    t.kernel_vxlan(2, &mac_str(2), &[(1, &mac_str(1))]);
    assert!(t.ping_eventually(1, "10.244.2.2", &[]), "weft -> kernel");
    let rx = in_netns(&t.pod(2), || {
        UdpSocket::bind("10.244.2.2:5555").expect("bind")
    });
    rx.set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    let tx = in_netns(&t.node(1), || {
        UdpSocket::bind("10.244.1.0:0").expect("bind")
    });
    set_udp_segment(&tx, SEG);
    let chunk = |i: usize| -> Vec<u8> {
        let mut c: Vec<u8> = (0..SEG).map(|j| ((i * 7 + j) % 251) as u8).collect();
        c[..4].copy_from_slice(&u32::try_from(i).expect("small").to_be_bytes());
        c
    };
    let data: Vec<u8> = (0..SEGS).flat_map(chunk).collect();
    let before = e.stats().batching.gso_super_packets;
    assert_eq!(
        tx.send_to(&data, "10.244.2.2:5555")
            .expect("send a UDP super-packet"),
        data.len()
    );
    let mut seen = [false; SEGS];
    let mut buf = vec![0u8; 65536];
    for _ in 0..SEGS {
        let n = rx.recv(&mut buf).expect("every segment arrives");
        assert_eq!(n, SEG, "segment length");
        let i =
            usize::try_from(u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]])).expect("index");
        assert!(i < SEGS && !seen[i], "segment {i} unexpected or twice");
        assert_eq!(buf[..n], chunk(i)[..], "segment {i} content");
        seen[i] = true;
    }
    if e.offloads().tun_uso {
        // Workers publish their counters after each step: wait for it.
        assert!(
            wait_for(5, || e.stats().batching.gso_super_packets > before),
            "the TUN handed over a UDP super-packet: {:?}",
            e.stats()
        );
    } else {
        eprintln!("note: this kernel refused TUN_F_USO4/6; the kernel segmented the UDP send");
    }
    e.stop();
}

/// Sets `UDP_SEGMENT` (UDP GSO) on `s`: each send is cut into `size`-byte datagrams.
fn set_udp_segment(s: &UdpSocket, size: usize) {
    use std::os::fd::AsRawFd;
    let v = libc::c_int::try_from(size).expect("size");
    // SAFETY: a valid socket descriptor and a c_int option value of the right length.
    let r = unsafe {
        libc::setsockopt(
            s.as_raw_fd(),
            libc::SOL_UDP,
            libc::UDP_SEGMENT,
            (&raw const v).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(r, 0, "UDP_SEGMENT: {}", std::io::Error::last_os_error());
}
