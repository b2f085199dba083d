//! The engine's experimental tunnel TAP (issue 32, `WEFT_ENGINE_TAP_GSO`,
//! `engine/src/path/tap.rs`): userspace VXLAN writes each TCP super-packet
//! whole to a TAP with UDP-tunnel GSO (Linux 6.17+) and the kernel cuts it.
//! Two real weftd nodes; the TAP brought up as docs/performance.md says.
//! Asserts, for an uplink that carries the unsegmented skb (a veth, as a NIC
//! with `tx-udp_tnl-segmentation`) and for one where the node's stack must
//! cut it (the offload off): TCP moves between the pods, the TAP carried
//! the super-packets, and the receiving pod counted no TCP checksum error
//! (the kernel's segments carry correct inner checksums).

use weft_testenv::require_root;
use weft_tests::cluster;

const TAP: &str = "wtap0";

fn counter(ns: &weft_tests::netns::Netns, name: &str) -> u64 {
    let out = ns.sh(&format!("nstat -az {name} | awk '/{name}/{{print $2}}'"));
    out.trim()
        .parse()
        .unwrap_or_else(|_| panic!("nstat gave no {name}: {out:?}"))
}

#[test]
fn tcp_through_the_tunnel_tap_arrives_intact() {
    require_root!();
    // SAFETY: the only test in this binary; set before weftd is spawned and
    // before any other thread of this process reads the environment.
    unsafe { std::env::set_var("WEFT_ENGINE_TAP_GSO", TAP) };
    let conf = cluster::net_conf(r#"{"Type":"vxlan"}"#);
    let (_w, mut c) = cluster::start(
        "tapgso",
        &conf,
        2,
        &["--traffic-manager=none", "--dataplane=userspace"],
    );
    for n in 0..2 {
        let ns = &c.nodes[n].ns;
        let have = ns.try_exec(&["ip", "link", "show", TAP]);
        assert!(
            have.status.success(),
            "node {n}: weftd opened no {TAP} (kernel without UDP-tunnel GSO?):\n{}",
            c.log(n)
        );
        ns.exec(&[
            "sysctl",
            "-qw",
            "net.ipv4.ip_forward=1",
            "net.ipv4.conf.all.rp_filter=0",
        ]);
        ns.exec(&["sysctl", "-qw", &format!("net.ipv4.conf.{TAP}.rp_filter=0")]);
        ns.exec(&[
            "sysctl",
            "-qw",
            &format!("net.ipv4.conf.{TAP}.accept_local=1"),
        ]);
        ns.exec(&["ip", "link", "set", TAP, "up"]);
    }
    for n in 0..2 {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    assert!(c.wait_ping(0, 1), "pods do not reach each other");
    let addr = c.nodes[0].addr.clone();
    let uplink = c.nodes[0].ns.sh(&format!(
        "ip -o -4 addr show | awk '$4 ~ /^{addr}\\//{{print $2}}'"
    ));
    let uplink = uplink.trim().to_string();
    assert!(!uplink.is_empty(), "no uplink with {addr}");
    for (mode, features) in [
        ("uplink passes the skb whole", "on"),
        ("the node's stack segments", "off"),
    ] {
        c.nodes[0].ns.exec(&[
            "ethtool",
            "-K",
            &uplink,
            "tx-udp_tnl-segmentation",
            features,
            "tx-udp_tnl-csum-segmentation",
            features,
        ]);
        let frames = |c: &cluster::Cluster| -> u64 {
            let s = c.nodes[0].ns.exec(&[
                "cat",
                &format!("/sys/class/net/{TAP}/statistics/rx_packets"),
            ]);
            s.trim().parse().unwrap_or(0)
        };
        let before = (frames(&c), counter(&c.pods[1].ns, "TcpInCsumErrors"));
        let bytes = c.iperf_bytes(0, 1, 2);
        let after = (frames(&c), counter(&c.pods[1].ns, "TcpInCsumErrors"));
        println!(
            "{mode}: {bytes} bytes in 2 s, {} super-packets through {TAP}, {} TCP checksum errors",
            after.0 - before.0,
            after.1 - before.1
        );
        assert!(
            bytes > 10_000_000,
            "{mode}: iperf3 moved only {bytes} bytes"
        );
        assert!(
            after.0 - before.0 > 100,
            "{mode}: only {} frames went through {TAP}",
            after.0 - before.0
        );
        assert_eq!(
            after.1, before.1,
            "{mode}: the receiving pod saw TCP checksum errors"
        );
    }
}
