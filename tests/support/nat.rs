//! Nodes behind NAT (docs/nat.md) on the cluster kit: a 3-node cluster
//! whose underlay bridge is the internet, node 1 on it with a public
//! address (`192.0.2.1`), nodes 2 and 3 each moved behind a NAT router of
//! their own:
//!
//! ```text
//!  n1 192.0.2.1 ─┐
//!  r2 192.0.2.102 ─ br0 (<prefix>-ul) ─ r3 192.0.2.103
//!   │ MASQUERADE                          │ MASQUERADE
//!  n2 10.12.0.2 (LAN 10.12.0.0/24)       n3 172.16.3.2 (LAN 172.16.3.0/24)
//! ```
//!
//! A router is what a Linux home or edge router is: `ip_forward`,
//! `MASQUERADE` out of its WAN port (a port-restricted cone NAT that keeps
//! the source port when it is free), no route into the other sites' LANs,
//! and unsolicited packets to the router itself dropped (as any NAT
//! router's firewall does; see docs/nat.md for what happens without it).
//! [`NatCluster::create_with`] makes both routers symmetric NATs instead
//! (`MASQUERADE --random-fully`: a new random port per destination, which
//! no punch gets through) and gives nodes weftd arguments of their own
//! (e.g. `--nat-relay` for the public nodes past [`SITES`]).
//! The lease store is the embedded one (a file every node's weftd reads),
//! so the nodes need no path to a store. Routers live in namespaces of
//! their own, removed on drop with the cluster's.

use std::time::{Duration, Instant};

use crate::cluster::{self, Cluster, ClusterStore};
use crate::netns::{Netns, run, veth};
use crate::ping::Stream;

/// Each node's NAT (`None`: the public node): router WAN address, LAN
/// prefix (the router is `.1`, the node `.2`).
pub const SITES: [Option<(&str, &str)>; 3] = [
    None,
    Some(("192.0.2.102", "10.12.0")),
    Some(("192.0.2.103", "172.16.3")),
];

/// The cluster and its routers (dropped after the cluster's namespaces).
#[derive(Debug)]
pub struct NatCluster {
    /// The cluster (its node `i` is [`SITES`]`[i]`).
    pub c: Cluster,
    /// The router of each node behind NAT.
    pub routers: Vec<Option<Netns>>,
    /// The work directory.
    pub work: tempfile::TempDir,
    /// The namespaces' name prefix.
    pub prefix: String,
}

/// The net-conf.json of a WireGuard network, NAT traversal on or off.
pub fn net_conf(nat: bool) -> String {
    net_conf_for(nat, "wireguard")
}

/// The net-conf.json of a network of backend `backend`, NAT traversal on or off.
pub fn net_conf_for(nat: bool, backend: &str) -> String {
    let key = if nat {
        r#""WeftNATTraversal":true,"#
    } else {
        ""
    };
    format!(
        r#"{{"Network":"{}",{key}"Backend":{{"Type":"{backend}"}}}}"#,
        cluster::NETWORK
    )
}

impl NatCluster {
    /// Builds the topology and the nodes (no weftd started yet).
    pub fn create(tag: &str, nat: bool) -> NatCluster {
        NatCluster::create_nodes(tag, nat, 3)
    }

    /// [`NatCluster::create`] with `nodes` (at least 3) nodes: those past
    /// [`SITES`] sit on the internet with public addresses `192.0.2.<i+1>`.
    pub fn create_nodes(tag: &str, nat: bool, nodes: u8) -> NatCluster {
        NatCluster::create_with(tag, nat, nodes, Vec::new(), false)
    }

    /// [`NatCluster::create_nodes`] with weftd arguments of node `i` in
    /// `node_args[i]`, and symmetric NATs when `symmetric`.
    pub fn create_with(
        tag: &str,
        nat: bool,
        nodes: u8,
        node_args: Vec<Vec<String>>,
        symmetric: bool,
    ) -> NatCluster {
        NatCluster::create_backend(tag, &net_conf(nat), nodes, node_args, symmetric)
    }

    /// [`NatCluster::create_with`] for the network `net_conf`
    /// ([`net_conf_for`]: another backend).
    pub fn create_backend(
        tag: &str,
        net_conf: &str,
        nodes: u8,
        node_args: Vec<Vec<String>>,
        symmetric: bool,
    ) -> NatCluster {
        assert!(
            usize::from(nodes) >= SITES.len(),
            "at least {} nodes",
            SITES.len()
        );
        let work = tempfile::tempdir().expect("tempdir");
        let args = [
            "--traffic-manager=none",
            "--dataplane=userspace",
            "--probe-port=0",
            "--healthz-port=8471",
        ];
        let spec = cluster::spec(tag, net_conf, nodes, &args, work.path());
        let prefix = spec.prefix.clone();
        let c = Cluster::create(spec, &ClusterStore::Embedded, node_args)
            .unwrap_or_else(|e| panic!("cluster: {e}"));
        let mut routers = Vec::new();
        for (i, site) in SITES.iter().enumerate() {
            routers.push(
                site.map(|(wan, lan)| behind_nat(&prefix, i, &c.nodes[i].ns, wan, lan, symmetric)),
            );
        }
        NatCluster {
            c,
            routers,
            work,
            prefix,
        }
    }

    /// The router of node `i` (panics for the public node).
    pub fn router(&self, i: usize) -> &Netns {
        self.routers[i].as_ref().expect("a node behind NAT")
    }

    /// Node `i`'s own address (its `PublicIP`).
    pub fn node_ip(i: usize) -> String {
        match SITES[i] {
            Some((_, lan)) => format!("{lan}.2"),
            None => "192.0.2.1".into(),
        }
    }

    /// The address node `i` is seen from on the internet.
    pub fn public_ip(i: usize) -> &'static str {
        match SITES[i] {
            Some((wan, _)) => wan,
            None => "192.0.2.1",
        }
    }
}

/// Moves `node` (index `i`) behind a new NAT router `<prefix>-r<i>`: its
/// underlay port goes, a LAN `<lan>.0/24` joins it to the router, whose WAN
/// port `wan` sits on the internet bridge; `symmetric`: a new random port
/// for every mapping.
fn behind_nat(
    prefix: &str,
    i: usize,
    node: &Netns,
    wan: &str,
    lan: &str,
    symmetric: bool,
) -> Netns {
    let r = Netns::new(&format!("{prefix}-r{i}"));
    let ul = format!("{prefix}-ul");
    let port = format!("rw{i}");
    run(
        "ip",
        &[
            "link",
            "add",
            "wan",
            "netns",
            r.name(),
            "type",
            "veth",
            "peer",
            "name",
            &port,
            "netns",
            &ul,
        ],
    );
    r.exec(&["ip", "addr", "add", &format!("{wan}/24"), "dev", "wan"]);
    r.exec(&["ip", "link", "set", "wan", "up"]);
    for cmd in [
        vec!["link", "set", &port, "master", "br0"],
        vec!["link", "set", &port, "up"],
    ] {
        let mut full = vec!["netns", "exec", ul.as_str(), "ip"];
        full.extend(cmd);
        run("ip", &full);
    }
    node.exec(&["ip", "link", "del", "eth0"]);
    let (gw, addr) = (format!("{lan}.1"), format!("{lan}.2"));
    veth(
        &r,
        "lan",
        &format!("{gw}/24"),
        node,
        "eth0",
        &format!("{addr}/24"),
    );
    node.exec(&["ip", "route", "add", "default", "via", &gw]);
    r.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    let mut masq = vec![
        "iptables",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-o",
        "wan",
        "-j",
        "MASQUERADE",
    ];
    if symmetric {
        masq.push("--random-fully");
    }
    r.exec(&masq);
    r.exec(&["iptables", "-A", "INPUT", "-i", "wan", "-j", "DROP"]);
    r
}

/// Node `i`'s path to the peer at `public_ip` in `weft status`
/// (`direct`, `punched`, `relayed via <ip>`, `unreachable`; `None` with the
/// feature off).
pub fn path(c: &Cluster, i: usize, public_ip: &str) -> Option<String> {
    let st = c.status(i);
    let p = st.peers.iter().find(|p| p.public_ip == public_ip);
    p.and_then(|p| p.path.clone())
}

/// Waits up to `within` for node `i`'s path to `public_ip` to be `want`
/// (the engine publishes handshake times on its timer tick).
#[track_caller]
pub fn wait_path(c: &Cluster, i: usize, public_ip: &str, want: &str, within: Duration) {
    let deadline = Instant::now() + within;
    while path(c, i, public_ip).as_deref() != Some(want) {
        assert!(
            Instant::now() < deadline,
            "node {i}'s path to {public_ip} is not {want}: {:?}",
            c.status(i).peers
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Pods 0, 1, 2 on nodes 1, 2, 3 after every weftd started; the time from
/// the start to the first reply of pod 1 (behind NAT) to pod 2 (behind the
/// other NAT), when there is one within `within`.
pub fn start(n: &mut NatCluster, within: Duration) -> Option<Duration> {
    start_pods(n, 0..3, (1, 2), within)
}

/// Every weftd started, then pods 0 and 1 on nodes 2 and 3 (the two
/// behind NAT; no pod on the public node); the time from the start to the
/// first reply of pod 0 to pod 1, when there is one within `within`.
pub fn start_pair(n: &mut NatCluster, within: Duration) -> Option<Duration> {
    start_pods(n, 1..3, (0, 1), within)
}

/// Every weftd started, then a pod on each of `nodes`; the time from the
/// start to the first reply of pod `from` to pod `to` within `within`.
fn start_pods(
    n: &mut NatCluster,
    nodes: std::ops::Range<usize>,
    (from, to): (usize, usize),
    within: Duration,
) -> Option<Duration> {
    let t0 = Instant::now();
    n.c.start_all().unwrap_or_else(|e| panic!("start: {e}"));
    for i in nodes {
        n.c.add_pod(i, &format!("p{i}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    let (from, to) = (&n.c.pods[from].ns, n.c.pods[to].ip.clone());
    while t0.elapsed() < within {
        if from.ping(&to, 1) {
            return Some(t0.elapsed());
        }
    }
    None
}

/// The `WeftNAT` field of the lease of the node at `public_ip`.
pub fn weft_nat(c: &Cluster, public_ip: &str) -> serde_json::Value {
    c.lease_of(public_ip)["value"]["WeftNAT"].clone()
}

/// Sends `hex` (a UDP payload) 20 times to `dst` from `src` (address,
/// port) as a raw IPv4 packet out of `ns` (so `src` may be forged: an
/// off-path sender).
pub fn forge(ns: &Netns, (src, sport): (&str, u16), (dst, port): (&str, u16), hex: &str) {
    let script = format!(
        r#"
import socket, struct
src, dst, data = "{src}", "{dst}", bytes.fromhex("{hex}")
udp = struct.pack("!HHHH", {sport}, {port}, 8 + len(data), 0) + data
ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(udp), 1, 0, 64, 17, 0,
                 socket.inet_aton(src), socket.inet_aton(dst))
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for _ in range(20):
    s.sendto(ip + udp, (dst, 0))
"#
    );
    let out = ns.try_exec(&["python3", "-c", &script]);
    assert!(
        out.status.success(),
        "forge: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every packet node `i`'s engine dropped so far, whatever the reason.
pub fn drops(c: &Cluster, i: usize) -> u64 {
    let st = serde_json::to_value(c.status(i)).expect("status JSON");
    let devs = st["backend"]["devices"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    devs.iter()
        .filter_map(|d| d["drops"].as_object().cloned())
        .flat_map(|m| m.into_iter().filter_map(|(_, v)| v.as_u64()))
        .sum()
}

/// A discovery answer (docs/nat.md) with a guessed nonce naming `seen`.
pub fn forged_answer(seen: [u8; 4], port: u16) -> String {
    let mut b = vec![0xd1, b'W', b'D', 1, 2, 0, 0, 0];
    b.extend([0x5a; 16]);
    b.push(4);
    b.extend(port.to_be_bytes());
    b.extend(seen);
    b.resize(48, 0);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The longest gap of a ping stream from pod 1 to pod 2 around flushing
/// the conntrack table of node `i`'s router, waiting up to `bound` for the
/// replies to resume.
pub fn flush_gap(n: &NatCluster, i: usize, bound: Duration) -> Duration {
    let s = Stream::start(&n.c.pods[1].ns, &n.c.pods[2].ip);
    std::thread::sleep(Duration::from_millis(500));
    let before = s.replies();
    n.router(i).exec(&["conntrack", "-F"]);
    std::thread::sleep(Duration::from_millis(200));
    s.wait_more(s.replies().max(before), 100, bound);
    let gap = s.finish();
    println!("conntrack -F on node {}'s router: {gap}", i + 1);
    gap.longest
}

/// Attaches `ns` to the internet bridge at 192.0.2.66.
pub fn attach_attacker(n: &NatCluster, ns: &Netns) {
    let ul = format!("{}-ul", n.prefix);
    run(
        "ip",
        &[
            "link",
            "add",
            "eth0",
            "netns",
            ns.name(),
            "type",
            "veth",
            "peer",
            "name",
            "atk",
            "netns",
            &ul,
        ],
    );
    ns.exec(&["ip", "addr", "add", "192.0.2.66/24", "dev", "eth0"]);
    ns.exec(&["ip", "link", "set", "eth0", "up"]);
    run(
        "ip",
        &[
            "netns", "exec", &ul, "ip", "link", "set", "atk", "master", "br0",
        ],
    );
    run(
        "ip",
        &["netns", "exec", &ul, "ip", "link", "set", "atk", "up"],
    );
}
