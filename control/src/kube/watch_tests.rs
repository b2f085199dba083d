use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, NodeSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::*;
use crate::kube::annotations::DEFAULT_PREFIX;

fn node(name: &str, cidr: &str, ip: &str, ty: &str) -> Node {
    let p = "flannel.alpha.coreos.com/";
    let a: BTreeMap<String, String> = [
        ("kube-subnet-manager", "true"),
        ("public-ip", ip),
        ("backend-type", ty),
    ]
    .iter()
    .map(|(k, v)| (format!("{p}{k}"), v.to_string()))
    .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(a),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(cidr.into()),
            ..Default::default()
        }),
        status: None,
    }
}

fn state() -> State {
    State::new(
        Annotations::new(DEFAULT_PREFIX).expect("prefix"),
        "me".into(),
        true,
        false,
    )
}

fn keys(evs: &[LeaseEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| match e {
            LeaseEvent::Snapshot(all) => format!(
                "snap:{}",
                all.iter()
                    .map(|l| l.key().to_string())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            LeaseEvent::Added(l) => format!("add:{}", l.key()),
            LeaseEvent::Removed(l) => format!("rm:{}", l.key()),
        })
        .collect()
}

#[test]
fn list_then_changes() {
    let mut s = state();
    s.init();
    s.init_apply(node("a", "10.244.1.0/24", "192.0.2.1", "vxlan"));
    s.init_apply(node("me", "10.244.9.0/24", "192.0.2.9", "vxlan"));
    assert_eq!(keys(&s.init_done()), ["snap:10.244.1.0-24"]);
    assert!(s.own_node.is_some(), "own node cached, never reported");
    assert_eq!(
        keys(&s.apply(node("b", "10.244.2.0/24", "192.0.2.2", "vxlan"))),
        ["add:10.244.2.0-24"]
    );
    // An unchanged update (a status heartbeat) is not an event.
    assert!(
        s.apply(node("b", "10.244.2.0/24", "192.0.2.2", "vxlan"))
            .is_empty()
    );
    assert_eq!(
        keys(&s.apply(node("b", "10.244.2.0/24", "192.0.2.3", "vxlan"))),
        ["add:10.244.2.0-24"]
    );
    assert_eq!(
        keys(&s.apply(node("b", "10.244.4.0/24", "192.0.2.3", "vxlan"))),
        ["rm:10.244.2.0-24", "add:10.244.4.0-24"]
    );
    assert_eq!(
        keys(&s.delete(&node("b", "10.244.4.0/24", "192.0.2.3", "vxlan"))),
        ["rm:10.244.4.0-24"]
    );
    assert!(
        s.delete(&node("me", "10.244.9.0/24", "192.0.2.9", "vxlan"))
            .is_empty()
    );
}

#[test]
fn other_backend_types_are_invisible_and_own_lease_is_in_snapshots() {
    let mut s = state();
    s.init();
    s.init_apply(node("me", "10.244.9.0/24", "192.0.2.9", "vxlan"));
    s.init_done();
    let mut own = node::node_to_lease(
        &node("me", "10.244.9.0/24", "192.0.2.9", "vxlan"),
        &s.ann,
        true,
        false,
    )
    .expect("ok")
    .expect("lease");
    own.attrs.backend_type = "vxlan".into();
    s.own_lease = Some(own);
    let mut rx = s.subscribe(4);
    match rx.try_recv() {
        Ok(LeaseEvent::Snapshot(all)) => assert_eq!(all.len(), 1, "own lease in the snapshot"),
        other => panic!("first event must be a snapshot, got {other:?}"),
    }
    assert!(
        s.apply(node("h", "10.244.3.0/24", "192.0.2.3", "host-gw"))
            .is_empty()
    );
    assert_eq!(
        keys(&s.apply(node("h", "10.244.3.0/24", "192.0.2.3", "vxlan"))),
        ["add:10.244.3.0-24"]
    );
    assert_eq!(
        keys(&s.apply(node("h", "10.244.3.0/24", "192.0.2.3", "host-gw"))),
        ["rm:10.244.3.0-24"]
    );
    // A relist that lost a node reports it through the snapshot.
    s.apply(node("x", "10.244.5.0/24", "192.0.2.5", "vxlan"));
    s.init();
    s.init_apply(node("me", "10.244.9.0/24", "192.0.2.9", "vxlan"));
    assert_eq!(keys(&s.init_done()), ["snap:10.244.9.0-24"]);
}

#[test]
fn broken_nodes_are_skipped() {
    let mut s = state();
    let mut n = node("b", "10.244.2.0/24", "not-an-ip", "vxlan");
    assert!(s.apply(n.clone()).is_empty());
    n.spec = None;
    assert!(s.apply(n).is_empty());
}

/// A peer's `weft-nat` change is a lease change (its endpoint moved); a bad
/// value is no field, logged once per value, never a lost peer.
#[test]
fn weft_nat_changes_are_events_and_bad_values_are_logged_once() {
    let mut s = state();
    let key = "flannel.alpha.coreos.com/weft-nat";
    let with = |v: &str| {
        let mut n = node("b", "10.244.2.0/24", "192.0.2.2", "wireguard");
        if let Some(a) = n.metadata.annotations.as_mut() {
            a.insert(key.into(), v.into());
        }
        n
    };
    assert_eq!(
        keys(&s.apply(node("b", "10.244.2.0/24", "192.0.2.2", "wireguard"))),
        ["add:10.244.2.0-24"]
    );
    let evs = s.apply(with(r#"{"Endpoint":"192.0.2.102:51820"}"#));
    match evs.as_slice() {
        [LeaseEvent::Added(l)] => assert_eq!(
            l.attrs.weft_nat.and_then(|n| n.endpoint),
            Some("192.0.2.102:51820".parse().expect("addr"))
        ),
        other => panic!("want one Added, got {other:?}"),
    }
    let evs = s.apply(with("garbage"));
    match evs.as_slice() {
        [LeaseEvent::Added(l)] => assert_eq!(l.attrs.weft_nat, None, "bad value: no field"),
        other => panic!("want one Added, got {other:?}"),
    }
    assert_eq!(s.bad_nat.get("b").map(String::as_str), Some("garbage"));
    assert!(s.apply(with("garbage")).is_empty(), "same node, no change");
    s.apply(with("{}"));
    assert!(s.bad_nat.is_empty(), "a good value clears the record");
}
