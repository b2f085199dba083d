//! The one story every NAT-traversing backend must tell (tests/nat.rs for
//! userspace WireGuard, tests/nat_vxlan.rs for userspace vxlan and udp), in
//! the topology of [`crate::nat`]: node 1 public, nodes 2 and 3 each behind
//! a MASQUERADE router of its own.
//!
//! With the feature on ([`punch_through`]): the two nodes behind NAT learn
//! the endpoint their NAT maps for the backend port, publish it, and send
//! each other's traffic there from that port (punched, not relayed: the
//! router holds that very mapping); forged discovery answers and forged
//! backend datagrams from an off-path address move neither a path nor a
//! published endpoint; a flushed NAT mapping heals. With it off
//! ([`never_meet`]): the pair never meets, a NATed node reaches the public
//! one only where WireGuard's roaming answers to its NAT, and nothing of
//! the feature shows in a lease or the status.

use std::time::Duration;

use weft_testenv::{require_root, require_tool};

use crate::cluster::wait_ping;
use crate::nat::{
    NatCluster, attach_attacker, drops, flush_gap, forge, forged_answer, net_conf_for, path, start,
    wait_path, weft_nat,
};
use crate::netns::Netns;
use crate::ping::Stream;

/// One backend's figures for [`punch_through`].
pub struct Story {
    /// `wireguard`, `vxlan` or `udp`.
    pub backend: &'static str,
    /// Its port (the NAT keeps it: MASQUERADE maps a free port to itself).
    pub port: u16,
    /// The cluster's name tag (namespaces are `<tag>-…`).
    pub tag: &'static str,
    /// Bound on the time from weftd start to the first pod packet across
    /// both NATs.
    pub first: Duration,
    /// Bound on the gap after the answering side's NAT mapping is flushed:
    /// nothing gets in until that node sends, at its next keepalive.
    pub answering_side: Duration,
}

/// A junk datagram of 48 bytes that starts as `backend`'s own would: a
/// WireGuard data message (type 4), a VXLAN header (flags 0x08, VNI 1),
/// an IPv4 header's first byte (flannel-UDP).
fn junk(backend: &str) -> String {
    match backend {
        "wireguard" => format!("04000000{}", "ab".repeat(44)),
        "vxlan" => format!("0800000000000100{}", "ab".repeat(40)),
        _ => format!("45{}", "ab".repeat(47)),
    }
}

/// The whole story with the feature on (see the module docs).
pub fn punch_through(s: &Story) {
    require_root!();
    require_tool!("conntrack", "conntrack", "conntrack");
    require_tool!("iptables", "iptables", "iptables");
    require_tool!("python3", "python3", "python3");
    require_tool!("curl", "curl", "curl");
    let (backend, port) = (s.backend, s.port);
    let conf = net_conf_for(true, backend);
    let mut n = NatCluster::create_backend(s.tag, &conf, 3, Vec::new(), false);
    let first = start(&mut n, s.first);
    let c = &n.c;
    let logs = || (0..3).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n");
    let first =
        first.unwrap_or_else(|| panic!("{backend}: pods behind NAT never met:\n{}", logs()));
    println!(
        "{backend}: time to first packet between the NATed nodes' pods (from weftd start): {first:?}"
    );
    // Each node behind NAT publishes the endpoint its NAT maps for the
    // backend port; the public node is the one that told them.
    for i in 1..3 {
        let want = format!("{}:{port}", NatCluster::public_ip(i));
        let got = weft_nat(c, &NatCluster::node_ip(i));
        assert_eq!(got, serde_json::json!({ "Endpoint": want }), "{}", logs());
    }
    // Punched, not relayed: each goes to the other's NAT.
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
    let stream = Stream::start(&c.pods[1].ns, &c.pods[2].ip);
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
    let gap = stream.finish();
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
    // the answering side nothing gets in until that node sends.
    let ours = flush_gap(&n, 1, Duration::from_secs(10));
    assert!(ours < Duration::from_secs(5), "recovery took {ours:?}");
    let theirs = flush_gap(&n, 2, s.answering_side + Duration::from_secs(10));
    assert!(theirs < s.answering_side, "recovery took {theirs:?}");
}

/// The story with the feature off on `backend` (see the module docs).
pub fn never_meet(tag: &str, backend: &str) {
    require_root!();
    require_tool!("iptables", "iptables", "iptables");
    let conf = net_conf_for(false, backend);
    let mut n = NatCluster::create_backend(tag, &conf, 3, Vec::new(), false);
    let first = start(&mut n, Duration::from_secs(15));
    assert_eq!(
        first, None,
        "{backend}: pods behind two NATs met without NAT traversal"
    );
    let c = &n.c;
    // A node behind NAT and the public one: WireGuard's roaming answers
    // to the address the NAT gave (the public node learns it from the
    // authenticated initiation), so they meet as with flannel; vxlan and
    // udp answer to the lease's private address, which the internet does
    // not route, so they do not (flannel's behaviour, which the feature
    // exists to change).
    let met = wait_ping(&c.pods[1].ns, &c.pods[0].ip);
    assert_eq!(met, backend == "wireguard", "{}", c.log(1));
    for l in c.leases() {
        assert!(l["value"].get("WeftNAT").is_none(), "{l}");
    }
    assert_eq!(path(c, 1, "192.0.2.1"), None);
}
