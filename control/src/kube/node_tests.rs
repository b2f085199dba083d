use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::config::parse_config;
use crate::kube::annotations::DEFAULT_PREFIX;

const P: &str = "flannel.alpha.coreos.com/";

fn ann() -> Annotations {
    Annotations::new(DEFAULT_PREFIX).expect("prefix")
}

fn node(name: &str, cidrs: &[&str], annotations: &[(&str, &str)]) -> Node {
    let a: BTreeMap<String, String> = annotations
        .iter()
        .map(|(k, v)| (format!("{P}{k}"), v.to_string()))
        .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(a),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: cidrs.first().map(|s| s.to_string()),
            pod_cidrs: (!cidrs.is_empty()).then(|| cidrs.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        }),
        status: None,
    }
}

fn vxlan_attrs() -> LeaseAttrs {
    LeaseAttrs {
        public_ip: "192.0.2.1".parse().expect("ip"),
        backend_type: "vxlan".into(),
        backend_data: Some(r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#.into()),
        ..Default::default()
    }
}

#[test]
fn missing_pod_cidr_is_flannels_error() {
    let e = pod_cidrs(&node("n1", &[], &[])).expect_err("no cidr");
    assert_eq!(e.to_string(), r#"node "n1" pod cidr not assigned"#);
    let mut n = node("n1", &["10.244.1.0/24", "fd00::/64", "10.245.0.0/24"], &[]);
    let e = pod_cidrs(&n).expect_err("three");
    assert_eq!(
        e.to_string(),
        r#"node "n1" pod cidrs should be IPv4/IPv6 only or dualstack"#
    );
    n.spec.as_mut().expect("spec").pod_cidrs = None;
    n.spec.as_mut().expect("spec").pod_cidr = Some("10.244.1.7/24".into());
    assert_eq!(
        pod_cidrs(&n).expect("single").v4,
        Some("10.244.1.0/24".parse().expect("net")),
        "masked like Go"
    );
    n.spec.as_mut().expect("spec").pod_cidr = Some("10.244.1/24".into());
    assert_eq!(
        pod_cidrs(&n).expect_err("bad").to_string(),
        "invalid CIDR address: 10.244.1/24"
    );
}

#[test]
fn dual_stack_pod_cidrs() {
    let c = pod_cidrs(&node("n1", &["10.244.1.0/24", "fd00:1::/64"], &[])).expect("dual");
    assert_eq!(c.v4, Some("10.244.1.0/24".parse().expect("v4")));
    assert_eq!(c.v6, Some("fd00:1::/64".parse().expect("v6")));
}

/// The exact annotation bytes flanneld writes for a vxlan node.
#[test]
fn vxlan_annotations_are_flannels_bytes() {
    let n = node("n1", &["10.244.1.0/24"], &[]);
    let u = annotation_updates(annotations(&n), &ann(), &vxlan_attrs());
    let want: BTreeMap<String, String> = [
        ("backend-data", r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#),
        ("backend-type", "vxlan"),
        ("kube-subnet-manager", "true"),
        ("public-ip", "192.0.2.1"),
    ]
    .iter()
    .map(|(k, v)| (format!("{P}{k}"), v.to_string()))
    .collect();
    assert_eq!(u, want);
    let patch = annotation_patch(&u).to_string();
    assert_eq!(
        patch,
        r#"{"metadata":{"annotations":{"flannel.alpha.coreos.com/backend-data":"{\"VNI\":1,\"VtepMAC\":\"c6:d2:32:6f:8f:44\"}","flannel.alpha.coreos.com/backend-type":"vxlan","flannel.alpha.coreos.com/kube-subnet-manager":"true","flannel.alpha.coreos.com/public-ip":"192.0.2.1"}}}"#
    );
    // Already annotated: nothing to patch.
    let done: Vec<(&str, &str)> = u
        .iter()
        .map(|(k, v)| (k.strip_prefix(P).expect("prefix"), v.as_str()))
        .collect();
    let n2 = node("n1", &["10.244.1.0/24"], &done);
    assert!(annotation_updates(annotations(&n2), &ann(), &vxlan_attrs()).is_empty());
}

#[test]
fn udp_and_host_gw_publish_null_data() {
    let n = node("n1", &["10.244.1.0/24"], &[]);
    let udp = LeaseAttrs {
        public_ip: "192.0.2.1".parse().expect("ip"),
        ..Default::default()
    };
    let u = annotation_updates(annotations(&n), &ann(), &udp);
    assert_eq!(u[&format!("{P}backend-data")], "null");
    assert_eq!(u[&format!("{P}backend-type")], "");
    let hg = LeaseAttrs {
        backend_type: "host-gw".into(),
        public_ipv6: Some("2001:db8::1".parse().expect("v6")),
        ..udp
    };
    let u = annotation_updates(annotations(&n), &ann(), &hg);
    assert_eq!(u[&format!("{P}backend-v6-data")], "null");
    assert_eq!(u[&format!("{P}public-ipv6")], "2001:db8::1");
}

#[test]
fn public_ip_overwrite_is_published() {
    let n = node(
        "n1",
        &["10.244.1.0/24"],
        &[("public-ip-overwrite", "203.0.113.9")],
    );
    let u = annotation_updates(annotations(&n), &ann(), &vxlan_attrs());
    assert_eq!(u[&format!("{P}public-ip")], "203.0.113.9");
    let n = node(
        "n1",
        &["10.244.1.0/24"],
        &[
            ("node-public-ip", "198.51.100.4"),
            ("node-public-ipv6", "x"),
        ],
    );
    assert_eq!(
        stored_public_ips(&n, &ann()),
        (Some("198.51.100.4".parse().expect("ip")), None)
    );
}

#[test]
fn peer_nodes_become_leases() {
    let a = ann();
    let unmanaged = node("n2", &["10.244.2.0/24"], &[("public-ip", "192.0.2.2")]);
    assert_eq!(
        node_to_lease(&unmanaged, &a, true, false).expect("ok"),
        None
    );
    let data = r#"{"VNI":1,"VtepMAC":"aa:bb:cc:dd:ee:ff"}"#;
    let managed = node(
        "n2",
        &["10.244.2.0/24"],
        &[
            ("kube-subnet-manager", "true"),
            ("public-ip", "192.0.2.2"),
            ("backend-type", "vxlan"),
            ("backend-data", data),
        ],
    );
    let l = node_to_lease(&managed, &a, true, false)
        .expect("ok")
        .expect("lease");
    assert_eq!(l.subnet, Some("10.244.2.0/24".parse().expect("net")));
    assert_eq!(l.attrs.backend_data.as_deref(), Some(data));
    assert_eq!(l.attrs.public_ip.to_string(), "192.0.2.2");
    let bad_ip = node(
        "n3",
        &["10.244.3.0/24"],
        &[("kube-subnet-manager", "true"), ("public-ip", "nope")],
    );
    assert!(node_to_lease(&bad_ip, &a, true, false).is_err());
    let no_cidr = node(
        "n4",
        &[],
        &[("kube-subnet-manager", "true"), ("public-ip", "192.0.2.4")],
    );
    assert!(node_to_lease(&no_cidr, &a, true, false).is_err());
    let v4_only = node(
        "n5",
        &["10.244.5.0/24"],
        &[("kube-subnet-manager", "true"), ("public-ip", "192.0.2.5")],
    );
    assert!(
        node_to_lease(&v4_only, &a, true, true).is_err(),
        "v6 enabled needs public-ipv6"
    );
}

#[test]
fn own_lease_must_lie_in_network() {
    let cfg =
        parse_config(br#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#).expect("cfg");
    let ok = node("n1", &["10.244.1.0/24"], &[]);
    assert_eq!(
        own_lease(&ok, &cfg, &vxlan_attrs()).expect("lease").subnet,
        Some("10.244.1.0/24".parse().expect("n"))
    );
    let out = node("n1", &["10.245.1.0/24"], &[]);
    assert_eq!(
        own_lease(&out, &cfg, &vxlan_attrs())
            .expect_err("outside")
            .to_string(),
        r#"subnet "10.244.0.0/16" specified in the flannel net config doesn't contain "10.245.1.0/24" PodCIDR of the "n1" node"#
    );
    let cfg6 =
        parse_config(br#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00::/56","Backend":{"Type":"vxlan"}}"#)
            .expect("cfg6");
    let dual = node("n1", &["10.244.1.0/24", "fd00:0:0:1::/64"], &[]);
    assert!(
        own_lease(&dual, &cfg6, &vxlan_attrs())
            .expect("dual")
            .ipv6_subnet
            .is_some()
    );
    let out6 = node("n1", &["10.244.1.0/24", "fd01::/64"], &[]);
    assert_eq!(
        own_lease(&out6, &cfg6, &vxlan_attrs())
            .expect_err("v6 outside")
            .to_string(),
        r#"subnet "fd00::/56" specified in the flannel net config doesn't contain "fd01::/64" IPv6 PodCIDR of the "n1" node"#
    );
    let udp = LeaseAttrs {
        backend_type: String::new(),
        ..vxlan_attrs()
    };
    assert_eq!(
        own_lease(&dual, &cfg6, &udp).expect("udp").ipv6_subnet,
        None,
        "udp is IPv4 only"
    );
}

#[test]
fn network_available_condition() {
    let t = Time("2026-01-02T03:04:05Z".parse().expect("time"));
    let p = network_available_patch(t);
    let c = &p["status"]["conditions"][0];
    assert_eq!(c["type"], "NetworkUnavailable");
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "FlannelIsUp");
    assert_eq!(c["message"], "Flannel is running on this node");
    assert_eq!(c["lastHeartbeatTime"], "2026-01-02T03:04:05Z");
    assert_eq!(c["lastTransitionTime"], "2026-01-02T03:04:05Z");
}

#[test]
fn peers_reachable_condition() {
    let t = || Time("2026-01-02T03:04:05Z".parse().expect("time"));
    let p = peers_reachable_patch(t(), &[]);
    let c = &p["status"]["conditions"][0];
    assert_eq!(c["type"], "WeftPeersReachable");
    assert_eq!(c["status"], "True");
    assert_eq!(c["reason"], "AllPeersReachable");
    let lost: Vec<String> = (1..=12)
        .map(|i| format!("10.244.{i}.0/24 (192.0.2.{i})"))
        .collect();
    let p = peers_reachable_patch(t(), &lost[..2]);
    let c = &p["status"]["conditions"][0];
    assert_eq!(c["status"], "False");
    assert_eq!(c["reason"], "PeersUnreachable");
    let m = c["message"].as_str().expect("message");
    assert!(
        m.contains("10.244.1.0/24 (192.0.2.1), 10.244.2.0/24 (192.0.2.2)"),
        "{m}"
    );
    let p = peers_reachable_patch(t(), &lost);
    let m = p["status"]["conditions"][0]["message"]
        .as_str()
        .expect("message")
        .to_string();
    assert!(
        m.contains("192.0.2.10)") && !m.contains("192.0.2.11)") && m.contains("and 2 more"),
        "{m}"
    );
}

fn wg_attrs(nat: Option<&str>) -> LeaseAttrs {
    LeaseAttrs {
        public_ip: "10.12.0.2".parse().expect("ip"),
        backend_type: "wireguard".into(),
        backend_data: Some(r#"{"PublicKey":"k","Port":51820}"#.into()),
        weft_nat: nat.map(|e| crate::lease::NatAttrs {
            endpoint: e.parse().ok(),
            relay: None,
        }),
        ..Default::default()
    }
}

/// weft's `weft-nat` annotation: written with the lease's `WeftNAT` bytes
/// beside flannel's (which stay byte for byte), changed with the endpoint,
/// removed (`null` in the strategic-merge patch) when the feature is off.
#[test]
fn weft_nat_annotation_is_written_and_removed() {
    let a = ann();
    let key = format!("{P}weft-nat");
    let set = |v: &str| BTreeMap::from([(key.clone(), Some(v.to_string()))]);
    let bare = node("n2", &["10.244.2.0/24"], &[]);
    let on = wg_attrs(Some(""));
    let flannel = annotation_updates(annotations(&bare), &a, &on);
    assert!(!flannel.contains_key(&key), "flannel's set is unchanged");
    let weft = weft_updates(annotations(&bare), &a, &on);
    assert_eq!(weft, set("{}"));
    let p = node_patch(&flannel, &weft);
    assert_eq!(p["metadata"]["annotations"][&key], "{}");
    assert_eq!(
        p["metadata"]["annotations"][format!("{P}backend-type")],
        "wireguard"
    );
    // The endpoint learnt later changes the value, and only it.
    let seen = wg_attrs(Some("192.0.2.102:51820"));
    let with_empty = node("n2", &["10.244.2.0/24"], &[("weft-nat", "{}")]);
    let weft = weft_updates(annotations(&with_empty), &a, &seen);
    assert_eq!(weft, set(r#"{"Endpoint":"192.0.2.102:51820"}"#));
    assert_eq!(
        node_patch(&BTreeMap::new(), &weft).to_string(),
        r#"{"metadata":{"annotations":{"flannel.alpha.coreos.com/weft-nat":"{\"Endpoint\":\"192.0.2.102:51820\"}"}}}"#
    );
    let current = node(
        "n2",
        &["10.244.2.0/24"],
        &[("weft-nat", r#"{"Endpoint":"192.0.2.102:51820"}"#)],
    );
    assert!(weft_updates(annotations(&current), &a, &seen).is_empty());
    // Feature off: removed; never written on a node that has none.
    let off = wg_attrs(None);
    let weft = weft_updates(annotations(&current), &a, &off);
    assert_eq!(weft, BTreeMap::from([(key.clone(), None)]));
    assert_eq!(
        node_patch(&BTreeMap::new(), &weft).to_string(),
        r#"{"metadata":{"annotations":{"flannel.alpha.coreos.com/weft-nat":null}}}"#
    );
    assert!(weft_updates(annotations(&bare), &a, &off).is_empty());
    assert_eq!(
        annotation_patch(&flannel),
        node_patch(&flannel, &BTreeMap::new()),
        "no weft change: flannel's patch exactly"
    );
}

/// `weft-gso`: "true" while the lease has `WeftGSO`, removed when it has
/// not; a peer's reads as `WeftGSO` only when it is exactly "true".
#[test]
fn weft_gso_annotation_is_written_removed_and_read() {
    let a = ann();
    let key = format!("{P}weft-gso");
    let mut udp = LeaseAttrs {
        public_ip: "10.12.0.2".parse().expect("ip"),
        weft_gso: true,
        ..Default::default()
    };
    let bare = node("n2", &["10.244.2.0/24"], &[]);
    let weft = weft_updates(annotations(&bare), &a, &udp);
    assert_eq!(weft, BTreeMap::from([(key.clone(), Some("true".into()))]));
    let with = node("n2", &["10.244.2.0/24"], &[("weft-gso", "true")]);
    assert!(weft_updates(annotations(&with), &a, &udp).is_empty());
    udp.weft_gso = false;
    let weft = weft_updates(annotations(&with), &a, &udp);
    assert_eq!(weft, BTreeMap::from([(key, None)]));
    assert!(weft_updates(annotations(&bare), &a, &udp).is_empty());
    for (v, want) in [("true", true), ("True", false), ("1", false), ("", false)] {
        let mut list = vec![("kube-subnet-manager", "true"), ("public-ip", "10.12.0.3")];
        if !v.is_empty() {
            list.push(("weft-gso", v));
        }
        let n = node("n3", &["10.244.3.0/24"], &list);
        let l = node_to_lease(&n, &a, true, false)
            .expect("lease")
            .expect("managed");
        assert_eq!(l.attrs.weft_gso, want, "{v:?}");
    }
}

/// A peer's `weft-nat` becomes its lease's `WeftNAT`; a value weft cannot
/// read is no field, never a skipped node.
#[test]
fn weft_nat_annotation_is_read_leniently() {
    let a = ann();
    let peer = |nat: Option<&str>| {
        let mut list = vec![
            ("kube-subnet-manager", "true"),
            ("public-ip", "10.12.0.2"),
            ("backend-type", "wireguard"),
            ("backend-data", r#"{"PublicKey":"k","Port":51820}"#),
        ];
        list.extend(nat.map(|v| ("weft-nat", v)));
        node("n2", &["10.244.2.0/24"], &list)
    };
    let lease = |n: &Node| {
        node_to_lease(n, &a, true, false)
            .expect("a good lease")
            .expect("managed")
    };
    let n = peer(Some(r#"{"Endpoint":"192.0.2.102:51820"}"#));
    assert_eq!(
        lease(&n).attrs.weft_nat.and_then(|x| x.endpoint),
        Some("192.0.2.102:51820".parse().expect("addr"))
    );
    assert_eq!(weft_nat(&peer(None), &a), Ok(None));
    assert_eq!(lease(&peer(None)).attrs.weft_nat, None);
    for bad in ["nope", "[1]", "null", "7", r#"{"Endpoint""#] {
        let n = peer(Some(bad));
        assert_eq!(weft_nat(&n, &a), Err(bad.to_string()), "{bad}");
        let l = lease(&n);
        assert_eq!(l.attrs.weft_nat, None, "{bad}");
        assert_eq!(l.attrs.public_ip.to_string(), "10.12.0.2");
    }
    // An object with an unreadable endpoint is the field without one.
    let odd = lease(&peer(Some(r#"{"Endpoint":"x"}"#)));
    assert_eq!(odd.attrs.weft_nat, Some(crate::lease::NatAttrs::default()));
}
