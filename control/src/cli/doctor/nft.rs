//! nftables base chains on the forward hook (`nft -j list ruleset`), for
//! hosts whose firewall is nftables itself (firewalld's nftables backend,
//! `/etc/nftables.conf`), which `iptables -S FORWARD` does not show.
//!
//! In nftables a packet passes a hook only if every base chain on it
//! accepts it: weft's accept (in its own table or in iptables' `FORWARD`)
//! does not help against another table's chain whose policy is drop. A
//! chain drops the pod network when, walking its rules in order, it meets
//! an unconditional `drop`/`reject`, or its end with `policy drop`, before
//! a rule that accepts traffic of the pod network (an `accept` matching
//! `ip saddr`/`ip daddr` within or around it, `iifname`/`oifname` of cni0
//! or one of weft's devices, or everything). `ct state established accept`
//! does not count (new flows are still dropped). A `jump`/`goto` ends the
//! walk without a finding (what the target does is not followed), so the
//! check never reports what it cannot see. iptables-nft's own `ip filter
//! FORWARD` is left to the iptables check when that could read it.

use ipnet::{IpNet, Ipv4Net};
use serde_json::Value;

use super::facts::Facts;
use super::{Finding, Severity};

/// How a chain's walk ended.
#[derive(Debug, PartialEq, Eq)]
enum Walk {
    /// A rule accepts pod traffic (or the policy is accept).
    Accepts,
    /// Dropped: the rule (or `policy drop`) that does it.
    Drops(String),
    /// A jump or goto: not followed.
    Unknown,
}

fn overlaps(s: &str, network: Ipv4Net) -> bool {
    let net = s
        .parse::<IpNet>()
        .or_else(|_| s.parse::<std::net::IpAddr>().map(IpNet::from));
    match net {
        Ok(n) => {
            let w = IpNet::V4(network);
            n.contains(&w.network()) || w.contains(&n.network())
        }
        Err(_) => false,
    }
}

/// The values of a match's right side (one, a set, a prefix as `a/len`).
fn values(v: &Value) -> Vec<String> {
    match v {
        Value::String(s) => vec![s.clone()],
        Value::Array(a) => a.iter().flat_map(values).collect(),
        Value::Object(o) => {
            if let Some(p) = o.get("prefix") {
                let addr = p["addr"].as_str().unwrap_or("");
                vec![format!("{addr}/{}", p["len"].as_u64().unwrap_or(32))]
            } else if let Some(s) = o.get("set") {
                values(s)
            } else {
                Vec::new()
            }
        }
        _ => Vec::new(),
    }
}

/// Whether one `match` expression selects pod traffic.
fn selects_pods(m: &Value, network: Ipv4Net, devs: &[String]) -> bool {
    if m["op"] != "==" && m["op"] != "in" {
        return false;
    }
    let left = &m["left"];
    let vals = values(&m["right"]);
    if left["payload"]["protocol"] == "ip"
        && (left["payload"]["field"] == "saddr" || left["payload"]["field"] == "daddr")
    {
        return vals.iter().any(|v| overlaps(v, network));
    }
    if left["meta"]["key"] == "iifname" || left["meta"]["key"] == "oifname" {
        return vals.iter().any(|v| devs.contains(v));
    }
    false
}

/// Walks one base chain's rules (`expr` lists, in order) and its policy.
fn walk(rules: &[&Value], policy: &str, network: Ipv4Net, devs: &[String]) -> Walk {
    for expr in rules {
        let Some(exprs) = expr.as_array() else {
            continue;
        };
        let matches: Vec<&Value> = exprs.iter().filter_map(|e| e.get("match")).collect();
        let verdict = |k: &str| exprs.iter().any(|e| e.get(k).is_some());
        if verdict("jump") || verdict("goto") {
            return Walk::Unknown;
        }
        if verdict("accept")
            && (matches.is_empty() || matches.iter().any(|m| selects_pods(m, network, devs)))
        {
            return Walk::Accepts;
        }
        if matches.is_empty() && (verdict("drop") || verdict("reject")) {
            return Walk::Drops(format!("an unconditional {}", expr_verdict(exprs)));
        }
    }
    if policy == "drop" {
        Walk::Drops("policy drop".into())
    } else {
        Walk::Accepts
    }
}

fn expr_verdict(exprs: &[Value]) -> &'static str {
    if exprs.iter().any(|e| e.get("reject").is_some()) {
        "reject"
    } else {
        "drop"
    }
}

/// Forward-hook base chains that drop the pod network.
pub fn nft_forward(f: &Facts) -> Vec<Finding> {
    let (Ok(ruleset), Some(network)) = (
        &f.nft,
        f.subnet_env
            .as_ref()
            .ok()
            .and_then(|e| e.as_ref())
            .and_then(|e| e.network),
    ) else {
        return Vec::new();
    };
    let mut devs = vec!["cni0".to_string()];
    if let Ok(st) = &f.daemon {
        devs.extend(st.backend.devices.iter().map(|d| d.name.clone()));
    }
    let items: Vec<&Value> = ruleset["nftables"]
        .as_array()
        .map(|a| a.iter().collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for c in items.iter().filter_map(|i| i.get("chain")) {
        let (family, table, name) = (
            c["family"].as_str().unwrap_or(""),
            c["table"].as_str().unwrap_or(""),
            c["name"].as_str().unwrap_or(""),
        );
        if c["hook"] != "forward" || !matches!(family, "ip" | "inet") {
            continue;
        }
        if family == "ip" && table == "filter" && name == "FORWARD" && f.forward.is_ok() {
            continue;
        }
        let rules: Vec<&Value> = items
            .iter()
            .filter_map(|i| i.get("rule"))
            .filter(|r| r["family"] == family && r["table"] == table && r["chain"] == name)
            .map(|r| &r["expr"])
            .collect();
        let policy = c["policy"].as_str().unwrap_or("accept");
        if let Walk::Drops(what) = walk(&rules, policy, network, &devs) {
            out.push(Finding::new(
                "nft_forward_drop",
                Severity::Error,
                format!(
                    "the nftables chain {family} {table} {name} (hook forward) drops forwarded traffic and nothing in it accepts the pod network {network}: pod traffic to and from other nodes is dropped (every base chain on a hook must accept a packet; weft's accept elsewhere does not help)"
                ),
                format!(
                    "nft list chain {family} {table} {name}: {what} after {} rule(s), none accepting {network}",
                    rules.len()
                ),
                format!(
                    "accept the pod network in that chain ahead of its drop (nft insert rule {family} {table} {name} ip saddr {network} accept; and the same with ip daddr), or in the firewall's own configuration (firewalld: add {network} to the trusted zone)"
                ),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net() -> Ipv4Net {
        "10.244.0.0/16".parse().expect("test fixture")
    }

    fn run(rules: Value, policy: &str) -> Walk {
        let rules: Vec<&Value> = rules.as_array().expect("array").iter().collect();
        walk(&rules, policy, net(), &["cni0".into(), "flannel.1".into()])
    }

    fn m(left: Value, right: Value) -> Value {
        serde_json::json!({"match": {"op": "==", "left": left, "right": right}})
    }

    #[test]
    fn a_drop_policy_without_a_pod_accept_drops() {
        let est = serde_json::json!([{"match": {"op": "in", "left": {"ct": {"key": "state"}}, "right": "established"}}, {"accept": null}]);
        assert_eq!(
            run(serde_json::json!([est]), "drop"),
            Walk::Drops("policy drop".into())
        );
        let reject = serde_json::json!([{"counter": {"packets": 0, "bytes": 0}}, {"reject": null}]);
        assert_eq!(
            run(serde_json::json!([reject]), "accept"),
            Walk::Drops("an unconditional reject".into())
        );
    }

    #[test]
    fn an_accept_of_the_pod_network_or_its_devices_passes() {
        let saddr = serde_json::json!({"payload": {"protocol": "ip", "field": "saddr"}});
        let iif = serde_json::json!({"meta": {"key": "iifname"}});
        let by_prefix = serde_json::json!([m(saddr.clone(), serde_json::json!({"prefix": {"addr": "10.0.0.0", "len": 8}})), {"accept": null}]);
        let by_dev = serde_json::json!([m(iif, serde_json::json!({"set": ["eth9", "flannel.1"]})), {"accept": null}]);
        let other = serde_json::json!([m(saddr, serde_json::json!("192.0.2.7")), {"accept": null}]);
        assert_eq!(run(serde_json::json!([by_prefix]), "drop"), Walk::Accepts);
        assert_eq!(run(serde_json::json!([by_dev]), "drop"), Walk::Accepts);
        assert_eq!(
            run(serde_json::json!([other]), "drop"),
            Walk::Drops("policy drop".into())
        );
        assert_eq!(run(serde_json::json!([]), "accept"), Walk::Accepts);
    }

    #[test]
    fn a_jump_is_not_followed() {
        let jump = serde_json::json!([{"jump": {"target": "fw2"}}]);
        assert_eq!(run(serde_json::json!([jump]), "drop"), Walk::Unknown);
    }
}
