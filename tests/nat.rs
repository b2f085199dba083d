//! Nodes behind NAT (docs/nat.md), through real weftd daemons on userspace
//! WireGuard, pods from weft's CNI plugin, in the topology of
//! `weft_tests::nat`: node 1 public, nodes 2 and 3 each behind a Linux
//! MASQUERADE router of its own. With NAT traversal the two nodes behind
//! NAT find their endpoints, publish them and punch through to each other
//! (the path is theirs: the public node relays nothing); a flushed NAT
//! mapping heals; forged answers and packets from an off-path address
//! redirect nothing. Without it the two cannot reach each other at all.
//! Times are printed (`--nocapture`) and bounded generously.

use std::time::Duration;

use weft_testenv::{require_root, require_tool};
use weft_tests::cluster::wait_ping;
use weft_tests::nat::{
    NatCluster, attach_attacker, drops, flush_gap, forge, forged_answer, path, start, wait_path,
    weft_nat,
};
use weft_tests::netns::Netns;
use weft_tests::ping::Stream;

#[test]
fn nodes_behind_two_nats_punch_through_and_heal() {
    require_root!();
    require_tool!("conntrack", "conntrack", "conntrack");
    require_tool!("iptables", "iptables", "iptables");
    require_tool!("python3", "python3", "python3");
    require_tool!("curl", "curl", "curl");
    let mut n = NatCluster::create("nat", true);
    let first = start(&mut n, Duration::from_secs(60));
    let c = &n.c;
    let logs = || (1..3).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n");
    let first = first.unwrap_or_else(|| panic!("pods behind NAT never met; logs:\n{}", logs()));
    println!("time to first packet between the NATed nodes' pods (from weftd start): {first:?}");
    // Each node behind NAT publishes the endpoint its NAT maps (MASQUERADE
    // keeps the port); the public node is the one that told them.
    for i in 1..3 {
        let want = format!("{}:51820", NatCluster::public_ip(i));
        let got = weft_nat(c, &NatCluster::node_ip(i));
        assert_eq!(got, serde_json::json!({ "Endpoint": want }));
    }
    // Punched, not relayed: each goes to the other's NAT, and its router
    // holds that very mapping.
    wait_path(c, 1, "172.16.3.2", "punched", Duration::from_secs(10));
    wait_path(c, 2, "10.12.0.2", "punched", Duration::from_secs(10));
    wait_path(c, 1, "192.0.2.1", "direct", Duration::from_secs(10));
    wait_path(c, 0, "10.12.0.2", "punched", Duration::from_secs(10));
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
    let ct = n
        .router(1)
        .exec(&["conntrack", "-L", "-p", "udp", "--dst", "192.0.2.103"]);
    assert!(
        ct.contains("dport=51820"),
        "no mapping to the other NAT:\n{ct}"
    );
    c.assert_mesh();
    // The transitions are in the log.
    let log = c.log(1);
    for line in [
        "NAT: this node is seen from 192.0.2.102:51820",
        "is behind NAT, punching to 192.0.2.103:51820",
    ] {
        assert!(log.contains(line), "no {line:?} in node 2's log:\n{log}");
    }

    // Forged answers and packets from an off-path address: one with the
    // public node's address forged (it passes node 2's NAT, which holds a
    // mapping to it), one from the attacker's own.
    let attacker = Netns::new(&format!("{}-x", n.prefix));
    attach_attacker(&n, &attacker);
    let s = Stream::start(&c.pods[1].ns, &c.pods[2].ip);
    let dropped = drops(c, 1);
    let lie = forged_answer([192, 0, 2, 66], 9);
    forge(
        &attacker,
        ("192.0.2.1", 51820),
        ("192.0.2.102", 51820),
        &lie,
    );
    forge(&attacker, ("192.0.2.66", 51820), ("192.0.2.1", 51820), &lie);
    let junk_data = format!("04000000{}", "ab".repeat(44));
    forge(
        &attacker,
        ("192.0.2.103", 51820),
        ("192.0.2.102", 51820),
        &junk_data,
    );
    forge(
        &attacker,
        ("192.0.2.66", 51820),
        ("192.0.2.1", 51820),
        &junk_data,
    );
    std::thread::sleep(Duration::from_secs(3));
    let gap = s.finish();
    assert!(
        gap.longest < Duration::from_secs(1),
        "forged packets hurt: {gap}"
    );
    assert_eq!(
        weft_nat(c, "10.12.0.2"),
        serde_json::json!({"Endpoint": "192.0.2.102:51820"})
    );
    assert_eq!(path(c, 1, "172.16.3.2").as_deref(), Some("punched"));
    // They reached node 2's engine through its NAT (20 of each kind) and
    // were dropped there.
    let more = drops(c, 1) - dropped;
    assert!(
        more >= 40,
        "only {more} forged packets reached node 2's engine"
    );
    drop(attacker);

    // A NAT mapping flushed on the pinging side heals at its next packet;
    // on the answering side, at its next keepalive (25 s) at the latest.
    let ours = flush_gap(&n, 1, Duration::from_secs(10));
    assert!(ours < Duration::from_secs(5), "recovery took {ours:?}");
    let theirs = flush_gap(&n, 2, Duration::from_secs(40));
    assert!(theirs < Duration::from_secs(32), "recovery took {theirs:?}");
}

#[test]
fn without_nat_traversal_nodes_behind_nat_do_not_meet() {
    require_root!();
    require_tool!("iptables", "iptables", "iptables");
    let mut n = NatCluster::create("nat0", false);
    let first = start(&mut n, Duration::from_secs(15));
    assert_eq!(
        first, None,
        "pods behind two NATs met without NAT traversal"
    );
    let c = &n.c;
    // The cluster works otherwise: a node behind NAT reaches the public one.
    assert!(wait_ping(&c.pods[1].ns, &c.pods[0].ip), "{}", c.log(1));
    // And nothing of the feature is in a lease or the status.
    for l in c.leases() {
        assert!(l["value"].get("WeftNAT").is_none(), "{l}");
    }
    assert_eq!(path(c, 1, "192.0.2.1"), None);
}
