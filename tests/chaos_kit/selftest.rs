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
        })
        .collect();
    let res = BTreeMap::from([((0, 0, 42), samples)]);
    let v = judge_with(&rec, &[], &res, "");
    assert!(v.iter().any(|v| v.contains("grew")), "{v:?}");
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
    use super::sample::{NodeView, node_problems};
    let lease = |key: &str, ip: Option<&str>| StoredLease {
        key: key.into(),
        public_ip: ip.map(str::to_string),
    };
    let leases = [
        lease("10.244.1.0-24", Some("192.0.2.1")),
        lease("10.244.2.0-24", Some("192.0.2.2")),
        lease("10.244.70.0-24", Some("192.0.2.170")),
        lease("10.244.3.0-24", None), // garbage: not judged
    ];
    let fresh = |k: &str| k == "10.244.70.0-24";
    // A udp node (10.244.1.0/24) whose engine has every peer and whose
    // network route goes into flannel0: converged.
    let mut v = NodeView {
        own: "10.244.1.0/24".into(),
        addr: "192.0.2.1".into(),
        have: vec!["10.244.2.0/24".into()],
        net_route: Some("10.244.0.0/16 dev flannel0 \n".into()),
        chains: Some(true),
        fdb: None,
    };
    assert!(node_problems(0, &v, &leases, &fresh).is_empty());
    // The peer missing from the engine, a stale one in it, the route gone,
    // the chains flushed: each is reported.
    v.have = vec!["10.244.9.0/24".into()];
    v.net_route = Some(String::new());
    v.chains = Some(false);
    let p = node_problems(0, &v, &leases, &fresh).join("; ");
    assert!(
        p.contains(r#"n0 peers missing ["10.244.2.0/24"] extra ["10.244.9.0/24"]"#),
        "{p}"
    );
    assert!(p.contains("no route for 10.244.0.0/16"), "{p}");
    assert!(p.contains("iptables chains empty"), "{p}");
    // A kernel vxlan node without an fdb entry for a remote lease.
    let k = NodeView {
        own: "10.244.1.0/24".into(),
        addr: "192.0.2.1".into(),
        have: vec!["10.244.2.0/24".into()],
        fdb: Some("aa:bb:cc:dd:ee:ff dst 192.0.2.9 self permanent\n".into()),
        ..NodeView::default()
    };
    let p = node_problems(1, &k, &leases, &fresh).join("; ");
    assert_eq!(p, "n1 no fdb entry for 192.0.2.2", "{p}");
}
