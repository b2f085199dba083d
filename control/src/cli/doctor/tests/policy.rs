//! The policy-routing check: rules that steal the pod network and rules
//! that do not.

use super::super::checks;
use super::super::facts::Facts;
use super::{healthy, link, route};
use crate::netlink::{Rule, RuleDo};

fn rule(priority: u32, src: Option<&str>, dst: Option<&str>, action: RuleDo) -> Rule {
    Rule {
        priority,
        action,
        src: src.map(|s| s.parse().expect("test fixture")),
        dst: dst.map(|s| s.parse().expect("test fixture")),
        iif: None,
        narrowed: false,
    }
}

/// The kernel's three rules.
fn system() -> Vec<Rule> {
    vec![
        rule(0, None, None, RuleDo::Table(255)),
        rule(32766, None, None, RuleDo::Table(254)),
        rule(32767, None, None, RuleDo::Table(253)),
    ]
}

fn ids(f: &Facts) -> Vec<&'static str> {
    checks::run(f).into_iter().map(|x| x.id).collect()
}

fn with(extra: Rule, table: Option<(u32, &str, Option<&str>, u32)>) -> Facts {
    let mut f = healthy();
    f.links.push(link(6, "tun0", "tun"));
    f.rules = system();
    f.rules.insert(1, extra);
    if let Some((t, dst, gw, oif)) = table {
        f.tables.insert(t, vec![route(dst, gw, Some(oif))]);
    }
    f
}

#[test]
fn the_kernels_rules_are_fine() {
    let mut f = healthy();
    f.rules = system();
    assert!(ids(&f).is_empty());
}

#[test]
fn a_rule_sending_the_pod_network_to_another_table_is_an_error() {
    // `ip rule add to 10.244.0.0/16 lookup 100` with table 100 via eth0.
    let f = with(
        rule(100, None, Some("10.244.0.0/16"), RuleDo::Table(100)),
        Some((100, "10.244.0.0/16", None, 2)),
    );
    let found = checks::run(&f);
    assert_eq!(ids(&f), ["policy_rule_steals"], "{found:#?}");
    assert!(found[0].evidence.contains("lookup 100"), "{found:#?}");
    assert!(found[0].fix.contains("ip rule del pref 100"), "{found:#?}");
    // A VPN's `from all lookup 51820` whose table has a default route.
    let f = with(
        rule(5000, None, None, RuleDo::Table(51820)),
        Some((51820, "0.0.0.0/0", None, 6)),
    );
    assert_eq!(ids(&f), ["policy_rule_steals"]);
    // A rule that drops it.
    let f = with(
        rule(
            200,
            Some("10.244.1.0/24"),
            None,
            RuleDo::Drop("unreachable"),
        ),
        None,
    );
    assert_eq!(ids(&f), ["policy_rule_steals"]);
}

#[test]
fn rules_that_leave_the_pod_network_alone_are_fine() {
    // Tailscale's `from all lookup 52`, a table without the pod network.
    let f = with(
        rule(5270, None, None, RuleDo::Table(52)),
        Some((52, "100.100.100.100/32", None, 6)),
    );
    assert!(ids(&f).is_empty());
    // Source-based routing of another address.
    let f = with(
        rule(100, Some("198.51.100.7/32"), None, RuleDo::Table(100)),
        Some((100, "0.0.0.0/0", Some("198.51.100.1"), 2)),
    );
    assert!(ids(&f).is_empty());
    // A table whose pod routes go through weft's device.
    let f = with(
        rule(100, None, Some("10.244.0.0/16"), RuleDo::Table(100)),
        Some((100, "10.244.2.0/24", Some("10.244.2.0"), 4)),
    );
    assert!(ids(&f).is_empty());
    // Only marked packets (a VPN's fwmark rule).
    let mut r = rule(100, None, None, RuleDo::Table(100));
    r.narrowed = true;
    let f = with(r, Some((100, "0.0.0.0/0", None, 6)));
    assert!(ids(&f).is_empty());
    // After the main rule.
    let f = with(
        rule(
            40000,
            None,
            Some("10.244.0.0/16"),
            RuleDo::Drop("blackhole"),
        ),
        None,
    );
    assert!(ids(&f).is_empty());
}

#[test]
fn iptables_own_forward_chain_is_left_to_the_iptables_check() {
    // iptables-nft's `ip filter FORWARD` with policy drop and weft's jump:
    // the iptables check reads it (and finds weft's accept), so no nft finding.
    let mut f = healthy();
    f.nft = Ok(serde_json::json!({"nftables": [
        {"chain": {"family": "ip", "table": "filter", "name": "FORWARD",
            "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}}]}));
    f.forward.as_mut().expect("test fixture")[0] = "-P FORWARD DROP".into();
    assert!(ids(&f).is_empty(), "{:#?}", checks::run(&f));
    // Without iptables to read it, it is judged here.
    f.forward = Err("cannot run iptables".into());
    assert!(
        ids(&f).contains(&"nft_forward_drop"),
        "{:#?}",
        checks::run(&f)
    );
}
