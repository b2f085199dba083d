//! IPv6 in weftd, in guests on Debian's stock kernel (tests/support/vm.rs)
//! whose underlay also has `fd00::<i>/64`: vxlan (kernel and userspace
//! nodes mixed), host-gw and WireGuard (kernel and userspace mixed), each
//! with an IPv6-only network (`EnableIPv4: false`) and with dual stack.
//! Per case: the v6 lease in etcd (its key, `PublicIPv6`, `BackendV6Data`),
//! the v6 lines of subnet.env, the devices and v6 routes each dataplane
//! programs, flannel's v6 firewall rules (iptables or, with
//! `EnableNFTables`, nftables; `--ip-masq`), and pods that ping6 and carry
//! TCP over IPv6 across the nodes (and IPv4 too in dual stack).
//!
//! The IPv6-only cases also prove the lease key of an IPv6-only node
//! (`0.0.0.0-0&<v6>-64`) reads back as no IPv4 subnet: weftd once took its
//! own lease for revoked there and exited at once.
//!
//! The Kubernetes side of IPv6 (v6 podCIDRs, the `public-ipv6` and
//! `backend-v6-data` node annotations) runs against a real kube-apiserver in
//! tests/kube.rs (`dual_stack_nodes_publish_flannels_ipv6_annotations`).

use std::time::Instant;

use weft_tests::vm::net as guests;
use weft_tests::vm::{LabSpec, Node};

const NET6: &str = "fd00:10:244::/56";
const NET4: &str = "10.244.0.0/16";

#[derive(Clone, Copy, PartialEq, Eq)]
enum Stack {
    V6Only,
    Dual,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Fw {
    Iptables,
    Nftables,
}

struct Case {
    tag: &'static str,
    /// The `Backend` object.
    backend: &'static str,
    stack: Stack,
    fw: Fw,
    /// `--dataplane` per node.
    dataplanes: [&'static str; 2],
}

fn conf(c: &Case) -> String {
    let fam = match c.stack {
        Stack::V6Only => r#""EnableIPv4":false,"EnableIPv6":true"#.to_string(),
        Stack::Dual => format!(r#""Network":"{NET4}","EnableIPv6":true"#),
    };
    let nft = if c.fw == Fw::Nftables {
        r#","EnableNFTables":true"#
    } else {
        ""
    };
    format!(
        r#"{{{fam},"IPv6Network":"{NET6}"{nft},"Backend":{}}}"#,
        c.backend
    )
}

/// The node's IPv6 subnet from subnet.env, as a network (`...::/64`).
fn subnet6(net: &guests::Net, i: usize) -> String {
    net.env(i, "FLANNEL_IPV6_SUBNET").replace("::1/", "::/")
}

/// v6 routes of node `i` into the v6 pod network.
fn routes6(n: &Node) -> Vec<String> {
    guests::routes(n, true)
        .into_iter()
        .filter(|r| r.starts_with("fd00:10:244:"))
        .collect()
}

/// flannel's v6 (and in dual stack v4) rules are in place, and in an
/// IPv6-only network no v4 rules.
fn check_rules(c: &Case, net: &guests::Net, i: usize) {
    let n = net.node(i);
    let sn6 = subnet6(net, i);
    match c.fw {
        Fw::Iptables => {
            let fwd = n.ok("ip6tables -t filter -S FLANNEL-FWD");
            for want in [
                format!(
                    "-A FLANNEL-FWD -s {NET6} -m comment --comment \"flanneld forward\" -j ACCEPT"
                ),
                format!(
                    "-A FLANNEL-FWD -d {NET6} -m comment --comment \"flanneld forward\" -j ACCEPT"
                ),
            ] {
                assert!(fwd.contains(&want), "node {i}: {want:?} missing:\n{fwd}");
            }
            let nat = n.ok("ip6tables -t nat -S FLANNEL-POSTRTG");
            let want = format!(
                "-A FLANNEL-POSTRTG -s {sn6} -d {NET6} -m comment --comment \"flanneld masq\" -j RETURN"
            );
            assert!(nat.contains(&want), "node {i}: {want:?} missing:\n{nat}");
            assert!(
                nat.contains(&format!("-s {NET6} ! -d ff00::/8")) && nat.contains("-j MASQUERADE"),
                "node {i}: no v6 masquerade:\n{nat}"
            );
            let jump = n.ok("ip6tables -t nat -S POSTROUTING");
            assert!(jump.contains("-j FLANNEL-POSTRTG"), "node {i}: {jump}");
            let v4 = n.sh("iptables -t nat -S FLANNEL-POSTRTG");
            match c.stack {
                Stack::V6Only => assert!(
                    !v4.success() || !v4.stdout.contains("10.244."),
                    "node {i}: v4 masq rules in an IPv6-only network: {v4}"
                ),
                Stack::Dual => assert!(
                    v4.success() && v4.stdout.contains(&format!("-d {NET4}")),
                    "node {i}: no v4 masq rules in dual stack: {v4}"
                ),
            }
        }
        Fw::Nftables => {
            let t6 = n.ok("nft list table ip6 flannel-ipv6");
            for want in [
                format!("ip6 saddr {NET6}"),
                format!("ip6 saddr {sn6} ip6 daddr {NET6}"),
                "masquerade".to_string(),
                "accept".to_string(),
            ] {
                assert!(t6.contains(&want), "node {i}: {want:?} missing:\n{t6}");
            }
            let t4 = n.sh("nft list table ip flannel-ipv4");
            match c.stack {
                Stack::V6Only => assert!(
                    !t4.success() || !t4.stdout.contains("10.244."),
                    "node {i}: v4 rules in an IPv6-only network: {t4}"
                ),
                Stack::Dual => assert!(
                    t4.success() && t4.stdout.contains(&format!("ip saddr {NET4}")),
                    "node {i}: no v4 rules in dual stack: {t4}"
                ),
            }
        }
    }
}

/// The backend-specific state of node `i` towards its peer `j`.
fn check_dataplane(c: &Case, net: &guests::Net, i: usize) {
    let j = 1 - i;
    let (n, peer) = (net.node(i), net.node(j));
    let peer6 = peer.addr6().expect("v6 underlay");
    let sn6_peer = subnet6(net, j);
    let links = guests::links(n);
    let r6 = routes6(n);
    let kernel = c.dataplanes[i] == "kernel";
    if c.backend.contains("vxlan") {
        let kind = if kernel { "vxlan" } else { "tun" };
        assert_eq!(
            links.get("flannel-v6.1").map(String::as_str),
            Some(kind),
            "node {i}: {links:?}"
        );
        if c.stack == Stack::V6Only {
            assert!(!links.contains_key("flannel.1"), "node {i}: {links:?}");
        } else {
            assert!(links.contains_key("flannel.1"), "node {i}: {links:?}");
            assert_eq!(guests::dev_mtu(n, "flannel.1"), 1450, "node {i}");
        }
        // Room for the 40-byte IPv6 outer header (flannel: 1450, see
        // control/src/backend/vxlan/mod.rs `Mtus`), and pods at the smaller MTU.
        assert_eq!(guests::dev_mtu(n, "flannel-v6.1"), 1430, "node {i}");
        assert_eq!(net.env(i, "FLANNEL_MTU"), "1430", "node {i}");
        if kernel {
            let l = n.ok("ip -d link show flannel-v6.1");
            assert!(
                l.contains(&format!("vxlan id 1 local {}", n.addr6().expect("v6"))),
                "{l}"
            );
            let gw = sn6_peer.trim_end_matches("/64");
            let want = format!("{sn6_peer} via {gw} dev flannel-v6.1 onlink");
            assert!(r6.contains(&want), "node {i}: {want:?} missing: {r6:?}");
            let fdb = n.ok("bridge fdb show dev flannel-v6.1");
            assert!(
                fdb.contains(&format!("dst {peer6} self permanent")),
                "{fdb}"
            );
        } else {
            assert!(
                r6.iter()
                    .any(|r| r.starts_with(&sn6_peer) && r.contains("dev flannel-v6.1")),
                "node {i}: {r6:?}"
            );
        }
    } else if c.backend.contains("host-gw") {
        let want = format!("{sn6_peer} via {peer6} dev eth0");
        assert!(r6.contains(&want), "node {i}: {want:?} missing: {r6:?}");
        assert!(
            !links
                .values()
                .any(|k| ["tun", "vxlan", "wireguard"].contains(&k.as_str())),
            "node {i}: {links:?}"
        );
    } else {
        // WireGuard, separate mode: flannel-wg-v6 on port 51821.
        let kind = if kernel { "wireguard" } else { "tun" };
        assert_eq!(
            links.get("flannel-wg-v6").map(String::as_str),
            Some(kind),
            "node {i}: {links:?}"
        );
        assert_eq!(
            links.contains_key("flannel-wg"),
            c.stack == Stack::Dual,
            "node {i}: {links:?}"
        );
        assert!(
            r6.iter()
                .any(|r| r.starts_with(NET6) && r.contains("dev flannel-wg-v6")),
            "node {i}: {r6:?}"
        );
        if kernel {
            let dump = n.ok("wg show flannel-wg-v6 dump");
            let peer_line = dump
                .lines()
                .nth(1)
                .unwrap_or_else(|| panic!("node {i}: no peer: {dump}"));
            let f: Vec<&str> = peer_line.split('\t').collect();
            assert_eq!(f[2], format!("[{peer6}]:51821"), "{dump}");
            assert_eq!(f[3], sn6_peer, "{dump}");
            assert_ne!(f[4], "0", "no handshake: {dump}");
        }
    }
}

fn v6_case(c: &Case) {
    let kit = weft_tests::require_vm!();
    let t0 = Instant::now();
    let per_node: Vec<Vec<&str>> = c
        .dataplanes
        .iter()
        .map(|d| {
            vec![if *d == "kernel" {
                "--dataplane=kernel"
            } else {
                "--dataplane=userspace"
            }]
        })
        .collect();
    let per_node: Vec<&[&str]> = per_node.iter().map(|v| v.as_slice()).collect();
    let net = guests::net(
        &kit,
        &LabSpec::new(c.tag, 2).with_ipv6(),
        &conf(c),
        &["--ip-masq"],
        &per_node,
    );
    for i in 0..2 {
        let n = net.node(i);
        // subnet.env: v6 lines; v4 lines only in dual stack.
        assert_eq!(net.env(i, "FLANNEL_IPV6_NETWORK"), NET6);
        let sn6 = net.env(i, "FLANNEL_IPV6_SUBNET");
        assert!(
            sn6.starts_with("fd00:10:244:") && sn6.ends_with("::1/64"),
            "node {i}: {sn6}"
        );
        assert_eq!(
            net.envs[i].contains_key("FLANNEL_SUBNET"),
            c.stack == Stack::Dual,
            "node {i}: {:?}",
            net.envs[i]
        );
        // The lease: key, PublicIPv6, BackendV6Data.
        let (key, raw) = net.lease_raw(i);
        let l = net.lease(i);
        let sn6net = subnet6(&net, i);
        let (a, len) = sn6net.split_once('/').expect("cidr");
        let k6 = format!("&{a}-{len}");
        match c.stack {
            Stack::V6Only => assert!(
                key.ends_with(&format!("/subnets/0.0.0.0-0{k6}")),
                "node {i}: {key}"
            ),
            Stack::Dual => {
                let sn4 = n.pod_subnet().replace('/', "-");
                assert!(
                    key.ends_with(&format!("/subnets/{sn4}{k6}")),
                    "node {i}: {key}"
                );
            }
        }
        assert_eq!(
            l["PublicIPv6"],
            n.addr6().expect("v6").to_string(),
            "node {i}: {raw}"
        );
        if c.backend.contains("vxlan") {
            assert!(
                raw.contains(r#""BackendV6Data":{"VNI":1,"VtepMAC":""#),
                "{raw}"
            );
            assert_eq!(
                l["BackendData"].is_object(),
                c.stack == Stack::Dual,
                "{raw}"
            );
        } else if c.backend.contains("wireguard") {
            let key = l["BackendV6Data"]["PublicKey"]
                .as_str()
                .unwrap_or_else(|| panic!("{raw}"));
            assert!(
                raw.contains(&format!(
                    r#""BackendV6Data":{{"PublicKey":"{key}","Port":51821}}"#
                )),
                "{raw}"
            );
            assert_eq!(
                l["BackendData"].is_object(),
                c.stack == Stack::Dual,
                "{raw}"
            );
        }
        check_rules(c, &net, i);
    }
    let pods = net.pods();
    let (p1, p2) = (&pods[0], &pods[1]);
    for (i, d) in net.weftd.iter().enumerate() {
        assert!(
            d.running(),
            "node {i}: weftd exited ({:?}):\n{}",
            d.exit_code(),
            d.log()
        );
    }
    for p in &pods {
        assert!(p.ip6.is_some(), "{} has no IPv6 address", p.ns);
        assert_eq!(p.ip4.is_some(), c.stack == Stack::Dual, "{}", p.ns);
    }
    let first = p1.must_reach(&p2.ip(true));
    p2.must_reach(&p1.ip(true));
    if c.stack == Stack::Dual {
        p1.must_reach(&p2.ip(false));
        p2.must_reach(&p1.ip(false));
    }
    for i in 0..2 {
        check_dataplane(c, &net, i);
        let kind = if c.dataplanes[i] == "kernel" {
            if c.backend.contains("vxlan") {
                "vxlan"
            } else {
                "wireguard"
            }
        } else {
            "tun"
        };
        let devs: &[&str] = if c.backend.contains("vxlan") {
            &["flannel-v6.1", "flannel.1"]
        } else if c.backend.contains("wireguard") {
            &["flannel-wg-v6", "flannel-wg"]
        } else {
            &[]
        };
        let n = if c.stack == Stack::Dual {
            devs.len()
        } else {
            devs.len().min(1)
        };
        let keep: Vec<(&str, &str)> = devs[..n].iter().map(|d| (*d, kind)).collect();
        guests::nothing_else(net.node(i), &keep);
    }
    guests::tcp(p1, p2, &p2.ip(true));
    guests::tcp(p2, p1, &p1.ip(true));
    println!(
        "figures {}: ready {:.1?} after weftd start, first ping6 {first:.1?} after CNI ADD; wall time {:.1?}",
        c.tag,
        net.ready_after,
        t0.elapsed()
    );
}

#[test]
fn vxlan_ipv6_only_kernel_and_userspace_nodes() {
    v6_case(&Case {
        tag: "6vx",
        backend: r#"{"Type":"vxlan"}"#,
        stack: Stack::V6Only,
        fw: Fw::Iptables,
        dataplanes: ["kernel", "userspace"],
    });
}

#[test]
fn vxlan_dual_stack_userspace_and_kernel_nodes() {
    v6_case(&Case {
        tag: "dvx",
        backend: r#"{"Type":"vxlan"}"#,
        stack: Stack::Dual,
        fw: Fw::Nftables,
        dataplanes: ["userspace", "kernel"],
    });
}

#[test]
fn host_gw_ipv6_only() {
    v6_case(&Case {
        tag: "6hg",
        backend: r#"{"Type":"host-gw"}"#,
        stack: Stack::V6Only,
        fw: Fw::Nftables,
        dataplanes: ["kernel", "kernel"],
    });
}

#[test]
fn host_gw_dual_stack() {
    v6_case(&Case {
        tag: "dhg",
        backend: r#"{"Type":"host-gw"}"#,
        stack: Stack::Dual,
        fw: Fw::Iptables,
        dataplanes: ["kernel", "kernel"],
    });
}

#[test]
fn wireguard_ipv6_only_kernel_and_userspace_nodes() {
    v6_case(&Case {
        tag: "6wg",
        backend: r#"{"Type":"wireguard"}"#,
        stack: Stack::V6Only,
        fw: Fw::Iptables,
        dataplanes: ["kernel", "userspace"],
    });
}

#[test]
fn wireguard_dual_stack_userspace_and_kernel_nodes() {
    v6_case(&Case {
        tag: "dwg",
        backend: r#"{"Type":"wireguard"}"#,
        stack: Stack::Dual,
        fw: Fw::Nftables,
        dataplanes: ["userspace", "kernel"],
    });
}
