//! Kernel backends end to end, through real weftd daemons in network
//! namespaces (the test kit's `Cluster`, on `weft demo`'s pieces): kernel vxlan and
//! host-gw meshes, a cluster mixing kernel and userspace vxlan nodes,
//! reconciliation of entries deleted by hand, the start-up errors for
//! backends this kernel cannot run, and live switching between the kernel
//! and userspace vxlan paths under a ping flood and an iperf3 flow (the
//! measured interruption is printed).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_testenv::require_root;
use weft_tests::RESTORED_WITHIN;
use weft_tests::cluster::{self, Cluster};
use weft_tests::ping;
use weft_tests::proc::wait_for;
use weft_tests::weftd::assert_dataplane;

/// `nodes` nodes, each with its `node_args`, on `backend`; no host rules.
fn cluster(tag: &str, backend: &str, node_args: &[&[&str]]) -> (tempfile::TempDir, Cluster) {
    cluster::start_nodes(
        tag,
        &cluster::net_conf(backend),
        node_args,
        &["--traffic-manager=none"],
    )
}

/// One pod per node; every pod pings every other and TCP flows both ways.
fn mesh(c: &mut Cluster, what: &str) {
    for n in 0..c.nodes.len() {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    let n = c.pods.len();
    c.assert_mesh();
    for (a, b) in [(0, 1), (n - 1, 0)] {
        let bytes = c.iperf_bytes(a, b, 2);
        assert!(
            bytes > 1_000_000,
            "{what}: iperf3 {a}->{b} moved only {bytes} bytes"
        );
    }
}

#[test]
fn kernel_vxlan_three_nodes_is_programmed_as_flannel() {
    require_root!();
    let (_w, mut c) = cluster(
        "kv",
        r#"{"Type":"vxlan"}"#,
        &[&["--dataplane=kernel"][..]; 3],
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
        addr.contains(&format!("inet {}/32", c.subnet(0).trim_end_matches("/24"))),
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
        let sn = c.subnet(peer);
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
    let (_w, mut c) = cluster("hg", r#"{"Type":"host-gw"}"#, &[&[][..]; 3]);
    mesh(&mut c, "host-gw");
    let routes = c.nodes[0].ns.exec(&["ip", "route"]);
    for peer in 1..3 {
        let want = format!("{} via 192.0.2.{} dev eth0", c.subnet(peer), peer + 1);
        assert!(routes.contains(&want), "{want:?} missing:\n{routes}");
    }
    assert!(c.subnet_env(0).expect("env").contains("FLANNEL_MTU=1500"));
}

/// Node 1 runs kernel vxlan, node 2 weft's userspace vxlan, node 3 auto
/// (kernel here): same leases, same wire, full mesh.
#[test]
fn mixed_kernel_and_userspace_vxlan_nodes() {
    require_root!();
    let node_args: &[&[&str]] = &[
        &["--dataplane=kernel"],
        &["--dataplane=userspace", "--engine-workers=1"],
        &[],
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

/// A route, a neighbour and an fdb entry deleted by hand are back within one
/// reconcile period ([`RESTORED_WITHIN`] of the delete), and so is the whole
/// device; a host-gw route too. The times are printed.
#[test]
fn deleted_entries_are_restored_within_a_period() {
    require_root!();
    let (_w, mut c) = cluster(
        "rc",
        r#"{"Type":"vxlan"}"#,
        &[&["--dataplane=kernel"][..]; 2],
    );
    assert_dataplane(&c.nodes[0].dir.join("subnet.env"), "vxlan", "kernel");
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial connectivity");
    let sn = c.subnet(1);
    let gw = sn.trim_end_matches("/24").to_string();
    let ns = &c.nodes[0].ns;
    let fdb_line = ns.exec(&["bridge", "fdb", "show", "dev", "flannel.1"]);
    let mac = fdb_line
        .lines()
        .find(|l| l.contains("dst 192.0.2.2"))
        .and_then(|l| l.split_whitespace().next())
        .expect("fdb mac")
        .to_string();
    let t0 = Instant::now();
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
    let route = format!("{sn} via {gw} dev flannel.1 onlink");
    restored(t0, "vxlan route", || ns.exec(&["ip", "route"]), &route);
    restored(
        t0,
        "vxlan neighbour",
        || ns.exec(&["ip", "neigh", "show", "dev", "flannel.1"]),
        &format!("{gw} lladdr"),
    );
    restored(
        t0,
        "vxlan fdb entry",
        || ns.exec(&["bridge", "fdb", "show", "dev", "flannel.1"]),
        "dst 192.0.2.2 self permanent",
    );
    assert!(c.wait_ping(0, 1), "traffic did not come back");
    assert!(c.log(0).contains("Route recovered"), "log:\n{}", c.log(0));
    // The whole device, too.
    let t0 = Instant::now();
    ns.exec(&["ip", "link", "del", "flannel.1"]);
    restored(t0, "vxlan device", || ns.exec(&["ip", "route"]), &route);
    assert!(
        c.wait_ping(0, 1),
        "traffic did not come back after the device was recreated"
    );
    drop(c);

    let (_w, mut c) = cluster("rh", r#"{"Type":"host-gw"}"#, &[&[][..]; 2]);
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial host-gw connectivity");
    let sn = c.subnet(1);
    let t0 = Instant::now();
    c.nodes[0].ns.exec(&["ip", "route", "del", &sn]);
    restored(
        t0,
        "host-gw route",
        || c.nodes[0].ns.exec(&["ip", "route"]),
        &format!("{sn} via 192.0.2.2 dev eth0"),
    );
    assert!(c.wait_ping(0, 1));
}

/// Waits until `f()` contains `needle`, at most until [`RESTORED_WITHIN`]
/// after `t0` (when the state was deleted); prints how long it took.
fn restored(t0: Instant, what: &str, mut f: impl FnMut() -> String, needle: &str) {
    let left = RESTORED_WITHIN.saturating_sub(t0.elapsed());
    wait_for(&format!("{what} restored"), left, || {
        f().contains(needle).then_some(())
    });
    println!(
        "reconcile: {what} restored {:.1?} after the delete",
        t0.elapsed()
    );
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
            &["--dataplane=kernel"][..],
            "this kernel cannot run the ipip backend: no ipip support",
        ),
        (
            format!(r#"{{"Type":"ipsec","PSK":"{psk}"}}"#),
            &[][..],
            "no esp4 (CONFIG_INET_ESP) support",
        ),
        (
            r#"{"Type":"wireguard"}"#.to_string(),
            &["--dataplane=kernel"][..],
            "wireguard",
        ),
        (
            r#"{"Type":"udp"}"#.to_string(),
            &["--dataplane=kernel"][..],
            "udp with --dataplane=kernel",
        ),
        (
            r#"{"Type":"host-gw"}"#.to_string(),
            &["--dataplane=userspace"][..],
            "no userspace host-gw engine",
        ),
    ];
    for (conf, extra, want) in cases {
        let work = tempfile::tempdir().expect("tempdir");
        let spec = cluster::spec(
            "er",
            &cluster::net_conf(&conf),
            1,
            &["--traffic-manager=none"],
            work.path(),
        );
        let extra = vec![extra.iter().map(|a| a.to_string()).collect()];
        let err = Cluster::start_with_node_args(spec, extra)
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

/// Node `node`'s lease in the store (key and value, without its expiry).
fn lease_json(c: &Cluster, node: usize) -> serde_json::Value {
    let l = c.lease_of(&format!("192.0.2.{}", node + 1));
    serde_json::json!({ "key": l["key"], "value": l["value"] })
}

/// The longest ping gap (one ping every 10 ms) a live switch of kernel
/// vxlan to the engine or back may cause on this machine's real CPU, with a
/// TCP flow running beside it (debug build, as `cargo test` builds it).
/// Measured on this 2-vCPU machine on 2026-12-03, at load average 8-11
/// (other sessions' builds): 51-224 ms in 21 switches over 7 runs, median
/// 64 ms (kernel → userspace 55-224, userspace → kernel 51-117); the
/// release build on a quieter machine loses 30-40 ms (the switch benchmark,
/// README "Switch and restart"). The bound is 2.2× the worst seen and half
/// the second the README promises: a switch that stalls on anything (a
/// retry, a deadline, a blocked main loop) costs more. A 600 ms sleep
/// injected between removing the old path and starting the new one
/// (`Dual::switch_dataplane`) fails it.
const SWITCH_GAP: Duration = Duration::from_millis(500);

/// Live switching: node 1 moves kernel → userspace → kernel and node 2
/// kernel → userspace while an iperf3 flow runs between the pods; around
/// each switch pod 1 pings pod 2 every 10 ms and the longest gap is
/// asserted ([`SWITCH_GAP`]). Both nodes start pinned to the kernel path
/// and each switch is checked in `weft status`; the leases and subnet.env
/// do not change and TCP resumes.
#[test]
fn live_switching_keeps_the_lease_and_traffic_resumes() {
    require_root!();
    let (_w, mut c) = cluster(
        "sw",
        r#"{"Type":"vxlan"}"#,
        &[&["--dataplane=kernel", "--engine-workers=1"][..]; 2],
    );
    for n in 0..2 {
        assert_dataplane(&c.nodes[n].dir.join("subnet.env"), "vxlan", "kernel");
    }
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(
        c.wait_ping(0, 1) && c.wait_ping(1, 0),
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
            "netns", "exec", &a, "iperf3", "-c", &b, "-t", "20", "-i", "0.5", "-J",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("iperf3");
    std::thread::sleep(Duration::from_secs(1));
    let mut report = Vec::new();
    let mut gaps = Vec::new();
    for (node, from, to) in [
        (0, "kernel", "userspace"),
        (0, "userspace", "kernel"),
        (1, "kernel", "userspace"),
    ] {
        let stream = ping::Stream::start(&c.pods[0].ns, &b);
        let took = c.switch_dataplane(node, to);
        assert_dataplane(&c.nodes[node].dir.join("subnet.env"), "vxlan", to);
        let at = stream.replies();
        stream.wait_more(at, 100, Duration::from_secs(30));
        let gap = stream.finish();
        report.push(format!(
            "node {} {from} -> {to}: {gap} (command returned after {took:.1?})",
            node + 1
        ));
        gaps.push((node, to, gap));
    }
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
    println!("live switching report (ping every 10 ms around each switch):");
    for r in &report {
        println!("  {r}");
    }
    for l in &switch_logs {
        println!(
            "  weftd: {}",
            l.split("dataplane:").last().unwrap_or(l).trim()
        );
    }
    println!("  iperf3: {bytes} bytes; bytes per 0.5 s interval: {intervals:?}");
    assert_eq!(switch_logs.len(), 3, "logs:\n{}\n{}", c.log(0), c.log(1));
    for (node, to, gap) in &gaps {
        assert!(
            gap.longest < SWITCH_GAP,
            "switching node {} to {to}: {gap}, bound {SWITCH_GAP:?}\nlogs:\n{}\n{}",
            node + 1,
            c.log(0),
            c.log(1)
        );
    }
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
        c.wait_ping(0, 1) && c.wait_ping(1, 0),
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
}
