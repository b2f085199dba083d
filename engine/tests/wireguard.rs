//! The WireGuard engine against a boringtun peer driven by the test (root,
//! one network namespace): handshake, data both ways through the kernel
//! (ICMP echo to the TUN address), and the drop counters for replayed
//! packets, bad MACs, unknown keys and spoofed inner sources.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::time::Duration;

use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519::{PublicKey, StaticSecret};
use weft_engine::{Encap, Engine, EngineConfig, Peer, Stats, WgPeer, WgSecret};

const ENGINE_KEY: [u8; 32] = [0x11; 32];
const PEER_KEY: [u8; 32] = [0x22; 32];
const STRANGER_KEY: [u8; 32] = [0x33; 32];
const PEER_PORT: u16 = 51999;

fn tunn(own: [u8; 32], peer_public: [u8; 32], idx: u32) -> Tunn {
    Tunn::new(
        StaticSecret::from(own),
        PublicKey::from(peer_public),
        None,
        None,
        idx,
        None,
    )
}

/// ICMP echo request `src -> dst` (IPv4).
fn echo(src: [u8; 4], dst: [u8; 4], seq: u16) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4(src, dst, 64)
        .icmpv4_echo_request(7, seq)
        .write(&mut v, b"weft-wireguard-test")
        .expect("build");
    v
}

struct PeerSide {
    sock: UdpSocket,
    tunn: Tunn,
    engine: SocketAddr,
    buf: Vec<u8>,
}

impl PeerSide {
    fn send(&self, d: &[u8]) {
        self.sock.send_to(d, self.engine).expect("send");
    }

    /// Receives and decapsulates until an inner packet arrives (answering
    /// handshake messages on the way); `None` on timeout.
    fn recv_inner(&mut self) -> Option<Vec<u8>> {
        let mut rx = vec![0u8; 65536];
        loop {
            let (n, from) = self.sock.recv_from(&mut rx).ok()?;
            let mut out = Vec::new();
            match self
                .tunn
                .decapsulate(Some(from.ip()), &rx[..n], &mut self.buf)
            {
                TunnResult::WriteToNetwork(p) => out.push(p.to_vec()),
                TunnResult::WriteToTunnelV4(p, _) => return Some(p.to_vec()),
                _ => {}
            }
            while let TunnResult::WriteToNetwork(p) =
                self.tunn.decapsulate(None, &[], &mut self.buf)
            {
                out.push(p.to_vec());
            }
            for p in out {
                self.send(&p);
            }
        }
    }

    fn seal(&mut self, inner: &[u8]) -> Vec<u8> {
        match self.tunn.encapsulate(inner, &mut self.buf) {
            TunnResult::WriteToNetwork(p) => p.to_vec(),
            other => panic!("no session: {other:?}"),
        }
    }
}

fn wait_stats(e: &Engine, what: &str, f: impl Fn(&Stats) -> bool) {
    let ok = common::wait_for(10, || f(&e.stats()));
    assert!(ok, "{what}: {:?}", e.stats());
}

#[test]
fn wireguard_engine_talks_to_boringtun_and_counts_drops() {
    if !common::require_root_and_tun() {
        return;
    }
    let mut topo = common::Topo::new("wge", 0);
    let ns = topo.add_ns("a");
    common::sh(&["ip", "-n", &ns, "link", "set", "lo", "up"]);
    let engine_pub = WgSecret(ENGINE_KEY).public_key();
    let peer_pub = WgSecret(PEER_KEY).public_key();
    let cfg = EngineConfig {
        tun_name: "flannel-wg".into(),
        encap: Encap::WireGuard {
            port: 51820,
            private_key: WgSecret(ENGINE_KEY),
        },
        local_addr: "127.0.0.1".parse().expect("ip"),
        tun_addr: None,
        mtu: 1420,
        workers: 2,
        offload: true,
        anti_spoof: true,
        tunnel_tap: None,
    };
    let engine = common::start_engine(&ns, cfg);
    common::sh(&[
        "ip",
        "-n",
        &ns,
        "addr",
        "add",
        "10.244.1.0/32",
        "dev",
        "flannel-wg",
    ]);
    common::sh(&[
        "ip",
        "-n",
        &ns,
        "link",
        "set",
        "flannel-wg",
        "mtu",
        "1420",
        "up",
    ]);
    common::sh(&[
        "ip",
        "-n",
        &ns,
        "route",
        "add",
        "10.244.0.0/16",
        "dev",
        "flannel-wg",
        "scope",
        "link",
    ]);
    let engine = std::sync::Arc::new(engine);
    let e = engine.clone();
    common::in_netns(&ns, move || {
        let sock = UdpSocket::bind(("127.0.0.1", PEER_PORT)).expect("bind");
        sock.set_read_timeout(Some(Duration::from_secs(3)))
            .expect("timeout");
        let mut p = PeerSide {
            sock,
            tunn: tunn(PEER_KEY, engine_pub, 0x42),
            engine: "127.0.0.1:51820".parse().expect("sa"),
            buf: vec![0u8; 65536],
        };
        e.set_peers(vec![Peer {
            subnet: "10.244.2.0/24".parse().expect("cidr"),
            endpoint: "127.0.0.1".parse().expect("ip"),
            vtep_mac: None,
            nat: None,
            wireguard: Some(WgPeer {
                public_key: peer_pub,
                port: PEER_PORT,
                psk: None,
                keepalive: 0,
            }),
            tunnel_gso: false,
        }]);
        // A new peer gets a handshake initiation right away, without traffic
        // (a restarted node must not wait for the peer's rekey timer).
        let mut rx = vec![0u8; 2048];
        let (n, from) = p.sock.recv_from(&mut rx).expect("unprompted initiation");
        assert_eq!(
            (rx[0], from.port()),
            (1, 51820),
            "initiation from the listen port"
        );
        // ... and noted: the peer now refuses older handshake timestamps
        // from our key (a kernel WireGuard taking over must wait for it).
        let noted = e
            .peer_stats()
            .and_then(|v| v.first().and_then(|(_, s)| s.last_initiation))
            .expect("last initiation noted");
        let age = std::time::SystemTime::now()
            .duration_since(noted)
            .expect("not in the future");
        assert!(age < Duration::from_secs(10), "noted {age:?} ago");
        let resp = match p.tunn.decapsulate(Some(from.ip()), &rx[..n], &mut p.buf) {
            TunnResult::WriteToNetwork(r) => r.to_vec(),
            other => panic!("not an initiation: {other:?}"),
        };
        p.send(&resp);
        let (n, _) = p
            .sock
            .recv_from(&mut rx)
            .expect("keepalive confirming the session");
        assert_eq!((rx[0], n), (4, 32), "a keepalive data packet");
        assert!(matches!(
            p.tunn.decapsulate(Some(from.ip()), &rx[..n], &mut p.buf),
            TunnResult::Done
        ));

        // Handshake the other way: initiation -> response -> our keepalive.
        let init = match p.tunn.format_handshake_initiation(&mut p.buf, false) {
            TunnResult::WriteToNetwork(i) => i.to_vec(),
            other => panic!("{other:?}"),
        };
        p.send(&init);
        let mut rx = vec![0u8; 2048];
        let (n, from) = p.sock.recv_from(&mut rx).expect("handshake response");
        assert_eq!(from.port(), 51820, "answers come from the listen port");
        let ka = match p.tunn.decapsulate(Some(from.ip()), &rx[..n], &mut p.buf) {
            TunnResult::WriteToNetwork(k) => k.to_vec(),
            other => panic!("not a response: {other:?}"),
        };
        p.send(&ka);

        // Data both ways: an echo request to the TUN address comes back as a reply.
        let req = p.seal(&echo([10, 244, 2, 2], [10, 244, 1, 0], 1));
        p.send(&req);
        let reply = p.recv_inner().expect("echo reply through the tunnel");
        assert_eq!(&reply[12..16], &[10, 244, 1, 0]);
        assert_eq!(&reply[16..20], &[10, 244, 2, 2]);
        assert_eq!(reply[20], 0, "ICMP echo reply");
        wait_stats(&e, "one packet each way", |s| {
            s.rx_packets >= 1 && s.tx_packets >= 1
        });

        // Replay of the request.
        p.send(&req);
        wait_stats(&e, "replay counted", |s| s.drops.replay >= 1);

        // A data packet with a flipped ciphertext byte.
        let mut bad = p.seal(&echo([10, 244, 2, 2], [10, 244, 1, 0], 2));
        bad[20] ^= 0x55;
        p.send(&bad);
        wait_stats(&e, "bad tag counted", |s| s.drops.decrypt_failure >= 1);

        // A handshake initiation with a broken MAC1.
        let mut other = tunn(PEER_KEY, engine_pub, 0x43);
        let mut hb = vec![0u8; 256];
        let mut init2 = match other.format_handshake_initiation(&mut hb, false) {
            TunnResult::WriteToNetwork(i) => i.to_vec(),
            r => panic!("{r:?}"),
        };
        init2[120] ^= 1;
        p.send(&init2);
        wait_stats(&e, "bad mac1 counted", |s| s.drops.decrypt_failure >= 2);

        // A valid initiation from a key that is not a peer.
        let mut stranger = tunn(STRANGER_KEY, engine_pub, 0x44);
        let init3 = match stranger.format_handshake_initiation(&mut hb, false) {
            TunnResult::WriteToNetwork(i) => i.to_vec(),
            r => panic!("{r:?}"),
        };
        p.send(&init3);
        wait_stats(&e, "unknown key counted", |s| s.drops.unknown_key >= 1);

        // Junk of every length does not hurt.
        for len in [0usize, 1, 4, 16, 31, 32, 92, 147, 148, 149, 1500] {
            let mut j = vec![0u8; len];
            for (i, b) in j.iter_mut().enumerate() {
                *b = (i * 7 + len) as u8;
            }
            if let Some(b) = j.first_mut() {
                *b = (len % 5) as u8;
            }
            p.send(&j);
        }

        // An inner source outside the peer's AllowedIPs.
        let spoof = p.seal(&echo([10, 244, 9, 9], [10, 244, 1, 0], 3));
        p.send(&spoof);
        wait_stats(&e, "spoofed source counted", |s| {
            s.drops.spoofed_source >= 1
        });

        // Still working afterwards.
        let req = p.seal(&echo([10, 244, 2, 2], [10, 244, 1, 0], 4));
        p.send(&req);
        let reply = p.recv_inner().expect("echo reply after the bad packets");
        assert_eq!(&reply[16..20], &[10, 244, 2, 2]);
    });
    let s = engine.stats();
    eprintln!("{s:?}");
    assert!(
        s.drops.replay >= 1
            && s.drops.decrypt_failure >= 2
            && s.drops.unknown_key >= 1
            && s.drops.spoofed_source >= 1
    );
    drop(engine);
}
