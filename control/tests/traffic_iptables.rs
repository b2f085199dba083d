//! Root tests of the iptables driver against the real Debian `iptables` (nf_tables backend),
//! each in its own network namespace: exact `iptables -S` output, repair by ensure/resync,
//! stale-rule cleanup on a changed subnet, and switching to nftables.

mod traffic_util;

use std::time::Duration;

use traffic_util::{Netns, count, wait_for};
use weft_control::traffic::{
    IptablesManager, Kind, Networks, Previous, TrafficManager, new_manager, spawn_resync,
};
use weft_testenv::require_root;

const N4: &str = "10.244.0.0/16";
const N6: &str = "2001:db8:42::/56";

fn nets(v4: &str, v6: Option<&str>) -> Networks {
    Networks {
        v4: Some(v4.parse().expect("v4")),
        v6: v6.map(|s| s.parse().expect("v6")),
    }
}

/// flannel's `iptables -t nat -S FLANNEL-POSTRTG` (fl:e2e/rules.go), written out by hand.
fn golden_postrtg(n: &str, p: &str, mcast: &str, rf: &str) -> String {
    format!(
        "-N FLANNEL-POSTRTG\n\
         -A FLANNEL-POSTRTG -m mark --mark 0x4000/0x4000 -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG -s {p} -d {n} -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG -s {n} -d {p} -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG ! -s {n} -d {p} -m comment --comment \"flanneld masq\" -j RETURN\n\
         -A FLANNEL-POSTRTG -s {n} ! -d {mcast} -m comment --comment \"flanneld masq\" -j MASQUERADE{rf}\n\
         -A FLANNEL-POSTRTG ! -s {n} -d {n} -m comment --comment \"flanneld masq\" -j MASQUERADE{rf}\n"
    )
}

fn golden_fwd(n: &str) -> String {
    format!(
        "-N FLANNEL-FWD\n\
         -A FLANNEL-FWD -s {n} -m comment --comment \"flanneld forward\" -j ACCEPT\n\
         -A FLANNEL-FWD -d {n} -m comment --comment \"flanneld forward\" -j ACCEPT\n"
    )
}

const MASQ_JUMP: &str = "-A POSTROUTING -m comment --comment \"flanneld masq\" -j FLANNEL-POSTRTG";
const FWD_JUMP: &str = "-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD";

fn setup(ns: &Netns, random_fully_disable: bool, subnet4: &str, subnet6: &str) -> IptablesManager {
    let mgr = IptablesManager::new(ns.runner(), random_fully_disable);
    mgr.init().expect("init");
    mgr.setup_masq(&nets(N4, Some(N6)), &nets(subnet4, Some(subnet6)), None)
        .expect("masq");
    mgr.setup_forward(&nets(N4, Some(N6)), None)
        .expect("forward");
    mgr
}

#[test]
fn iptables_output_equals_flannels_lines_v4_and_v6() {
    require_root!();
    let ns = Netns::new("ipt-gold");
    // kube-proxy's jumps are already there: flannel's jumps must be appended after them.
    ns.exec(&["iptables", "-w", "-N", "KUBE-FORWARD"]);
    ns.exec(&[
        "iptables",
        "-w",
        "-A",
        "FORWARD",
        "-m",
        "comment",
        "--comment",
        "kubernetes forwarding rules",
        "-j",
        "KUBE-FORWARD",
    ]);
    let mgr = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");

    let rf = " --random-fully";
    assert_eq!(
        ns.exec(&["iptables", "-t", "nat", "-S", "FLANNEL-POSTRTG"]),
        golden_postrtg(N4, "10.244.1.0/24", "224.0.0.0/4", rf)
    );
    assert_eq!(ns.exec(&["iptables", "-S", "FLANNEL-FWD"]), golden_fwd(N4));
    assert_eq!(
        ns.exec(&["ip6tables", "-t", "nat", "-S", "FLANNEL-POSTRTG"]),
        golden_postrtg(N6, "2001:db8:42:1::/64", "ff00::/8", rf)
    );
    assert_eq!(ns.exec(&["ip6tables", "-S", "FLANNEL-FWD"]), golden_fwd(N6));
    assert_eq!(
        ns.exec(&["iptables", "-t", "nat", "-S", "POSTROUTING"]),
        format!("-P POSTROUTING ACCEPT\n{MASQ_JUMP}\n")
    );
    assert_eq!(
        ns.exec(&["iptables", "-S", "FORWARD"]),
        format!(
            "-P FORWARD ACCEPT\n-A FORWARD -m comment --comment \"kubernetes forwarding rules\" -j KUBE-FORWARD\n{FWD_JUMP}\n"
        )
    );
    assert_eq!(
        count(&ns.exec(&["ip6tables", "-S", "FORWARD"]), FWD_JUMP),
        1
    );
    assert!(
        !mgr.ensure().expect("ensure"),
        "nothing to repair right after setup"
    );

    // Setting up again (a restart with the same lease) changes nothing and duplicates nothing.
    let again = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");
    assert!(!again.ensure().expect("ensure"));
    assert_eq!(
        count(&ns.exec(&["iptables", "-t", "nat", "-S"]), MASQ_JUMP),
        1
    );
    assert_eq!(ns.exec(&["iptables", "-S", "FLANNEL-FWD"]), golden_fwd(N4));
}

#[test]
fn random_fully_disable_drops_the_flag() {
    require_root!();
    let ns = Netns::new("ipt-norf");
    let _mgr = setup(&ns, true, "10.244.3.0/24", "2001:db8:42:3::/64");
    assert_eq!(
        ns.exec(&["iptables", "-t", "nat", "-S", "FLANNEL-POSTRTG"]),
        golden_postrtg(N4, "10.244.3.0/24", "224.0.0.0/4", "")
    );
    assert_eq!(
        ns.exec(&["ip6tables", "-t", "nat", "-S", "FLANNEL-POSTRTG"]),
        golden_postrtg(N6, "2001:db8:42:3::/64", "ff00::/8", "")
    );
}

#[test]
fn ensure_restores_rules_deleted_by_hand() {
    require_root!();
    let ns = Netns::new("ipt-ens");
    let mgr = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");
    let want = ns.exec(&["iptables", "-t", "nat", "-S"]);
    let want6 = ns.exec(&["ip6tables", "-S"]);

    ns.exec(&[
        "iptables",
        "-w",
        "-t",
        "nat",
        "-D",
        "FLANNEL-POSTRTG",
        "-s",
        N4,
        "-d",
        "10.244.1.0/24",
        "-m",
        "comment",
        "--comment",
        "flanneld masq",
        "-j",
        "RETURN",
    ]);
    ns.exec(&[
        "ip6tables",
        "-w",
        "-D",
        "FORWARD",
        "-m",
        "comment",
        "--comment",
        "flanneld forward",
        "-j",
        "FLANNEL-FWD",
    ]);
    assert_ne!(ns.exec(&["iptables", "-t", "nat", "-S"]), want);
    assert!(mgr.ensure().expect("ensure"), "repaired");
    assert_eq!(ns.exec(&["iptables", "-t", "nat", "-S"]), want);
    assert_eq!(ns.exec(&["ip6tables", "-S"]), want6);
    assert!(!mgr.ensure().expect("ensure"), "nothing left to repair");

    // A whole chain gone (jump included) comes back too.
    ns.exec(&[
        "iptables",
        "-w",
        "-D",
        "FORWARD",
        "-m",
        "comment",
        "--comment",
        "flanneld forward",
        "-j",
        "FLANNEL-FWD",
    ]);
    ns.exec(&["iptables", "-w", "-F", "FLANNEL-FWD"]);
    ns.exec(&["iptables", "-w", "-X", "FLANNEL-FWD"]);
    assert!(mgr.ensure().expect("ensure"));
    assert_eq!(ns.exec(&["iptables", "-S", "FLANNEL-FWD"]), golden_fwd(N4));
    assert_eq!(count(&ns.exec(&["iptables", "-S", "FORWARD"]), FWD_JUMP), 1);
}

#[test]
fn resync_thread_restores_a_deleted_rule_within_a_period() {
    require_root!();
    let ns = Netns::new("ipt-rsy");
    let mgr = new_manager(Kind::Iptables, false, ns.runner());
    mgr.init().expect("init");
    mgr.setup_forward(&nets(N4, None), None).expect("forward");
    let handle = spawn_resync(mgr.clone(), Duration::from_secs(1)).expect("spawn");
    ns.exec(&[
        "iptables",
        "-w",
        "-D",
        "FLANNEL-FWD",
        "-d",
        N4,
        "-m",
        "comment",
        "--comment",
        "flanneld forward",
        "-j",
        "ACCEPT",
    ]);
    assert!(
        wait_for(|| ns.exec(&["iptables", "-S", "FLANNEL-FWD"]) == golden_fwd(N4)),
        "rule not restored: {}",
        ns.exec(&["iptables", "-S", "FLANNEL-FWD"])
    );
    handle.stop();
}

#[test]
fn changed_subnet_removes_old_rules_and_leaves_no_duplicates() {
    require_root!();
    let ns = Netns::new("ipt-chg");
    let old_mgr = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");
    drop(old_mgr);
    // A messy leftover: a second copy of the jump.
    ns.exec(&[
        "iptables",
        "-w",
        "-t",
        "nat",
        "-A",
        "POSTROUTING",
        "-m",
        "comment",
        "--comment",
        "flanneld masq",
        "-j",
        "FLANNEL-POSTRTG",
    ]);

    // Restart: new lease 10.244.7.0/24, previous subnet.env said 10.244.1.1/24.
    let prev = Previous {
        network: nets(N4, Some(N6)),
        subnet: nets("10.244.1.1/24", Some("2001:db8:42:1::1/64")),
    };
    let mgr = IptablesManager::new(ns.runner(), false);
    mgr.init().expect("init");
    mgr.setup_masq(
        &nets(N4, Some(N6)),
        &nets("10.244.7.0/24", Some("2001:db8:42:7::/64")),
        Some(&prev),
    )
    .expect("masq");

    let nat = ns.exec(&["iptables", "-t", "nat", "-S"]);
    assert!(
        !nat.contains("10.244.1.0/24"),
        "old subnet still present:\n{nat}"
    );
    assert_eq!(count(&nat, MASQ_JUMP), 1, "{nat}");
    assert_eq!(
        ns.exec(&["iptables", "-t", "nat", "-S", "FLANNEL-POSTRTG"]),
        golden_postrtg(N4, "10.244.7.0/24", "224.0.0.0/4", " --random-fully")
    );
    let nat6 = ns.exec(&["ip6tables", "-t", "nat", "-S"]);
    assert!(!nat6.contains("2001:db8:42:1::/64"), "{nat6}");
    assert_eq!(count(&nat6, MASQ_JUMP), 1);

    // Network changed too, and IPv6 was switched off: the v6 masquerade chain goes away.
    let prev = Previous {
        network: nets(N4, Some(N6)),
        subnet: nets("10.244.7.1/24", Some("2001:db8:42:7::1/64")),
    };
    let mgr = IptablesManager::new(ns.runner(), false);
    mgr.setup_masq(
        &nets("10.245.0.0/16", None),
        &nets("10.245.7.0/24", None),
        Some(&prev),
    )
    .expect("masq");
    let nat = ns.exec(&["iptables", "-t", "nat", "-S"]);
    assert!(!nat.contains("10.244."), "{nat}");
    assert_eq!(
        ns.exec(&["iptables", "-t", "nat", "-S", "FLANNEL-POSTRTG"]),
        golden_postrtg(
            "10.245.0.0/16",
            "10.245.7.0/24",
            "224.0.0.0/4",
            " --random-fully"
        )
    );
    assert_eq!(
        ns.exec(&["ip6tables", "-t", "nat", "-S"]),
        "-P PREROUTING ACCEPT\n-P INPUT ACCEPT\n-P OUTPUT ACCEPT\n-P POSTROUTING ACCEPT\n"
    );
}

#[test]
fn switching_to_nftables_removes_the_iptables_chains() {
    require_root!();
    let ns = Netns::new("ipt-sw");
    let _ipt = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");
    // Another jump to flannel's chain (e.g. by hand) must not block the chain deletion.
    ns.exec(&[
        "iptables",
        "-w",
        "-A",
        "FORWARD",
        "-s",
        "10.9.0.0/16",
        "-j",
        "FLANNEL-FWD",
    ]);

    weft_control::traffic::cleanup_other(Kind::Nftables, false, ns.runner())
        .expect("cleanup iptables");
    weft_control::traffic::cleanup_other(Kind::Nftables, false, ns.runner()).expect("idempotent");
    for tool in ["iptables", "ip6tables"] {
        let nat = ns.exec(&[tool, "-t", "nat", "-S"]);
        let filter = ns.exec(&[tool, "-S"]);
        assert!(!nat.contains("FLANNEL"), "{tool} nat:\n{nat}");
        assert!(!filter.contains("FLANNEL"), "{tool} filter:\n{filter}");
    }
    assert!(!ns.try_exec(&["iptables", "-S", "FLANNEL-FWD"]).0);
}

/// `--tunnel-gso`: the accept for packets in from weft's tunnel TAP is one
/// more line of the IPv4 forward chain, as iptables prints it (so ensure
/// finds it intact), and none in the IPv6 one.
#[test]
fn the_tunnel_tap_accept_is_intact_after_setup() {
    require_root!();
    let ns = Netns::new("ipt-tap");
    let mgr = IptablesManager::new(ns.runner(), false);
    mgr.init().expect("init");
    mgr.setup_forward(&nets(N4, Some(N6)), Some("weft-gso0"))
        .expect("forward");
    assert_eq!(
        ns.exec(&["iptables", "-S", "FLANNEL-FWD"]),
        format!(
            "{}-A FLANNEL-FWD -i weft-gso0 -m comment --comment \"flanneld forward\" -j ACCEPT\n",
            golden_fwd(N4)
        )
    );
    assert_eq!(ns.exec(&["ip6tables", "-S", "FLANNEL-FWD"]), golden_fwd(N6));
    assert!(!mgr.ensure().expect("ensure"), "nothing to repair");
    mgr.cleanup().expect("cleanup");
    assert!(!ns.exec(&["iptables", "-S"]).contains("weft-gso0"));
}
