//! flanneld's flags and behaviours end to end, with real weftd daemons in
//! network namespaces (root): interface selection with a node that has two
//! interfaces (`--iface` that matches nothing falling through to
//! `--iface-regex`, then `--iface-can-reach`), a start from `FLANNELD_*`
//! variables alone, `--ip-blackhole-route`, Go's flag syntax, and
//! `--anti-spoofing` with a node whose public IP is not the address its
//! packets leave from.
//!
//! Addresses: underlays in 192.0.2.0/24, 198.51.100.0/24 and 203.0.113.0/24,
//! pods in 10.244.0.0/16. Every namespace has a unique name and is deleted
//! when its owner is dropped, also when an assertion fails.
//!
//! Run `cargo build --workspace --bins` first (the tests exec `weftd`,
//! `weft` and `flannel` from the target directory).

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use weft_testenv::require_root;
use weft_tests::cluster::{Cluster, ClusterSpec};
use weft_tests::netns::Netns;
use weft_tests::proc::{Proc, wait_for};
use weft_tests::weftd::{Weftd, read_env};

const READY: Duration = Duration::from_secs(60);
const ALLOC: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"alloc"}}"#;

/// A node namespace with two interfaces: `eth0` (192.0.2.1/24, the default
/// route) and `eth1` (198.51.100.1/24, the way to 203.0.113.0/24).
fn two_homed(tag: &str) -> Netns {
    let ns = Netns::new(&weft_tests::unique(tag));
    // veth pairs with both ends here (no dummy module everywhere): the
    // ends named eth0/eth1 carry the addresses.
    ns.sh(
        "for i in 0 1; do ip link add eth$i type veth peer name eth${i}p; done
         ip addr add 192.0.2.1/24 dev eth0 && ip addr add 198.51.100.1/24 dev eth1
         for l in eth0 eth0p eth1 eth1p; do ip link set $l up; done
         ip route add default via 192.0.2.254 dev eth0 onlink
         ip route add 203.0.113.0/24 via 198.51.100.254 dev eth1 onlink",
    );
    ns
}

/// A work directory with net-conf.json (alloc backend).
fn workdir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("net-conf.json"), ALLOC).expect("net-conf");
    dir
}

/// weftd flags for a daemon of `dir` on its embedded store in `store`.
fn base_args(dir: &Path, store: &str) -> Vec<String> {
    vec![
        "--traffic-manager=none".into(),
        format!("--store-path={}", dir.join(store).display()),
        format!("--net-config-path={}", dir.join("net-conf.json").display()),
    ]
}

fn args(dir: &Path, store: &str, extra: &[&str]) -> Vec<String> {
    let mut a = base_args(dir, store);
    a.extend(extra.iter().map(|s| s.to_string()));
    a
}

/// The PublicIPs of the leases in the embedded store at `store`.
fn public_ips(store: &Path) -> Vec<String> {
    let out = Command::new(weft_tests::bins::path("weft"))
        .args(["leases", "--json"])
        .arg(format!("--store-path={}", store.display()))
        .output()
        .expect("run weft");
    assert!(
        out.status.success(),
        "weft leases: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("leases JSON");
    v.as_array()
        .expect("a list")
        .iter()
        .map(|l| {
            l["value"]["PublicIP"]
                .as_str()
                .expect("PublicIP")
                .to_string()
        })
        .collect()
}

/// The lease subnet (`10.244.N.0/24`) from a subnet.env `FLANNEL_SUBNET`.
fn lease_subnet(flannel_subnet: &str) -> String {
    let (ip, len) = flannel_subnet.split_once('/').expect("cidr");
    let ip: std::net::Ipv4Addr = ip.parse().expect("ip");
    let o = ip.octets();
    assert_eq!(len, "24", "{flannel_subnet}");
    format!("{}.{}.{}.0/24", o[0], o[1], o[2])
}

/// The destinations of the namespace's blackhole routes.
fn blackholes(ns: &Netns) -> Vec<String> {
    ns.exec(&["ip", "route", "show", "type", "blackhole"])
        .lines()
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect()
}

/// `--iface` names nothing on the node: flanneld goes on to `--iface-regex`,
/// which matches eth1's address, so eth1's address is published (not eth0's,
/// the default route's).
#[test]
fn iface_regex_decides_after_an_iface_that_matches_nothing() {
    require_root!();
    let ns = two_homed("fr");
    let dir = workdir();
    let mut w = Weftd::start(
        "w",
        dir.path(),
        Some(ns.name()),
        &args(
            dir.path(),
            "store",
            &["--iface=nosuch0", r"--iface-regex=^198\.51\.100\."],
        ),
    );
    let env = w.wait_ready(READY);
    assert_eq!(env["FLANNEL_NETWORK"], "10.244.0.0/16");
    assert_eq!(public_ips(&dir.path().join("store")), vec!["198.51.100.1"]);
    w.wait_log(
        "Using interface with name eth1 and address 198.51.100.1",
        READY,
    );
    // Without --ip-blackhole-route there is no blackhole route.
    assert!(blackholes(&ns).is_empty(), "{:?}", blackholes(&ns));
}

/// Neither `--iface` nor `--iface-regex` match: `--iface-can-reach` picks the
/// interface the kernel reaches that address by, eth1 for 203.0.113.7 and
/// eth0 for 192.0.2.77.
#[test]
fn iface_can_reach_decides_after_iface_and_regex_match_nothing() {
    require_root!();
    let ns = two_homed("fc");
    let dir = workdir();
    for (target, want, store) in [
        ("203.0.113.7", "198.51.100.1", "s1"),
        ("192.0.2.77", "192.0.2.1", "s2"),
    ] {
        let mut w = Weftd::start(
            store,
            dir.path(),
            Some(ns.name()),
            &args(
                dir.path(),
                store,
                &[
                    "--iface=nosuch0",
                    "--iface=203.0.113.99",
                    "--iface-regex=^nomatch$",
                    &format!("--iface-can-reach={target}"),
                ],
            ),
        );
        w.wait_ready(READY);
        assert_eq!(
            public_ips(&dir.path().join(store)),
            vec![want],
            "--iface-can-reach={target}"
        );
        assert_eq!(w.proc.stop(libc::SIGTERM, Duration::from_secs(20)), Some(0));
    }
    // Nothing matches at all (no route to 10.99.0.1): flannel's error, exit 1, no subnet.env.
    ns.exec(&["ip", "route", "add", "unreachable", "10.99.0.0/16"]);
    let mut w = Weftd::start(
        "none",
        dir.path(),
        Some(ns.name()),
        &args(
            dir.path(),
            "s3",
            &["--iface=nosuch0", "--iface-can-reach=10.99.0.1"],
        ),
    );
    wait_for("weftd to give up", READY, || {
        (!w.proc.running()).then_some(())
    });
    assert_eq!(w.proc.stop(libc::SIGTERM, Duration::from_secs(5)), Some(1));
    assert!(
        w.proc.log().contains(
            "Failed to find interface to use that matches the interfaces and/or regexes provided"
        ),
        "{}",
        w.proc.log()
    );
    assert!(read_env(&dir.path().join("none.env")).is_none());
}

/// weftd started with no command-line flag at all: every setting from
/// `FLANNELD_*` (and weft's `WEFT_*`), in an otherwise empty environment.
#[test]
fn every_setting_from_the_environment_alone() {
    require_root!();
    let ns = two_homed("fe");
    let dir = workdir();
    let subnet_file = dir.path().join("run").join("subnet.env");
    let mut cmd = ns.command(&weft_tests::bins::path("weftd").to_string_lossy());
    cmd.env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("FLANNELD_SUBNET_FILE", &subnet_file)
        .env("FLANNELD_NET_CONFIG_PATH", dir.path().join("net-conf.json"))
        .env("FLANNELD_IFACE", "eth1")
        .env("FLANNELD_PUBLIC_IP", "203.0.113.5")
        .env("FLANNELD_IP_MASQ", "true")
        .env("FLANNELD_IPTABLES_FORWARD_RULES", "false")
        .env("FLANNELD_IPTABLES_RESYNC", "1")
        .env("FLANNELD_IP_BLACKHOLE_ROUTE", "true")
        .env("FLANNELD_HEALTHZ_IP", "127.0.0.1")
        .env("FLANNELD_HEALTHZ_PORT", "18081")
        .env("FLANNELD_V", "2")
        .env("WEFT_STORE_PATH", dir.path().join("store"));
    let mut p = Proc::spawn("weftd", cmd, &dir.path().join("weftd.log"));
    let env = wait_for("subnet.env", READY, || {
        assert!(p.running(), "weftd exited; log:\n{}", p.log());
        read_env(&subnet_file)
    });
    assert_eq!(env["FLANNEL_NETWORK"], "10.244.0.0/16");
    assert_eq!(env["FLANNEL_IPMASQ"], "true");
    assert_eq!(public_ips(&dir.path().join("store")), vec!["203.0.113.5"]);
    let log = p.log();
    assert!(
        log.contains("Using interface with name eth1 and address 198.51.100.1"),
        "{log}"
    );
    // --ip-masq installed the masquerade chain; --iptables-forward-rules=false left out FLANNEL-FWD.
    let masq = ns.exec(&["iptables", "-t", "nat", "-S", "FLANNEL-POSTRTG"]);
    assert!(masq.contains("-j MASQUERADE"), "{masq}");
    let fwd = ns.try_exec(&["iptables", "-S", "FLANNEL-FWD"]);
    assert!(
        !fwd.status.success(),
        "FLANNEL-FWD exists: {}",
        String::from_utf8_lossy(&fwd.stdout)
    );
    // The healthz server listens where the environment said.
    let listening = ns.exec(&["ss", "-ltnH"]);
    assert!(listening.contains("127.0.0.1:18081"), "{listening}");
    // The blackhole route, re-added within the 1 s resync period.
    let own = lease_subnet(&env["FLANNEL_SUBNET"]);
    assert_eq!(blackholes(&ns), vec![own.clone()]);
    ns.exec(&["ip", "route", "del", "blackhole", &own]);
    wait_for(
        "the blackhole route to come back",
        Duration::from_secs(10),
        || (blackholes(&ns) == vec![own.clone()]).then_some(()),
    );
    assert_eq!(p.stop(libc::SIGTERM, Duration::from_secs(20)), Some(0));
}

/// `--ip-blackhole-route`: the own subnet's blackhole is there before
/// subnet.env, restored when deleted, kept after weftd exits (as flannel,
/// which never removes it), and replaced when the node restarts with another
/// subnet.
#[test]
fn ip_blackhole_route_as_flannel() {
    require_root!();
    let ns = two_homed("fb");
    let dir = workdir();
    let flags = |ip: &str| {
        args(
            dir.path(),
            "store",
            &[
                "--ip-blackhole-route",
                "--iptables-resync=1",
                "--iface=eth0",
                &format!("--public-ip={ip}"),
            ],
        )
    };
    let mut w = Weftd::start("w", dir.path(), Some(ns.name()), &flags("192.0.2.1"));
    let env = w.wait_ready(READY);
    let own = lease_subnet(&env["FLANNEL_SUBNET"]);
    assert_eq!(blackholes(&ns), vec![own.clone()]);
    let route = ns.exec(&["ip", "route", "show", "type", "blackhole"]);
    // At the largest metric (see control/src/daemon/blackhole.rs for why not flannel's 0).
    assert!(
        route.starts_with(&format!("blackhole {own} ")) && route.contains("metric 4294967295"),
        "{route}"
    );

    ns.exec(&["ip", "route", "del", "blackhole", &own]);
    assert!(blackholes(&ns).is_empty());
    wait_for(
        "the blackhole route to come back",
        Duration::from_secs(10),
        || (blackholes(&ns) == vec![own.clone()]).then_some(()),
    );

    // A bridge that gets the subnet's address later (the first pod) is not
    // hidden by it: its connected route wins.
    ns.sh(&format!(
        "ip link add cni0 type bridge && ip addr add {} dev cni0 && ip link set cni0 up",
        env["FLANNEL_SUBNET"]
    ));
    let probe = own.replace(".0/24", ".77");
    let via = ns.exec(&["ip", "route", "get", &probe]);
    assert!(via.contains("dev cni0"), "{via}");
    ns.exec(&["ip", "link", "del", "cni0"]);
    let via = ns.try_exec(&["ip", "route", "get", &probe]);
    assert!(
        !via.status.success() || String::from_utf8_lossy(&via.stdout).contains("blackhole"),
        "{}",
        String::from_utf8_lossy(&via.stdout)
    );

    // Exit: the route stays.
    assert_eq!(w.proc.stop(libc::SIGTERM, Duration::from_secs(20)), Some(0));
    assert_eq!(blackholes(&ns), vec![own.clone()]);

    // Restart as another node (new public IP → new subnet) with the old
    // subnet.env: the old subnet's blackhole goes, the new one's comes.
    w.set_args(&flags("192.0.2.9"));
    w.restart();
    let env2 = w.wait_env(READY, |e| {
        e.get("FLANNEL_SUBNET") != env.get("FLANNEL_SUBNET")
    });
    let own2 = lease_subnet(&env2["FLANNEL_SUBNET"]);
    assert_ne!(own2, own);
    assert_eq!(blackholes(&ns), vec![own2]);
}

/// Go's flag syntax reaches the binary: `-v 2` parses (here with
/// `-version`, which prints and exits 0), unsupported klog flags and
/// malformed values exit 2 with the reason.
#[test]
fn weftd_parses_go_flags_and_refuses_what_it_cannot_honour() {
    let weftd = weft_tests::bins::path("weftd");
    let run = |args: &[&str]| {
        let out = Command::new(&weftd)
            .args(args)
            .env_remove("FLANNELD_V")
            .output()
            .expect("run weftd");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    for form in [
        &["-v", "2", "-version"][..],
        &["--v", "2", "--version"],
        &["-v=2", "-version"],
        &["--v=2", "-version=true"],
    ] {
        let (code, err) = run(form);
        assert_eq!(code, Some(0), "{form:?}: {err}");
        assert_eq!(err.trim(), env!("CARGO_PKG_VERSION"), "{form:?}");
    }
    let (code, err) = run(&["-vmodule=vxlan=5", "-version"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("does not support klog's -vmodule"), "{err}");
    let (code, err) = run(&["-ip-masq", "false", "-version"]);
    assert_eq!(code, Some(2), "a boolean takes no separate value: {err}");
    let (code, err) = run(&["--anti-spoofing=loose", "-version"]);
    assert_eq!(code, Some(2), "{err}");
    let (code, out) = {
        let out = Command::new(&weftd).arg("-h").output().expect("run weftd");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(code, Some(0));
    assert!(
        out.contains("--anti-spoofing") && out.contains("strict"),
        "{out}"
    );
}

fn ping(c: &Cluster, from: usize, to: usize, tries: u32) -> bool {
    (0..tries).any(|_| c.pods[from].ns.ping(&c.pods[to].ip, 1))
}

/// `weft status --json` of node `i`: its engine's drop counter `reason`.
fn engine_drops(c: &Cluster, i: usize, reason: &str) -> u64 {
    let out = Command::new(weft_tests::bins::path("weft"))
        .args(["status", "--json"])
        .arg(format!(
            "--subnet-file={}",
            c.nodes[i].dir.join("subnet.env").display()
        ))
        .output()
        .expect("run weft status");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("status JSON");
    v["backend"]["devices"][0]["drops"][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no drop counter {reason} in {v:#}"))
}

/// Node B publishes `--public-ip=198.51.100.2`, which is routed to it (and
/// DNATed to its 192.0.2.2), but its packets leave from 192.0.2.2. Node A
/// runs the default (`subnet`): pod pings with B pass and A logs the peer
/// once, with the fix. Node C runs `--anti-spoofing=strict`: B's packets
/// are unknown-peer drops and pod pings with B fail, while pings with A pass.
#[test]
fn anti_spoofing_default_accepts_a_node_whose_packets_leave_from_another_address() {
    require_root!();
    let work = tempfile::tempdir().expect("tempdir");
    let spec = ClusterSpec {
        prefix: weft_tests::unique("fs"),
        nodes: 3,
        net_conf: r#"{"Network":"10.244.0.0/16","Backend":{"Type":"udp"}}"#.into(),
        weftd_args: vec!["--traffic-manager=none".into()],
        bin_dir: weft_tests::bins::dir(),
        work: work.path().to_path_buf(),
    };
    let node_args = vec![
        vec![],
        vec!["--iface=eth0".into(), "--public-ip=198.51.100.2".into()],
        vec!["--anti-spoofing=strict".into()],
    ];
    let mut c = Cluster::create(spec, &Default::default(), node_args)
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    for i in [0, 2] {
        c.nodes[i].ns.exec(&[
            "ip",
            "route",
            "add",
            "198.51.100.2/32",
            "via",
            "192.0.2.2",
            "dev",
            "eth0",
        ]);
    }
    c.nodes[1].ns.exec(&[
        "iptables",
        "-t",
        "nat",
        "-A",
        "PREROUTING",
        "-d",
        "198.51.100.2/32",
        "-p",
        "udp",
        "--dport",
        "8285",
        "-j",
        "DNAT",
        "--to-destination",
        "192.0.2.2",
    ]);
    c.start_all().unwrap_or_else(|e| panic!("{e}"));
    let mut ips = public_ips(&work.path().join("store"));
    ips.sort();
    assert_eq!(ips, vec!["192.0.2.1", "192.0.2.3", "198.51.100.2"]);
    for n in 0..3 {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    // Default: both directions pass.
    assert!(ping(&c, 0, 1, 10), "A -> B; A's log:\n{}", c.log(0));
    assert!(ping(&c, 1, 0, 10), "B -> A; A's log:\n{}", c.log(0));
    // Strict: C and A are fine, C and B are not.
    assert!(ping(&c, 2, 0, 10), "C -> A; C's log:\n{}", c.log(2));
    assert!(!ping(&c, 2, 1, 4), "C -> B passed under strict");
    assert!(!ping(&c, 1, 2, 4), "B -> C passed under strict");
    assert!(engine_drops(&c, 2, "unknown_peer") > 0);
    assert_eq!(engine_drops(&c, 0, "unknown_peer"), 0);

    // A names the peer and the fix, once (weftd checks every 10 s).
    let warning = "publishes public IP 198.51.100.2 but its packets arrive from 192.0.2.2";
    wait_for("A's warning", Duration::from_secs(40), || {
        c.log(0).contains(warning).then_some(())
    });
    assert!(c.log(0).contains("--public-ip=192.0.2.2"), "{}", c.log(0));
    assert!(ping(&c, 0, 1, 3));
    std::thread::sleep(Duration::from_secs(12));
    assert_eq!(c.log(0).matches(warning).count(), 1, "{}", c.log(0));
    assert!(
        !c.log(2).contains(warning),
        "strict delivers nothing to warn about"
    );
}
