//! Nodes behind NAT on **kernel WireGuard** (docs/nat.md, "Kernel
//! WireGuard"), in one guest on Debian's stock kernel (this machine's
//! kernel has no wireguard module): the topology of `weft_tests::nat`
//! built from network namespaces inside the guest, real weftd with
//! `--dataplane=kernel --nat-traversal` on the embedded store:
//!
//! ```text
//!  kn-n1 192.0.2.1 ─┐
//!  kn-r2 192.0.2.102 ─ br0 (kn-inet) ─ kn-r3 192.0.2.103
//!   │ MASQUERADE                          │ MASQUERADE
//!  kn-n2 10.12.0.2                       kn-n3 172.16.3.2
//! ```
//!
//! The two nodes behind NAT learn their endpoints from the public node's
//! kernel-path discovery (raw UDP sockets on the devices' port), publish
//! them, and punch: their overlay addresses ping each other over kernel
//! WireGuard whose endpoint is the other NAT's public address, not
//! through the public node. Times are printed (`--nocapture`).

use std::time::{Duration, Instant};

use weft_tests::vm::{Daemon, Lab, LabSpec, Node, quote};

/// The guest's work directory (its own tmpfs).
const WORK: &str = "/run/knat";

/// Builds the topology (see the module docs) in the guest.
const TOPOLOGY: &str = r#"
set -e
# veth A in namespace NA, B in NB (made in the guest's own namespace
# under scratch names, where its eth0 lives, then moved and renamed)
pair() {
  ip link add kn-a type veth peer name kn-b
  ip link set kn-a netns $2 name $1
  ip link set kn-b netns $4 name $3
}
ip netns add kn-inet
ip -n kn-inet link set lo up
ip -n kn-inet link add br0 type bridge
ip -n kn-inet link set br0 up
ip netns add kn-n1
pair eth0 kn-n1 p1 kn-inet
ip -n kn-inet link set p1 master br0 up
ip -n kn-n1 addr add 192.0.2.1/24 dev eth0
ip -n kn-n1 link set eth0 up
ip -n kn-n1 link set lo up
ip -n kn-n1 route add default via 192.0.2.254 dev eth0 onlink
site() {
  i=$1; wan=$2; lan=$3
  ip netns add kn-r$i
  ip netns add kn-n$i
  pair wan kn-r$i rw$i kn-inet
  ip -n kn-inet link set rw$i master br0 up
  ip -n kn-r$i addr add $wan/24 dev wan
  ip -n kn-r$i link set wan up
  ip -n kn-r$i link set lo up
  pair lan kn-r$i eth0 kn-n$i
  ip -n kn-r$i addr add $lan.1/24 dev lan
  ip -n kn-r$i link set lan up
  ip -n kn-n$i addr add $lan.2/24 dev eth0
  ip -n kn-n$i link set eth0 up
  ip -n kn-n$i link set lo up
  ip -n kn-n$i route add default via $lan.1
  ip netns exec kn-r$i sysctl -qw net.ipv4.ip_forward=1
  ip netns exec kn-r$i iptables -t nat -A POSTROUTING -o wan -j MASQUERADE
  ip netns exec kn-r$i iptables -A INPUT -i wan -j DROP
}
site 2 192.0.2.102 10.12.0
site 3 192.0.2.103 172.16.3
"#;

/// Each node: its namespace's address and the address it is seen from.
const NODES: [(&str, &str); 3] = [
    ("192.0.2.1", "192.0.2.1"),
    ("10.12.0.2", "192.0.2.102"),
    ("172.16.3.2", "192.0.2.103"),
];

/// Starts node `i`'s weftd (namespace `kn-n<i+1>`).
fn start_weftd(n: &Node, i: usize) -> Daemon {
    let dir = format!("{WORK}/n{}", i + 1);
    let bin = weft_tests::bins::path("weftd");
    let args = [
        format!("--store-path={WORK}/store"),
        format!("--net-config-path={WORK}/net-conf.json"),
        format!("--subnet-file={dir}/subnet.env"),
    ]
    .map(|a| quote(&a))
    .join(" ");
    n.spawn(
        &format!("weftd-n{}", i + 1),
        &format!(
            "mkdir -p {dir} && cd {dir} && WIREGUARD_KEY_FILE={dir}/wgkey RUST_LOG=info \
             exec ip netns exec kn-n{} {} --store=embedded {args} --iface=eth0 \
             --dataplane=kernel --nat-traversal --traffic-manager=none --probe-port=0 \
             --healthz-port=8471",
            i + 1,
            quote(&bin.to_string_lossy())
        ),
    )
}

/// Node `i`'s overlay address (its `flannel-wg` address, `<subnet>.0`).
fn overlay(n: &Node, d: &Daemon, i: usize) -> String {
    let env = format!("{WORK}/n{}/subnet.env", i + 1);
    let out = n.wait_sh(
        &format!("node {}'s subnet.env", i + 1),
        Duration::from_secs(60),
        &format!("cat {env} 2>/dev/null"),
        |o| o.stdout.contains("FLANNEL_SUBNET="),
    );
    assert!(d.running(), "weftd n{} exited:\n{}", i + 1, d.log());
    let sub = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
        .expect("FLANNEL_SUBNET");
    let ip = sub.split('/').next().expect("ip");
    let (head, _) = ip.rsplit_once('.').expect("dotted");
    format!("{head}.0")
}

/// `wg show flannel-wg endpoints` in node `i`'s namespace: key → endpoint.
fn endpoints(n: &Node, i: usize) -> Vec<(String, String)> {
    n.ok(&format!(
        "ip netns exec kn-n{} wg show flannel-wg endpoints",
        i + 1
    ))
    .lines()
    .filter_map(|l| l.split_once('\t'))
    .map(|(k, e)| (k.to_string(), e.to_string()))
    .collect()
}

fn public_key(n: &Node, i: usize) -> String {
    n.ok(&format!(
        "ip netns exec kn-n{} wg show flannel-wg public-key",
        i + 1
    ))
    .trim()
    .to_string()
}

#[test]
fn kernel_wireguard_nodes_behind_nat_punch_through() {
    let kit = weft_tests::require_vm!();
    let lab = Lab::start(&kit, &LabSpec::new("knat", 1));
    let n = lab.node(0);
    let t_topo = Instant::now();
    n.ok(TOPOLOGY);
    n.ok(&format!(
        "mkdir -p {WORK} && echo '{{\"Network\":\"10.244.0.0/16\",\"WeftNATTraversal\":true,\"Backend\":{{\"Type\":\"wireguard\"}}}}' > {WORK}/net-conf.json"
    ));
    println!("topology in the guest: {:?}", t_topo.elapsed());

    let t0 = Instant::now();
    let weftds: Vec<Daemon> = (0..3).map(|i| start_weftd(n, i)).collect();
    let addrs: Vec<String> = (0..3).map(|i| overlay(n, &weftds[i], i)).collect();
    let ready = Instant::now();
    println!("subnet.env on all three: {:?}", t0.elapsed());
    for (i, d) in weftds.iter().enumerate() {
        let log = d.log();
        assert!(
            log.contains("(kernel module)"),
            "n{}: not the kernel path:\n{log}",
            i + 1
        );
        d.wait_log(
            "NAT: discovery on flannel-wg's port 51820",
            Duration::from_secs(10),
        );
    }

    // The first reply between the two nodes behind NAT (n2 -> n3's
    // overlay). Bound: from the last subnet.env, discovery's first round
    // (1 s) and the main loop's publish poll (1 s), the peers' lease watch,
    // the greeting handshake and one 5 s retry if its first initiation
    // raced the other NAT's mapping: ~10 s of protocol, 1.6-2.4 s measured;
    // 45 s leaves the emulated CPU (speed varying 2x between sessions)
    // four times that.
    let from = "ip netns exec kn-n2";
    let first = loop {
        let out = n.sh(&format!("{from} ping -c1 -W1 -n {}", addrs[2]));
        if out.success() {
            break ready.elapsed();
        }
        assert!(
            ready.elapsed() < Duration::from_secs(45),
            "n2 never reached n3 over punched kernel WireGuard;\nn2:\n{}\nn3:\n{}\nn1:\n{}",
            weftds[1].log(),
            weftds[2].log(),
            weftds[0].log()
        );
    };
    println!(
        "all subnet.env -> first reply n2 -> n3 (behind two NATs): {first:?} ({:?} from weftd start)",
        t0.elapsed()
    );
    n.ok(&format!("{from} ping -c3 -i0.2 -W2 -n {}", addrs[2]));
    n.ok(&format!(
        "ip netns exec kn-n3 ping -c3 -i0.2 -W2 -n {}",
        addrs[1]
    ));

    // Published endpoints: the NATs' public addresses, the kernel's port.
    for (i, (own, public)) in NODES.iter().enumerate().skip(1) {
        weftds[i].wait_log(
            &format!("NAT: this node is seen from {public}:51820"),
            Duration::from_secs(10),
        );
        assert_ne!(own, public);
    }
    let leases = n.ok(&format!(
        "{} leases --json --store-path={WORK}/store --net-config-path={WORK}/net-conf.json",
        quote(&weft_tests::bins::path("weft").to_string_lossy())
    ));
    let leases: serde_json::Value = serde_json::from_str(&leases).expect("leases JSON");
    for (own, public) in &NODES[1..] {
        let l = leases
            .as_array()
            .expect("array")
            .iter()
            .find(|l| l["value"]["PublicIP"] == *own)
            .unwrap_or_else(|| panic!("no lease of {own}: {leases}"));
        assert_eq!(
            l["value"]["WeftNAT"]["Endpoint"],
            format!("{public}:51820"),
            "{l}"
        );
    }

    // The kernel's peers: each node behind NAT sends to the other's NAT
    // (punched, then confirmed by WireGuard roaming), keepalive 25 s.
    let keys: Vec<String> = (0..3).map(|i| public_key(n, i)).collect();
    for (i, j) in [(1, 2), (2, 1)] {
        let eps = endpoints(n, i);
        let ep = eps
            .iter()
            .find(|(k, _)| *k == keys[j])
            .map(|(_, e)| e.clone());
        assert_eq!(
            ep,
            Some(format!("{}:51820", NODES[j].1)),
            "n{}'s endpoint for n{}: {eps:?}",
            i + 1,
            j + 1
        );
        let ka = n.ok(&format!(
            "ip netns exec kn-n{} wg show flannel-wg persistent-keepalive",
            i + 1
        ));
        assert!(
            ka.lines().all(|l| l.ends_with("\t25")),
            "n{}: keepalive: {ka}",
            i + 1
        );
        let log = weftds[i].log();
        assert!(
            log.contains(&format!("is behind NAT, punching to {}:51820", NODES[j].1)),
            "n{}:\n{log}",
            i + 1
        );
    }
    // The public node reached both through their NATs (roaming), and the
    // pair's traffic did not go through it: it has no route between them.
    let hs = n.ok("ip netns exec kn-n2 wg show flannel-wg latest-handshakes");
    assert!(
        hs.lines()
            .filter(|l| l.starts_with(&keys[2]))
            .all(|l| !l.ends_with("\t0")),
        "n2 has a handshake with n3: {hs}"
    );
    let n1_ping = n.sh(&format!("ip netns exec kn-n1 ping -c1 -W2 -n {}", addrs[1]));
    assert!(n1_ping.success(), "n1 -> n2's overlay: {n1_ping}");
    for d in &weftds {
        for l in d.log().lines().filter(|l| l.contains("NAT:")) {
            println!("{}: {l}", d.name());
        }
        assert!(d.running(), "{} exited:\n{}", d.name(), d.log());
        d.stop(libc::SIGTERM, Duration::from_secs(10));
    }
}
