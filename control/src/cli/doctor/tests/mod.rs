//! `weft doctor`'s judgement, table-driven: a healthy node's facts give no
//! finding; each row breaks one fact and expects its finding by id.

use std::collections::BTreeMap;
use std::net::IpAddr;

use weft_compat::subnet_env::SubnetEnv;

use super::facts::{CniFacts, Facts, L2Entry, LinkFact};
use super::{Severity, checks};
use crate::netlink::Route;

const M2: [u8; 6] = [0x0a, 0, 0, 0, 0, 2];

fn link(index: u32, name: &str, kind: &str) -> LinkFact {
    LinkFact {
        index,
        name: name.into(),
        up: true,
        mtu: 1500,
        kind: kind.into(),
    }
}

fn route(dst: &str, gw: Option<&str>, oif: Option<u32>) -> Route {
    Route {
        dst: dst.parse().expect("test fixture"),
        gateway: gw.map(|g| g.parse().expect("test fixture")),
        oif,
        onlink: false,
        scope_link: false,
    }
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("test fixture")
}

/// A healthy kernel-vxlan node 192.0.2.1 (10.244.1.0/24) with one peer,
/// 192.0.2.2 (10.244.2.0/24).
fn healthy() -> Facts {
    let status = serde_json::json!({
        "version": "0", "pid": 7,
        "lease": {"subnet": "10.244.1.0/24", "ipv6_subnet": null, "public_ip": "192.0.2.1",
                  "public_ipv6": null, "backend_type": "vxlan", "expires": null},
        "backend": {"name": "vxlan", "dataplane": "kernel", "requested": "kernel",
            "devices": [{"name": "flannel.1", "kind": "kernel", "workers": null, "offloads": null,
                "counters": {"tx_packets": 0, "tx_bytes": 0, "rx_packets": 0, "rx_bytes": 0}}]},
        "peers": [{"subnet": "10.244.2.0/24", "ipv6_subnet": null, "public_ip": "192.0.2.2",
                   "public_ipv6": null, "backend_type": "vxlan", "device": null, "counters": null}]
    });
    Facts {
        ip_forward: Some(1),
        bridge_nf_call_iptables: Some(1),
        rp_filter: BTreeMap::from([
            ("all".into(), 0),
            ("eth0".into(), 0),
            ("flannel.1".into(), 0),
        ]),
        links: vec![
            link(1, "lo", ""),
            link(2, "eth0", ""),
            link(3, "cni0", "bridge"),
            link(4, "flannel.1", "vxlan"),
        ],
        addrs: vec![
            (1, "127.0.0.1/8".parse().expect("test fixture")),
            (2, "192.0.2.1/24".parse().expect("test fixture")),
            (3, "10.244.1.1/24".parse().expect("test fixture")),
            (4, "10.244.1.0/32".parse().expect("test fixture")),
        ],
        routes: vec![
            route("0.0.0.0/0", Some("192.0.2.254"), Some(2)),
            route("192.0.2.0/24", None, Some(2)),
            route("10.244.1.0/24", None, Some(3)),
            route("10.244.2.0/24", Some("10.244.2.0"), Some(4)),
        ],
        rules: Vec::new(),
        tables: BTreeMap::new(),
        neighs: vec![L2Entry {
            dev: "flannel.1".into(),
            ip: ip("10.244.2.0"),
            mac: M2,
        }],
        fdbs: vec![L2Entry {
            dev: "flannel.1".into(),
            ip: ip("192.0.2.2"),
            mac: M2,
        }],
        netlink_error: None,
        forward: Ok(vec![
            "-P FORWARD ACCEPT".into(),
            "-A FORWARD -m comment --comment \"flanneld forward\" -j FLANNEL-FWD".into(),
        ]),
        nft: Err("nft not installed".into()),
        subnet_file: "/run/flannel/subnet.env".into(),
        subnet_env: Ok(Some(SubnetEnv::parse(
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
        ))),
        cni: CniFacts {
            conf_dir: "/etc/cni/net.d".into(),
            confs: Some(vec![(
                "10-flannel.conflist".into(),
                Ok(serde_json::json!({"name": "cbr0", "plugins": [
                    {"type": "flannel", "delegate": {"hairpinMode": true}},
                    {"type": "portmap"}]})),
            )]),
            bin_dir: "/opt/cni/bin".into(),
            bins: Some(
                ["flannel", "bridge", "host-local", "portmap"]
                    .map(String::from)
                    .into(),
            ),
        },
        now: 1_764_547_200,
        clock_synced: Ok(true),
        daemon: Ok(serde_json::from_value(status).expect("test fixture")),
        udp_csum_errors: Some(0),
        tx_csum_off: Vec::new(),
        tunnel_uplink: None,
    }
}

fn status_mut(f: &mut Facts) -> &mut crate::status::model::Status {
    f.daemon.as_mut().expect("test fixture")
}

#[test]
fn a_healthy_node_has_no_finding() {
    let found = checks::run(&healthy());
    assert!(found.is_empty(), "{found:#?}");
}

mod gso;
mod policy;
mod rows;
mod wg;

#[test]
fn strict_rp_filter_with_an_asymmetric_path_is_an_error() {
    let mut f = healthy();
    f.rp_filter.insert("eth0".into(), 1);
    f.links.push(link(5, "eth1", ""));
    f.routes.push(route("192.0.2.2/32", None, Some(5)));
    let found = checks::run(&f);
    assert!(
        found
            .iter()
            .any(|x| x.id == "rp_filter_strict" && x.severity == Severity::Error),
        "{found:#?}"
    );
    // Loose (2) is fine.
    f.rp_filter.insert("eth0".into(), 2);
    assert!(!checks::run(&f).iter().any(|x| x.id == "rp_filter_strict"));
}

#[test]
fn forward_policy_drop_with_weft_rules_is_fine() {
    let mut f = healthy();
    f.forward.as_mut().expect("test fixture")[0] = "-P FORWARD DROP".into();
    // A conditional drop (Docker's isolation) is not a finding either.
    f.forward
        .as_mut()
        .expect("test fixture")
        .insert(1, "-A FORWARD -i docker0 ! -o docker0 -j DROP".into());
    assert!(checks::run(&f).is_empty());
}

#[test]
fn without_weftd_only_the_host_checks_report() {
    let mut f = healthy();
    f.daemon = Err("no socket".into());
    let found = checks::run(&f);
    assert_eq!(
        found.iter().map(|x| x.id).collect::<Vec<_>>(),
        ["weftd_down"]
    );
}

#[test]
fn routed_cni_mode_needs_no_delegate() {
    let mut f = healthy();
    f.cni.confs = Some(vec![(
        "10-flannel.conf".into(),
        Ok(serde_json::json!({"type": "flannel", "mode": "routed"})),
    )]);
    f.cni.bins = Some(["flannel".to_string()].into());
    assert!(checks::run(&f).is_empty());
}

#[test]
fn errors_sort_first() {
    let mut f = healthy();
    f.links.push(link(5, "eth1", ""));
    f.addrs
        .push((5, "198.51.100.1/24".parse().expect("test fixture")));
    f.ip_forward = Some(0);
    let found = checks::run(&f);
    assert_eq!(found[0].id, "ip_forward_off");
    assert_eq!(found.last().expect("test fixture").severity, Severity::Info);
}

#[test]
fn a_path_as_large_as_the_overlay_mtu_is_fine() {
    let mut f = healthy();
    status_mut(&mut f).peers[0].probe = Some(crate::view::ProbeStatus {
        reachable: Some(true),
        rtt_us: Some(300),
        losses: 0,
        sent: 3,
        received: 3,
        pmtu: Some(1450),
    });
    assert!(checks::run(&f).is_empty());
}

#[test]
fn skipped_checks_report_nothing() {
    let mut f = healthy();
    f.ip_forward = Some(0);
    f.cni.confs = None;
    let ids = |skip: &[&str]| {
        let skip: Vec<String> = skip.iter().map(|s| s.to_string()).collect();
        checks::run_except(&f, &skip)
            .into_iter()
            .map(|x| x.id)
            .collect::<Vec<_>>()
    };
    assert_eq!(ids(&[]), ["ip_forward_off", "cni_conf_missing"]);
    assert_eq!(ids(&["cni"]), ["ip_forward_off"]);
    assert!(ids(&["cni", "ip_forward"]).is_empty());
}
