//! Policy routing: a rule before the main table's (`ip rule`, priority
//! below 32766) that sends the pod network elsewhere. A VPN client, a
//! multi-homing script or another CNI adds `to 10.0.0.0/8 lookup 100` or
//! `from all lookup 52`, and pod traffic to other nodes leaves through the
//! wrong interface although every route in the main table (which the other
//! checks judge) is right.
//!
//! A rule steals the pod network when, ahead of the main rule, it could
//! match pod traffic (its `from` and `to` overlap the network or are `all`;
//! one narrowed to marked packets, users, ports or protocols, or inverted,
//! is left alone: it does not take every pod packet) and either drops it
//! (`blackhole`, `unreachable`, `prohibit`) or looks up a table holding a
//! route that covers part of the network and leaves through neither weft's
//! devices nor cni0 (a table without one falls through to the main table,
//! which is harmless: Tailscale's `lookup 52` is such a rule).

use ipnet::{IpNet, Ipv4Net};

use super::facts::Facts;
use super::{Finding, Severity};
use crate::netlink::{Route, Rule, RuleDo};

/// The main table, `local` and `default`.
const SYSTEM_TABLES: [u32; 3] = [253, 254, 255];
/// The main table's rule when none is found.
const MAIN_PREF: u32 = 32766;

fn overlaps(a: IpNet, b: Ipv4Net) -> bool {
    let b = IpNet::V4(b);
    a.contains(&b.network()) || b.contains(&a.network())
}

/// Whether `r` could match pod traffic of `network` ahead of the main rule.
fn matches_pods(r: &Rule, network: Ipv4Net) -> bool {
    !r.narrowed
        && r.src.is_none_or(|s| overlaps(s, network))
        && r.dst.is_none_or(|d| overlaps(d, network))
}

/// The routes of `table` that take part of the pod network away from weft.
fn stolen(f: &Facts, table: u32, network: Ipv4Net) -> Vec<&Route> {
    let ours: Vec<u32> = f
        .links
        .iter()
        .filter(|l| {
            l.name == "cni0"
                || f.daemon
                    .as_ref()
                    .is_ok_and(|st| st.backend.devices.iter().any(|d| d.name == l.name))
        })
        .map(|l| l.index)
        .collect();
    f.tables
        .get(&table)
        .map(|rs| {
            rs.iter()
                .filter(|r| overlaps(r.dst, network))
                .filter(|r| !r.oif.is_some_and(|o| ours.contains(&o)))
                .collect()
        })
        .unwrap_or_default()
}

/// The rules that take the pod network away from the main table.
pub fn policy_rules(f: &Facts) -> Vec<Finding> {
    let Some(network) = f
        .subnet_env
        .as_ref()
        .ok()
        .and_then(|e| e.as_ref())
        .and_then(|e| e.network)
    else {
        return Vec::new();
    };
    let main = f
        .rules
        .iter()
        .find(|r| r.action == RuleDo::Table(254))
        .map_or(MAIN_PREF, |r| r.priority);
    let mut out = Vec::new();
    for r in f.rules.iter().filter(|r| r.priority < main) {
        if !matches_pods(r, network) {
            continue;
        }
        let evidence = match r.action {
            RuleDo::Drop(_) => format!("ip rule: {r}"),
            RuleDo::Table(t) if !SYSTEM_TABLES.contains(&t) => {
                let routes = stolen(f, t, network);
                if routes.is_empty() {
                    continue;
                }
                let shown: Vec<String> = routes
                    .iter()
                    .map(|x| {
                        let dev = x
                            .oif
                            .and_then(|o| f.links.iter().find(|l| l.index == o))
                            .map_or(String::new(), |l| format!(" dev {}", l.name));
                        let via = x.gateway.map_or(String::new(), |g| format!(" via {g}"));
                        format!("{}{via}{dev}", x.dst)
                    })
                    .collect();
                format!("ip rule: {r}; table {t}: {}", shown.join(", "))
            }
            _ => continue,
        };
        out.push(Finding::new(
            "policy_rule_steals",
            Severity::Error,
            format!(
                "a policy-routing rule ahead of the main table (pref {}) takes pod traffic of {network} away from weft's routes",
                r.priority
            ),
            evidence,
            format!(
                "delete the rule (ip rule del pref {}) or keep the pod network on the main table ahead of it (ip rule add to {network} lookup main pref {}); find the tool that added it (a VPN client, a multi-homing script) so it does not come back",
                r.priority,
                r.priority.saturating_sub(1)
            ),
        ));
    }
    out
}
