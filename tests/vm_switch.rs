//! `--dataplane=auto` and live switching (`weft dataplane set`) on a kernel
//! that has every driver (Debian's stock kernel in guests, tests/support/vm.rs)
//! and, for the same network configs, on this machine's kernel (network
//! namespaces), which lacks wireguard and ipip.
//!
//! Per backend (vxlan, ipip, wireguard), two guests run weftd with
//! `--dataplane=auto`: both must pick the kernel path (status and device
//! kind say so). Node 1 then switches to userspace and back while a pod on
//! node 2 pings a pod on node 1 every 10 ms: the longest gap between replies
//! is asserted (at most 2 s longer than weftd's own switch, see [`SLACK`])
//! and printed per direction, the lease in etcd stays
//! byte-identical, subnet.env does not change, the old path leaves nothing
//! behind (devices of the other kind, probe links, routes through another
//! device, XFRM state, policy rules), the route set after the round trip is
//! the one before it, and TCP flows both ways after every switch.
//!
//! WireGuard userspace → kernel is the case that used to cut the node off
//! for 15-27 s: the peer holds the engine's handshake timestamp (boringtun
//! stamps 27 s ahead of the kernel) and refuses the kernel's initiations,
//! and the kernel device never initiated while the peer only sent into the
//! old session. weftd now keeps the engine running until the peer accepts
//! the kernel's timestamps (`Backend::handover_at`, so that command takes
//! up to ~28 s) and the kernel path greets every new peer; the gap is
//! asserted like the others. The switch is pending meanwhile, not blocking
//! weftd: `weft status` answers throughout and shows it.

#[path = "vmdp/common.rs"]
mod common;

use std::time::Duration;

use common::{Gap, PingStream};
use weft_tests::vm::LabSpec;

/// How much longer than weftd's own switch the longest ping gap may be: the
/// first packets through the new path (WireGuard: one handshake). The bound
/// is relative because under software CPU emulation the switch itself
/// scales with the emulator's speed: the same code switched to the engine in
/// 534 ms in one session and in 976-1,159 ms in another (2026-12-01), with
/// gaps of 0.7 and 1.3-1.6 s. On 2026-12-02 the WireGuard case's gap
/// exceeded its switch by 387 ms in CI and by 859 ms (2,113 ms after a
/// 1,254 ms switch) in a rerun, too close to 1 s, so the slack is 2 s. The
/// bug it guards against cut the node off for 15-27 s after a switch that
/// took 200 ms.
const SLACK: Duration = Duration::from_secs(2);

/// The `N` of the first `<phrase> N ms` in weftd's log text: the switch's
/// `switched in N ms`, the pending switch's `takes over in N ms`.
fn ms_after(text: &str, phrase: &str) -> Option<Duration> {
    let rest = text.split(phrase).nth(1)?;
    let ms: u64 = rest.split(" ms").next()?.trim().parse().ok()?;
    Some(Duration::from_millis(ms))
}

struct Case {
    tag: &'static str,
    conf: &'static str,
    /// The device both paths use.
    dev: &'static str,
    /// Its kind on the kernel path (`ip -d link`).
    kernel_kind: &'static str,
}

/// Routes of node `n` into the pod network (v4), sorted.
fn pod_routes(n: &weft_tests::vm::Node) -> Vec<String> {
    let mut r: Vec<String> = common::routes(n, false)
        .into_iter()
        .filter(|r| r.starts_with("10.244."))
        .collect();
    r.sort();
    r
}

fn switch_case(c: &Case) {
    let kit = weft_tests::require_vm!();
    let net = common::net(
        &kit,
        &LabSpec::new(c.tag, 2),
        c.conf,
        &["--traffic-manager=none", "--dataplane=auto"],
        &[],
    );
    let (n1, n2) = (net.node(0), net.node(1));
    // auto on a kernel with the driver: the kernel path, on both nodes.
    for i in 0..2 {
        let st = net.status(i);
        assert_eq!(st["backend"]["dataplane"], "kernel", "node {i}: {st:#}");
        assert_eq!(st["backend"]["requested"], "auto", "node {i}: {st:#}");
        let devs = st["backend"]["devices"].as_array().expect("devices");
        assert!(
            devs.iter()
                .any(|d| d["name"] == c.dev && d["kind"] == "kernel"),
            "node {i}: {st:#}"
        );
        common::nothing_else(net.node(i), &[(c.dev, c.kernel_kind)]);
        assert!(
            net.weftd[i].log().contains("auto: the kernel supports it"),
            "node {i}: {}",
            net.weftd[i].log()
        );
    }
    let pods = net.pods();
    let (p1, p2) = (&pods[0], &pods[1]);
    let first = p2.must_reach(&p1.ip(false));
    p1.must_reach(&p2.ip(false));
    let lease0 = (net.lease_raw(0), net.lease_raw(1));
    let env0 = (n1.subnet_env(), n2.subnet_env());
    let routes0 = pod_routes(n1);
    assert!(
        routes0
            .iter()
            .any(|r| r.contains(&format!(" dev {}", c.dev))),
        "no pod route through {}: {routes0:?}",
        c.dev
    );
    let mut report = Vec::new();
    for (to, kind) in [("userspace", "tun"), ("kernel", c.kernel_kind)] {
        let stream = PingStream::start(p2, &p1.ip(false));
        let took = if c.dev == "flannel-wg" && to == "kernel" {
            pending_switch(&net)
        } else {
            common::switch(n1, to)
        };
        // The stream must carry on: 100 more replies (about 1 s of it).
        let at = stream.replies();
        stream.wait_more(at, 100, Duration::from_secs(60));
        let gap: Gap = stream.finish();
        let logged = net.weftd[0]
            .log()
            .lines()
            .rfind(|l| l.contains("switched in"))
            .map(|l| l.split("dataplane:").last().unwrap_or(l).trim().to_string())
            .unwrap_or_default();
        report.push(format!(
            "{} -> {to}: {gap} (command {took:.1?}; weftd: {logged})",
            if to == "kernel" {
                "userspace"
            } else {
                "kernel"
            }
        ));
        println!("{}: {}", c.tag, report.last().expect("line"));
        // State after the switch.
        let st = net.status(0);
        assert_eq!(st["backend"]["dataplane"], to, "{st:#}");
        assert_eq!(st["backend"]["requested"], to, "{st:#}");
        common::nothing_else(n1, &[(c.dev, kind)]);
        let routes = pod_routes(n1);
        for r in &routes {
            assert!(
                r.contains(&format!(" dev {}", c.dev)) || r.contains(" dev cni0"),
                "after switching to {to}: a pod route through another device: {routes:?}"
            );
        }
        assert!(
            routes
                .iter()
                .any(|r| r.contains(&format!(" dev {}", c.dev))),
            "after switching to {to}: no pod route through {}: {routes:?}",
            c.dev
        );
        if to == "kernel" {
            assert_eq!(routes, routes0, "the kernel path's routes changed");
        }
        assert_eq!(
            (net.lease_raw(0), net.lease_raw(1)),
            lease0,
            "switching to {to} changed a lease"
        );
        assert_eq!(
            (n1.subnet_env(), n2.subnet_env()),
            env0,
            "switching changed subnet.env"
        );
        common::tcp(p2, p1, &p1.ip(false));
        common::tcp(p1, p2, &p2.ip(false));
        // weftd's own switch is an outage by design (the kernel device goes
        // before the engine can bind its port); what must not follow is a
        // path that stays cut off after it.
        let switched = ms_after(&logged, "switched in ")
            .unwrap_or_else(|| panic!("{}: no switch time in weftd's log line {logged:?}", c.tag));
        assert!(
            gap.longest < switched + SLACK,
            "{}: switching node 1 to {to}: {gap}, weftd switched in {switched:?}\n{}",
            c.tag,
            net.logs()
        );
    }
    println!(
        "figures {} switching (node 1; pod on node 2 pings pod on node 1 every 10 ms): first pod ping {first:.1?} after CNI ADD; ready {:.1?} after weftd start",
        c.tag, net.ready_after
    );
    for r in &report {
        println!("  {r}");
    }
    println!("  test wall time {:.1?}", net.t0.elapsed());
}

/// How long one `weft status` may take while a switch is pending. A weftd
/// whose main loop blocked on the switch would answer only once the ~27 s
/// handshake wait is over (and then `seen_pending` fails too); a serving one
/// answers at once natively, but in the software-emulated guest one status
/// (spawn `weft` in the guest, its socket request, the output back through
/// the kit) took up to 5.96 s in CI on 2026-12-02, which failed a 5 s bound.
const STATUS_BOUND: Duration = Duration::from_secs(15);

/// WireGuard userspace → kernel on node 1: the switch waits for the peers
/// to accept the kernel's handshakes (about 27 s), and meanwhile weftd goes
/// on serving: `weft status` answers at once, showing the kernel requested
/// and the userspace path still running. Returns how long the command took.
fn pending_switch(net: &common::Net) -> Duration {
    let n1 = net.node(0);
    let weft = weft_tests::bins::path("weft");
    let t = std::time::Instant::now();
    let cmd = n1.spawn(
        "switch",
        &format!(
            "exec {} dataplane set kernel --timeout 90 --subnet-file {}",
            weft_tests::vm::quote(&weft.to_string_lossy()),
            weft_tests::vm::SUBNET_ENV
        ),
    );
    let mut seen_pending = false;
    while cmd.exit_code().is_none() && t.elapsed() < Duration::from_secs(90) {
        let asked = std::time::Instant::now();
        let st = net.status(0);
        let answered = asked.elapsed();
        assert!(
            answered < STATUS_BOUND,
            "weft status took {answered:?} during the switch"
        );
        if st["backend"]["requested"] == "kernel" && st["backend"]["dataplane"] == "userspace" {
            seen_pending = true;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let took = t.elapsed();
    assert_eq!(cmd.exit_code(), Some(0), "{}", cmd.log());
    assert!(cmd.log().contains("runs in the kernel"), "{}", cmd.log());
    let log = net.weftd[0].log();
    assert!(
        log.contains("runs in the userspace until the pending switch is due"),
        "{log}"
    );
    // The wait is what is left of the ~27 s lead once the userspace path
    // has run a while: in CI on 2026-12-02 the guest took 27 s between the
    // two switches and the wait was 804 ms, too short for a status round
    // trip to land in. A wait longer than one round trip must be seen.
    let wait = ms_after(&log, "takes over in ")
        .unwrap_or_else(|| panic!("no announced wait in the log:\n{log}"));
    if wait > STATUS_BOUND + Duration::from_secs(1) {
        assert!(
            seen_pending,
            "weftd never reported the pending switch (userspace running, kernel requested) \
             during its {wait:?} wait; command took {took:?}:\n{log}"
        );
    } else {
        eprintln!(
            "pending wait {wait:?}: too short to require a status inside it (seen: {seen_pending})"
        );
    }
    took
}

#[test]
fn vxlan_auto_is_kernel_and_switches_live() {
    switch_case(&Case {
        tag: "svx",
        conf: r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#,
        dev: "flannel.1",
        kernel_kind: "vxlan",
    });
}

#[test]
fn ipip_auto_is_kernel_and_switches_live() {
    switch_case(&Case {
        tag: "sip",
        conf: r#"{"Network":"10.244.0.0/16","Backend":{"Type":"ipip"}}"#,
        dev: "flannel.ipip",
        kernel_kind: "ipip",
    });
}

#[test]
fn wireguard_auto_is_kernel_and_switches_live() {
    switch_case(&Case {
        tag: "swg",
        conf: r#"{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}"#,
        dev: "flannel-wg",
        kernel_kind: "wireguard",
    });
}

// === This machine: the same configs under --dataplane=auto ===

mod host {
    use weft_control::demo::cluster::{Cluster, ClusterSpec};
    use weft_control::demo::netns::Netns;

    /// Whether this machine's kernel can create a link of `kind` (probed in
    /// a scratch namespace, as weftd's probe does).
    fn kernel_has(kind: &str) -> bool {
        let ns = Netns::new(&weft_tests::unique("pk"));
        let mut args = vec!["ip", "link", "add", "probe0", "type", kind];
        if kind == "vxlan" {
            args.extend(["id", "1", "dstport", "0"]);
        }
        ns.try_exec(&args).status.success()
    }

    fn status(c: &Cluster, i: usize) -> serde_json::Value {
        let out = std::process::Command::new(weft_tests::bins::path("weft"))
            .args(["status", "--json", "--subnet-file"])
            .arg(c.nodes[i].dir.join("subnet.env"))
            .output()
            .expect("weft status");
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "weft status --json: {e}: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            )
        })
    }

    /// `kind` of link `name` in node `i`'s namespace.
    fn kind(c: &Cluster, i: usize, name: &str) -> String {
        let out = c.nodes[i]
            .ns
            .exec(&["ip", "-d", "-j", "link", "show", "dev", name]);
        let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j");
        v[0]["linkinfo"]["info_kind"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    fn auto_case(tag: &str, conf: &str, dev: &str, kernel_kind: &str) {
        weft_testenv::require_root!();
        let t0 = std::time::Instant::now();
        let kernel = kernel_has(kernel_kind);
        let work = tempfile::tempdir().expect("tempdir");
        let mut c = Cluster::start(ClusterSpec {
            prefix: weft_tests::unique(tag),
            nodes: 2,
            net_conf: conf.to_string(),
            weftd_args: vec!["--traffic-manager=none".into(), "--dataplane=auto".into()],
            bin_dir: weft_tests::bins::dir(),
            work: work.path().to_path_buf(),
            store: Default::default(),
        })
        .unwrap_or_else(|e| panic!("cluster: {e}"));
        let (want, want_kind, why) = if kernel {
            (
                "kernel",
                kernel_kind,
                "auto: the kernel supports it".to_string(),
            )
        } else {
            (
                "userspace",
                "tun",
                format!("auto: the kernel has no {kernel_kind} support"),
            )
        };
        for i in 0..2 {
            let st = status(&c, i);
            assert_eq!(st["backend"]["dataplane"], want, "node {i}: {st:#}");
            assert_eq!(st["backend"]["requested"], "auto", "node {i}: {st:#}");
            let engine = if kernel { "kernel" } else { "engine" };
            assert!(
                st["backend"]["devices"]
                    .as_array()
                    .expect("devices")
                    .iter()
                    .any(|d| d["name"] == dev && d["kind"] == engine),
                "node {i}: {st:#}"
            );
            assert_eq!(kind(&c, i, dev), want_kind, "node {i}: {dev}");
            assert!(c.log(i).contains(&why), "node {i}: {}", c.log(i));
        }
        c.add_pod(0, "a").expect("pod a");
        c.add_pod(1, "b").expect("pod b");
        for (a, b) in [(0, 1), (1, 0)] {
            let ip = c.pods[b].ip.clone();
            assert!(
                (0..20).any(|_| c.pods[a].ns.ping(&ip, 1)),
                "{tag}: pod {a} cannot reach pod {b}; logs:\n{}\n{}",
                c.log(0),
                c.log(1)
            );
        }
        println!(
            "host {tag}: auto -> {want} ({why}); wall time {:.1?}",
            t0.elapsed()
        );
    }

    #[test]
    fn auto_on_this_host_wireguard() {
        auto_case(
            "hwg",
            r#"{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}"#,
            "flannel-wg",
            "wireguard",
        );
    }

    #[test]
    fn auto_on_this_host_ipip() {
        auto_case(
            "hip",
            r#"{"Network":"10.244.0.0/16","Backend":{"Type":"ipip"}}"#,
            "flannel.ipip",
            "ipip",
        );
    }

    #[test]
    fn auto_on_this_host_vxlan() {
        auto_case(
            "hvx",
            r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#,
            "flannel.1",
            "vxlan",
        );
    }
}
