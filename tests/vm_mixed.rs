//! Mixed nodes on one network, in guests on Debian's stock kernel
//! (tests/support/vm.rs): node 1 runs the kernel path (`--dataplane=kernel`),
//! node 2 weft's userspace engine (`--dataplane=userspace`), for WireGuard,
//! ipip and vxlan. Both publish flannel's lease format, each programs the
//! other from it, and pods ping and carry TCP both ways. Asserted per
//! backend: what each node says it runs (`weft status`), the device kinds,
//! the leases' backend data, the kernel node's per-peer state (WireGuard
//! peer, ipip and vxlan routes, vxlan neighbour and fdb entries) and the
//! userspace node's routes through its TUN device.

use std::time::Instant;

use weft_tests::vm::net as guests;
use weft_tests::vm::{LabSpec, Pod};

/// Node 1 kernel, node 2 userspace, both up with a pod each; checks what
/// both run. Returns the net, the pods and the time from weftd start to the
/// first pod ping answered across the nodes.
fn mixed(
    kit: &weft_tests::vm::Kit,
    tag: &str,
    conf: &str,
    dev: &str,
    kernel_kind: &str,
) -> (guests::Net, Vec<Pod>, std::time::Duration) {
    let net = guests::net(
        kit,
        &LabSpec::new(tag, 2),
        conf,
        &["--traffic-manager=none"],
        &[&["--dataplane=kernel"], &["--dataplane=userspace"]],
    );
    for (i, (dp, kind, dkind)) in [
        ("kernel", kernel_kind, "kernel"),
        ("userspace", "tun", "engine"),
    ]
    .into_iter()
    .enumerate()
    {
        let st = net.status(i);
        assert_eq!(st["backend"]["dataplane"], dp, "node {i}: {st:#}");
        assert!(
            st["backend"]["devices"]
                .as_array()
                .expect("devices")
                .iter()
                .any(|d| d["name"] == dev && d["kind"] == dkind),
            "node {i}: {st:#}"
        );
        guests::nothing_else(net.node(i), &[(dev, kind)]);
    }
    let pods = net.pods();
    let (p1, p2) = (&pods[0], &pods[1]);
    p1.must_reach(&p2.ip(false));
    let first = net.started.elapsed();
    p2.must_reach(&p1.ip(false));
    (net, pods, first)
}

/// Pings both ways and a 1 MiB TCP transfer each way.
fn traffic(pods: &[Pod]) {
    let (p1, p2) = (&pods[0], &pods[1]);
    p1.must_reach(&p2.ip(false));
    p2.must_reach(&p1.ip(false));
    guests::tcp(p1, p2, &p2.ip(false));
    guests::tcp(p2, p1, &p1.ip(false));
}

/// The routes of node `i` into the pod network (v4).
fn pod_routes(net: &guests::Net, i: usize) -> Vec<String> {
    guests::routes(net.node(i), false)
        .into_iter()
        .filter(|r| r.starts_with("10.244."))
        .collect()
}

fn subnet_of(net: &guests::Net, i: usize) -> String {
    net.node(i).pod_subnet()
}

fn report(what: &str, net: &guests::Net, first: std::time::Duration, t0: Instant) {
    println!(
        "figures {what}: boot {:.1?}; from weftd start: both subnet.env {:.1?}, first pod ping across nodes answered {first:.1?}; wall time {:.1?}",
        net.lab.boot_time(),
        net.ready_after,
        t0.elapsed()
    );
}

#[test]
fn kernel_wireguard_and_userspace_wireguard() {
    let kit = weft_tests::require_vm!();
    let t0 = Instant::now();
    let (net, pods, first) = mixed(
        &kit,
        "mwg",
        r#"{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}"#,
        "flannel-wg",
        "wireguard",
    );
    traffic(&pods);
    // Leases: flannel's BackendData from both paths.
    let keys: Vec<String> = (0..2)
        .map(|i| {
            let (_, raw) = net.lease_raw(i);
            let l = net.lease(i);
            assert_eq!(l["BackendType"], "wireguard", "{raw}");
            let key = l["BackendData"]["PublicKey"]
                .as_str()
                .unwrap_or_else(|| panic!("node {i}: {raw}"))
                .to_string();
            // flannel's bytes, whichever path wrote them.
            assert!(
                raw.contains(&format!(
                    r#""BackendData":{{"PublicKey":"{key}","Port":51820}}"#
                )),
                "node {i}: {raw}"
            );
            key
        })
        .collect();
    // The kernel node's peer is the userspace node, handshaken and carrying bytes.
    let n1 = net.node(0);
    let dump = n1.ok("wg show flannel-wg dump");
    let lines: Vec<Vec<&str>> = dump.lines().map(|l| l.split('\t').collect()).collect();
    assert_eq!(lines.len(), 2, "one interface line, one peer: {dump}");
    assert_eq!(lines[0][1], keys[0], "device key = node 1's lease key");
    assert_eq!(lines[0][2], "51820");
    let p = &lines[1];
    assert_eq!(p[0], keys[1], "peer = node 2's key: {dump}");
    assert_eq!(p[2], "192.0.2.2:51820", "{dump}");
    assert_eq!(p[3], subnet_of(&net, 1), "allowed-ips: {dump}");
    assert_ne!(p[4], "0", "no handshake: {dump}");
    let (rx, tx): (u64, u64) = (p[5].parse().expect("rx"), p[6].parse().expect("tx"));
    assert!(rx > 1 << 20 && tx > 1 << 20, "rx {rx} tx {tx}: {dump}");
    // Routes: the network through each node's device.
    for i in 0..2 {
        let r = pod_routes(&net, i);
        assert!(
            r.contains(&"10.244.0.0/16 dev flannel-wg".to_string()),
            "node {i}: {r:?}"
        );
    }
    // The userspace node counts the kernel node as a peer with a handshake.
    let st = net.status(1);
    let peer = st["peers"]
        .as_array()
        .expect("peers")
        .iter()
        .find(|p| p["public_ip"] == "192.0.2.1")
        .unwrap_or_else(|| panic!("{st:#}"))
        .clone();
    assert!(peer["last_handshake"].is_u64(), "{peer:#}");
    assert!(
        peer["counters"]["rx_bytes"].as_u64().unwrap_or(0) > 1 << 20,
        "{peer:#}"
    );
    report(
        "mixed wireguard (kernel node 1, userspace node 2)",
        &net,
        first,
        t0,
    );
}

#[test]
fn kernel_ipip_and_userspace_ipip() {
    let kit = weft_tests::require_vm!();
    let t0 = Instant::now();
    let (net, pods, first) = mixed(
        &kit,
        "mip",
        r#"{"Network":"10.244.0.0/16","Backend":{"Type":"ipip"}}"#,
        "flannel.ipip",
        "ipip",
    );
    let rx0 = net
        .node(0)
        .ok("cat /sys/class/net/flannel.ipip/statistics/rx_bytes");
    traffic(&pods);
    let rx1 = net
        .node(0)
        .ok("cat /sys/class/net/flannel.ipip/statistics/rx_bytes");
    let moved = rx1.trim().parse::<u64>().expect("rx") - rx0.trim().parse::<u64>().expect("rx");
    assert!(
        moved > 1 << 20,
        "node 1's flannel.ipip received {moved} bytes during a 1 MiB transfer"
    );
    for i in 0..2 {
        let l = net.lease(i);
        assert_eq!(l["BackendType"], "ipip", "node {i}: {l}");
        assert!(l.get("BackendData").is_none_or(|d| d.is_null()), "{l}");
    }
    let (s1, s2) = (subnet_of(&net, 0), subnet_of(&net, 1));
    let r1 = pod_routes(&net, 0);
    assert!(
        r1.contains(&format!("{s2} via 192.0.2.2 dev flannel.ipip onlink")),
        "node 1: {r1:?}"
    );
    let r2 = pod_routes(&net, 1);
    assert!(
        r2.iter()
            .any(|r| r.starts_with(&s1) && r.contains("dev flannel.ipip")),
        "node 2: {r2:?}"
    );
    let link = net.node(0).ok("ip -d link show flannel.ipip");
    assert!(link.contains("ipip remote any local 192.0.2.1"), "{link}");
    report(
        "mixed ipip (kernel node 1, userspace node 2)",
        &net,
        first,
        t0,
    );
}

#[test]
fn kernel_vxlan_and_userspace_vxlan() {
    let kit = weft_tests::require_vm!();
    let t0 = Instant::now();
    let (net, pods, first) = mixed(
        &kit,
        "mvx",
        r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#,
        "flannel.1",
        "vxlan",
    );
    traffic(&pods);
    let macs: Vec<String> = (0..2)
        .map(|i| {
            let l = net.lease(i);
            assert_eq!(l["BackendType"], "vxlan", "node {i}: {l}");
            let mac = l["BackendData"]["VtepMAC"]
                .as_str()
                .unwrap_or_else(|| panic!("node {i}: {l}"))
                .to_string();
            let (_, raw) = net.lease_raw(i);
            assert!(
                raw.contains(&format!(r#""BackendData":{{"VNI":1,"VtepMAC":"{mac}"}}"#)),
                "node {i}: {raw}"
            );
            mac
        })
        .collect();
    let n1 = net.node(0);
    // Kernel node: the device has the published MAC; route, neighbour and
    // fdb entry for the userspace node.
    let link = n1.ok("ip -d link show flannel.1");
    assert!(link.contains(&format!("link/ether {}", macs[0])), "{link}");
    assert!(link.contains("vxlan id 1 local 192.0.2.1"), "{link}");
    let s2 = subnet_of(&net, 1);
    let gw = s2.trim_end_matches("/24");
    let r1 = pod_routes(&net, 0);
    assert!(
        r1.contains(&format!("{s2} via {gw} dev flannel.1 onlink")),
        "{r1:?}"
    );
    let neigh = n1.ok("ip neigh show dev flannel.1");
    assert!(
        neigh.contains(&format!("{gw} lladdr {} PERMANENT", macs[1])),
        "{neigh}"
    );
    let fdb = n1.ok("bridge fdb show dev flannel.1");
    assert!(
        fdb.contains(&format!("{} dst 192.0.2.2 self permanent", macs[1])),
        "{fdb}"
    );
    let s1 = subnet_of(&net, 0);
    let r2 = pod_routes(&net, 1);
    assert!(
        r2.iter()
            .any(|r| r.starts_with(&s1) && r.contains("dev flannel.1")),
        "node 2: {r2:?}"
    );
    report(
        "mixed vxlan (kernel node 1, userspace node 2)",
        &net,
        first,
        t0,
    );
}
