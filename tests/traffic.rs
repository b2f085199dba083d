//! weftd's host rules end to end: a real weftd in its own network namespace
//! installs flannel's iptables rules before it writes subnet.env, restores a
//! rule deleted by hand within one resync period, and after a restart with a
//! different subnet leaves only the new rules.

use std::time::Duration;

use weft_testenv::require_root;
use weft_tests::netns::{Netns, Underlay};
use weft_tests::proc::wait_for;
use weft_tests::weftd::Weftd;

const READY: Duration = Duration::from_secs(60);

fn postrtg(ns: &Netns) -> Vec<String> {
    ns.exec(&["iptables", "-t", "nat", "-S", "FLANNEL-POSTRTG"])
        .lines()
        .map(str::to_string)
        .collect()
}

#[test]
fn weftd_installs_and_restores_flannel_rules() {
    require_root!();
    let p = weft_tests::unique("tr");
    let mut ul = Underlay::new(&format!("{p}-ul"));
    let node = Netns::new(&format!("{p}-n1"));
    ul.attach(&node, "192.0.2.1/24");
    node.exec(&[
        "ip",
        "route",
        "add",
        "default",
        "via",
        "192.0.2.254",
        "dev",
        "eth0",
        "onlink",
    ]);
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("net-conf.json"),
        r#"{"Network":"10.244.0.0/16","Backend":{"Type":"alloc"}}"#,
    )
    .expect("net-conf");
    let args = |extra: &str| -> Vec<String> {
        vec![
            "--ip-masq".into(),
            "--iptables-resync=1".into(),
            format!("--store-path={}", dir.path().join("store").display()),
            format!(
                "--net-config-path={}",
                dir.path().join("net-conf.json").display()
            ),
            extra.to_string(),
        ]
    };
    let mut w = Weftd::start(
        "w",
        dir.path(),
        Some(node.name()),
        &args("--public-ip=192.0.2.1"),
    );
    let env = w.wait_ready(READY);
    let subnet = env["FLANNEL_SUBNET"].replace(".1/24", ".0/24");
    let expected = vec![
        "-N FLANNEL-POSTRTG".to_string(),
        "-A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment \"flanneld masq\" -j RETURN".into(),
        format!("-A FLANNEL-POSTRTG -s {subnet} -d 10.244.0.0/16 -m comment --comment \"flanneld masq\" -j RETURN"),
        format!("-A FLANNEL-POSTRTG -s 10.244.0.0/16 -d {subnet} -m comment --comment \"flanneld masq\" -j RETURN"),
        format!("-A FLANNEL-POSTRTG ! -s 10.244.0.0/16 -d {subnet} -m comment --comment \"flanneld masq\" -j RETURN"),
        "-A FLANNEL-POSTRTG -s 10.244.0.0/16 ! -d 224.0.0.0/4 -m comment --comment \"flanneld masq\" -j MASQUERADE --random-fully".into(),
        "-A FLANNEL-POSTRTG ! -s 10.244.0.0/16 -d 10.244.0.0/16 -m comment --comment \"flanneld masq\" -j MASQUERADE --random-fully".into(),
    ];
    assert_eq!(postrtg(&node), expected);
    let fwd = node.exec(&["iptables", "-S", "FLANNEL-FWD"]);
    assert!(
        fwd.contains(
            "-A FLANNEL-FWD -s 10.244.0.0/16 -m comment --comment \"flanneld forward\" -j ACCEPT"
        ),
        "{fwd}"
    );

    // A rule deleted by hand is back within a resync period (1 s here).
    node.exec(&[
        "iptables",
        "-t",
        "nat",
        "-D",
        "FLANNEL-POSTRTG",
        "-m",
        "mark",
        "--mark",
        "0x4000/0x4000",
        "-m",
        "comment",
        "--comment",
        "flanneld masq",
        "-j",
        "RETURN",
    ]);
    assert_ne!(postrtg(&node), expected);
    wait_for(
        "the deleted rule to come back",
        Duration::from_secs(20),
        || (postrtg(&node) == expected).then_some(()),
    );

    // Restart as another node (new public IP → new subnet), with the old
    // subnet.env in place: the old rules go, no duplicates stay.
    assert_eq!(w.proc.stop(libc::SIGTERM, Duration::from_secs(20)), Some(0));
    node.exec(&["ip", "addr", "add", "192.0.2.9/24", "dev", "eth0"]);
    w.set_args(&args("--public-ip=192.0.2.9"));
    w.restart();
    let env2 = w.wait_env(READY, |e| {
        e.get("FLANNEL_SUBNET") != env.get("FLANNEL_SUBNET")
    });
    let subnet2 = env2["FLANNEL_SUBNET"].replace(".1/24", ".0/24");
    let rules = postrtg(&node).join("\n");
    assert!(
        !rules.contains(&subnet),
        "stale rules for {subnet} left:\n{rules}"
    );
    assert_eq!(rules.matches(&subnet2).count(), 3, "{rules}");
    let jumps = node.exec(&["iptables", "-t", "nat", "-S", "POSTROUTING"]);
    assert_eq!(jumps.matches("FLANNEL-POSTRTG").count(), 1, "{jumps}");
}
