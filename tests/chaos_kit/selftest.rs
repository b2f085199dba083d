//! The invariants can fail: each is fed a record that breaks it (no root,
//! no daemons). The sampler's convergence and subnet checks were broken on
//! purpose in a real run once (see README "Reliability").

use std::collections::BTreeMap;

use super::sample::Res;
use super::verdict::{BOUNDS, Run, judge};
use super::workload::{PodRef, Records, Req, StreamLog};
use super::{FaultRecord, Scope};

fn pods() -> Vec<PodRef> {
    (0..2)
        .map(|n| PodRef {
            cluster: 0,
            node: n,
            ns: String::new(),
            ip: String::new(),
        })
        .collect()
}

fn fault(start: f64, end: f64) -> FaultRecord {
    FaultRecord {
        kind: "sigkill",
        scope: Scope {
            cluster: 0,
            nodes: vec![1],
        },
        start,
        end,
        what: String::new(),
    }
}

fn stream(last_echo: f64) -> StreamLog {
    StreamLog {
        pods: (0, 1),
        last_echo,
        echoed: 10,
        ..StreamLog::default()
    }
}

fn judge_with(
    rec: &Records,
    faults: &[FaultRecord],
    res: &BTreeMap<(usize, usize, u32), Vec<Res>>,
    log: &str,
) -> Vec<String> {
    let pods = pods();
    let r = Run {
        faults,
        pods: &pods,
        rec,
        res,
        logs: vec![("etcd".into(), 0, log.into())],
        end: 100.0,
        from: 0.0,
    };
    judge(&r, BOUNDS).0
}

fn req(t: f64, ok: bool) -> Req {
    Req {
        from: 0,
        to: 1,
        t,
        end: t + if ok { 0.01 } else { 3.0 },
        ok,
        why: (!ok).then_some("connect"),
    }
}

#[test]
fn a_clean_record_passes() {
    let rec = Records {
        reqs: vec![req(10.0, true), req(8.0, false), req(99.0, true)],
        streams: vec![stream(99.5)],
        stalls: Vec::new(),
    };
    let v = judge_with(&rec, &[fault(11.0, 14.0)], &BTreeMap::new(), "info: ok");
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn each_invariant_can_fail() {
    // A failure long after the only fault's bound.
    let rec = Records {
        reqs: vec![req(50.0, false)],
        streams: vec![stream(99.5)],
        stalls: Vec::new(),
    };
    let v = judge_with(&rec, &[fault(11.0, 14.0)], &BTreeMap::new(), "");
    assert!(
        v.iter().any(|v| v.contains("with no fault touching")),
        "{v:?}"
    );
    // The same failure while this process did not run: still a violation,
    // with the stall named.
    let rec = Records {
        stalls: vec![(49.0, 4.0)],
        ..rec
    };
    let v = judge_with(&rec, &[fault(11.0, 14.0)], &BTreeMap::new(), "");
    assert!(
        v.iter()
            .any(|v| v.contains("with no fault touching") && v.contains("stalled 4.0 s at 49.0s")),
        "{v:?}"
    );
    // A stream that broke, and one that went silent.
    let mut s = stream(99.5);
    s.breaks
        .push((30.0, "read: Connection reset by peer".into()));
    let rec = Records {
        reqs: vec![],
        streams: vec![s, stream(20.0)],
        stalls: Vec::new(),
    };
    let v = judge_with(&rec, &[], &BTreeMap::new(), "");
    assert!(v.iter().any(|v| v.contains("broke")), "{v:?}");
    assert!(v.iter().any(|v| v.contains("silent")), "{v:?}");
    // A panic in a log.
    let rec = Records {
        reqs: vec![],
        streams: vec![],
        stalls: Vec::new(),
    };
    let v = judge_with(
        &rec,
        &[],
        &BTreeMap::new(),
        "thread 'main' panicked at control/src/x.rs:1:1",
    );
    assert!(v.iter().any(|v| v.contains("panicked")), "{v:?}");
    // A weftd that leaks fds.
    let samples: Vec<Res> = (0..200)
        .map(|i| Res {
            t: f64::from(i),
            rss_kib: 30_000,
            fds: 20 + u64::try_from(i).unwrap_or(0),
            threads: 8,
            dataplane: "userspace",
        })
        .collect();
    let res = BTreeMap::from([((0, 0, 42), samples)]);
    let v = judge_with(&rec, &[], &res, "");
    assert!(v.iter().any(|v| v.contains("grew")), "{v:?}");
    // A step at a live switch (more fds and threads on the engine) is not
    // growth: each dataplane's stretch is judged alone.
    let samples: Vec<Res> = (0..300)
        .map(|i| Res {
            t: f64::from(i),
            rss_kib: 30_000,
            fds: if i < 150 { 15 } else { 21 },
            threads: if i < 150 { 5 } else { 6 },
            dataplane: if i < 150 { "kernel" } else { "userspace" },
        })
        .collect();
    let res = BTreeMap::from([((0, 0, 42), samples)]);
    let v = judge_with(&rec, &[], &res, "");
    assert!(v.is_empty(), "{v:?}");
}

#[test]
fn each_fault_kind_excuses_only_its_own_window() {
    let kind = |k: &'static str, start: f64, end: f64, nodes: Vec<usize>| FaultRecord {
        kind: k,
        ..FaultRecord {
            scope: Scope { cluster: 0, nodes },
            ..fault(start, end)
        }
    };
    let failed = |t: f64| Records {
        reqs: vec![req(t, false)],
        streams: vec![stream(99.5)],
        stalls: Vec::new(),
    };
    let unexcused = |rec: &Records, faults: &[FaultRecord]| {
        judge_with(rec, faults, &BTreeMap::new(), "")
            .iter()
            .any(|v| v.contains("with no fault touching"))
    };
    // A SIGKILL (restart at 14 s) excuses a request that failed while the
    // node was down, not one that started 3 s after its recovery window.
    let kill = kind("sigkill", 11.0, 14.0, vec![1]);
    assert!(!unexcused(&failed(12.0), std::slice::from_ref(&kill)));
    assert!(unexcused(&failed(19.0), std::slice::from_ref(&kill)));
    // An etcd outage excuses nothing on its own ...
    let etcd = kind("etcd-kill", 10.0, 30.0, vec![0, 1]);
    assert!(unexcused(&failed(20.0), std::slice::from_ref(&etcd)));
    // ... but a node restarted during it waits for etcd, and is excused
    // until etcd is back and its own recovery time after that.
    assert!(!unexcused(&failed(28.0), &[kill.clone(), etcd.clone()]));
    assert!(unexcused(&failed(36.0), &[kill, etcd]));
    // A route deleted by hand: restored within a reconcile period.
    let route = kind("route-del", 40.0, 40.0, vec![1]);
    assert!(!unexcused(&failed(48.0), std::slice::from_ref(&route)));
    assert!(unexcused(&failed(55.0), &[route]));
}

#[test]
fn durations_parse() {
    use super::run::parse_duration;
    assert_eq!(parse_duration("1h"), Some(3600.0));
    assert_eq!(parse_duration("30m"), Some(1800.0));
    assert_eq!(parse_duration("90s"), Some(90.0));
    assert_eq!(parse_duration("45"), Some(45.0));
    assert_eq!(parse_duration("x"), None);
}

#[test]
fn two_nodes_on_one_subnet_are_caught() {
    use super::sample::shared_subnets;
    let ok = [
        (0, "10.244.1.0/24".to_string()),
        (1, "10.244.2.0/24".to_string()),
    ];
    assert!(shared_subnets(&ok).is_empty());
    let bad = [
        (0, "10.244.1.0/24".to_string()),
        (1, "10.244.1.0/24".to_string()),
    ];
    assert_eq!(
        shared_subnets(&bad),
        vec![(0, 1, "10.244.1.0/24".to_string())]
    );
}

#[test]
fn a_one_route_node_is_judged_by_its_engine_peers_and_its_network_route() {
    use super::rig::StoredLease;
    use super::sample::{EnginePeer, NodeView, node_problems};
    let lease = |key: &str, ip: Option<&str>| StoredLease {
        key: key.into(),
        public_ip: ip.map(str::to_string),
        vtep_mac: None,
    };
    let leases = [
        lease("10.244.1.0-24", Some("192.0.2.1")),
        lease("10.244.2.0-24", Some("192.0.2.2")),
        lease("10.244.70.0-24", Some("192.0.2.170")),
        lease("10.244.3.0-24", None), // garbage: not judged
    ];
    let fresh = |k: &str| k == "10.244.70.0-24";
    let peer = |subnet: &str, ip: &str, dev: &str| EnginePeer {
        subnet: subnet.into(),
        public_ip: ip.into(),
        device: dev.into(),
    };
    // A udp node (10.244.1.0/24) whose engine has every peer and whose
    // network route goes into flannel0: converged.
    let mut v = NodeView {
        own: "10.244.1.0/24".into(),
        dev: "flannel0".into(),
        engine: Some(vec![peer("10.244.2.0/24", "192.0.2.2", "flannel0")]),
        net_route: Some("10.244.0.0/16 dev flannel0 \n".into()),
        chains: Some(true),
        ..NodeView::default()
    };
    assert!(node_problems(0, &v, &leases, &fresh).is_empty());
    // The peer sent to the wrong endpoint, or on the wrong device.
    v.engine = Some(vec![peer("10.244.2.0/24", "192.0.2.9", "flannel0")]);
    let p = node_problems(0, &v, &leases, &fresh).join("; ");
    assert_eq!(
        p,
        "n0 engine peer 10.244.2.0/24 to 192.0.2.9 on flannel0, want 192.0.2.2 on flannel0"
    );
    v.engine = Some(vec![peer("10.244.2.0/24", "192.0.2.2", "flannel.1")]);
    assert!(!node_problems(0, &v, &leases, &fresh).is_empty());
    // The network route into another device.
    v.engine = Some(vec![peer("10.244.2.0/24", "192.0.2.2", "flannel0")]);
    v.net_route = Some("10.244.0.0/16 dev eth0 \n".into());
    let p = node_problems(0, &v, &leases, &fresh).join("; ");
    assert!(
        p.contains("no route for 10.244.0.0/16 into flannel0"),
        "{p}"
    );
    // The peer missing from the engine, a stale one in it, the route gone,
    // the chains flushed: each is reported.
    v.engine = Some(vec![peer("10.244.9.0/24", "192.0.2.9", "flannel0")]);
    v.net_route = Some(String::new());
    v.chains = Some(false);
    let p = node_problems(0, &v, &leases, &fresh).join("; ");
    assert!(
        p.contains(r#"n0 peers missing ["10.244.2.0/24"] extra ["10.244.9.0/24"]"#),
        "{p}"
    );
    assert!(p.contains("no route for 10.244.0.0/16"), "{p}");
    assert!(p.contains("iptables chains empty"), "{p}");
}

#[test]
fn a_vxlan_node_is_judged_by_gateway_device_and_vtep_mac() {
    use super::rig::StoredLease;
    use super::sample::{EnginePeer, NodeView, node_problems};
    let leases = [
        StoredLease {
            key: "10.244.1.0-24".into(),
            public_ip: Some("192.0.2.1".into()),
            vtep_mac: Some("02:00:00:00:00:01".into()),
        },
        StoredLease {
            key: "10.244.2.0-24".into(),
            public_ip: Some("192.0.2.2".into()),
            vtep_mac: Some("02:00:00:00:00:02".into()),
        },
    ];
    let fresh = |_: &str| false;
    // Kernel vxlan: flannel's onlink route, neighbour and fdb entry.
    let mut k = NodeView {
        own: "10.244.1.0/24".into(),
        dev: "flannel.1".into(),
        kernel: true,
        routes: vec!["10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink ".into()],
        fdb: Some("02:00:00:00:00:02 dst 192.0.2.2 self permanent\n".into()),
        neigh: Some("10.244.2.0 lladdr 02:00:00:00:00:02 PERMANENT\n".into()),
        ..NodeView::default()
    };
    assert!(node_problems(1, &k, &leases, &fresh).is_empty());
    // A wrong gateway, a wrong device, a stale VTEP MAC: each is caught.
    k.routes = vec!["10.244.2.0/24 via 10.244.9.0 dev flannel.1 onlink".into()];
    let p = node_problems(1, &k, &leases, &fresh).join("; ");
    assert!(p.contains("n1 route") && p.contains("want"), "{p}");
    k.routes = vec!["10.244.2.0/24 via 10.244.2.0 dev eth0 onlink".into()];
    assert!(!node_problems(1, &k, &leases, &fresh).is_empty());
    k.routes = vec!["10.244.2.0/24 via 10.244.2.0 dev flannel.1 onlink".into()];
    k.fdb = Some("02:00:00:00:00:99 dst 192.0.2.2 self permanent\n".into());
    k.neigh = Some("10.244.2.0 lladdr 02:00:00:00:00:99 PERMANENT\n".into());
    let p = node_problems(1, &k, &leases, &fresh).join("; ");
    assert_eq!(
        p,
        "n1 no fdb entry 02:00:00:00:00:02 dst 192.0.2.2; n1 no neighbour 10.244.2.0 lladdr 02:00:00:00:00:02"
    );
    // Userspace vxlan: a scope-link route into the TUN and an engine peer.
    let mut u = NodeView {
        own: "10.244.1.0/24".into(),
        dev: "flannel.1".into(),
        routes: vec!["10.244.2.0/24 dev flannel.1 scope link".into()],
        engine: Some(vec![EnginePeer {
            subnet: "10.244.2.0/24".into(),
            public_ip: "192.0.2.2".into(),
            device: "flannel.1".into(),
        }]),
        ..NodeView::default()
    };
    assert!(node_problems(0, &u, &leases, &fresh).is_empty());
    u.engine = Some(Vec::new());
    let p = node_problems(0, &u, &leases, &fresh).join("; ");
    assert_eq!(p, r#"n0 engine peers missing ["10.244.2.0/24"] extra []"#);
}
