//! `--dataplane=auto` and live switching (`weft dataplane set`) on a kernel
//! that has every driver (Debian's stock kernel in guests, tests/support/vm.rs)
//! and, for the same network configs, on this machine's kernel (network
//! namespaces), which lacks wireguard and ipip.
//!
//! Per backend (vxlan, ipip, wireguard), two guests run weftd with
//! `--dataplane=auto`: both must pick the kernel path (status and device
//! kind say so). Node 1 then switches to userspace and back while a pod on
//! node 2 pings a pod on node 1 every 10 ms: the longest gap between replies
//! is asserted against a bound measured in the same guest run without weftd
//! (see [`gap_bound`]: the stream's own jitter on the kernel path and the
//! time the guest's kernel takes to build such a path by hand), never
//! against weftd's own report of its switch. It is printed per direction;
//! the lease in etcd stays
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

use std::time::Duration;

use guests::PingStream;
use weft_tests::ping::Gap;
use weft_tests::vm::net as guests;
use weft_tests::vm::{LabSpec, Pod};

/// The longest gap a switch may cause, in kernel-only baselines of the same
/// run ([`Baseline`]) beyond the stream's own jitter. Measured on 2026-12-03
/// (tcg guests, load average 3.5-5.6): kernel → userspace 0.5-0.9 (vxlan
/// 0.5-0.8 in 3 runs, ipip 0.7, WireGuard 0.8-0.9 in 2), userspace → kernel
/// 0.1-0.2 and once 1.3 (WireGuard's handover, switched in 1,456 ms); the
/// baselines were 0.7-1.25 s, so the bound was 2.1-3.8 s. Three is 2.3× the
/// worst seen. It fails a switch that stalls for seconds (a retry until a
/// 2 s deadline, a node cut off until its peers' handshake timers fire) at
/// any emulation speed, where the old bound (weftd's own switch time + 2 s)
/// grew with the stall. A 3 s sleep injected into the switch fails it, and
/// so did one real run of 2026-12-04 (vxlan kernel → userspace switched in
/// 4,348 ms, its setup retried past its 2 s deadline: 4.9 baselines; the
/// rerun 1.2): the guests' weftd logs those retries (`Node::start_weftd`).
const PER_BUILD: u32 = 3;

/// What the guests of one run show without weftd: `jitter`, the longest gap
/// of the same 10 ms ping stream on the kernel path with nothing changing
/// (the emulator's own stalls), and `build`, how long node 1's kernel takes
/// to make a device of the backend's kind with an address and a route and
/// delete it again, by hand (median of 5, timed inside the guest): the
/// kernel work any path change does, at this run's emulation speed.
#[derive(Debug, Clone, Copy)]
struct Baseline {
    jitter: Duration,
    build: Duration,
}

impl Baseline {
    fn measure(c: &Case, n1: &weft_tests::vm::Node, from: &Pod, dst: &str) -> Baseline {
        let stream = PingStream::start(from, dst);
        stream.wait_more(stream.replies(), 150, Duration::from_secs(60));
        let jitter = stream.finish().longest;
        Baseline {
            jitter,
            build: n1.kernel_build_time(c.kernel_kind),
        }
    }

    /// The longest gap a switch may cause in this run.
    fn gap_bound(&self) -> Duration {
        self.jitter + self.build * PER_BUILD
    }
}

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
    let mut r: Vec<String> = guests::routes(n, false)
        .into_iter()
        .filter(|r| r.starts_with("10.244."))
        .collect();
    r.sort();
    r
}

fn switch_case(c: &Case) {
    let kit = weft_tests::require_vm!();
    let net = guests::net(
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
        guests::nothing_else(net.node(i), &[(c.dev, c.kernel_kind)]);
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
    let base = Baseline::measure(c, n1, p2, &p1.ip(false));
    println!(
        "{}: baseline without weftd: kernel path jitter {:?}, {} device by hand {:?}; gap bound {:?}",
        c.tag,
        base.jitter,
        c.kernel_kind,
        base.build,
        base.gap_bound()
    );
    let mut report = Vec::new();
    for (to, kind) in [("userspace", "tun"), ("kernel", c.kernel_kind)] {
        let stream = PingStream::start(p2, &p1.ip(false));
        let took = if c.dev == "flannel-wg" && to == "kernel" {
            pending_switch(&net)
        } else {
            guests::switch(n1, to)
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
            "{} -> {to}: {gap}, {:.1} builds beyond the jitter (command {took:.1?}; weftd: {logged})",
            if to == "kernel" {
                "userspace"
            } else {
                "kernel"
            },
            gap.longest.saturating_sub(base.jitter).as_secs_f64() / base.build.as_secs_f64()
        ));
        println!("{}: {}", c.tag, report.last().expect("line"));
        // State after the switch.
        let st = net.status(0);
        assert_eq!(st["backend"]["dataplane"], to, "{st:#}");
        assert_eq!(st["backend"]["requested"], to, "{st:#}");
        guests::nothing_else(n1, &[(c.dev, kind)]);
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
        guests::tcp(p2, p1, &p1.ip(false));
        guests::tcp(p1, p2, &p2.ip(false));
        // weftd's own switch is an outage by design (the kernel device goes
        // before the engine can bind its port); what must not follow is a
        // path that stays cut off after it.
        assert!(
            gap.longest < base.gap_bound(),
            "{}: switching node 1 to {to}: {gap}, bound {:?} ({base:?})\n{}",
            c.tag,
            base.gap_bound(),
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

/// How many times an idle `weft status` (timed in the same guest run just
/// before the switch) one may take while a switch is pending, plus 1 s. A
/// weftd whose main loop blocked on the switch would answer only once the
/// ~27 s handshake wait is over (and then `seen_pending` fails too); a
/// serving one answers as it does idle, but in the software-emulated guest
/// one status (spawn `weft` in the guest, its socket request, the output
/// back through the kit) is slower while the engine and the ping streams
/// run: 0.78 s idle and up to 2.64 s during the wait on 2026-12-03 (3.4×),
/// 5.96 s once in CI on 2026-12-02. Six times is 1.8× the worst ratio seen.
/// Issue 33 (status answered from published snapshots) tightens this.
const STATUS_TIMES: u32 = 6;

/// WireGuard userspace → kernel on node 1: the switch waits for the peers
/// to accept the kernel's handshakes (about 27 s), and meanwhile weftd goes
/// on serving: `weft status` answers at once, showing the kernel requested
/// and the userspace path still running. Returns how long the command took.
fn pending_switch(net: &guests::Net) -> Duration {
    let n1 = net.node(0);
    let weft = weft_tests::bins::path("weft");
    let asked = std::time::Instant::now();
    net.status(0);
    let idle = asked.elapsed();
    let bound = idle * STATUS_TIMES + Duration::from_secs(1);
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
    let mut slowest = idle;
    while cmd.exit_code().is_none() && t.elapsed() < Duration::from_secs(90) {
        let asked = std::time::Instant::now();
        let st = net.status(0);
        let answered = asked.elapsed();
        slowest = slowest.max(answered);
        // Issue 33 tightens this bound (see STATUS_TIMES).
        assert!(
            answered < bound,
            "weft status took {answered:?} during the switch ({idle:?} before it, bound {bound:?})"
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
    // trip to land in. A wait longer than two of this run's slowest round
    // trips (and the 0.5 s between them) must be seen.
    let wait = ms_after(&log, "takes over in ")
        .unwrap_or_else(|| panic!("no announced wait in the log:\n{log}"));
    let must_see = (slowest + Duration::from_millis(500)) * 2;
    println!(
        "pending wait {wait:?}: status {idle:?} before it, slowest {slowest:?} during it (seen pending: {seen_pending})"
    );
    if wait > must_see {
        assert!(
            seen_pending,
            "weftd never reported the pending switch (userspace running, kernel requested) \
             during its {wait:?} wait (status round trips up to {slowest:?}); command took {took:?}:\n{log}"
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
    use weft_tests::cluster::{self, Cluster};
    use weft_tests::netns::Netns;

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
        let (_work, mut c) = cluster::start(
            tag,
            conf,
            2,
            &["--traffic-manager=none", "--dataplane=auto"],
        );
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
            let st = c.status(i).backend;
            assert_eq!(st.dataplane, want, "node {i}: {st:?}");
            assert_eq!(st.requested, "auto", "node {i}: {st:?}");
            let engine = if kernel { "kernel" } else { "engine" };
            assert!(
                st.devices.iter().any(|d| d.name == dev && d.kind == engine),
                "node {i}: {st:?}"
            );
            assert_eq!(kind(&c, i, dev), want_kind, "node {i}: {dev}");
            assert!(c.log(i).contains(&why), "node {i}: {}", c.log(i));
        }
        c.add_pod(0, "a").expect("pod a");
        c.add_pod(1, "b").expect("pod b");
        for (a, b) in [(0, 1), (1, 0)] {
            assert!(
                c.wait_ping(a, b),
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
