//! Fault tests (issue 10): real weftd daemons in network namespaces, pods made
//! by the CNI plugin, continuous pod-to-pod traffic while the control plane
//! has a bad day.
//!
//! - etcd stopped for 30 s: no packet lost between established peers; the
//!   daemons keep running and resync (a node started during the outage and a
//!   lease written afterwards both reach everyone);
//! - weftd killed with SIGKILL and restarted: same subnet, traffic back, no
//!   duplicate or stale routes, links or iptables rules;
//! - the node's own lease deleted: exit 0 with flannel's line, the subnet is
//!   taken again on restart;
//! - garbage lease JSON in etcd: skipped and logged, the rest keeps working;
//! - the embedded store's file damaged: running daemons keep their last good
//!   state, a (re)starting daemon refuses with an error naming the file and
//!   its backup, nothing overwrites the damaged file;
//! - the TUN device deleted under a running weftd: recreated by the next
//!   reconcile, traffic resumes.
//!
//! Measured gaps are printed (run with `--nocapture`). Where the README
//! promises lost traffic (a restart, a repair within one reconcile period,
//! none during an etcd outage) the bound is asserted as a fixed number.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weft_testenv::require_root;
use weft_tests::RESTORED_WITHIN;
use weft_tests::cluster::{self, Cluster, ClusterStore};
use weft_tests::etcd::Etcd;
use weft_tests::netns::Netns;
use weft_tests::ping;
use weft_tests::proc::wait_for;
use weft_tests::proxy::{TcpProxy, ns_proxy};
use weft_tests::require_etcd;
use weft_tests::weftd::assert_dataplane;

/// The userspace dataplane with one worker (the machine is small and shared).
const USERSPACE: &[&str] = &[
    "--dataplane=userspace",
    "--engine-workers=1",
    "--traffic-manager=none",
];
/// A started cluster of `nodes` nodes of `backend` on `store`; `args` are
/// the weftd arguments.
fn cluster(
    tag: &str,
    backend: &str,
    nodes: u8,
    store: ClusterStore,
    args: &[&str],
) -> (tempfile::TempDir, Cluster) {
    let work = tempfile::tempdir().expect("tempdir");
    let spec = cluster::spec(
        tag,
        &cluster::net_conf_below_64(backend),
        nodes,
        args,
        work.path(),
    );
    let mut c =
        Cluster::create(spec, &store, Vec::new()).unwrap_or_else(|e| panic!("cluster: {e}"));
    c.start_all().unwrap_or_else(|e| panic!("cluster: {e}"));
    (work, c)
}

/// Where weftd inside a node namespace finds etcd (a [`TcpProxy`]).
const ETCD_IN_NS: &str = "http://127.0.0.1:2379";
const LONG: Duration = Duration::from_secs(60);

/// A cluster on a real etcd: the network config is put into etcd and every
/// node namespace gets a proxy to it. Nodes listed in `start` are started.
fn etcd_cluster(
    tag: &str,
    nodes: u8,
    start: &[usize],
    args: &[&str],
) -> (Etcd, Vec<TcpProxy>, tempfile::TempDir, Cluster) {
    let etcd = Etcd::start();
    etcd.etcdctl_ok(&[
        "put",
        "/coreos.com/network/config",
        &cluster::net_conf_below_64("vxlan"),
    ]);
    let work = tempfile::tempdir().expect("tempdir");
    let spec = cluster::spec(
        tag,
        &cluster::net_conf_below_64("vxlan"),
        nodes,
        args,
        work.path(),
    );
    let mut c = Cluster::create(spec, &ClusterStore::Etcd(ETCD_IN_NS.into()), Vec::new())
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    let proxies = c
        .nodes
        .iter()
        .map(|n| ns_proxy(&n.ns.path(), 2379, etcd.port()))
        .collect();
    for &i in start {
        c.start_weftd(i).expect("start weftd");
    }
    for &i in start {
        c.wait_ready(i, LONG).unwrap_or_else(|e| panic!("{e}"));
    }
    (etcd, proxies, work, c)
}

/// A lease for a node that does not exist (vxlan attributes), as flannel writes it.
fn fake_lease(ip: &str) -> String {
    format!(
        r#"{{"PublicIP":"{ip}","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"02:00:00:00:00:99"}}}}"#
    )
}

#[test]
fn etcd_outage_loses_no_packets_and_resyncs() {
    require_root!();
    require_etcd!();
    let (mut etcd, _proxies, _work, mut c) = etcd_cluster("fe", 3, &[0, 1], USERSPACE);
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(
        c.wait_ping(0, 1),
        "no initial connectivity; log:\n{}",
        c.log(0)
    );
    // ~45 s of pings at 100/s, and a paced UDP stream the other way.
    let ping = ping::Stream::start(&c.pods[0].ns, &c.pods[1].ip.clone());
    let udp = UdpStream::start(&c, 1, 0, 42, "2M", 5201);
    std::thread::sleep(Duration::from_secs(3));

    etcd.stop();
    let outage = Instant::now();
    // A node that comes up while etcd is down waits for it.
    std::thread::sleep(Duration::from_secs(5));
    c.start_weftd(2).expect("start node 3");
    std::thread::sleep(Duration::from_secs(30).saturating_sub(outage.elapsed()));
    assert!(
        c.running(0) && c.running(1),
        "a weftd died during the outage:\n{}\n{}",
        c.log(0),
        c.log(1)
    );
    assert!(
        c.subnet_env(2).is_none(),
        "node 3 got a lease without etcd?"
    );
    assert!(
        c.log(0).contains("etcd lease watch"),
        "node 1 did not notice the outage:\n{}",
        c.log(0)
    );
    etcd.start_again();
    let down = outage.elapsed();

    // Resync: node 3 gets its lease and everyone learns it; so is a lease written now.
    c.wait_ready(2, LONG).unwrap_or_else(|e| panic!("{e}"));
    let k3 = c.lease_key(2);
    etcd.etcdctl_ok(&[
        "put",
        "/coreos.com/network/subnets/10.244.250.0-24",
        &fake_lease("192.0.2.250"),
    ]);
    for n in 0..2 {
        for key in [k3.as_str(), "10.244.250.0-24"] {
            wait_for(&format!("node {n} to learn {key}"), LONG, || {
                c.log(n)
                    .contains(&format!("Subnet added: {key}"))
                    .then_some(())
            });
        }
    }
    let report = ping.finish();
    let (udp_sent, udp_lost) = udp.finish();
    eprintln!(
        "MEASURED etcd outage {down:.1?}: ping {report}; iperf3 UDP {udp_lost}/{udp_sent} lost"
    );
    assert_eq!(
        report.lost(),
        0,
        "pings lost during the etcd outage: {report}"
    );
    assert_eq!(
        udp_lost, 0,
        "UDP datagrams lost during the etcd outage ({udp_sent} sent)"
    );
    // The late node carries traffic too, and TCP still flows between the first two.
    c.add_pod(2, "c").expect("pod c");
    assert!(
        c.wait_ping(2, 0) && c.wait_ping(1, 2),
        "node 3 unreachable; logs:\n{}\n{}",
        c.log(0),
        c.log(2)
    );
    let bytes = c.iperf_bytes(0, 1, 2);
    assert!(
        bytes > 1_000_000,
        "TCP after the outage moved only {bytes} bytes"
    );
}

/// The longest ping gap (one ping every 10 ms, pod on node 1 to pod on
/// node 2) that restarting node 2's userspace weftd may cause: the engine
/// and its TUN die with the process, so traffic stops until the new
/// process has its engine and routes. Measured on this 2-vCPU machine on
/// 2026-12-03 (debug build): 112-257 ms in 12 restarts at load average 6-8
/// (SIGKILL 112-263, SIGTERM 144-160), and 819 ms once with two emulated
/// guests busy beside the test (four CPU-bound processes on two cores; the
/// SIGTERMed process's teardown included); release builds on a quieter
/// machine: 64-184 ms (the switch and restart benchmark, README). The bound
/// is the second the README promises for a change of path, 1.2× that worst
/// case. On the kernel dataplane the devices outlive the process and no
/// ping may be lost at all (20-27 ms gaps, 0 lost, in the same runs). A
/// 1.5 s sleep before the engine starts (`tunnel::Tunnel`) fails the
/// userspace bound; a kernel backend whose teardown deleted its device on
/// SIGTERM fails the kernel one.
const USERSPACE_RESTART_GAP: Duration = Duration::from_secs(1);

/// SIGKILL and restart, then SIGTERM and restart, on the userspace
/// dataplane (the TUN dies with the process) and on the kernel one (its
/// devices outlive the process): the same subnet, the longest ping gap
/// no ping lost on the kernel path and the gap within
/// [`USERSPACE_RESTART_GAP`] on the engine, and the node's links, routes
/// and rules as before.
fn sigkill_restart(tag: &str, dataplane: &str) {
    // The default traffic manager (iptables rules inside the node namespace).
    let args = [dataplane, "--engine-workers=1", "--iptables-resync=1"];
    let (_work, mut c) = cluster(tag, "vxlan", 2, ClusterStore::Embedded, &args);
    let want = dataplane.trim_start_matches("--dataplane=");
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial connectivity");
    wait_for("host rules", LONG, || {
        c.log(1).contains("bootstrap done").then_some(())
    });
    std::thread::sleep(Duration::from_secs(2));
    let before = node_state(&c.nodes[1].ns);
    let subnet = c.env_var(1, "FLANNEL_SUBNET");
    let env = c.nodes[1].dir.join("subnet.env");
    assert_dataplane(&env, "vxlan", want);
    let dst = c.pods[1].ip.clone();
    for signal in ["SIGKILL", "SIGTERM"] {
        let stream = ping::Stream::start(&c.pods[0].ns, &dst);
        let t = Instant::now();
        if signal == "SIGKILL" {
            let mut child = c.nodes[1].weftd.take().expect("weftd");
            child.kill().expect("SIGKILL");
            let _ = child.wait();
        } else {
            c.stop_weftd(1);
        }
        c.start_weftd(1).expect("restart");
        wait_for("the restarted weftd to be ready", LONG, || {
            c.log(1).contains("flannel is ready").then_some(())
        });
        let ready = t.elapsed();
        let at = stream.replies();
        stream.wait_more(at, 100, LONG);
        let gap = stream.finish();
        eprintln!("MEASURED {signal}+restart ({want}): ready again after {ready:.2?}; {gap}");
        assert_dataplane(&env, "vxlan", want);
        if want == "kernel" {
            assert_eq!(
                gap.lost(),
                0,
                "{signal} + restart on the kernel dataplane lost pings: {gap}; log:\n{}",
                c.log(1)
            );
        } else {
            assert!(
                gap.longest < USERSPACE_RESTART_GAP,
                "{signal} + restart on {want}: {gap}, bound {USERSPACE_RESTART_GAP:?}; log:\n{}",
                c.log(1)
            );
        }
        assert_eq!(
            c.env_var(1, "FLANNEL_SUBNET"),
            subnet,
            "the restarted node changed its subnet"
        );
        assert!(
            c.log(1).contains("reusing"),
            "no lease reuse logged:\n{}",
            c.log(1)
        );
    }
    assert!(
        c.wait_ping(0, 1) && c.wait_ping(1, 0),
        "traffic did not come back; log:\n{}",
        c.log(1)
    );

    // Let the rule resync run, then compare with the state before the kill.
    std::thread::sleep(Duration::from_secs(3));
    let after = node_state(&c.nodes[1].ns);
    for (what, lines) in &after {
        assert!(
            duplicates(lines).is_empty(),
            "duplicate {what} after restart: {:?}",
            duplicates(lines)
        );
    }
    assert_eq!(before, after, "node state differs after SIGKILL + restart");
    for (what, lines) in node_state(&c.nodes[0].ns) {
        assert!(
            duplicates(&lines).is_empty(),
            "duplicate {what} on the peer: {:?}",
            duplicates(&lines)
        );
    }
}

#[test]
fn sigkill_restart_userspace() {
    require_root!();
    sigkill_restart("fk", "--dataplane=userspace");
}

#[test]
fn sigkill_restart_kernel() {
    require_root!();
    sigkill_restart("fj", "--dataplane=kernel");
}

#[test]
fn own_lease_deleted_in_etcd_exits_and_retakes_subnet() {
    require_root!();
    require_etcd!();
    let (etcd, _proxies, _work, mut c) = etcd_cluster("fo", 2, &[0, 1], USERSPACE);
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial connectivity");
    let key = c.lease_key(1);
    etcd.etcdctl_ok(&["del", &format!("/coreos.com/network/subnets/{key}")]);
    assert_eq!(c.wait_exit(1, LONG), Some(0), "log:\n{}", c.log(1));
    assert!(
        c.log(1)
            .contains("Lease has been revoked. Shutting down daemon."),
        "log:\n{}",
        c.log(1)
    );
    wait_for("node 1 to drop the peer", LONG, || {
        c.log(0)
            .contains(&format!("Subnet removed: {key}"))
            .then_some(())
    });
    assert!(c.running(0), "the other node exited too");
    // A restart (what the DaemonSet does) takes the same subnet again.
    c.start_weftd(1).expect("restart");
    wait_for("the restarted node", LONG, || {
        c.log(1).contains("flannel is ready").then_some(())
    });
    assert!(
        c.log(1)
            .contains(&format!("Found previously leased subnet ({key}), reusing")),
        "log:\n{}",
        c.log(1)
    );
    assert_eq!(c.lease_key(1), key);
    assert!(
        c.wait_ping(0, 1),
        "traffic did not come back; logs:\n{}\n{}",
        c.log(0),
        c.log(1)
    );
}

#[test]
fn garbage_lease_json_in_etcd_is_skipped() {
    require_root!();
    require_etcd!();
    let (etcd, _proxies, _work, mut c) = etcd_cluster("fg", 2, &[0, 1], USERSPACE);
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial connectivity");
    let sub = "/coreos.com/network/subnets";
    etcd.etcdctl_ok(&[
        "put",
        &format!("{sub}/10.244.99.0-24"),
        "{\"PublicIP\": garbage",
    ]);
    etcd.etcdctl_ok(&[
        "put",
        &format!("{sub}/10.244.98.0-24"),
        r#"{"PublicIP":12,"BackendType":[]}"#,
    ]);
    etcd.etcdctl_ok(&[
        "put",
        &format!("{sub}/not-a-subnet"),
        &fake_lease("192.0.2.97"),
    ]);
    etcd.etcdctl_ok(&[
        "put",
        &format!("{sub}/10.244.97.0-24"),
        &fake_lease("192.0.2.97"),
    ]);
    for n in 0..2 {
        wait_for("the good lease", LONG, || {
            c.log(n)
                .contains("Subnet added: 10.244.97.0-24")
                .then_some(())
        });
        let log = c.log(n);
        assert!(
            log.contains("skipping lease with a bad value") && log.contains("10.244.99.0-24"),
            "log:\n{log}"
        );
        assert!(
            log.contains("skipping lease with a bad key") && log.contains("not-a-subnet"),
            "log:\n{log}"
        );
        let routes = c.nodes[n].ns.exec(&["ip", "route"]);
        assert!(
            !routes.contains("10.244.99.0") && !routes.contains("10.244.98.0"),
            "bad lease programmed:\n{routes}"
        );
        assert!(
            routes.contains("10.244.97.0/24"),
            "good lease not programmed:\n{routes}"
        );
    }
    assert!(c.running(0) && c.running(1));
    assert!(c.wait_ping(0, 1) && c.wait_ping(1, 0), "traffic broke");
    // A daemon (re)starting with the garbage in the store lists past it.
    c.stop_weftd(0);
    c.start_weftd(0).expect("restart");
    wait_for("the restarted node", LONG, || {
        c.log(0).contains("flannel is ready").then_some(())
    });
    wait_for("the restarted node's peers", LONG, || {
        c.log(0)
            .contains("Subnet added: 10.244.97.0-24")
            .then_some(())
    });
    assert!(
        c.log(0).contains("skipping lease with a bad value"),
        "log:\n{}",
        c.log(0)
    );
    assert!(c.wait_ping(0, 1), "traffic broke after the restart");
}

/// The embedded store's data file damaged two ways: truncated, and one byte
/// flipped. Running daemons keep their last good state and traffic; a
/// (re)start refuses with an error naming the file and its backup; nothing
/// overwrites the damaged file; copying the backup back recovers.
#[test]
fn damaged_embedded_store_is_refused_not_lost() {
    require_root!();
    let (_work, mut c) = cluster("fs", "vxlan", 2, ClusterStore::Embedded, USERSPACE);
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial connectivity");
    let store = c.work().join("store");
    let (db, prev) = (store.join("leases.db"), store.join("leases.db.prev"));
    let good = std::fs::read(&db).expect("read leases.db");
    let subnet = c.lease_key(1);
    let weft = weft_tests::bins::path("weft");
    let store_arg = format!("--store-path={}", store.display());

    let mut flipped = good.clone();
    let last = flipped.len() - 3;
    flipped[last] ^= 0x01;
    for (how, bytes) in [
        ("truncated", good[..good.len() / 2].to_vec()),
        ("bit-flipped", flipped),
    ] {
        let seen: Vec<usize> = (0..2)
            .map(|n| c.log(n).matches("leases.db is damaged").count())
            .collect();
        std::fs::write(&db, &bytes).expect("damage leases.db");
        // The running daemons notice, say so, and keep going.
        for (n, before) in seen.into_iter().enumerate() {
            wait_for(&format!("node {n} to report the {how} file"), LONG, || {
                (c.log(n).matches("leases.db is damaged").count() > before).then_some(())
            });
        }
        assert!(
            c.wait_ping(0, 1) && c.wait_ping(1, 0),
            "traffic broke with a {how} store"
        );
        // A writer refuses (weft leases put), naming both files.
        let (ok, out) = run(std::process::Command::new(&weft).args([
            "leases",
            "put",
            "10.244.200.0-24",
            &fake_lease("192.0.2.200"),
            &store_arg,
        ]));
        assert!(!ok, "a write to a {how} store succeeded: {out}");
        assert!(
            out.contains(&db.display().to_string()) && out.contains(&prev.display().to_string()),
            "{out}"
        );
        // A restarting daemon refuses, naming both files.
        c.stop_weftd(1);
        c.start_weftd(1).expect("start");
        let code = c.wait_exit(1, LONG);
        let log = c.log(1);
        assert!(
            code.is_some_and(|c| c != 0),
            "weftd started on a {how} store (exit {code:?}):\n{log}"
        );
        assert!(
            log.contains(&db.display().to_string()) && log.contains("leases.db.prev"),
            "{log}"
        );
        assert_eq!(
            std::fs::read(&db).expect("read"),
            bytes,
            "the {how} file was overwritten"
        );
        assert!(
            c.running(0),
            "node 1 died with a {how} store:\n{}",
            c.log(0)
        );
        // Recovery as the error message says: the good generation goes back.
        std::fs::write(&db, &good).expect("restore");
        c.start_weftd(1).expect("start");
        wait_for("node 2 after the repair", LONG, || {
            c.log(1).contains("flannel is ready").then_some(())
        });
        assert_eq!(c.lease_key(1), subnet);
        assert!(c.wait_ping(0, 1), "no traffic after the repair");
    }
    eprintln!("INFO .prev backup exists: {}", prev.exists());
}

/// `ip link del` of the tunnel device under a running weftd: the next
/// reconcile recreates it within [`RESTORED_WITHIN`] of the delete, pod
/// traffic stops no longer than that, and nothing is duplicated.
fn device_deleted(tag: &str, backend: &str, dev: &str, args: &[&str]) {
    let (_work, c) = cluster(tag, backend, 2, ClusterStore::Embedded, args);
    let mut c = c;
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial connectivity");
    let stream = ping::Stream::start(&c.pods[0].ns, &c.pods[1].ip.clone());
    let t = Instant::now();
    c.nodes[1].ns.exec(&["ip", "link", "del", dev]);
    wait_for(&format!("{dev} to come back"), RESTORED_WITHIN, || {
        c.nodes[1]
            .ns
            .try_exec(&["ip", "link", "show", dev])
            .status
            .success()
            .then_some(())
    });
    let back = t.elapsed();
    let at = stream.replies();
    stream.wait_more(at, 100, RESTORED_WITHIN);
    let gap = stream.finish();
    eprintln!("MEASURED {backend} {args:?}: {dev} back after {back:.1?}; {gap}");
    assert!(
        gap.longest < RESTORED_WITHIN,
        "{dev} deleted: {gap}, bound {RESTORED_WITHIN:?}; log:\n{}",
        c.log(1)
    );
    assert!(
        c.wait_ping(0, 1) && c.wait_ping(1, 0),
        "traffic did not resume; log:\n{}",
        c.log(1)
    );
    assert!(
        c.running(1),
        "weftd exited instead of recreating {dev}:\n{}",
        c.log(1)
    );
    let routes = c.nodes[1].ns.exec(&["ip", "route"]);
    assert!(
        routes.contains(&format!("dev {dev}")),
        "no routes on the new {dev}:\n{routes}"
    );
    for (what, lines) in node_state(&c.nodes[1].ns) {
        assert!(
            duplicates(&lines).is_empty(),
            "duplicate {what}: {:?}",
            duplicates(&lines)
        );
    }
}

#[test]
fn tun_deleted_is_recreated_vxlan() {
    require_root!();
    device_deleted("ft", "vxlan", "flannel.1", USERSPACE);
}

#[test]
fn tun_deleted_is_recreated_udp() {
    require_root!();
    device_deleted("fu", "udp", "flannel0", USERSPACE);
}

#[test]
fn kernel_vxlan_deleted_is_recreated() {
    require_root!();
    device_deleted(
        "fv",
        "vxlan",
        "flannel.1",
        &["--dataplane=kernel", "--traffic-manager=none"],
    );
}

// === Traffic and node-state helpers of these tests ===

/// A paced iperf3 UDP stream from pod `a` to pod `b`; `finish` returns
/// (datagrams sent, datagrams lost) as the server counted them.
pub struct UdpStream {
    client: Child,
}

impl UdpStream {
    /// Starts `secs` seconds at `rate` (iperf3 `-b`, e.g. `2M`) on `port`.
    pub fn start(c: &Cluster, a: usize, b: usize, secs: u32, rate: &str, port: u16) -> UdpStream {
        let server = &c.pods[b];
        let p = port.to_string();
        server
            .ns
            .exec(&["iperf3", "-s", "-1", "-D", "-B", &server.ip, "-p", &p]);
        std::thread::sleep(Duration::from_millis(300));
        let client = c.pods[a]
            .ns
            .command("iperf3")
            .args([
                "-c",
                &server.ip,
                "-p",
                &p,
                "-u",
                "-b",
                rate,
                "-l",
                "1000",
                "-t",
                &secs.to_string(),
                "-J",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn iperf3");
        UdpStream { client }
    }

    /// Waits for the stream to end; returns (packets, lost) from the server's view.
    pub fn finish(self) -> (u64, u64) {
        let out = self.client.wait_with_output().expect("iperf3");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let sum = &v["end"]["sum"];
        let packets = sum["packets"].as_u64().unwrap_or(0);
        let lost = sum["lost_packets"].as_u64().unwrap_or(u64::MAX);
        assert!(
            packets > 0,
            "iperf3 UDP produced no result: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (packets, lost)
    }
}

/// A snapshot of what a node's namespace holds: links, routes, neighbours
/// and firewall rules, one normalised line per item, sorted.
pub fn node_state(ns: &Netns) -> BTreeMap<&'static str, Vec<String>> {
    let sorted = |text: String| {
        let mut v: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    let links: String = ns
        .exec(&["ip", "-o", "link", "show"])
        .lines()
        .filter_map(|l| {
            l.split(':')
                .nth(1)
                .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        })
        .collect::<Vec<_>>()
        .join("\n");
    // Chains and rules, each prefixed with its table; counters dropped.
    let mut table = String::new();
    let mut rules = Vec::new();
    for l in ns.exec(&["iptables-save"]).lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
        } else if l.starts_with("-A ") || l.starts_with(':') {
            rules.push(format!("{table} {}", l.split(" [").next().unwrap_or(l)));
        }
    }
    let rules = rules.join("\n");
    BTreeMap::from([
        ("links", sorted(links)),
        ("routes", sorted(ns.exec(&["ip", "route", "show"]))),
        ("rules", sorted(rules)),
    ])
}

/// Lines that occur more than once.
pub fn duplicates(lines: &[String]) -> Vec<String> {
    let mut seen = BTreeMap::new();
    for l in lines {
        *seen.entry(l.clone()).or_insert(0) += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(l, _)| l)
        .collect()
}

/// Runs `cmd` to completion, returning (success, stdout+stderr).
pub fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("spawn");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
