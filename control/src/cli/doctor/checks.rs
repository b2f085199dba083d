//! The checks of `weft doctor`: pure functions over [`Facts`], in the order
//! they are reported. This file holds the host's checks (forwarding, the
//! bridge's netfilter hook, the FORWARD chain, the CNI config, weftd's
//! socket and subnet file); [`super::overlay`] those of the overlay itself.

use super::facts::Facts;
use super::{Finding, Severity};
use super::{csum, gso, nft, overlay, peers, policy, wg};
use crate::traffic::rules::FWD_CHAIN;

/// A check: its name and its judgement.
pub type Check = fn(&Facts) -> Vec<Finding>;

/// Every check, by name, in report order.
pub const CHECKS: &[(&str, Check)] = &[
    ("weftd", weftd),
    ("ip_forward", ip_forward),
    ("br_netfilter", br_netfilter),
    ("forward_chain", forward_chain),
    ("nft_forward", nft::nft_forward),
    ("subnet_env", subnet_env),
    ("cni", cni),
    ("devices", overlay::devices),
    ("peer_routes", overlay::peer_routes),
    ("policy_rules", policy::policy_rules),
    ("vxlan_l2", overlay::vxlan_l2),
    ("interface", overlay::interface),
    ("rp_filter", overlay::rp_filter),
    ("peers", peers::peers),
    ("wg_handshakes", wg::handshakes),
    ("path_mtu", peers::path_mtu),
    ("checksums", csum::checksums),
    ("tunnel_gso", gso::tunnel_gso),
];

/// Runs every check: errors first, then warnings, then notes (stable within each).
pub fn run(f: &Facts) -> Vec<Finding> {
    run_except(f, &[])
}

/// [`run`] without the checks named in `skip`.
pub fn run_except(f: &Facts, skip: &[String]) -> Vec<Finding> {
    let mut out: Vec<Finding> = CHECKS
        .iter()
        .filter(|(n, _)| !skip.iter().any(|s| s == n))
        .flat_map(|(_, c)| c(f))
        .collect();
    out.sort_by_key(|x| x.severity);
    out
}

fn weftd(f: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(e) = &f.netlink_error {
        out.push(Finding::new(
            "netlink_unreadable",
            Severity::Warning,
            "links, addresses and routes could not be read: the overlay checks were skipped",
            e.clone(),
            "run weft doctor as root on the node (in the host's network namespace)",
        ));
    }
    match &f.daemon {
        Ok(_) => out,
        Err(e) if e.contains("ermission denied") => {
            out.push(Finding::new(
                "not_root",
                Severity::Error,
                "weftd's status socket is root-only: without it the overlay checks cannot run",
                e.clone(),
                "run weft doctor as root (sudo weft doctor)",
            ));
            out
        }
        Err(e) => {
            out.push(Finding::new(
            "weftd_down",
            Severity::Error,
            "weftd is not running (its status socket does not answer): no lease is renewed and no peer change is programmed",
            e.clone(),
            format!(
                "start weftd with --subnet-file={} (systemctl start weftd, or see the DaemonSet's pod log); the checks that need it were skipped",
                f.subnet_file.display()
            ),
            ));
            out
        }
    }
}

fn ip_forward(f: &Facts) -> Vec<Finding> {
    match f.ip_forward {
        Some(0) => vec![Finding::new(
            "ip_forward_off",
            Severity::Error,
            "IPv4 forwarding is off: the node does not forward pod traffic between its pods and the overlay",
            "/proc/sys/net/ipv4/ip_forward = 0",
            "sysctl -w net.ipv4.ip_forward=1, and keep it in /etc/sysctl.d/ (e.g. 99-weft.conf: net.ipv4.ip_forward = 1)",
        )],
        _ => Vec::new(),
    }
}

/// Whether the node's pods hang on the CNI bridge.
fn bridge_in_use(f: &Facts) -> bool {
    f.links
        .iter()
        .any(|l| l.name == "cni0" && l.kind == "bridge")
}

fn br_netfilter(f: &Facts) -> Vec<Finding> {
    if !bridge_in_use(f) {
        return Vec::new();
    }
    match f.bridge_nf_call_iptables {
        None => vec![Finding::new(
            "br_netfilter_missing",
            Severity::Error,
            "the br_netfilter module is not loaded: traffic between pods on the bridge cni0 bypasses iptables, so Service replies are not un-NATed",
            "cni0 is a bridge; /proc/sys/net/bridge/bridge-nf-call-iptables does not exist",
            "modprobe br_netfilter, and keep it in /etc/modules-load.d/ (e.g. br_netfilter.conf)",
        )],
        Some(0) => vec![Finding::new(
            "bridge_nf_call_iptables_off",
            Severity::Error,
            "bridged pod traffic is not passed to iptables: Services between pods of one node fail",
            "cni0 is a bridge; net.bridge.bridge-nf-call-iptables = 0",
            "sysctl -w net.bridge.bridge-nf-call-iptables=1, and keep it in /etc/sysctl.d/",
        )],
        Some(_) => Vec::new(),
    }
}

/// A rule's words without `-A CHAIN` and `-m comment --comment ...`.
fn rule_body(line: &str) -> String {
    let mut rest = line.trim();
    if let Some(r) = rest.strip_prefix("-A FORWARD") {
        rest = r.trim_start();
    }
    let mut out = String::new();
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix("-m comment --comment ") {
            let r = r.trim_start();
            rest = match r.strip_prefix('"') {
                Some(q) => q.split_once('"').map_or("", |(_, after)| after),
                None => r.split_once(' ').map_or("", |(_, after)| after),
            }
            .trim_start();
            continue;
        }
        let (word, after) = rest.split_once(' ').unwrap_or((rest, ""));
        if !out.is_empty() {
            out.push(' ');
        }
        out.push_str(word);
        rest = after.trim_start();
    }
    out
}

fn forward_chain(f: &Facts) -> Vec<Finding> {
    let lines = match &f.forward {
        Ok(l) => l,
        Err(e) => {
            return vec![Finding::new(
                "forward_unchecked",
                Severity::Info,
                "the FORWARD chain was not checked",
                e.clone(),
                "",
            )];
        }
    };
    let policy_drop = lines.iter().any(|l| l.trim() == "-P FORWARD DROP");
    let rules: Vec<&String> = lines
        .iter()
        .filter(|l| l.starts_with("-A FORWARD"))
        .collect();
    let jump = rules
        .iter()
        .position(|l| rule_body(l) == format!("-j {FWD_CHAIN}"));
    let drop = rules.iter().position(|l| {
        let b = rule_body(l);
        b == "-j DROP" || b.starts_with("-j REJECT")
    });
    let evidence = lines.join("; ");
    match (jump, drop) {
        (_, Some(d)) if jump.is_none_or(|j| d < j) => vec![Finding::new(
            "forward_drop",
            Severity::Error,
            "a rule in the FORWARD chain drops all forwarded traffic before weft's accept rules: pod traffic to and from other nodes is dropped",
            evidence,
            format!(
                "delete the rule (iptables -D FORWARD {}) or have what added it insert it after weft's jump to {FWD_CHAIN}",
                rule_body(rules[d])
            ),
        )],
        (None, _) if policy_drop => vec![Finding::new(
            "forward_drop",
            Severity::Error,
            "the FORWARD chain's policy is DROP (Docker sets it) and weft's accept rules are not in it: pod traffic to and from other nodes is dropped",
            evidence,
            format!(
                "let weftd manage host rules (--traffic-manager=auto, it adds -j {FWD_CHAIN}), or iptables -I FORWARD -s <network> -j ACCEPT and -d <network> -j ACCEPT"
            ),
        )],
        _ => Vec::new(),
    }
}

fn subnet_env(f: &Facts) -> Vec<Finding> {
    let path = f.subnet_file.display();
    let lease = f
        .daemon
        .as_ref()
        .ok()
        .and_then(|st| st.lease.as_ref())
        .and_then(|l| l.subnet.clone());
    match (&f.subnet_env, lease) {
        (Err(e), _) => vec![Finding::new(
            "subnet_env_unreadable",
            Severity::Error,
            "the subnet file cannot be read: the CNI plugin cannot give pods addresses",
            format!("{path}: {e}"),
            "restart weftd, which writes it again",
        )],
        (Ok(None), Some(lease)) => vec![Finding::new(
            "subnet_env_missing",
            Severity::Error,
            "weftd holds a lease but the subnet file is missing: the CNI plugin cannot give pods addresses",
            format!("{path} does not exist; weftd's lease is {lease}"),
            "restart weftd, which writes it again (and check that nothing deletes it)",
        )],
        (Ok(Some(env)), Some(lease)) => {
            let file = env.subnet.map(|s| s.trunc().to_string());
            if file.as_deref() == Some(lease.as_str()) {
                return Vec::new();
            }
            vec![Finding::new(
                "subnet_env_mismatch",
                Severity::Error,
                "the subnet file disagrees with the lease weftd holds: new pods get addresses another node routes",
                format!(
                    "{path}: FLANNEL_SUBNET={}; weftd's lease: {lease}",
                    env.subnet.map_or("(none)".to_string(), |s| s.to_string())
                ),
                "restart weftd, which writes the file from its lease; pods created since the file changed need to be recreated",
            )]
        }
        _ => Vec::new(),
    }
}

/// The plugin types of one CNI config (`.conf`: its type; `.conflist`: each plugin's).
fn conf_types(v: &serde_json::Value) -> Vec<String> {
    let plugins = match v.get("plugins").and_then(|p| p.as_array()) {
        Some(p) => p.iter().collect(),
        None => vec![v],
    };
    plugins
        .iter()
        .filter_map(|p| p.get("type").and_then(|t| t.as_str()))
        .map(str::to_string)
        .collect()
}

/// The plugins a conf needs: its own, and flannel's delegate and IPAM.
fn needed_plugins(v: &serde_json::Value) -> Vec<String> {
    let mut out = conf_types(v);
    let flannel = match v.get("plugins").and_then(|p| p.as_array()) {
        Some(p) => p.iter().find(|p| p["type"] == "flannel").cloned(),
        None => Some(v.clone()).filter(|v| v["type"] == "flannel"),
    };
    if let Some(fl) = flannel
        && fl["mode"] != "routed"
    {
        let delegate = fl["delegate"]["type"].as_str().unwrap_or("bridge");
        out.push(delegate.to_string());
        let ipam = fl["ipam"]["type"].as_str().unwrap_or("host-local");
        out.push(ipam.to_string());
    }
    out.sort();
    out.dedup();
    out
}

fn cni(f: &Facts) -> Vec<Finding> {
    let c = &f.cni;
    let dir = c.conf_dir.display();
    let missing = |evidence: String| {
        vec![Finding::new(
            "cni_conf_missing",
            Severity::Error,
            "no CNI config for weft: the kubelet cannot start pods with networking",
            evidence,
            format!(
                "install weft's CNI config in {dir} (the DaemonSet's install-conf does; e.g. 10-flannel.conflist with plugins flannel and portmap)"
            ),
        )]
    };
    let Some(confs) = &c.confs else {
        return missing(format!("{dir} cannot be read"));
    };
    let Some((name, conf)) = confs
        .iter()
        .find_map(|(n, v)| v.as_ref().ok().map(|v| (n, v)))
    else {
        return missing(format!(
            "{dir} holds no valid .conf, .conflist or .json file"
        ));
    };
    if !conf_types(conf).iter().any(|t| t == "flannel") {
        let ours = confs.iter().find(|(_, v)| {
            v.as_ref()
                .is_ok_and(|v| conf_types(v).iter().any(|t| t == "flannel"))
        });
        return match ours {
            Some((o, _)) => vec![Finding::new(
                "cni_conf_shadowed",
                Severity::Error,
                "another CNI config sorts before weft's: the kubelet uses it, not weft",
                format!("{dir}: {name} (first) is not flannel; weft's is {o}"),
                format!(
                    "remove {name}, or rename weft's config so it sorts first (e.g. 00-flannel.conflist)"
                ),
            )],
            None => missing(format!(
                "{dir}: no config has a plugin of type flannel (first: {name})"
            )),
        };
    }
    let Some(bins) = &c.bins else {
        return vec![Finding::new(
            "cni_plugin_missing",
            Severity::Error,
            "the CNI plugin directory cannot be read: pods cannot be started",
            format!("{} cannot be read", c.bin_dir.display()),
            "install the CNI plugins (flannel, bridge, host-local, portmap) there",
        )];
    };
    let absent: Vec<String> = needed_plugins(conf)
        .into_iter()
        .filter(|p| !bins.contains(p))
        .collect();
    if absent.is_empty() {
        return Vec::new();
    }
    vec![Finding::new(
        "cni_plugin_missing",
        Severity::Error,
        format!(
            "CNI plugin(s) {} missing: pods cannot be started",
            absent.join(", ")
        ),
        format!(
            "{name} needs them; {} has no executable of that name",
            c.bin_dir.display()
        ),
        format!(
            "install them into {} (flannel from weft's image; bridge, host-local, portmap from containernetworking/plugins)",
            c.bin_dir.display()
        ),
    )]
}
