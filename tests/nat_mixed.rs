//! A mixed cluster with NAT traversal (issue 35, docs/nat.md "A mixed
//! cluster"): the topology of `weft_tests::nat` (node 1 public, nodes 2 and
//! 3 behind NAT routers of their own, real weftd on userspace WireGuard
//! with `WeftNATTraversal`, pods from weft's CNI plugin) plus a fourth,
//! public node that is **not weft**: wireguard-go + `wg` configured as
//! flannel's wireguard backend configures its device (`flannel-wg`, its
//! subnet's first address /32, MTU 1420, a route for the network, one peer
//! per lease at `PublicIP:Port` with the lease's subnet as allowed IPs, no
//! keepalive) and a lease written to the store as flanneld writes it,
//! without `WeftNAT`.
//!
//! NAT traversal acts on weft's WireGuard peers only. The test asserts that
//! the flannel-style node and the public weft node reach each other's
//! pods; that the weft nodes behind NAT still reach the public weft node
//! and punch through to each other; that the nodes behind NAT reach the
//! flannel-style node's pods and it theirs (as before the feature: their
//! keepalives reach it, WireGuard roaming answers them); that its lease
//! decodes beside the `WeftNAT` leases and has none; and that no weft node
//! sends endpoint discovery to it (counted by an iptables `u32` rule on
//! its WireGuard port matching discovery's first byte `0xd1`), while the
//! same rule on the public weft node counts the discovery it answers.
//! Times are printed (`--nocapture`).

use std::time::{Duration, Instant};

use weft_testenv::{require_root, require_tool};
use weft_tests::cluster::{Cluster, NETWORK, wait_ping};
use weft_tests::nat::{NatCluster, wait_path};
use weft_tests::netns::Netns;
use weft_tests::proc::wait_for;
use weft_tests::wggo::WireguardGo;

/// The flannel-style node: cluster node index 3, `192.0.2.4`.
const FL: usize = 3;
const FL_IP: &str = "192.0.2.4";

/// An iptables rule in `ns` counting datagrams to UDP port 51820 whose
/// payload starts with `0xd1` (a discovery message, docs/nat.md "The wire").
const DISCO_RULE: [&str; 12] = [
    "INPUT",
    "-p",
    "udp",
    "--dport",
    "51820",
    "-m",
    "u32",
    "--u32",
    "0>>22&0x3C@8>>24=0xD1",
    "-j",
    "ACCEPT",
    "-w",
];

fn count_discovery(ns: &Netns) {
    let mut args = vec!["iptables", "-A"];
    args.extend(DISCO_RULE);
    ns.exec(&args);
}

/// Packets the rule of [`count_discovery`] counted in `ns`.
fn discovery_seen(ns: &Netns) -> u64 {
    let out = ns.exec(&["iptables", "-L", "INPUT", "-v", "-x", "-n", "-w"]);
    out.lines()
        .find(|l| l.contains("u32"))
        .and_then(|l| l.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no discovery counter in:\n{out}"))
}

/// The first `10.244.<n>.0/24` (n from 200) no lease holds.
fn free_subnet(c: &Cluster) -> u8 {
    let taken: Vec<String> = c
        .leases()
        .iter()
        .filter_map(|l| l["key"].as_str().map(str::to_string))
        .collect();
    (200..=254)
        .find(|n| !taken.contains(&format!("10.244.{n}.0-24")))
        .expect("a free subnet")
}

/// Sets up the flannel-style node on cluster node [`FL`]: wireguard-go,
/// its key, device, addresses and routes as flannel's wireguard backend
/// makes them, a peer per weft lease, `cni0` with a hand-made pod, and its
/// lease as flanneld writes it. Returns the wireguard-go guard and the pod.
fn flannel_node(c: &Cluster) -> (WireguardGo, Netns, String) {
    let ns = &c.nodes[FL].ns;
    let n = free_subnet(c);
    let (subnet, gw, bridge, pod_ip) = (
        format!("10.244.{n}.0/24"),
        format!("10.244.{n}.0"),
        format!("10.244.{n}.1"),
        format!("10.244.{n}.2"),
    );
    let key_file = c.nodes[FL].dir.join("wg-go.key");
    let go = WireguardGo::start(ns, &key_file);
    let public_key = go.public_key.clone();
    let mut script = format!(
        "wg set flannel-wg private-key {key} listen-port 51820
         ip addr add {gw}/32 dev flannel-wg
         ip link set flannel-wg mtu 1420 up
         ip route replace {NETWORK} dev flannel-wg scope link
         ip link add cni0 type bridge; ip addr add {bridge}/24 dev cni0; ip link set cni0 up
         sysctl -qw net.ipv4.ip_forward=1\n",
        key = key_file.display()
    );
    // flannel's AddPeer: endpoint PublicIP:Port, allowed IPs the subnet.
    for l in c.leases() {
        let v = &l["value"];
        let (Some(ip), Some(pk), Some(port), Some(key)) = (
            v["PublicIP"].as_str(),
            v["BackendData"]["PublicKey"].as_str(),
            v["BackendData"]["Port"].as_u64(),
            l["key"].as_str(),
        ) else {
            panic!("a weft lease flannel cannot use: {l}");
        };
        script.push_str(&format!(
            "wg set flannel-wg peer {pk} endpoint {ip}:{port} allowed-ips {}\n",
            key.replace('-', "/")
        ));
    }
    ns.sh(&script);
    let lease = format!(
        r#"{{"PublicIP":"{FL_IP}","PublicIPv6":null,"BackendType":"wireguard","BackendData":{{"PublicKey":"{public_key}","Port":51820}}}}"#
    );
    c.weft_leases(&["put", &subnet.replace('/', "-"), &lease])
        .unwrap_or_else(|e| panic!("weft leases put: {e}"));
    let pod = c.hand_made_pod(FL, &format!("{pod_ip}/24"), &bridge);
    (go, pod, pod_ip)
}

/// How long until `from` gets a reply from `ip` (one ping a second), or
/// `None` after `within`.
fn first_reply(from: &Netns, ip: &str, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if from.ping(ip, 1) {
            return Some(t0.elapsed());
        }
    }
    None
}

#[test]
fn flannel_style_node_keeps_working_beside_nat_traversal() {
    require_root!();
    require_tool!("wireguard-go", "wireguard-go", "wireguard-go");
    require_tool!("wg", "wg", "wireguard-tools");
    require_tool!("iptables", "iptables", "iptables");
    let mut n = NatCluster::create_nodes("natmx", true, 4);
    // The discovery counters exist before any weftd runs.
    count_discovery(&n.c.nodes[FL].ns);
    count_discovery(&n.c.nodes[0].ns);
    let t0 = Instant::now();
    for i in 0..3 {
        n.c.start_weftd(i)
            .unwrap_or_else(|e| panic!("weftd {i}: {e}"));
    }
    for i in 0..3 {
        n.c.wait_ready(i, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("weftd {i}: {e}"));
        n.c.add_pod(i, &format!("p{i}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    let c = &n.c;
    let logs = || (0..3).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n");
    let punched = first_reply(&c.pods[1].ns, &c.pods[2].ip, Duration::from_secs(60))
        .unwrap_or_else(|| panic!("pods behind NAT never met; logs:\n{}", logs()));
    println!(
        "weft nodes: weftd start -> first reply between the NATed nodes' pods: {:?}",
        t0.elapsed()
    );
    let _ = punched;

    // The flannel-style node joins: its lease (no WeftNAT) beside theirs.
    let t1 = Instant::now();
    let (_go, fpod, fpod_ip) = flannel_node(c);
    let fkey = c
        .leases()
        .into_iter()
        .find(|l| l["value"]["PublicIP"] == FL_IP)
        .and_then(|l| l["key"].as_str().map(str::to_string))
        .expect("the flannel-style lease decodes");
    for i in 0..3 {
        wait_for(
            "weft to learn the flannel-style node",
            Duration::from_secs(30),
            || c.log(i).contains(&fkey).then_some(()),
        );
    }
    let fwd = first_reply(&c.pods[0].ns, &fpod_ip, Duration::from_secs(30)).unwrap_or_else(|| {
        panic!(
            "public weft pod -> flannel-style pod failed; log:\n{}\n{}",
            c.log(0),
            c.nodes[FL].ns.exec(&["wg", "show"])
        )
    });
    println!(
        "flannel-style lease put -> first reply public weft pod -> its pod: {:?} (ping {fwd:?})",
        t1.elapsed()
    );
    assert!(
        wait_ping(&fpod, &c.pods[0].ip),
        "flannel-style pod -> public weft pod failed"
    );
    // The nodes behind NAT reach it (their keepalives open the way and
    // wireguard-go roams to their NATs), and it them, as before the feature.
    for i in 1..3 {
        let t = Instant::now();
        assert!(
            wait_ping(&c.pods[i].ns, &fpod_ip),
            "NATed weft pod {i} -> flannel-style pod failed; log:\n{}\n{}",
            c.log(i),
            c.nodes[FL].ns.exec(&["wg", "show"])
        );
        println!(
            "NATed weft node {} -> flannel-style pod: {:?}",
            i + 1,
            t.elapsed()
        );
        assert!(
            wait_ping(&fpod, &c.pods[i].ip),
            "flannel-style pod -> NATed weft pod {i} failed"
        );
    }

    // The weft mesh is as it was: punched between the NATed nodes, direct
    // to the public one; every pod reaches every weft pod.
    wait_path(c, 1, "172.16.3.2", "punched", Duration::from_secs(15));
    wait_path(c, 2, "10.12.0.2", "punched", Duration::from_secs(15));
    wait_path(c, 1, "192.0.2.1", "direct", Duration::from_secs(15));
    wait_path(c, 0, FL_IP, "direct", Duration::from_secs(15));
    c.assert_mesh();

    // Leases: every weft lease has WeftNAT, the flannel-style one none,
    // and all decode together.
    let leases = c.leases();
    assert_eq!(leases.len(), 4, "{leases:?}");
    for l in &leases {
        let has = l["value"].get("WeftNAT").is_some();
        assert_eq!(has, l["value"]["PublicIP"] != FL_IP, "{l}");
    }
    for i in 1..3 {
        let want = format!("{}:51820", NatCluster::public_ip(i));
        assert_eq!(
            c.lease_of(&NatCluster::node_ip(i))["value"]["WeftNAT"],
            serde_json::json!({ "Endpoint": want })
        );
    }

    // No discovery goes to the node without WeftNAT, over a window of more
    // than a discovery round (15 s), while the public weft node keeps
    // receiving it.
    let before = discovery_seen(&c.nodes[0].ns);
    let since = t1.elapsed();
    std::thread::sleep(Duration::from_secs(16));
    let at_public = discovery_seen(&c.nodes[0].ns);
    let at_flannel = discovery_seen(&c.nodes[FL].ns);
    println!(
        "discovery requests: {at_public} at the public weft node ({} in the last 16 s), \
         {at_flannel} at the flannel-style node in {:?}",
        at_public - before,
        since + Duration::from_secs(16)
    );
    assert!(
        at_public > before,
        "the public weft node got no discovery in 16 s"
    );
    assert_eq!(
        at_flannel, 0,
        "weft sent discovery to a node without WeftNAT"
    );
    let shown = c.nodes[FL].ns.exec(&["wg", "show", "flannel-wg"]);
    assert_eq!(
        shown.matches("latest handshake").count(),
        3,
        "the flannel-style node has a session with each weft node:\n{shown}"
    );
}
