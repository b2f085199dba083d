//! One row per fault: the fact it breaks and the finding it must give.
use weft_compat::subnet_env::SubnetEnv;

use super::super::facts::{Facts, L2Entry};
use super::super::{Severity, checks};
use super::{healthy, ip, link, route, status_mut};

type Row = (&'static str, fn(&mut Facts), &'static str, Severity);

const ROWS: &[Row] = &[
    (
        "not root",
        |f| {
            f.daemon =
                Err("connect /run/flannel/weft-status.sock: Permission denied (os error 13)".into())
        },
        "not_root",
        Severity::Error,
    ),
    (
        "netlink unreadable",
        |f| f.netlink_error = Some("ip link show: EPERM".into()),
        "netlink_unreadable",
        Severity::Warning,
    ),
    (
        "weftd down",
        |f| f.daemon = Err("connection refused".into()),
        "weftd_down",
        Severity::Error,
    ),
    (
        "ip_forward off",
        |f| f.ip_forward = Some(0),
        "ip_forward_off",
        Severity::Error,
    ),
    (
        "br_netfilter not loaded",
        |f| f.bridge_nf_call_iptables = None,
        "br_netfilter_missing",
        Severity::Error,
    ),
    (
        "bridge-nf-call-iptables 0",
        |f| f.bridge_nf_call_iptables = Some(0),
        "bridge_nf_call_iptables_off",
        Severity::Error,
    ),
    (
        "Docker's FORWARD DROP without weft's rules",
        |f| {
            f.forward = Ok(vec![
                "-P FORWARD DROP".into(),
                "-A FORWARD -j DOCKER-USER".into(),
            ])
        },
        "forward_drop",
        Severity::Error,
    ),
    (
        "an nftables-only firewall whose forward chain drops (no iptables)",
        |f| {
            f.forward = Err("cannot run iptables: No such file or directory".into());
            f.nft = Ok(serde_json::json!({"nftables": [
                {"chain": {"family": "inet", "table": "filter", "name": "forward",
                    "type": "filter", "hook": "forward", "prio": 0, "policy": "drop"}},
                {"rule": {"family": "inet", "table": "filter", "chain": "forward",
                    "expr": [{"match": {"op": "in", "left": {"ct": {"key": "state"}},
                        "right": "established"}}, {"accept": null}]}}]}))
        },
        "nft_forward_drop",
        Severity::Error,
    ),
    (
        "an unconditional drop before weft's jump",
        |f| {
            f.forward
                .as_mut()
                .expect("test fixture")
                .insert(1, "-A FORWARD -m comment --comment \"x y\" -j DROP".into())
        },
        "forward_drop",
        Severity::Error,
    ),
    (
        "iptables missing",
        |f| f.forward = Err("cannot run iptables".into()),
        "forward_unchecked",
        Severity::Info,
    ),
    (
        "rp_filter strict",
        |f| {
            f.rp_filter.insert("all".into(), 1);
        },
        "rp_filter_strict",
        Severity::Warning,
    ),
    (
        "subnet.env missing",
        |f| f.subnet_env = Ok(None),
        "subnet_env_missing",
        Severity::Error,
    ),
    (
        "subnet.env edited",
        |f| {
            f.subnet_env = Ok(Some(SubnetEnv::parse(
                "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.9.1/24\n",
            )))
        },
        "subnet_env_mismatch",
        Severity::Error,
    ),
    (
        "subnet.env unreadable",
        |f| f.subnet_env = Err("EACCES".into()),
        "subnet_env_unreadable",
        Severity::Error,
    ),
    (
        "no CNI conf dir",
        |f| f.cni.confs = None,
        "cni_conf_missing",
        Severity::Error,
    ),
    (
        "empty CNI conf dir",
        |f| f.cni.confs = Some(Vec::new()),
        "cni_conf_missing",
        Severity::Error,
    ),
    (
        "a broken CNI conf only",
        |f| f.cni.confs = Some(vec![("10-flannel.conflist".into(), Err("EOF".into()))]),
        "cni_conf_missing",
        Severity::Error,
    ),
    (
        "another CNI conf sorts first",
        |f| {
            f.cni.confs.as_mut().expect("test fixture").insert(
                0,
                (
                    "05-cilium.conf".into(),
                    Ok(serde_json::json!({"type": "cilium-cni"})),
                ),
            )
        },
        "cni_conf_shadowed",
        Severity::Error,
    ),
    (
        "bridge plugin missing",
        |f| {
            f.cni.bins.as_mut().expect("test fixture").remove("bridge");
        },
        "cni_plugin_missing",
        Severity::Error,
    ),
    (
        "flannel plugin missing",
        |f| {
            f.cni.bins.as_mut().expect("test fixture").remove("flannel");
        },
        "cni_plugin_missing",
        Severity::Error,
    ),
    (
        "no CNI bin dir",
        |f| f.cni.bins = None,
        "cni_plugin_missing",
        Severity::Error,
    ),
    (
        "overlay device gone",
        |f| f.links.retain(|l| l.name != "flannel.1"),
        "device_missing",
        Severity::Error,
    ),
    (
        "overlay device down",
        |f| f.links[3].up = false,
        "device_down",
        Severity::Error,
    ),
    (
        "peer route deleted",
        |f| f.routes.retain(|r| r.oif != Some(4)),
        "route_missing",
        Severity::Error,
    ),
    (
        "peer route to elsewhere",
        |f| f.routes[3] = route("10.244.2.0/24", Some("192.0.2.254"), Some(2)),
        "route_missing",
        Severity::Error,
    ),
    (
        "peer route blackholed",
        |f| f.routes[3] = route("10.244.2.0/24", None, None),
        "route_missing",
        Severity::Error,
    ),
    (
        "neighbour deleted",
        |f| f.neighs.clear(),
        "neigh_missing",
        Severity::Error,
    ),
    (
        "fdb deleted",
        |f| f.fdbs.clear(),
        "fdb_missing",
        Severity::Error,
    ),
    (
        "fdb with a wrong VTEP",
        |f| f.fdbs[0].ip = ip("192.0.2.99"),
        "fdb_stale",
        Severity::Error,
    ),
    (
        "fdb of a gone node",
        |f| {
            f.fdbs.push(L2Entry {
                dev: "flannel.1".into(),
                ip: ip("192.0.2.7"),
                mac: [0x0a, 0, 0, 0, 0, 7],
            })
        },
        "fdb_stale",
        Severity::Warning,
    ),
    (
        "public IP on no interface",
        |f| {
            status_mut(f)
                .lease
                .as_mut()
                .expect("test fixture")
                .public_ip = "203.0.113.9".into()
        },
        "public_ip_not_local",
        Severity::Warning,
    ),
    (
        "a second interface",
        |f| {
            f.links.push(link(5, "eth1", ""));
            f.addrs
                .push((5, "198.51.100.1/24".parse().expect("test fixture")));
        },
        "multi_homed",
        Severity::Info,
    ),
    (
        "the peer is reached through another interface",
        |f| {
            f.links.push(link(5, "eth1", ""));
            f.routes.push(route("192.0.2.2/32", None, Some(5)));
        },
        "wrong_iface",
        Severity::Error,
    ),
    (
        "a peer lost",
        |f| {
            status_mut(f).peers[0].probe = Some(crate::view::ProbeStatus {
                reachable: Some(false),
                rtt_us: Some(400),
                losses: 3,
                sent: 9,
                received: 6,
                pmtu: None,
            })
        },
        "peer_unreachable",
        Severity::Error,
    ),
    (
        "a path smaller than the overlay MTU",
        |f| {
            status_mut(f).peers[0].probe = Some(crate::view::ProbeStatus {
                reachable: Some(true),
                rtt_us: Some(400),
                losses: 0,
                sent: 9,
                received: 9,
                pmtu: Some(1350),
            })
        },
        "path_mtu_low",
        Severity::Error,
    ),
    (
        "UDP datagrams dropped for bad checksums",
        |f| f.udp_csum_errors = Some(5),
        "udp_checksum_errors",
        Severity::Warning,
    ),
    (
        "the vxlan device's checksum offload off",
        |f| f.tx_csum_off = vec!["flannel.1".into()],
        "vxlan_tx_csum_off",
        Severity::Info,
    ),
];

#[test]
fn each_broken_fact_gives_its_finding() {
    for (name, breaks, id, sev) in ROWS {
        let mut f = healthy();
        breaks(&mut f);
        let found = checks::run(&f);
        assert!(
            found.iter().any(|x| x.id == *id && x.severity == *sev),
            "{name}: expected {id} ({sev:?}), found {found:#?}"
        );
        for x in &found {
            assert!(
                !x.message.is_empty() && !x.evidence.is_empty(),
                "{name}: {x:?}"
            );
            assert!(
                x.severity == Severity::Info || !x.fix.is_empty(),
                "{name}: {x:?}"
            );
        }
    }
}
