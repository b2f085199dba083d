//! A smaller path to one peer on the backends that route the whole network
//! through one device (udp and WireGuard on the userspace dataplane:
//! `10.244.0.0/16 dev flannel0`), where lowering that route's MTU would
//! lower it for every peer. Three nodes; node 2's underlay interface at MTU
//! 1400 (the overlay's MTU assumes 1500), its bridge port dropping the
//! bigger frames silently (no ICMP anywhere). Node 1's path-MTU probes find
//! the smaller path and weftd adds a per-peer route (node 2's subnet via
//! the same device, `mtu` the path MTU, `proto 87`) so a TCP flow to node
//! 2's pod completes without manual change, while node 3's pods stay on the
//! network route at the full MTU. The route survives the backend's
//! reconcile, goes when the path is whole again, and goes when the peer
//! leaves. ~55 s per backend on this machine.

#[allow(dead_code)] // shared with tests/doctor.rs, which uses all of it
mod doctor_kit;

use std::time::Duration;

use doctor_kit::restart_weftd;
use weft_testenv::require_root;
use weft_tests::cluster::{self, Cluster};
use weft_tests::proc::{wait_for, wait_for_or_show};

/// `ip route show exact NET` on node `i`.
fn route(c: &Cluster, i: usize, net: &str) -> String {
    c.nodes[i]
        .ns
        .exec(&["ip", "route", "show", "exact", net])
        .trim()
        .to_string()
}

#[test]
fn a_smaller_path_gets_a_per_peer_route_on_one_route_backends() {
    require_root!();
    weft_testenv::require_tool!("iperf3", "iperf3", "iperf3");
    for backend in ["udp", "wireguard"] {
        one_route_backend(backend);
    }
}

fn one_route_backend(backend: &str) {
    let (_w, mut c) = cluster::start(
        &format!("pm{}", &backend[..2]),
        &cluster::net_conf(&format!(r#"{{"Type":"{backend}"}}"#)),
        3,
        &["--traffic-manager=none", "--dataplane=userspace"],
    );
    for i in 0..3 {
        c.add_pod(i, &format!("p{i}"))
            .unwrap_or_else(|e| panic!("{backend}: pod: {e}"));
    }
    c.assert_mesh();
    let mtu: u32 = c.env_var(0, "FLANNEL_MTU").parse().expect("FLANNEL_MTU");
    let (small, whole) = (c.subnet(1), c.subnet(2));
    let small_ip = c.nodes[1].addr.clone();
    assert_eq!(
        route(&c, 0, &small),
        "",
        "{backend}: a per-peer route before any fault"
    );

    // Node 2's underlay at 1400; node 1's weftd restarted to search at once.
    // Node 1's eth0 sends wire-size datagrams (gso_max_segs 1): a veth
    // forwards a GSO train whatever its MTU, so the engine's UDP_SEGMENT
    // trains would cross node 2's smaller link whole, which no real link
    // allows (measured without it: 1.67 GB in 2 s with no route lowered;
    // with it and --probe-route-mtu=false: 0 bytes, a black hole).
    c.nodes[1].ns.sh("ip link set eth0 mtu 1400");
    c.nodes[0].ns.sh("ip link set eth0 gso_max_segs 1");
    restart_weftd(&mut c, 0);
    let pmtu = wait_for_or_show(
        &format!("{backend}: node 1's path-MTU search"),
        Duration::from_secs(60),
        || {
            let st = c.status(0);
            let p = st.peers.iter().find(|p| p.public_ip == small_ip)?;
            p.probe.as_ref()?.pmtu.filter(|m| *m < mtu)
        },
        || format!("{:?}\n{}", c.status(0).peers, c.log(0)),
    );
    assert!(
        (1200..mtu).contains(&pmtu),
        "{backend}: path MTU {pmtu} (overlay {mtu})"
    );
    eprintln!("{backend}: path MTU to node 2 with its eth0 at 1400: {pmtu} (overlay {mtu})");
    wait_for_or_show(
        &format!("{backend}: the per-peer route"),
        Duration::from_secs(10),
        || {
            let r = route(&c, 0, &small);
            (r.contains(&format!("mtu {pmtu}")) && r.contains("proto 87")).then_some(())
        },
        || format!("{}\n{}", c.nodes[0].ns.exec(&["ip", "route"]), c.log(0)),
    );
    let dev = c.nodes[0]
        .ns
        .exec(&["ip", "route", "show", "exact", cluster::NETWORK]);
    let r = route(&c, 0, &small);
    eprintln!("{backend}: node 1's routes: {} | {r}", dev.trim());
    let dev_name = dev
        .split_whitespace()
        .nth(2)
        .expect("the network route's device");
    assert!(
        r.contains(&format!("dev {dev_name} ")),
        "{backend}: {r} vs {dev}"
    );
    // Only that peer: node 3 keeps the network route and its full MTU.
    assert_eq!(
        route(&c, 0, &whole),
        "",
        "{backend}: node 3's subnet got a route"
    );
    assert!(
        !dev.contains(" mtu "),
        "{backend}: the network route was lowered: {dev}"
    );
    c.assert_df_ping(0, 2, mtu, false);
    c.assert_df_ping(0, 1, pmtu, true);
    let bytes = c.iperf_bytes(0, 1, 2);
    assert!(
        bytes > 1_000_000,
        "{backend}: TCP over the smaller path moved {bytes} bytes"
    );
    eprintln!("{backend}: TCP over the smaller path: {bytes} bytes in 2 s");

    // The backend's reconcile (every 10 s) leaves the route alone.
    std::thread::sleep(Duration::from_secs(11));
    assert!(
        route(&c, 0, &small).contains(&format!("mtu {pmtu}")),
        "{backend}: the per-peer route went after a reconcile"
    );

    // The path whole again: a restarted weftd searches at once, finds it
    // whole and deletes its route (the TUN's restart removes it anyway, so
    // this also checks nothing re-adds it).
    c.nodes[1].ns.sh("ip link set eth0 mtu 1500");
    restart_weftd(&mut c, 0);
    wait_for_or_show(
        &format!("{backend}: the whole path searched"),
        Duration::from_secs(30),
        || {
            let st = c.status(0);
            let p = st.peers.iter().find(|p| p.public_ip == small_ip)?;
            (p.probe.as_ref()?.pmtu == Some(mtu)).then_some(())
        },
        || format!("{:?}\n{}", c.status(0).peers, c.log(0)),
    );
    assert_eq!(route(&c, 0, &small), "", "{backend}: the route stayed");

    // The peer leaves while its route is lowered: the route goes with it.
    c.nodes[1].ns.sh("ip link set eth0 mtu 1400");
    restart_weftd(&mut c, 0);
    wait_for(
        &format!("{backend}: the per-peer route again"),
        Duration::from_secs(60),
        || route(&c, 0, &small).contains("proto 87").then_some(()),
    );
    c.weft_leases(&["rm", &c.lease_key(1)])
        .unwrap_or_else(|e| panic!("weft leases rm: {e}"));
    wait_for_or_show(
        &format!("{backend}: the route of the peer that left removed"),
        Duration::from_secs(30),
        || route(&c, 0, &small).is_empty().then_some(()),
        || c.log(0),
    );
}
