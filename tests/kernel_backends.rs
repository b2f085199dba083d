//! Kernel backends end to end, through real weftd daemons in network
//! namespaces (the `Cluster` builder `weft demo` uses): kernel vxlan and
//! host-gw meshes, a cluster mixing kernel and userspace vxlan nodes,
//! reconciliation of entries deleted by hand, the start-up errors for
//! backends this kernel cannot run, and live switching between the kernel
//! and userspace vxlan paths under a ping flood and an iperf3 flow (the
//! measured interruption is printed).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_control::demo::cluster::{Cluster, ClusterSpec};
use weft_testenv::require_root;
use weft_tests::proc::wait_for;

fn spec(tag: &str, backend_json: &str, nodes: u8, work: &std::path::Path) -> ClusterSpec {
    ClusterSpec {
        prefix: weft_tests::unique(tag),
        nodes,
        net_conf: format!(r#"{{"Network":"10.244.0.0/16","Backend":{backend_json}}}"#),
        weftd_args: vec!["--traffic-manager=none".into()],
        bin_dir: weft_tests::bins::dir(),
        work: work.to_path_buf(),
        store: Default::default(),
    }
}

fn cluster(
    tag: &str,
    backend_json: &str,
    node_args: Vec<Vec<String>>,
) -> (tempfile::TempDir, Cluster) {
    let work = tempfile::tempdir().expect("tempdir");
    let n = u8::try_from(node_args.len()).expect("nodes");
    let c = Cluster::start_with_node_args(spec(tag, backend_json, n, work.path()), node_args)
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    (work, c)
}

fn args(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

fn wait_ping(c: &Cluster, a: usize, b: usize) -> bool {
    (0..15).any(|_| c.pods[a].ns.ping(&c.pods[b].ip, 1))
}

fn iperf_bytes(c: &Cluster, a: usize, b: usize) -> u64 {
    let server = &c.pods[b];
    server
        .ns
        .exec(&["iperf3", "-s", "-1", "-D", "-B", &server.ip]);
    std::thread::sleep(Duration::from_millis(300));
    let out = c.pods[a]
        .ns
        .try_exec(&["iperf3", "-c", &server.ip, "-t", "2", "-J"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0)
}

/// One pod per node; every pod pings every other and TCP flows both ways.
fn mesh(c: &mut Cluster, what: &str) {
    for n in 0..c.nodes.len() {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    let n = c.pods.len();
    for a in 0..n {
        for b in 0..n {
            if a != b {
                assert!(
                    wait_ping(c, a, b),
                    "{what}: pod {a} cannot reach pod {b}; logs:\n{}\n{}",
                    c.log(a),
                    c.log(b)
                );
            }
        }
    }
    for (a, b) in [(0, 1), (n - 1, 0)] {
        let bytes = iperf_bytes(c, a, b);
        assert!(
            bytes > 1_000_000,
            "{what}: iperf3 {a}->{b} moved only {bytes} bytes"
        );
    }
}

fn subnet_of(c: &Cluster, node: usize) -> String {
    let env = c.subnet_env(node).expect("subnet.env");
    let s = env
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
        .expect("FLANNEL_SUBNET");
    s.replace(".1/", ".0/")
}

#[test]
fn kernel_vxlan_three_nodes_is_programmed_as_flannel() {
    require_root!();
    let (_w, mut c) = cluster(
        "kv",
        r#"{"Type":"vxlan"}"#,
        vec![args(&["--dataplane=kernel"]); 3],
    );
    assert!(
        c.log(0).contains("runs in the kernel"),
        "log:\n{}",
        c.log(0)
    );
    mesh(&mut c, "kernel vxlan");
    let ns = &c.nodes[0].ns;
    let link = ns.exec(&["ip", "-d", "link", "show", "flannel.1"]);
    for want in [
        "vxlan id 1 local 192.0.2.1 dev eth0",
        "dstport 8472",
        "nolearning",
        "mtu 1450",
    ] {
        assert!(link.contains(want), "{want:?} missing in:\n{link}");
    }
    let addr = ns.exec(&["ip", "-4", "addr", "show", "flannel.1"]);
    assert!(
        addr.contains(&format!(
            "inet {}/32",
            subnet_of(&c, 0).trim_end_matches("/24")
        )),
        "{addr}"
    );
    assert_eq!(
        ns.exec(&["cat", "/proc/sys/net/ipv6/conf/flannel.1/accept_ra"])
            .trim(),
        "0"
    );
    let routes = ns.exec(&["ip", "route", "show", "dev", "flannel.1"]);
    let fdb = ns.exec(&["bridge", "fdb", "show", "dev", "flannel.1"]);
    let neigh = ns.exec(&["ip", "neigh", "show", "dev", "flannel.1"]);
    for peer in 1..3 {
        let sn = subnet_of(&c, peer);
        let gw = sn.trim_end_matches("/24");
        assert!(
            routes.contains(&format!("{sn} via {gw} onlink")),
            "route to {sn} missing:\n{routes}"
        );
        assert!(
            neigh.contains(&format!("{gw} lladdr")) && neigh.contains("PERMANENT"),
            "neigh {gw}:\n{neigh}"
        );
        assert!(
            fdb.contains(&format!("dst 192.0.2.{} self permanent", peer + 1)),
            "fdb:\n{fdb}"
        );
    }
}

#[test]
fn host_gw_three_nodes() {
    require_root!();
    let (_w, mut c) = cluster("hg", r#"{"Type":"host-gw"}"#, vec![vec![]; 3]);
    mesh(&mut c, "host-gw");
    let routes = c.nodes[0].ns.exec(&["ip", "route"]);
    for peer in 1..3 {
        let want = format!("{} via 192.0.2.{} dev eth0", subnet_of(&c, peer), peer + 1);
        assert!(routes.contains(&want), "{want:?} missing:\n{routes}");
    }
    assert!(c.subnet_env(0).expect("env").contains("FLANNEL_MTU=1500"));
}

/// Node 1 runs kernel vxlan, node 2 weft's userspace vxlan, node 3 auto
/// (kernel here): same leases, same wire, full mesh.
#[test]
fn mixed_kernel_and_userspace_vxlan_nodes() {
    require_root!();
    let node_args = vec![
        args(&["--dataplane=kernel"]),
        args(&["--dataplane=userspace", "--engine-workers=1"]),
        vec![],
    ];
    let (_w, mut c) = cluster("mx", r#"{"Type":"vxlan"}"#, node_args);
    assert!(c.log(0).contains("runs in the kernel"));
    assert!(
        c.log(1).contains("runs in the userspace"),
        "log:\n{}",
        c.log(1)
    );
    let kind = c.nodes[1]
        .ns
        .exec(&["ip", "-d", "link", "show", "flannel.1"]);
    assert!(kind.contains("tun"), "node 2 should run a TUN:\n{kind}");
    mesh(&mut c, "mixed vxlan");
}

fn wait_contains(what: &str, timeout: Duration, mut f: impl FnMut() -> String, needle: &str) {
    wait_for(what, timeout, || f().contains(needle).then_some(()));
}

/// A route, a neighbour and an fdb entry deleted by hand are back within one
/// reconcile period (10 s; waited for up to 25 s); a host-gw route too.
#[test]
fn deleted_entries_are_restored_within_a_period() {
    require_root!();
    let (_w, mut c) = cluster(
        "rc",
        r#"{"Type":"vxlan"}"#,
        vec![args(&["--dataplane=kernel"]); 2],
    );
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(wait_ping(&c, 0, 1), "no initial connectivity");
    let sn = subnet_of(&c, 1);
    let gw = sn.trim_end_matches("/24").to_string();
    let ns = &c.nodes[0].ns;
    let fdb_line = ns.exec(&["bridge", "fdb", "show", "dev", "flannel.1"]);
    let mac = fdb_line
        .lines()
        .find(|l| l.contains("dst 192.0.2.2"))
        .and_then(|l| l.split_whitespace().next())
        .expect("fdb mac")
        .to_string();
    ns.exec(&["ip", "route", "del", &sn]);
    ns.exec(&["ip", "neigh", "del", &gw, "dev", "flannel.1"]);
    ns.exec(&[
        "bridge",
        "fdb",
        "del",
        &mac,
        "dev",
        "flannel.1",
        "dst",
        "192.0.2.2",
        "self",
    ]);
    assert!(!ns.exec(&["ip", "route"]).contains(&sn));
    let t0 = Instant::now();
    wait_contains(
        "route back",
        Duration::from_secs(25),
        || ns.exec(&["ip", "route"]),
        &format!("{sn} via {gw} dev flannel.1 onlink"),
    );
    wait_contains(
        "neigh back",
        Duration::from_secs(5),
        || ns.exec(&["ip", "neigh", "show", "dev", "flannel.1"]),
        &gw,
    );
    wait_contains(
        "fdb back",
        Duration::from_secs(5),
        || ns.exec(&["bridge", "fdb", "show", "dev", "flannel.1"]),
        "dst 192.0.2.2 self permanent",
    );
    println!("kernel vxlan entries restored after {:?}", t0.elapsed());
    assert!(wait_ping(&c, 0, 1), "traffic did not come back");
    assert!(c.log(0).contains("Route recovered"), "log:\n{}", c.log(0));
    // The whole device, too.
    ns.exec(&["ip", "link", "del", "flannel.1"]);
    wait_contains(
        "device back",
        Duration::from_secs(25),
        || ns.exec(&["ip", "route"]),
        &format!("{sn} via {gw} dev flannel.1 onlink"),
    );
    assert!(
        wait_ping(&c, 0, 1),
        "traffic did not come back after the device was recreated"
    );
    drop(c);

    let (_w, mut c) = cluster("rh", r#"{"Type":"host-gw"}"#, vec![vec![]; 2]);
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(wait_ping(&c, 0, 1), "no initial host-gw connectivity");
    let sn = subnet_of(&c, 1);
    c.nodes[0].ns.exec(&["ip", "route", "del", &sn]);
    wait_contains(
        "host-gw route back",
        Duration::from_secs(25),
        || c.nodes[0].ns.exec(&["ip", "route"]),
        &format!("{sn} via 192.0.2.2 dev eth0"),
    );
    assert!(wait_ping(&c, 0, 1));
}

/// Backends this kernel cannot run fail at start-up with a clear message.
#[test]
fn backends_without_kernel_support_fail_clearly() {
    require_root!();
    let psk = "p".repeat(96);
    let cases = [
        (
            // auto runs the userspace IPIP engine instead (tests/ipip.rs).
            r#"{"Type":"ipip"}"#.to_string(),
            args(&["--dataplane=kernel"]),
            "this kernel cannot run the ipip backend: no ipip support",
        ),
        (
            format!(r#"{{"Type":"ipsec","PSK":"{psk}"}}"#),
            vec![],
            "no esp4 (CONFIG_INET_ESP) support",
        ),
        (
            r#"{"Type":"wireguard"}"#.to_string(),
            args(&["--dataplane=kernel"]),
            "wireguard",
        ),
        (
            r#"{"Type":"udp"}"#.to_string(),
            args(&["--dataplane=kernel"]),
            "udp with --dataplane=kernel",
        ),
        (
            r#"{"Type":"host-gw"}"#.to_string(),
            args(&["--dataplane=userspace"]),
            "no userspace host-gw engine",
        ),
    ];
    for (conf, extra, want) in cases {
        let work = tempfile::tempdir().expect("tempdir");
        let err = Cluster::start_with_node_args(spec("er", &conf, 1, work.path()), vec![extra])
            .map(|_| ())
            .expect_err(&format!("{conf} must not start"));
        let msg = err.to_string();
        assert!(
            msg.contains("Error fetching backend") || msg.contains("Error registering network"),
            "{conf}: {msg}"
        );
        assert!(msg.contains(want), "{conf}: expected {want:?} in:\n{msg}");
    }
}

/// A background ping flood (every 10 ms) whose replies are timestamped.
struct PingFlood {
    child: Option<std::process::Child>,
}

impl PingFlood {
    fn start(ns: &str, dst: &str) -> PingFlood {
        let child = Command::new("ip")
            .args([
                "netns", "exec", ns, "ping", "-D", "-n", "-i", "0.01", "-W", "1", dst,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("ping");
        PingFlood { child: Some(child) }
    }

    /// Stops it; returns (replies, longest gap between consecutive replies).
    fn finish(mut self) -> (usize, Duration) {
        let child = self.child.take().expect("running");
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        let out = child.wait_with_output().expect("ping output");
        let text = String::from_utf8_lossy(&out.stdout);
        let stamps: Vec<f64> = text
            .lines()
            .filter(|l| l.contains("bytes from"))
            .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
            .collect();
        let gap = stamps
            .windows(2)
            .map(|w| w[1] - w[0])
            .fold(0.0f64, f64::max);
        (stamps.len(), Duration::from_secs_f64(gap))
    }
}

impl Drop for PingFlood {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn lease_json(c: &Cluster, node: usize) -> serde_json::Value {
    let store = format!("--store-path={}", c.work().join("store").display());
    let out = Command::new(weft_tests::bins::path("weft"))
        .args(["leases", "--json", &store])
        .output()
        .expect("weft leases");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let ip = format!("192.0.2.{}", node + 1);
    let l = v
        .as_array()
        .expect("array")
        .iter()
        .find(|l| l["value"]["PublicIP"] == ip.as_str())
        .expect("lease")
        .clone();
    serde_json::json!({ "key": l["key"], "value": l["value"] })
}

fn switch(c: &Cluster, node: usize, to: &str) -> Duration {
    let t0 = Instant::now();
    let out = Command::new(weft_tests::bins::path("weft"))
        .args(["dataplane", "set", to, "--subnet-file"])
        .arg(c.nodes[node].dir.join("subnet.env"))
        .output()
        .expect("weft dataplane set");
    assert!(
        out.status.success(),
        "weft dataplane set {to} failed: {}{}\nlog:\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        c.log(node)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("runs in the {to}")));
    t0.elapsed()
}

/// Live switching: node 1 moves kernel → userspace → kernel and node 2
/// kernel → userspace while pod 1 pings pod 2 every 10 ms and an iperf3 flow
/// runs between them. The leases and subnet.env do not change, traffic
/// resumes after every switch, and the longest ping gap is reported.
#[test]
fn live_switching_keeps_the_lease_and_traffic_resumes() {
    require_root!();
    let (_w, mut c) = cluster(
        "sw",
        r#"{"Type":"vxlan"}"#,
        vec![args(&["--engine-workers=1"]); 2],
    );
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(
        wait_ping(&c, 0, 1) && wait_ping(&c, 1, 0),
        "no initial connectivity"
    );
    let leases = (lease_json(&c, 0), lease_json(&c, 1));
    let envs = (c.subnet_env(0), c.subnet_env(1));
    let (a, b) = (c.pods[0].ns.name().to_string(), c.pods[1].ip.clone());
    // iperf3 for the whole sequence, 0.5 s intervals.
    c.pods[1].ns.exec(&["iperf3", "-s", "-1", "-D", "-B", &b]);
    std::thread::sleep(Duration::from_millis(300));
    let iperf = Command::new("ip")
        .args([
            "netns", "exec", &a, "iperf3", "-c", &b, "-t", "14", "-i", "0.5", "-J",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iperf3");
    let flood = PingFlood::start(&a, &b);
    std::thread::sleep(Duration::from_secs(2));
    let mut report = Vec::new();
    for (node, to) in [(0, "userspace"), (0, "kernel"), (1, "userspace")] {
        let took = switch(&c, node, to);
        report.push(format!(
            "node {} -> {to}: command returned after {took:?}",
            node + 1
        ));
        std::thread::sleep(Duration::from_secs(3));
    }
    let (replies, gap) = flood.finish();
    let out = iperf.wait_with_output().expect("iperf3 result");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let bytes = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    let intervals: Vec<u64> = v["intervals"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|i| i["sum"]["bytes"].as_u64())
                .collect()
        })
        .unwrap_or_default();
    let switch_logs: Vec<String> = (0..2)
        .flat_map(|n| {
            c.log(n)
                .lines()
                .filter(|l| l.contains("switched in"))
                .map(String::from)
                .collect::<Vec<_>>()
        })
        .collect();
    println!("live switching report:");
    for r in &report {
        println!("  {r}");
    }
    for l in &switch_logs {
        println!(
            "  weftd: {}",
            l.split("dataplane:").last().unwrap_or(l).trim()
        );
    }
    println!("  ping every 10 ms: {replies} replies, longest gap between replies {gap:?}");
    println!("  iperf3: {bytes} bytes; bytes per 0.5 s interval: {intervals:?}");
    assert_eq!(switch_logs.len(), 3, "logs:\n{}\n{}", c.log(0), c.log(1));
    assert!(replies > 100, "too few ping replies: {replies}");
    assert!(
        out.status.success(),
        "iperf3 failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        intervals.last().is_some_and(|b| *b > 0),
        "the TCP flow did not resume: {intervals:?}"
    );
    assert!(
        wait_ping(&c, 0, 1) && wait_ping(&c, 1, 0),
        "traffic did not resume"
    );
    assert_eq!(
        (lease_json(&c, 0), lease_json(&c, 1)),
        leases,
        "switching changed a lease"
    );
    assert_eq!(
        (c.subnet_env(0), c.subnet_env(1)),
        envs,
        "switching changed subnet.env"
    );
    // Node 2 now runs userspace, node 1 kernel: the status files say so.
    let st = Command::new(weft_tests::bins::path("weft"))
        .args(["dataplane", "--subnet-file"])
        .arg(c.nodes[1].dir.join("subnet.env"))
        .output()
        .expect("weft dataplane");
    assert!(
        String::from_utf8_lossy(&st.stdout).contains("runs in the userspace"),
        "{}",
        String::from_utf8_lossy(&st.stdout)
    );
}
