//! The userspace dataplane end to end, through real weftd daemons: 3-node
//! clusters in network namespaces (the same builder `weft demo` uses), pods
//! made by weft's CNI plugin, traffic over flannel-UDP and userspace VXLAN,
//! and a kernel-vxlan node configured by hand exactly as flannel would. The
//! daemons run with `--dataplane=userspace`, so the engine carries the traffic.

use std::time::Duration;

use weft_testenv::require_root;
use weft_tests::cluster::{self, Cluster};
use weft_tests::proc::wait_for;

/// `nodes` nodes of `backend` on the engine: the engine is under test here,
/// so it is forced (auto would pick kernel vxlan).
fn cluster(tag: &str, backend: &str, nodes: u8) -> (tempfile::TempDir, Cluster) {
    let conf = cluster::net_conf(&format!(r#"{{"Type":"{backend}"}}"#));
    let (w, c) = cluster::start(
        tag,
        &conf,
        nodes,
        &["--traffic-manager=none", "--dataplane=userspace"],
    );
    for i in 0..c.nodes.len() {
        weft_tests::weftd::assert_dataplane(&c.subnet_file(i), backend, "userspace");
    }
    (w, c)
}

/// Every pod reaches every pod on the other nodes, full-size unfragmented
/// packets pass, and a TCP bulk transfer completes both ways.
fn full_mesh(backend: &str, tag: &str) {
    let (_w, mut c) = cluster(tag, backend, 3);
    for n in 0..3 {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    c.assert_mesh();
    // Don't-fragment pings of exactly the MTU.
    let mtu = c.env_var(0, "FLANNEL_MTU").parse().expect("MTU");
    c.assert_df_ping(0, 1, mtu, false);
    // TCP both ways.
    for (a, b) in [(0, 1), (2, 0)] {
        let bytes = c.iperf_bytes(a, b, 2);
        assert!(
            bytes > 1_000_000,
            "{backend}: iperf3 {a}->{b} moved only {bytes} bytes"
        );
    }
}

#[test]
fn udp_three_nodes() {
    require_root!();
    full_mesh("udp", "du");
}

#[test]
fn vxlan_three_nodes() {
    require_root!();
    full_mesh("vxlan", "dv");
}

/// A node whose lease is deleted becomes unreachable and the others forget
/// it; when its weftd comes back it takes its subnet again and traffic flows.
#[test]
fn removed_lease_cuts_and_restores_a_peer() {
    require_root!();
    let (_w, mut c) = cluster("dr", "vxlan", 2);
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(c.wait_ping(0, 1), "no initial connectivity");
    let key = c.lease_key(1);
    c.weft_leases(&["rm", &key])
        .unwrap_or_else(|e| panic!("weft leases rm: {e}"));
    // Node 2's weftd exits (flannel's behaviour) and node 1 drops the peer.
    wait_for("node 1 to drop the peer", Duration::from_secs(30), || {
        c.log(0)
            .contains(&format!("Subnet removed: {key}"))
            .then_some(())
    });
    wait_for("node 2 to exit", Duration::from_secs(30), || {
        let n = &mut c.nodes[1];
        n.weftd
            .as_mut()
            .is_some_and(|p| !matches!(p.try_wait(), Ok(None)))
            .then_some(())
    });
    let net = c.subnet(1);
    let routes = c.nodes[0].ns.exec(&["ip", "route"]);
    assert!(!routes.contains(&net), "stale route left:\n{routes}");
    // Node 1's engine forgot the peer too: with a route into the TUN put
    // back by hand, pings to the dead node's pod are dropped for want of a
    // peer (`no_route`), not encapsulated towards 192.0.2.2. (A ping alone
    // proves nothing here: node 2's own TUN died with its weftd.)
    let no_route = || {
        let st = c.status(0);
        let dev = st.backend.devices.iter().find(|d| d.name == "flannel.1");
        dev.and_then(|d| d.drops).map_or(0, |d| d.no_route)
    };
    let peers = c.status(0).peers;
    assert!(
        peers
            .iter()
            .all(|p| p.subnet.as_deref() != Some(net.as_str())),
        "node 1 still lists the removed peer: {peers:?}"
    );
    c.nodes[0]
        .ns
        .exec(&["ip", "route", "add", &net, "dev", "flannel.1"]);
    let before = no_route();
    let out = c.pods[0]
        .ns
        .try_exec(&["ping", "-c", "3", "-i", "0.2", "-W", "1", &c.pods[1].ip]);
    assert!(
        !out.status.success(),
        "the removed peer's pod answered: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    let dropped = no_route() - before;
    assert!(
        dropped >= 3,
        "node 1's engine dropped {dropped} of 3 pings to the removed peer as no_route: it still forwards to it"
    );
    c.nodes[0]
        .ns
        .exec(&["ip", "route", "del", &net, "dev", "flannel.1"]);
    // Restart: same subnet from subnet.env, traffic back.
    c.start_weftd(1).expect("restart");
    wait_for(
        "node 2 to re-take its subnet",
        Duration::from_secs(30),
        || {
            c.log(1)
                .contains("Found previously leased subnet")
                .then_some(())
        },
    );
    assert!(
        c.wait_ping(0, 1),
        "traffic did not come back; logs:\n{}\n{}",
        c.log(0),
        c.log(1)
    );
}

/// Interop: node 1 runs weft's userspace VXLAN; node 2 is a plain kernel
/// vxlan node set up by hand exactly as flannel's vxlan backend would from
/// node 1's lease. Pods ping and carry TCP both ways.
#[test]
fn userspace_vxlan_interoperates_with_kernel_vxlan() {
    require_root!();
    let (_w, mut c) = cluster("dk", "vxlan", 2);
    // Node 2 stops being a weft node: its weftd goes, a kernel vxlan comes.
    c.stop_weftd(1);
    let n1 = c.lease_of("192.0.2.1");
    let n1_key = n1["key"].as_str().expect("key").to_string();
    let n1_subnet = n1_key.replace('-', "/");
    let n1_gw = n1_key.split('-').next().expect("ip").to_string();
    let n1_mac = n1["value"]["BackendData"]["VtepMAC"]
        .as_str()
        .expect("mac")
        .to_string();
    let n2 = &c.nodes[1].ns;
    // The kernel node's subnet and its VTEP MAC, published like flannel would.
    let (sub2, gw2, mac2) = ("10.244.200.0/24", "10.244.200.0", "02:00:00:c0:ff:ee");
    n2.sh(&format!(
        "ip link del flannel.1 2>/dev/null || true
         ip link add flannel.1 address {mac2} type vxlan id 1 local 192.0.2.2 dev eth0 dstport 8472 nolearning
         ip link set flannel.1 mtu 1450
         ip addr add {gw2}/32 dev flannel.1
         ip link set flannel.1 up
         ip neigh replace {n1_gw} lladdr {n1_mac} dev flannel.1 nud permanent
         bridge fdb replace {n1_mac} dev flannel.1 dst 192.0.2.1 self permanent
         ip route replace {n1_subnet} via {n1_gw} dev flannel.1 onlink
         ip link add cni0 type bridge; ip addr add 10.244.200.1/24 dev cni0; ip link set cni0 up
         sysctl -qw net.ipv4.ip_forward=1"
    ));
    c.weft_leases(&["put", "10.244.200.0-24", &format!(r#"{{"PublicIP":"192.0.2.2","PublicIPv6":null,"BackendType":"vxlan","BackendData":{{"VNI":1,"VtepMAC":"{mac2}"}}}}"#)])
        .unwrap_or_else(|e| panic!("weft leases put: {e}"));
    let _ = sub2;
    // A pod on each side: weft's via CNI, the kernel node's by hand.
    let kp = c.hand_made_pod(1, "10.244.200.2/24", "10.244.200.1");
    c.add_pod(0, "w").expect("pod on the weft node");
    let wpod = c.pods[0].ip.clone();
    wait_for(
        "weft to learn the kernel node",
        Duration::from_secs(30),
        || {
            c.log(0)
                .contains("Subnet added: 10.244.200.0-24")
                .then_some(())
        },
    );
    assert!(
        (0..10).any(|_| c.pods[0].ns.ping("10.244.200.2", 1)),
        "weft pod -> kernel pod failed"
    );
    assert!(
        (0..10).any(|_| kp.ping(&wpod, 1)),
        "kernel pod -> weft pod failed"
    );
    // TCP both ways.
    for (client, server_ns, server_ip) in [
        (&c.pods[0].ns, &kp, "10.244.200.2"),
        (&kp, &c.pods[0].ns, wpod.as_str()),
    ] {
        server_ns.exec(&["iperf3", "-s", "-1", "-D", "-B", server_ip]);
        std::thread::sleep(Duration::from_millis(300));
        let out = client.try_exec(&["iperf3", "-c", server_ip, "-t", "2", "-J"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let bytes = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
        assert!(
            bytes > 1_000_000,
            "TCP to {server_ip} moved only {bytes} bytes"
        );
    }
}
