//! The routed pod datapath with weftd's IPAM end to end (root): real weftd
//! daemons in namespace clusters, pods attached by weft's CNI plugin in
//! `"mode": "routed"`, addresses from weftd's unix-socket API.
//!
//! Run `cargo build --workspace --bins` first (the tests exec `weftd` and
//! `flannel` from the target directory).

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use weft_control::demo::netns::Netns;
use weft_testenv::require_root;
use weft_tests::cluster::{self, Cluster, CniMode};

fn cluster(tag: &str, nodes: u8) -> (tempfile::TempDir, Cluster) {
    cluster::start(
        tag,
        &cluster::net_conf(r#"{"Type":"vxlan"}"#),
        nodes,
        &["--traffic-manager=none"],
    )
}

fn add_ip(c: &Cluster, i: usize, id: &str, netns: &str) -> Ipv4Addr {
    let (code, out) = c.cni_raw(i, CniMode::Routed, "ADD", id, netns);
    assert_eq!(code, 0, "ADD {id}: {out}");
    let v: serde_json::Value =
        serde_json::from_str(out.lines().next().unwrap_or_default()).expect("result JSON");
    let addr = v["ips"][0]["address"].as_str().expect("address");
    assert!(addr.ends_with("/32"), "{addr}");
    addr.trim_end_matches("/32").parse().expect("ipv4")
}

/// The node's pod subnet from subnet.env (`10.244.N.0/24` → N).
fn subnet_octet(c: &Cluster, i: usize) -> u8 {
    let env = c.subnet_env(i).expect("subnet.env");
    let s = env
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
        .expect("FLANNEL_SUBNET");
    s.split('.')
        .nth(2)
        .and_then(|o| o.parse().ok())
        .expect("octet")
}

/// The node's `ip route` lines through routed-mode host veths.
fn pod_routes(c: &Cluster, i: usize) -> Vec<String> {
    c.nodes[i]
        .ns
        .exec(&["ip", "-4", "route", "show"])
        .lines()
        .filter(|l| l.contains(" dev weft"))
        .map(str::to_string)
        .collect()
}

/// The allocations in node `i`'s IPAM state file (container IDs).
fn held(c: &Cluster, i: usize) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(c.nodes[i].dir.join("weft-ipam.json")).unwrap_or_default();
    let v: serde_json::Value = serde_json::from_str(&text).unwrap_or_default();
    let mut out: Vec<(String, String)> = v["allocations"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|x| {
                    (
                        x["containerID"].as_str().unwrap_or("").to_string(),
                        x["ipv4"].as_str().unwrap_or("").to_string(),
                    )
                })
                .collect()
        })
        .unwrap_or_default();
    out.sort();
    out
}

fn wait_socket(c: &Cluster, i: usize) {
    let sock = c.nodes[i].dir.join("weft.sock");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sock.exists() {
        assert!(
            Instant::now() < deadline,
            "no IPAM socket; weftd log:\n{}",
            c.log(i)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Two routed nodes: pods ping and carry TCP across nodes and on one node,
/// every pod has exactly one /32 host route, and DEL removes it.
#[test]
fn routed_nodes_ping_tcp_and_host_routes() {
    require_root!();
    let (_w, mut c) = cluster("ro", 2);
    c.set_cni_mode(0, CniMode::Routed);
    c.set_cni_mode(1, CniMode::Routed);
    let a = c.add_pod(0, "a").unwrap_or_else(|e| panic!("pod: {e}"));
    let b = c.add_pod(0, "b").unwrap_or_else(|e| panic!("pod: {e}"));
    let d = c.add_pod(1, "d").unwrap_or_else(|e| panic!("pod: {e}"));
    let n0 = subnet_octet(&c, 0);
    for p in [a, b] {
        assert!(
            c.pods[p].ip.starts_with(&format!("10.244.{n0}.")),
            "{} outside the node's lease",
            c.pods[p].ip
        );
    }
    // The pod side: /32, default via the link-local gateway, permanent neighbour.
    let addr = c.pods[a]
        .ns
        .exec(&["ip", "-4", "-o", "addr", "show", "dev", "eth0"]);
    assert!(addr.contains(&format!("{}/32", c.pods[a].ip)), "{addr}");
    let route = c.pods[a].ns.exec(&["ip", "route", "show", "default"]);
    assert!(
        route.contains("via 169.254.1.1 dev eth0") && route.contains("onlink"),
        "{route}"
    );
    let neigh = c.pods[a].ns.exec(&["ip", "neigh", "show", "169.254.1.1"]);
    assert!(neigh.contains("PERMANENT"), "{neigh}");
    // One /32 per pod on each node, no bridge.
    for (node, pods) in [(0, vec![a, b]), (1, vec![d])] {
        let routes = pod_routes(&c, node);
        assert_eq!(routes.len(), pods.len(), "node {node}: {routes:?}");
        for p in pods {
            let ip = &c.pods[p].ip;
            assert_eq!(
                routes
                    .iter()
                    .filter(|r| r.starts_with(&format!("{ip} dev weft")))
                    .count(),
                1,
                "{routes:?}"
            );
        }
        assert!(
            !c.nodes[node]
                .ns
                .try_exec(&["ip", "link", "show", "cni0"])
                .status
                .success(),
            "no bridge in routed mode"
        );
    }
    for (x, y) in [(a, d), (d, a), (a, b), (b, a), (d, b)] {
        assert!(
            c.wait_ping(x, y),
            "pod {x} cannot reach pod {y}; node log:\n{}",
            c.log(0)
        );
    }
    for (x, y) in [(a, d), (b, a)] {
        let bytes = c.iperf_bytes(x, y, 2);
        assert!(
            bytes > 1_000_000,
            "iperf3 {x}->{y} moved only {bytes} bytes"
        );
    }
    // DEL removes the route and frees the address.
    let ip_b = c.pods[b].ip.clone();
    c.del_pod(b).unwrap_or_else(|e| panic!("del: {e}"));
    let routes = pod_routes(&c, 0);
    assert_eq!(routes.len(), 1, "{routes:?}");
    assert!(!held(&c, 0).iter().any(|(_, ip)| *ip == ip_b));
}

/// 64 parallel ADDs get 64 distinct addresses; weftd restarts between the
/// ADDs and the DELs without reusing a held address; DEL succeeds also when
/// the netns is already gone, and twice; afterwards nothing is held.
#[test]
fn parallel_adds_restart_and_dels() {
    require_root!();
    let (_w, mut c) = cluster("rp", 1);
    let prefix = weft_tests::unique("rq");
    let pods: Vec<Netns> = (0..64)
        .map(|i| Netns::new(&format!("{prefix}-{i}")))
        .collect();
    let ips: Vec<Ipv4Addr> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .enumerate()
            .map(|(i, ns)| {
                let c = &c;
                s.spawn(move || add_ip(c, 0, &format!("par{i}"), &ns.path()))
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("ADD thread"))
            .collect()
    });
    let distinct: BTreeSet<Ipv4Addr> = ips.iter().copied().collect();
    assert_eq!(distinct.len(), 64, "addresses handed out twice: {ips:?}");
    let n = subnet_octet(&c, 0);
    assert!(
        ips.iter()
            .all(|ip| ip.octets()[2] == n && ip.octets()[3] >= 2 && ip.octets()[3] < 255),
        "{ips:?}"
    );
    assert_eq!(held(&c, 0).len(), 64);
    assert_eq!(pod_routes(&c, 0).len(), 64);

    // Restart weftd: the 64 stay held; new pods get other addresses.
    c.stop_weftd(0);
    c.start_weftd(0).unwrap_or_else(|e| panic!("restart: {e}"));
    wait_socket(&c, 0);
    let extra: Vec<Netns> = (0..4)
        .map(|i| Netns::new(&format!("{prefix}-x{i}")))
        .collect();
    for (i, ns) in extra.iter().enumerate() {
        let ip = add_ip(&c, 0, &format!("new{i}"), &ns.path());
        assert!(!distinct.contains(&ip), "{ip} reused while held");
    }
    // A repeated ADD of a held attachment fails and leaves it intact.
    let (code, out) = c.cni_raw(0, CniMode::Routed, "ADD", "par0", &pods[0].path());
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("already exists"), "{out}");
    assert_eq!(held(&c, 0).len(), 68);

    // Half the pods lose their netns before DEL.
    let (gone, kept) = pods.split_at(32);
    let gone_paths: Vec<String> = gone.iter().map(Netns::path).collect();
    for ns in gone {
        weft_control::demo::netns::run("ip", &["netns", "del", ns.name()]);
    }
    for (i, path) in gone_paths.iter().enumerate() {
        for _ in 0..2 {
            let (code, out) = c.cni_raw(0, CniMode::Routed, "DEL", &format!("par{i}"), path);
            assert_eq!(code, 0, "DEL with a vanished netns: {out}");
        }
    }
    for (i, ns) in kept.iter().enumerate() {
        let (code, out) = c.cni_raw(
            0,
            CniMode::Routed,
            "DEL",
            &format!("par{}", i + 32),
            &ns.path(),
        );
        assert_eq!(code, 0, "DEL: {out}");
    }
    for (i, ns) in extra.iter().enumerate() {
        let (code, out) = c.cni_raw(0, CniMode::Routed, "DEL", &format!("new{i}"), &ns.path());
        assert_eq!(code, 0, "DEL: {out}");
    }
    assert_eq!(
        held(&c, 0),
        Vec::<(String, String)>::new(),
        "everything released"
    );
    assert!(pod_routes(&c, 0).is_empty(), "{:?}", pod_routes(&c, 0));
    let links = c.nodes[0].ns.exec(&["ip", "-o", "link", "show"]);
    assert!(!links.contains("weft"), "host veths left: {links}");
    drop(extra);
    drop(pods);
    // The freed addresses are usable again.
    let again = Netns::new(&format!("{prefix}-again"));
    add_ip(&c, 0, "again", &again.path());
}

/// A routed node and a bridge node: their pods reach each other.
#[test]
fn mixed_routed_and_bridge_nodes() {
    require_root!();
    let (_w, mut c) = cluster("rm", 2);
    c.set_cni_mode(0, CniMode::Routed);
    let r = c.add_pod(0, "r").unwrap_or_else(|e| panic!("pod: {e}"));
    let b = c.add_pod(1, "b").unwrap_or_else(|e| panic!("pod: {e}"));
    assert!(
        c.nodes[1]
            .ns
            .try_exec(&["ip", "link", "show", "cni0"])
            .status
            .success(),
        "node 2 is bridged"
    );
    assert_eq!(pod_routes(&c, 0).len(), 1);
    for (x, y) in [(r, b), (b, r)] {
        assert!(c.wait_ping(x, y), "pod {x} cannot reach pod {y}");
    }
    let bytes = c.iperf_bytes(r, b, 2);
    assert!(bytes > 1_000_000, "iperf3 moved only {bytes} bytes");
    c.del_pod(0).unwrap_or_else(|e| panic!("del: {e}"));
    assert!(pod_routes(&c, 0).is_empty());
}

#[path = "routed/latency.rs"]
mod latency;
