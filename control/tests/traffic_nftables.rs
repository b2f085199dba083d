//! Root tests of the nftables driver against the real Debian `nft`, each in its own network
//! namespace: exact `nft list chain` output, repair by ensure, re-setup without duplicates,
//! and switching to iptables.

mod traffic_util;

use traffic_util::{Netns, count};
use weft_control::traffic::{Kind, Networks, NftablesManager, Previous, TrafficManager};
use weft_testenv::require_root;

const N4: &str = "10.244.0.0/16";
const N6: &str = "2001:db8:42::/56";

fn nets(v4: &str, v6: Option<&str>) -> Networks {
    Networks {
        v4: Some(v4.parse().expect("v4")),
        v6: v6.map(|s| s.parse().expect("v6")),
    }
}

/// fl:e2e/rules.go `expectedNftPostrouting`, with `ip`/`ip6`, multicast and masquerade as parameters.
fn golden_postrtg(f: &str, n: &str, p: &str, mcast: &str, masq: &str) -> String {
    let table = if f == "ip" {
        "flannel-ipv4"
    } else {
        "flannel-ipv6"
    };
    format!(
        "table {f} {table} {{\n\
         \tchain postrtg {{\n\
         \t\tcomment \"chain to manage traffic masquerading by flannel\"\n\
         \t\ttype nat hook postrouting priority srcnat; policy accept;\n\
         \t\tmeta mark 0x00004000 return\n\
         \t\t{f} saddr {p} {f} daddr {n} return\n\
         \t\t{f} saddr {n} {f} daddr {p} return\n\
         \t\t{f} saddr != {p} {f} daddr {n} return\n\
         \t\t{f} saddr {n} {f} daddr != {mcast} {masq}\n\
         \t\t{f} saddr != {n} {f} daddr {n} {masq}\n\
         \t}}\n\
         }}\n"
    )
}

/// fl:e2e/rules.go `expectedNftForward`.
fn golden_forward(f: &str, n: &str) -> String {
    let table = if f == "ip" {
        "flannel-ipv4"
    } else {
        "flannel-ipv6"
    };
    format!(
        "table {f} {table} {{\n\
         \tchain forward {{\n\
         \t\tcomment \"chain to accept flannel traffic\"\n\
         \t\ttype filter hook forward priority filter; policy accept;\n\
         \t\t{f} saddr {n} accept\n\
         \t\t{f} daddr {n} accept\n\
         \t}}\n\
         }}\n"
    )
}

fn setup(ns: &Netns, random_fully_disable: bool, s4: &str, s6: &str) -> NftablesManager {
    let mgr = NftablesManager::new(ns.runner(), random_fully_disable);
    mgr.init().expect("init");
    mgr.setup_masq(&nets(N4, Some(N6)), &nets(s4, Some(s6)), None)
        .expect("masq");
    mgr.setup_forward(&nets(N4, Some(N6)), None)
        .expect("forward");
    mgr
}

fn list(ns: &Netns, f: &str, chain: &str) -> String {
    let table = if f == "ip" {
        "flannel-ipv4"
    } else {
        "flannel-ipv6"
    };
    ns.exec(&["nft", "list", "chain", f, table, chain])
}

#[test]
fn nft_output_equals_flannels_lines_v4_and_v6() {
    require_root!();
    let ns = Netns::new("nft-gold");
    let mgr = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");
    let fr = "masquerade fully-random";
    assert_eq!(
        list(&ns, "ip", "postrtg"),
        golden_postrtg("ip", N4, "10.244.1.0/24", "224.0.0.0/4", fr)
    );
    assert_eq!(list(&ns, "ip", "forward"), golden_forward("ip", N4));
    assert_eq!(
        list(&ns, "ip6", "postrtg"),
        golden_postrtg("ip6", N6, "2001:db8:42:1::/64", "ff00::/8", fr)
    );
    assert_eq!(list(&ns, "ip6", "forward"), golden_forward("ip6", N6));
    let tables = ns.exec(&["nft", "list", "tables"]);
    assert!(
        tables.contains("table ip flannel-ipv4\n") && tables.contains("table ip6 flannel-ipv6\n"),
        "{tables}"
    );
    let table = ns.exec(&["nft", "list", "table", "ip", "flannel-ipv4"]);
    assert!(
        table.contains("comment \"rules for flannel-ipv4\""),
        "{table}"
    );
    assert!(
        !table.contains("masqueradeTest"),
        "the probe is check-mode only:\n{table}"
    );
    assert!(
        !mgr.ensure().expect("ensure"),
        "nothing to repair right after setup"
    );
}

#[test]
fn random_fully_disable_drops_fully_random() {
    require_root!();
    let ns = Netns::new("nft-norf");
    let _mgr = setup(&ns, true, "10.244.3.0/24", "2001:db8:42:3::/64");
    assert_eq!(
        list(&ns, "ip", "postrtg"),
        golden_postrtg("ip", N4, "10.244.3.0/24", "224.0.0.0/4", "masquerade")
    );
}

#[test]
fn ensure_restores_deleted_rules_chains_and_tables() {
    require_root!();
    let ns = Netns::new("nft-ens");
    let mgr = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");
    let want = ns.exec(&["nft", "list", "ruleset"]);

    // One rule, by handle.
    let listing = ns.exec(&[
        "nft",
        "-a",
        "list",
        "chain",
        "ip",
        "flannel-ipv4",
        "postrtg",
    ]);
    let line = listing
        .lines()
        .find(|l| l.contains("ip saddr != 10.244.1.0/24"))
        .expect("rule present");
    let handle = line.rsplit(' ').next().expect("handle");
    ns.exec(&[
        "nft",
        "delete",
        "rule",
        "ip",
        "flannel-ipv4",
        "postrtg",
        "handle",
        handle,
    ]);
    assert_ne!(ns.exec(&["nft", "list", "ruleset"]), want);
    assert!(mgr.ensure().expect("ensure"));
    assert_eq!(ns.exec(&["nft", "list", "ruleset"]), want);
    assert!(!mgr.ensure().expect("ensure"));

    // A whole chain, then a whole table.
    ns.exec(&["nft", "delete", "chain", "ip6", "flannel-ipv6", "forward"]);
    assert!(mgr.ensure().expect("ensure"));
    assert_eq!(list(&ns, "ip6", "forward"), golden_forward("ip6", N6));
    ns.exec(&["nft", "delete", "table", "ip", "flannel-ipv4"]);
    assert!(mgr.ensure().expect("ensure"));
    assert_eq!(
        list(&ns, "ip", "postrtg"),
        golden_postrtg(
            "ip",
            N4,
            "10.244.1.0/24",
            "224.0.0.0/4",
            "masquerade fully-random"
        )
    );
    assert_eq!(list(&ns, "ip", "forward"), golden_forward("ip", N4));

    // A foreign rule inside flannel's chain is an alteration too.
    ns.exec(&[
        "nft",
        "add",
        "rule",
        "ip",
        "flannel-ipv4",
        "forward",
        "ip",
        "saddr",
        "10.9.0.0/16",
        "drop",
    ]);
    assert!(mgr.ensure().expect("ensure"));
    assert_eq!(list(&ns, "ip", "forward"), golden_forward("ip", N4));
}

#[test]
fn changed_subnet_re_setup_leaves_only_the_new_rules() {
    require_root!();
    let ns = Netns::new("nft-chg");
    drop(setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64"));
    let prev = Previous {
        network: nets(N4, Some(N6)),
        subnet: nets("10.244.1.1/24", Some("2001:db8:42:1::1/64")),
    };
    let mgr = NftablesManager::new(ns.runner(), false);
    mgr.init().expect("init");
    mgr.setup_masq(&nets(N4, None), &nets("10.244.7.0/24", None), Some(&prev))
        .expect("masq");
    let ruleset = ns.exec(&["nft", "list", "ruleset"]);
    assert!(!ruleset.contains("10.244.1.0/24"), "{ruleset}");
    assert_eq!(
        count(&ruleset, "\t\tmeta mark 0x00004000 return"),
        1,
        "v6 masquerade chain removed:\n{ruleset}"
    );
    assert_eq!(
        list(&ns, "ip", "postrtg"),
        golden_postrtg(
            "ip",
            N4,
            "10.244.7.0/24",
            "224.0.0.0/4",
            "masquerade fully-random"
        )
    );
}

#[test]
fn switching_to_iptables_deletes_the_nft_tables() {
    require_root!();
    let ns = Netns::new("nft-sw");
    let _nft = setup(&ns, false, "10.244.1.0/24", "2001:db8:42:1::/64");
    weft_control::traffic::cleanup_other(Kind::Iptables, false, ns.runner())
        .expect("cleanup nftables");
    weft_control::traffic::cleanup_other(Kind::Iptables, false, ns.runner()).expect("idempotent");
    let tables = ns.exec(&["nft", "list", "tables"]);
    assert!(!tables.contains("flannel"), "{tables}");
}

/// `--tunnel-gso`: the accept for packets in from weft's tunnel TAP, as nft
/// lists it (so ensure finds it intact), in the IPv4 chain only.
#[test]
fn the_tunnel_tap_accept_is_intact_after_setup() {
    require_root!();
    let ns = Netns::new("nft-tap");
    let mgr = NftablesManager::new(ns.runner(), false);
    mgr.init().expect("init");
    mgr.setup_forward(&nets(N4, Some(N6)), Some("weft-gso0"))
        .expect("forward");
    let got = list(&ns, "ip", "forward");
    let want = golden_forward("ip", N4).replace(
        &format!("daddr {N4} accept\n"),
        &format!("daddr {N4} accept\n\t\tiifname \"weft-gso0\" accept\n"),
    );
    assert_eq!(got, want);
    assert_eq!(list(&ns, "ip6", "forward"), golden_forward("ip6", N6));
    assert!(!mgr.ensure().expect("ensure"), "nothing to repair");
}
