//! weftd's tunnel TAP (issue 32, `--tunnel-gso`, `engine/src/path/tap.rs`,
//! `control/src/backend/tunnel/gso.rs`): userspace VXLAN writes each TCP
//! super-packet whole to a TAP with UDP-tunnel GSO (Linux 6.17+) and the
//! kernel cuts it. Two real weftd nodes; nothing configured by hand but
//! `ip_forward=1` on the nodes (a Kubernetes node has it; the CNI bridge
//! plugin would set it only with the first pod, after weftd started).
//!
//! One cluster, one node restarted through the cases (a few seconds):
//!
//! - `on`: weftd set the TAP's `rp_filter=0` and `accept_local=1` and
//!   brought it up, status names it; TCP moves between the pods, the TAP
//!   carried the super-packets and the receiving pod counted no TCP
//!   checksum error, both with the uplink passing the unsegmented skb (a
//!   veth, as a NIC with `tx-udp_tnl-segmentation`) and with the node's
//!   stack cutting it (the offload turned off under the running weftd,
//!   which `weft doctor` then reports as `tunnel_gso_stack_segments`);
//!   after weftd stops the TAP is gone.
//! - `auto` on an uplink without `tx-udp_tnl-segmentation`: the sockets,
//!   status says why, no TAP, pods still reach each other.
//! - `on` with `net.ipv4.conf.all.rp_filter=1`: weftd refuses to start,
//!   naming the condition, and leaves no TAP.
//! - The other node switched to the kernel dataplane and back: the TAP
//!   goes and comes back; after weftd stops it is gone.
//!
//! The udp backend (flannel-UDP, a second cluster): with `on` on both
//! nodes the TAP carries the super-packets (the peer's lease has
//! `WeftGSO`), TCP moves without checksum errors; once the peer runs with
//! `off` (no `WeftGSO`: what flanneld's lease looks like), nothing more
//! goes through the TAP toward it and TCP still moves, over the sockets.

#[allow(dead_code)] // shared with tests/doctor.rs, which uses all of it
mod doctor_kit;

use std::time::Duration;

use weft_testenv::require_root;
use weft_tests::cluster::{self, Cluster, ClusterStore};

const TAP: &str = "weft-gso0";

fn counter(ns: &weft_tests::netns::Netns, name: &str) -> u64 {
    let out = ns.sh(&format!("nstat -az {name} | awk '/{name}/{{print $2}}'"));
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("nstat gave no {name}: {out:?}"))
}

fn has_tap(c: &Cluster, n: usize) -> bool {
    c.nodes[n]
        .ns
        .try_exec(&["ip", "link", "show", TAP])
        .status
        .success()
}

/// Node `n`'s IPv4 vxlan device's `tunnel_gso` status.
fn gso_status(c: &Cluster, n: usize) -> weft_control::status::model::TunnelGsoStatus {
    device_gso_status(c, n, "flannel.1")
}

/// Node `n`'s device `name`'s `tunnel_gso` status.
fn device_gso_status(
    c: &Cluster,
    n: usize,
    name: &str,
) -> weft_control::status::model::TunnelGsoStatus {
    let st = c.status(n);
    let dev = st
        .backend
        .devices
        .iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("node {n}: no {name} in status: {st:?}"));
    dev.tunnel_gso
        .clone()
        .unwrap_or_else(|| panic!("node {n}: no tunnel_gso in status: {dev:?}"))
}

/// The frames node `n`'s weftd wrote to its TAP (the TAP's `rx_packets`).
fn tap_frames(c: &Cluster, n: usize) -> u64 {
    let s = c.nodes[n].ns.exec(&[
        "cat",
        &format!("/sys/class/net/{TAP}/statistics/rx_packets"),
    ]);
    s.trim().parse().unwrap_or(0)
}

/// 2 s of iperf3 from pod 0 to pod 1: (bytes, frames through node 0's
/// TAP, TCP checksum errors counted in pod 1).
fn run_iperf(c: &Cluster) -> (u64, u64, u64) {
    let before = (tap_frames(c, 0), counter(&c.pods[1].ns, "TcpInCsumErrors"));
    let bytes = c.iperf_bytes(0, 1, 2);
    let after = (tap_frames(c, 0), counter(&c.pods[1].ns, "TcpInCsumErrors"));
    (bytes, after.0 - before.0, after.1 - before.1)
}

/// Restarts node `n`'s weftd with `--tunnel-gso=<mode>` (and no subnet.env,
/// so that readiness is this run's).
fn restart(c: &mut Cluster, n: usize, mode: &str) {
    c.stop_weftd(n);
    let _ = std::fs::remove_file(c.subnet_file(n));
    c.start_weftd_with(n, &[format!("--tunnel-gso={mode}")])
        .expect("start weftd");
}

#[test]
fn weftd_runs_the_tunnel_tap_and_follows_the_uplink() {
    require_root!();
    let work = tempfile::tempdir().expect("tempdir");
    let conf = cluster::net_conf(r#"{"Type":"vxlan"}"#);
    let args = ["--traffic-manager=none", "--dataplane=userspace"];
    let spec = cluster::spec("tapgso", &conf, 2, &args, work.path());
    let mut c = Cluster::create(spec, &ClusterStore::Embedded, Vec::new()).expect("cluster");
    for n in 0..2 {
        let ns = &c.nodes[n].ns;
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let rp = ns.sh("sysctl -n net.ipv4.conf.all.rp_filter");
        assert_ne!(rp.trim(), "1", "a fresh namespace has no strict rp_filter");
        c.start_weftd_with(n, &["--tunnel-gso=on".into()])
            .expect("start weftd");
    }
    for n in 0..2 {
        c.wait_ready(n, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        let ns = &c.nodes[n].ns;
        assert!(
            has_tap(&c, n),
            "node {n}: weftd opened no {TAP}:\n{}",
            c.log(n)
        );
        let link = ns.sh(&format!("ip -o link show {TAP}"));
        assert!(link.contains(",UP"), "node {n}: {TAP} is not up: {link}");
        for (key, want) in [("rp_filter", "0"), ("accept_local", "1")] {
            let v = ns.sh(&format!("sysctl -n net.ipv4.conf.{TAP}.{key}"));
            assert_eq!(v.trim(), want, "node {n}: {TAP} {key}");
        }
        let g = gso_status(&c, n);
        assert_eq!(
            (g.mode.as_str(), g.tap.as_deref(), g.reason.as_deref()),
            ("on", Some(TAP), None),
            "node {n}"
        );
    }
    for n in 0..2 {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    assert!(c.wait_ping(0, 1), "pods do not reach each other");
    let addr = c.nodes[0].addr.clone();
    let uplink = c.nodes[0].ns.sh(&format!(
        "ip -o -4 addr show | awk '$4 ~ /^{addr}\\//{{print $2}}'"
    ));
    let uplink = uplink.trim().to_string();
    assert!(!uplink.is_empty(), "no uplink with {addr}");
    let offload = |c: &Cluster, on: &str| {
        c.nodes[0].ns.exec(&[
            "ethtool",
            "-K",
            &uplink,
            "tx-udp_tnl-segmentation",
            on,
            "tx-udp_tnl-csum-segmentation",
            on,
        ]);
    };
    for (mode, features) in [
        ("uplink passes the skb whole", "on"),
        ("the node's stack segments", "off"),
    ] {
        offload(&c, features);
        let (bytes, frames, errors) = run_iperf(&c);
        println!(
            "{mode}: {bytes} bytes in 2 s, {frames} super-packets through {TAP}, {errors} TCP checksum errors"
        );
        assert!(
            bytes > 10_000_000,
            "{mode}: iperf3 moved only {bytes} bytes"
        );
        assert!(
            frames > 100,
            "{mode}: only {frames} frames went through {TAP}"
        );
        assert_eq!(
            errors, 0,
            "{mode}: the receiving pod saw TCP checksum errors"
        );
    }

    // auto, the uplink's offload still off: the sockets, and why.
    restart(&mut c, 0, "auto");
    c.wait_ready(0, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(
        !has_tap(&c, 0),
        "auto made {TAP} on an uplink without the offload"
    );
    let g = gso_status(&c, 0);
    assert_eq!((g.mode.as_str(), g.tap.as_deref()), ("auto", None));
    let why = g.reason.unwrap_or_default();
    assert!(
        why.contains(&format!("uplink {uplink} has no tx-udp_tnl-segmentation")),
        "{why}"
    );
    println!("auto without the offload: {why}");
    assert!(
        c.wait_ping(0, 1),
        "pods do not reach each other over the sockets"
    );

    // on, strict rp_filter: no start, the condition named, no TAP.
    offload(&c, "on");
    c.nodes[0]
        .ns
        .exec(&["sysctl", "-qw", "net.ipv4.conf.all.rp_filter=1"]);
    restart(&mut c, 0, "on");
    let code = c.wait_exit(0, Duration::from_secs(30));
    let log = c.log(0);
    assert!(
        code.is_some_and(|c| c != 0),
        "weftd exited {code:?}:\n{log}"
    );
    assert!(
        log.contains("--tunnel-gso=on: net.ipv4.conf.all.rp_filter is 1 (strict)"),
        "{log}"
    );
    assert!(!has_tap(&c, 0), "{TAP} left behind after a refused start");
    println!("on with strict rp_filter: refused");
    assert!(
        c.nodes[0]
            .ns
            .sh("sysctl -n net.ipv4.conf.all.rp_filter")
            .trim()
            == "1",
        "weftd changed a node-wide sysctl"
    );

    // Node 1 (still on it) switched to the kernel dataplane: the TAP goes;
    // back to userspace: it comes back, configured again.
    assert!(has_tap(&c, 1));
    c.switch_dataplane(1, "kernel");
    assert!(!has_tap(&c, 1), "{TAP} left behind on the kernel dataplane");
    c.switch_dataplane(1, "userspace");
    assert!(
        has_tap(&c, 1),
        "no {TAP} after switching back:\n{}",
        c.log(1)
    );
    assert_eq!(gso_status(&c, 1).tap.as_deref(), Some(TAP));
    // After weftd stops, the TAP is gone.
    c.stop_weftd(1);
    assert!(!has_tap(&c, 1), "{TAP} left behind after weftd stopped");
}

#[test]
fn weftd_udp_sends_whole_only_to_peers_whose_lease_takes_it() {
    require_root!();
    let work = tempfile::tempdir().expect("tempdir");
    let conf = cluster::net_conf(r#"{"Type":"udp"}"#);
    let args = ["--traffic-manager=none"];
    let spec = cluster::spec("tapudp", &conf, 2, &args, work.path());
    let mut c = Cluster::create(spec, &ClusterStore::Embedded, Vec::new()).expect("cluster");
    for n in 0..2 {
        c.nodes[n]
            .ns
            .exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        c.start_weftd_with(n, &["--tunnel-gso=on".into()])
            .expect("start weftd");
    }
    for n in 0..2 {
        c.wait_ready(n, Duration::from_secs(60))
            .unwrap_or_else(|e| panic!("{e}"));
        assert!(has_tap(&c, n), "node {n}: no {TAP}:\n{}", c.log(n));
        let g = device_gso_status(&c, n, "flannel0");
        assert_eq!(
            (g.mode.as_str(), g.tap.as_deref(), g.reason.as_deref()),
            ("on", Some(TAP), None),
            "node {n}"
        );
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    assert!(c.wait_ping(0, 1), "pods do not reach each other");
    let (bytes, frames, errors) = run_iperf(&c);
    println!(
        "both WeftGSO: {bytes} bytes in 2 s, {frames} through {TAP}, {errors} checksum errors"
    );
    assert!(bytes > 10_000_000, "iperf3 moved only {bytes} bytes");
    assert!(frames > 100, "only {frames} frames went through {TAP}");
    assert_eq!(errors, 0, "the receiving pod saw TCP checksum errors");

    // Node 1 without the flag: its lease loses WeftGSO, as a flanneld
    // node's never has it. Node 0 keeps its TAP but stops using it toward
    // node 1 once the lease change reaches it (within a few seconds).
    restart(&mut c, 1, "off");
    c.wait_ready(1, Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(!has_tap(&c, 1), "off made a {TAP}");
    assert!(has_tap(&c, 0));
    assert!(c.wait_ping(0, 1), "pods do not reach each other");
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let (bytes, frames, errors) = loop {
        let r = run_iperf(&c);
        if r.1 == 0 || std::time::Instant::now() > deadline {
            break r;
        }
    };
    println!(
        "peer without WeftGSO: {bytes} bytes in 2 s, {frames} through {TAP}, {errors} checksum errors"
    );
    assert_eq!(
        frames, 0,
        "node 0 still writes to {TAP} for a peer without WeftGSO"
    );
    assert!(
        bytes > 10_000_000,
        "iperf3 moved only {bytes} bytes over the sockets"
    );
    assert_eq!(errors, 0, "the receiving pod saw TCP checksum errors");
    let g = device_gso_status(&c, 1, "flannel0");
    assert_eq!((g.mode.as_str(), g.tap.as_deref()), ("off", None));
    c.stop_weftd(0);
    assert!(!has_tap(&c, 0), "{TAP} left behind after weftd stopped");
}
