//! Nodes behind NAT on the `vxlan` (userspace dataplane) and `udp`
//! backends (docs/nat.md, "vxlan and udp"), through real weftd daemons,
//! pods from weft's CNI plugin, in the topology of `weft_tests::nat`: node 1
//! public, nodes 2 and 3 each behind a Linux MASQUERADE router of its own.
//! With NAT traversal the two nodes behind NAT discover the endpoint their
//! NAT maps for the backend port, publish it, and send each other's
//! traffic there from that port: they punch through. A flushed NAT mapping
//! heals; forged discovery answers and forged VXLAN / flannel-UDP packets
//! from an off-path address move neither a path nor a published endpoint
//! (those encapsulations authenticate nothing: paths come from the lease
//! store only). Without the feature the pair never meets. Times are
//! printed (`--nocapture`) and bounded generously.

use std::time::Duration;

use weft_testenv::{require_root, require_tool};
use weft_tests::nat::{
    NatCluster, attach_attacker, drops, flush_gap, forge, forged_answer, net_conf_for, path, start,
    wait_path, weft_nat,
};
use weft_tests::netns::Netns;
use weft_tests::ping::Stream;

/// A junk datagram that starts as the backend's own would (VXLAN flags
/// 0x08 with VNI 1; an IPv4 header's first byte), 48 bytes.
fn junk(backend: &str) -> String {
    match backend {
        "vxlan" => format!("0800000000000100{}", "ab".repeat(40)),
        _ => format!("45{}", "ab".repeat(47)),
    }
}

/// The whole story on `backend` listening on `port` (see the module docs).
fn punch_through(backend: &str, port: u16, tag: &str) {
    require_root!();
    require_tool!("conntrack", "conntrack", "conntrack");
    require_tool!("iptables", "iptables", "iptables");
    require_tool!("python3", "python3", "python3");
    require_tool!("curl", "curl", "curl");
    let conf = net_conf_for(true, backend);
    let mut n = NatCluster::create_backend(tag, &conf, 3, Vec::new(), false);
    // Bound: discovery's first round (1 s), the 1 s publish poll, the
    // store watch and the peers' apply, keepalives sent at once on the new
    // table; measured 2-4 s. 30 s leaves a debug build on a loaded 2-vCPU
    // machine room without hiding a pair that only meets by a 25 s
    // keepalive's luck twice.
    let first = start(&mut n, Duration::from_secs(30));
    let c = &n.c;
    let logs = || (0..3).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n");
    let first =
        first.unwrap_or_else(|| panic!("{backend}: pods behind NAT never met:\n{}", logs()));
    println!(
        "{backend}: time to first packet between the NATed nodes' pods (from weftd start): {first:?}"
    );
    // Each node behind NAT publishes the endpoint its NAT maps for the
    // backend port (MASQUERADE keeps the port).
    for i in 1..3 {
        let want = format!("{}:{port}", NatCluster::public_ip(i));
        let got = weft_nat(c, &NatCluster::node_ip(i));
        assert_eq!(got, serde_json::json!({ "Endpoint": want }), "{}", logs());
    }
    wait_path(c, 1, "172.16.3.2", "punched", Duration::from_secs(10));
    wait_path(c, 2, "10.12.0.2", "punched", Duration::from_secs(10));
    wait_path(c, 0, "10.12.0.2", "punched", Duration::from_secs(10));
    wait_path(c, 1, "192.0.2.1", "direct", Duration::from_secs(10));
    let m = c.nodes[1]
        .ns
        .exec(&["curl", "-sf", "http://127.0.0.1:8471/metrics"]);
    let punched = m
        .lines()
        .find(|l| l.starts_with("weft_peer_path{") && l.contains("punched"));
    assert!(
        punched.is_some_and(|l| l.ends_with(" 1")),
        "no punched peer in /metrics:\n{m}"
    );
    // Node 2's NAT holds the mapping from its backend port to the other NAT.
    let ct = n
        .router(1)
        .exec(&["conntrack", "-L", "-p", "udp", "--dst", "192.0.2.103"]);
    let want = format!("sport={port} dport={port}");
    assert!(
        ct.contains(&want),
        "no {want} mapping to the other NAT:\n{ct}"
    );
    c.assert_mesh();
    let log = c.log(1);
    for line in [
        format!("NAT: this node is seen from 192.0.2.102:{port}"),
        format!("is behind NAT, punching to 192.0.2.103:{port}"),
    ] {
        assert!(log.contains(&line), "no {line:?} in node 2's log:\n{log}");
    }

    // Off-path forgeries: a discovery answer with a guessed nonce and a
    // junk datagram, each with a spoofed source that node 2's NAT lets in
    // (the public node's, the other NAT's), and from the attacker's own
    // address to the public node.
    let attacker = Netns::new(&format!("{}-x", n.prefix));
    attach_attacker(&n, &attacker);
    let s = Stream::start(&c.pods[1].ns, &c.pods[2].ip);
    let dropped = drops(c, 1);
    let lie = forged_answer([192, 0, 2, 66], 9);
    let junk = junk(backend);
    forge(&attacker, ("192.0.2.1", port), ("192.0.2.102", port), &lie);
    forge(
        &attacker,
        ("192.0.2.103", port),
        ("192.0.2.102", port),
        &junk,
    );
    forge(&attacker, ("192.0.2.66", port), ("192.0.2.1", port), &lie);
    forge(&attacker, ("192.0.2.66", port), ("192.0.2.1", port), &junk);
    std::thread::sleep(Duration::from_secs(3));
    let gap = s.finish();
    assert!(
        gap.longest < Duration::from_secs(1),
        "forged packets hurt: {gap}"
    );
    assert_eq!(
        weft_nat(c, "10.12.0.2"),
        serde_json::json!({ "Endpoint": format!("192.0.2.102:{port}") })
    );
    assert_eq!(path(c, 1, "172.16.3.2").as_deref(), Some("punched"));
    assert_eq!(path(c, 0, "10.12.0.2").as_deref(), Some("punched"));
    // They reached node 2's engine through its NAT (20 of each) and were
    // dropped there.
    let more = drops(c, 1) - dropped;
    assert!(
        more >= 40,
        "only {more} forged packets reached node 2's engine"
    );
    drop(attacker);

    // A mapping flushed on the pinging side heals at its next packet (it
    // leaves the backend port again, MASQUERADE keeps the port): 5 s. On
    // the answering side nothing gets in until that node sends: its next
    // keepalive, at most 25 s later; 30 s.
    let ours = flush_gap(&n, 1, Duration::from_secs(10));
    assert!(ours < Duration::from_secs(5), "recovery took {ours:?}");
    let theirs = flush_gap(&n, 2, Duration::from_secs(40));
    assert!(theirs < Duration::from_secs(30), "recovery took {theirs:?}");
}

#[test]
fn vxlan_nodes_behind_two_nats_punch_through_and_heal() {
    punch_through("vxlan", 8472, "natvx");
}

#[test]
fn udp_nodes_behind_two_nats_punch_through_and_heal() {
    punch_through("udp", 8285, "natud");
}

#[test]
fn without_nat_traversal_vxlan_nodes_behind_nat_do_not_meet() {
    require_root!();
    require_tool!("iptables", "iptables", "iptables");
    let conf = net_conf_for(false, "vxlan");
    let mut n = NatCluster::create_backend("natvx0", &conf, 3, Vec::new(), false);
    let first = start(&mut n, Duration::from_secs(15));
    assert_eq!(
        first, None,
        "pods behind two NATs met without NAT traversal"
    );
    let c = &n.c;
    for l in c.leases() {
        assert!(l["value"].get("WeftNAT").is_none(), "{l}");
    }
    assert_eq!(path(c, 1, "192.0.2.1"), None);
}
