//! Root test: the masquerade rules change real traffic as flannel's do.
//!
//! Topology (all in our own namespaces):
//!
//! ```text
//! pod 10.244.1.2/24 --veth-- node 10.244.1.1/24 | 192.0.2.1/24 --veth-- outside 192.0.2.2/24
//!                                                                       + 10.244.2.2 (a pod of
//!                                                                         another node, on lo)
//! ```
//!
//! A TCP listener in `outside` tells each client which source address it saw. Pod → 192.0.2.2
//! (non-cluster) must arrive from the node's 192.0.2.1; pod → 10.244.2.2 (in-cluster) must keep
//! the pod's 10.244.1.2. Before the rules are installed both keep the pod address, which shows
//! that the translation comes from the manager's rules.

mod traffic_util;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpListener, TcpStream},
    time::Duration,
};

use traffic_util::Netns;
use weft_control::traffic::{Kind, Networks, new_manager};
use weft_testenv::require_root;

struct Topology {
    pod: Netns,
    node: Netns,
    outside: Netns,
}

fn topology(tag: &str) -> Topology {
    let t = Topology {
        pod: Netns::new(&format!("{tag}-pod")),
        node: Netns::new(&format!("{tag}-node")),
        outside: Netns::new(&format!("{tag}-out")),
    };
    let (pod, node, out) = (&t.pod.name, &t.node.name, &t.outside.name);
    traffic_util::sh(&[
        "ip", "-n", node, "link", "add", "vpod", "type", "veth", "peer", "name", "eth0", "netns",
        pod,
    ]);
    traffic_util::sh(&[
        "ip", "-n", node, "link", "add", "vout", "type", "veth", "peer", "name", "eth0", "netns",
        out,
    ]);
    t.pod
        .exec(&["ip", "addr", "add", "10.244.1.2/24", "dev", "eth0"]);
    t.pod.exec(&["ip", "link", "set", "eth0", "up"]);
    t.pod
        .exec(&["ip", "route", "add", "default", "via", "10.244.1.1"]);
    t.node
        .exec(&["ip", "addr", "add", "10.244.1.1/24", "dev", "vpod"]);
    t.node
        .exec(&["ip", "addr", "add", "192.0.2.1/24", "dev", "vout"]);
    t.node.exec(&["ip", "link", "set", "vpod", "up"]);
    t.node.exec(&["ip", "link", "set", "vout", "up"]);
    t.node
        .exec(&["ip", "route", "add", "10.244.2.0/24", "via", "192.0.2.2"]);
    t.node.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    t.outside
        .exec(&["ip", "addr", "add", "192.0.2.2/24", "dev", "eth0"]);
    t.outside
        .exec(&["ip", "addr", "add", "10.244.2.2/32", "dev", "lo"]);
    t.outside.exec(&["ip", "link", "set", "eth0", "up"]);
    t.outside
        .exec(&["ip", "route", "add", "10.244.1.0/24", "via", "192.0.2.1"]);
    t
}

/// Connects from the pod to each target; returns the source address the listener saw for each.
fn seen_sources(t: &Topology, targets: &'static [&'static str]) -> Vec<String> {
    let server = t.outside.run(move || {
        let listener = TcpListener::bind("0.0.0.0:8080").expect("bind");
        for _ in targets {
            let (mut conn, peer) = listener.accept().expect("accept");
            conn.write_all(peer.ip().to_string().as_bytes())
                .expect("reply");
        }
    });
    let client = t.pod.run(move || {
        targets
            .iter()
            .map(|ip| {
                let addr: SocketAddr = format!("{ip}:8080").parse().expect("addr");
                // The listener may not be bound yet: retry for a while.
                let mut conn = (0..300)
                    .find_map(|_| {
                        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
                            .inspect_err(|_| std::thread::sleep(Duration::from_millis(100)))
                            .ok()
                    })
                    .expect("connect");
                conn.set_read_timeout(Some(Duration::from_secs(30)))
                    .expect("timeout");
                let mut seen = String::new();
                conn.read_to_string(&mut seen).expect("read");
                seen
            })
            .collect::<Vec<_>>()
    });
    let seen = client.join().expect("client thread");
    server.join().expect("server thread");
    seen
}

fn masquerades_only_non_cluster_traffic(kind: Kind, tag: &str) {
    let t = topology(tag);
    const TARGETS: &[&str] = &["192.0.2.2", "10.244.2.2"];
    assert_eq!(
        seen_sources(&t, TARGETS),
        ["10.244.1.2", "10.244.1.2"],
        "no NAT before setup"
    );

    let mgr = new_manager(kind, false, t.node.runner());
    weft_control::traffic::cleanup_other(kind, false, t.node.runner()).expect("cleanup other");
    mgr.init().expect("init");
    let network = Networks {
        v4: Some("10.244.0.0/16".parse().expect("cidr")),
        v6: None,
    };
    let subnet = Networks {
        v4: Some("10.244.1.0/24".parse().expect("cidr")),
        v6: None,
    };
    mgr.setup_masq(&network, &subnet, None).expect("masq");
    mgr.setup_forward(&network, None).expect("forward");

    assert_eq!(
        seen_sources(&t, TARGETS),
        ["192.0.2.1", "10.244.1.2"],
        "non-cluster traffic masqueraded to the node address, pod-to-pod traffic untouched"
    );
}

#[test]
fn iptables_masquerades_only_non_cluster_traffic() {
    require_root!();
    masquerades_only_non_cluster_traffic(Kind::Iptables, "mq-ipt");
}

#[test]
fn nftables_masquerades_only_non_cluster_traffic() {
    require_root!();
    masquerades_only_non_cluster_traffic(Kind::Nftables, "mq-nft");
}
