//! Pure conversions between Node objects and leases (no I/O): podCIDR
//! parsing and checks, peer nodes as leases, and the annotations a daemon
//! writes on its own node, all as flannel does (fl:pkg/subnet/kube/kube.go
//! `AcquireLease`, `nodeToLease`, `CompleteLease`), plus weft's own
//! `weft-nat` annotation (the lease's `WeftNAT`, docs/nat.md): written
//! when the lease has the field, removed when not, read leniently (a value
//! weft cannot read is no field, never a skipped node).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use k8s_openapi::api::core::v1::{Node, NodeCondition};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};
use weft_compat::gonet::{self, go_ip6_string};

use super::{Annotations, KubeError};
use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs, NatAttrs};

/// A node's pod networks, one per family at most.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PodCidrs {
    /// The IPv4 podCIDR, masked.
    pub v4: Option<Ipv4Net>,
    /// The IPv6 podCIDR, masked.
    pub v6: Option<Ipv6Net>,
}

/// The node's annotations (empty when it has none).
pub fn annotations(node: &Node) -> &BTreeMap<String, String> {
    static EMPTY: BTreeMap<String, String> = BTreeMap::new();
    node.metadata.annotations.as_ref().unwrap_or(&EMPTY)
}

/// `metadata.name`, or `""`.
pub fn name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or("")
}

fn get<'a>(a: &'a BTreeMap<String, String>, key: &str) -> &'a str {
    a.get(key).map_or("", String::as_str)
}

/// Whether the node carries `kube-subnet-manager: "true"`.
pub fn is_managed(node: &Node, ann: &Annotations) -> bool {
    get(annotations(node), &ann.subnet_kube_managed) == "true"
}

/// `spec.podCIDRs` (1 or 2 entries), else `spec.podCIDR`, parsed as Go's
/// `net.ParseCIDR` does (the address is masked). `spec.podCIDR` empty is
/// flannel's `node "<name>" pod cidr not assigned`.
pub fn pod_cidrs(node: &Node) -> Result<PodCidrs, KubeError> {
    let name = name(node);
    let spec = node.spec.as_ref();
    let single = spec.and_then(|s| s.pod_cidr.as_deref()).unwrap_or("");
    if single.is_empty() {
        return Err(KubeError::Node(format!(
            "node {name:?} pod cidr not assigned"
        )));
    }
    let list: &[String] = spec.and_then(|s| s.pod_cidrs.as_deref()).unwrap_or(&[]);
    let texts: Vec<&str> = match list.len() {
        0 => vec![single],
        1 | 2 => list.iter().map(String::as_str).collect(),
        _ => {
            return Err(KubeError::Node(format!(
                "node {name:?} pod cidrs should be IPv4/IPv6 only or dualstack"
            )));
        }
    };
    let mut out = PodCidrs::default();
    for t in texts {
        match parse_cidr(t)? {
            IpNet::V4(n) => out.v4 = out.v4.or(Some(n)),
            IpNet::V6(n) => out.v6 = out.v6.or(Some(n)),
        }
    }
    Ok(out)
}

/// Go's `net.ParseCIDR` (network part) with its error text.
fn parse_cidr(s: &str) -> Result<IpNet, KubeError> {
    gonet::parse_cidr(s)
        .map(|(_, net)| net)
        .map_err(|e| KubeError::Node(e.to_string()))
}

/// A peer node as a lease (`nodeToLease`): `None` when the node is not
/// managed by flannel; an error when a needed annotation or podCIDR is
/// missing or malformed (the node is then skipped). `BackendData` is the
/// annotation text (`None` for `null`/empty), so it round-trips byte for byte.
pub fn node_to_lease(
    node: &Node,
    ann: &Annotations,
    v4: bool,
    v6: bool,
) -> Result<Option<Lease>, KubeError> {
    if !is_managed(node, ann) {
        return Ok(None);
    }
    let a = annotations(node);
    let cidrs = pod_cidrs(node)?;
    let name = name(node);
    let mut lease = Lease {
        subnet: None,
        ipv6_subnet: None,
        attrs: LeaseAttrs::default(),
        expiration: None,
    };
    if v4 {
        let ip = get(a, &ann.backend_public_ip);
        lease.attrs.public_ip = ip
            .parse()
            .map_err(|_| KubeError::Node(format!("invalid IP address {ip:?}")))?;
        lease.attrs.backend_data = raw_data(get(a, &ann.backend_data));
        lease.subnet = Some(
            cidrs
                .v4
                .ok_or_else(|| KubeError::Node(format!("node {name:?} has no IPv4 podCIDR")))?,
        );
    }
    if v6 {
        let ip = get(a, &ann.backend_public_ipv6);
        let parsed: Ipv6Addr = ip
            .parse()
            .map_err(|_| KubeError::Node(format!("invalid IPv6 address {ip:?}")))?;
        lease.attrs.public_ipv6 = Some(parsed);
        lease.attrs.backend_v6_data = raw_data(get(a, &ann.backend_v6_data));
        lease.ipv6_subnet = Some(
            cidrs
                .v6
                .ok_or_else(|| KubeError::Node(format!("node {name:?} has no IPv6 podCIDR")))?,
        );
    }
    lease.attrs.backend_type = get(a, &ann.backend_type).to_string();
    lease.attrs.weft_nat = weft_nat(node, ann).ok().flatten();
    lease.attrs.weft_gso = get(a, &ann.weft_gso) == "true";
    Ok(Some(lease))
}

/// The node's `WeftNAT` from weft's `weft-nat` annotation: `Ok(None)` when
/// absent or empty, `Err(value)` when the value is not a JSON object (the
/// caller logs it and treats it as absent). An object with an unreadable
/// endpoint is the field without an endpoint, as in a stored lease
/// ([`NatAttrs::from_value`]).
pub fn weft_nat(node: &Node, ann: &Annotations) -> Result<Option<NatAttrs>, String> {
    let v = get(annotations(node), &ann.weft_nat);
    if v.is_empty() {
        return Ok(None);
    }
    serde_json::from_str::<Value>(v)
        .ok()
        .as_ref()
        .and_then(NatAttrs::from_value)
        .map(Some)
        .ok_or_else(|| v.to_string())
}

/// The changes the own node's weft annotations (`weft-nat`, `weft-gso`)
/// need for `attrs`: annotation -> its new value, or `None` to remove it
/// (empty: they are right). flannel's own annotations are not among them.
pub fn weft_updates(
    current: &BTreeMap<String, String>,
    ann: &Annotations,
    attrs: &LeaseAttrs,
) -> BTreeMap<String, Option<String>> {
    let want = [
        (&ann.weft_nat, attrs.weft_nat.map(|n| n.to_json())),
        (&ann.weft_gso, attrs.weft_gso.then(|| "true".to_string())),
    ];
    want.into_iter()
        .filter(|(k, v)| current.get(*k) != v.as_ref())
        .map(|(k, v)| (k.clone(), v))
        .collect()
}

fn raw_data(text: &str) -> Option<String> {
    (!text.is_empty() && text != "null").then(|| text.to_string())
}

/// Go's `json.RawMessage.MarshalJSON` of optional backend data.
fn marshal_data(d: Option<&str>) -> &str {
    d.filter(|d| !d.is_empty()).unwrap_or("null")
}

/// The annotations `AcquireLease` writes on the own node, as the keys whose
/// value must change (empty: no patch). Follows flannel exactly: which
/// backends publish v4/v6 data, and `public-ip(v6)-overwrite` taking the
/// place of the detected address.
pub fn annotation_updates(
    current: &BTreeMap<String, String>,
    ann: &Annotations,
    attrs: &LeaseAttrs,
) -> BTreeMap<String, String> {
    let g = |k: &str| get(current, k);
    let bt = attrs.backend_type.as_str();
    let bd = marshal_data(attrs.backend_data.as_deref());
    let v6bd = marshal_data(attrs.backend_v6_data.as_deref());
    let ip = attrs.public_ip.to_string();
    let ip6 = attrs.public_ipv6.map(go_ip6_string);
    let overwrite = g(&ann.backend_public_ip_overwrite);
    let overwrite6 = g(&ann.backend_public_ipv6_overwrite);
    let differs_v4 = g(&ann.backend_data) != bd
        || g(&ann.backend_type) != bt
        || g(&ann.backend_public_ip) != ip
        || g(&ann.subnet_kube_managed) != "true"
        || (!overwrite.is_empty() && overwrite != ip);
    let differs_v6 = ip6.as_deref().is_some_and(|ip6| {
        g(&ann.backend_v6_data) != v6bd
            || g(&ann.backend_type) != bt
            || g(&ann.backend_public_ipv6) != ip6
            || g(&ann.subnet_kube_managed) != "true"
            || (!overwrite6.is_empty() && overwrite6 != ip6)
    });
    let mut want = BTreeMap::new();
    if differs_v4 || differs_v6 {
        want.insert(ann.backend_type.clone(), bt.to_string());
        // flannel: (vxlan && bd != "null") || (wireguard && bd != "null") || !vxlan
        if bt != "vxlan" || bd != "null" {
            want.insert(ann.backend_data.clone(), bd.to_string());
            let pip = if overwrite.is_empty() {
                ip
            } else {
                overwrite.to_string()
            };
            want.insert(ann.backend_public_ip.clone(), pip);
        }
        let has6 = ip6.is_some();
        if (bt == "vxlan" && v6bd != "null")
            || (bt == "wireguard" && v6bd != "null" && has6)
            || ((bt == "host-gw" || bt == "extension") && has6)
        {
            want.insert(ann.backend_v6_data.clone(), v6bd.to_string());
            // Go prints a nil *IP6 as "<nil>".
            let pip6 = if overwrite6.is_empty() {
                ip6.unwrap_or_else(|| "<nil>".into())
            } else {
                overwrite6.to_string()
            };
            want.insert(ann.backend_public_ipv6.clone(), pip6);
        }
        want.insert(ann.subnet_kube_managed.clone(), "true".to_string());
    }
    want.retain(|k, v| current.get(k) != Some(v));
    want
}

/// The strategic-merge patch flannel's `CreateTwoWayMergePatch` yields when
/// only annotations change.
pub fn annotation_patch(updates: &BTreeMap<String, String>) -> Value {
    json!({ "metadata": { "annotations": updates } })
}

/// [`annotation_patch`] plus weft's annotation changes ([`weft_updates`];
/// a strategic-merge patch removes a key given as `null`).
pub fn node_patch(
    updates: &BTreeMap<String, String>,
    weft: &BTreeMap<String, Option<String>>,
) -> Value {
    let mut p = annotation_patch(updates);
    for (k, v) in weft {
        p["metadata"]["annotations"][k.as_str()] = match v {
            Some(v) => Value::String(v.clone()),
            None => Value::Null,
        };
    }
    p
}

/// The own lease from the own node (`AcquireLease` after the patch): the
/// podCIDR(s) checked against the network config.
pub fn own_lease(node: &Node, cfg: &Config, attrs: &LeaseAttrs) -> Result<Lease, KubeError> {
    let name = name(node);
    let cidrs = pod_cidrs(node)?;
    let mut lease = Lease {
        subnet: None,
        ipv6_subnet: None,
        attrs: attrs.clone(),
        expiration: None,
    };
    if cfg.enable_ipv4 {
        let cidr = cidrs
            .v4
            .ok_or_else(|| KubeError::Node(format!("node {name:?} has no IPv4 podCIDR")))?;
        // Go: an unset Network is 0.0.0.0/0, which contains everything.
        let net = cfg
            .network
            .unwrap_or_else(|| Ipv4Net::new_assert(Ipv4Addr::UNSPECIFIED, 0));
        if !(net.prefix_len() <= cidr.prefix_len() && net.contains(&cidr.network())) {
            return Err(KubeError::Node(format!(
                "subnet {:?} specified in the flannel net config doesn't contain {:?} PodCIDR of the {name:?} node",
                net.to_string(),
                cidr.to_string()
            )));
        }
        lease.subnet = Some(cidr);
    }
    let dual = matches!(
        attrs.backend_type.as_str(),
        "vxlan" | "host-gw" | "wireguard"
    );
    if cfg.enable_ipv6 && dual {
        let cidr = cidrs
            .v6
            .ok_or_else(|| KubeError::Node(format!("node {name:?} has no IPv6 podCIDR")))?;
        let Some(net) = cfg.ipv6_network else {
            return Err(KubeError::Node(format!(
                "subnet {:?} specified in the PodCIDR, but doesn't exist in the flannel net config of the {name:?} node",
                cidr.to_string()
            )));
        };
        if !(net.prefix_len() <= cidr.prefix_len() && net.contains(&cidr.network())) {
            return Err(KubeError::Node(format!(
                "subnet {:?} specified in the flannel net config doesn't contain {:?} IPv6 PodCIDR of the {name:?} node",
                net.to_string(),
                cidr.to_string()
            )));
        }
        lease.ipv6_subnet = Some(cidr);
    }
    Ok(lease)
}

/// The user's `node-public-ip(v6)` annotations (they replace
/// `--public-ip(v6)`); unparsable values are reported and ignored.
pub fn stored_public_ips(node: &Node, ann: &Annotations) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
    let a = annotations(node);
    let parse = |key: &str| -> Option<IpAddr> {
        let v = get(a, key);
        if v.is_empty() {
            return None;
        }
        let ip = v.parse().ok();
        if ip.is_none() {
            tracing::warn!("ignoring annotation {key}={v:?}: not an IP address");
        }
        ip
    };
    let v4 = match parse(&ann.backend_node_public_ip) {
        Some(IpAddr::V4(ip)) => Some(ip),
        _ => None,
    };
    let v6 = match parse(&ann.backend_node_public_ipv6) {
        Some(IpAddr::V6(ip)) => Some(ip),
        _ => None,
    };
    (v4, v6)
}

/// flannel's `CompleteLease` status patch: `NetworkUnavailable=False`,
/// reason `FlannelIsUp`, both times `now`.
pub fn network_available_patch(now: Time) -> Value {
    let cond = NodeCondition {
        type_: "NetworkUnavailable".into(),
        status: "False".into(),
        reason: Some("FlannelIsUp".into()),
        message: Some("Flannel is running on this node".into()),
        last_transition_time: Some(now.clone()),
        last_heartbeat_time: Some(now),
    };
    json!({ "status": { "conditions": [cond] } })
}

/// The most unreachable peers a `WeftPeersReachable` message names.
pub const CONDITION_NAMES: usize = 10;

/// weft's own node condition from its overlay probes (docs/probes.md):
/// `WeftPeersReachable`, `True` (reason `AllPeersReachable`) or `False`
/// (reason `PeersUnreachable`, the first [`CONDITION_NAMES`] unreachable
/// peers named), both times `now`.
pub fn peers_reachable_patch(now: Time, unreachable: &[String]) -> Value {
    let (status, reason, message) = if unreachable.is_empty() {
        (
            "True",
            "AllPeersReachable",
            "weftd's overlay probes reach every peer".to_string(),
        )
    } else {
        let mut names = unreachable
            .iter()
            .take(CONDITION_NAMES)
            .cloned()
            .collect::<Vec<_>>()
            .join(", ");
        if unreachable.len() > CONDITION_NAMES {
            names.push_str(&format!(
                " and {} more",
                unreachable.len() - CONDITION_NAMES
            ));
        }
        (
            "False",
            "PeersUnreachable",
            format!(
                "weftd's overlay probes get no answer from: {names} (run weft doctor on this node)"
            ),
        )
    };
    let cond = NodeCondition {
        type_: "WeftPeersReachable".into(),
        status: status.into(),
        reason: Some(reason.into()),
        message: Some(message),
        last_transition_time: Some(now.clone()),
        last_heartbeat_time: Some(now),
    };
    json!({ "status": { "conditions": [cond] } })
}

#[cfg(test)]
#[path = "node_tests.rs"]
mod tests;
