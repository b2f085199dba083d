//! Kernel ipip in guests on Debian's stock kernel (this machine's kernel has
//! no ipip module): three nodes with `--dataplane=kernel` and DirectRouting,
//! programmed as flannel programs them (spec §2.4, §4.5): `flannel.ipip`
//! (ipip, local = the interface address, remote any, MTU ext − 20,
//! `<subnet IP>/32`), per peer `<subnet> via <PublicIP> dev flannel.ipip
//! onlink`, and with DirectRouting, for a peer that `ip route get` reaches
//! without a gateway, the route via the underlay (`dev eth0 onlink`) instead.
//!
//! Nodes 1 and 2 share a subnet; node 3 is reached "through a gateway": the
//! other nodes have `192.0.2.3/32 via 192.0.2.3 onlink` and it has the same
//! for them, so `ip route get` returns a gateway while the frames still
//! cross the one segment.

use weft_tests::vm::net as guests;
use weft_tests::vm::{LabSpec, Node};

/// RX and TX bytes of a device.
fn bytes(n: &Node, dev: &str) -> (u64, u64) {
    let rx = n.ok(&format!("cat /sys/class/net/{dev}/statistics/rx_bytes"));
    let tx = n.ok(&format!("cat /sys/class/net/{dev}/statistics/tx_bytes"));
    (
        rx.trim().parse().expect("rx"),
        tx.trim().parse().expect("tx"),
    )
}

#[test]
fn kernel_ipip_three_nodes_with_direct_routing() {
    let kit = weft_tests::require_vm!();
    let t0 = std::time::Instant::now();
    let lab_spec = LabSpec::new("ip", 3);
    // The "gateway" routes go in before weftd starts; guests::cluster boots
    // the lab, so the routes are added through a wrapper script per node.
    let c = guests::net_with(
        &kit,
        &lab_spec,
        r#"{"Network":"10.244.0.0/16","Backend":{"Type":"ipip","DirectRouting":true}}"#,
        &["--ip-masq", "--dataplane=kernel"],
        &[],
        |lab| {
            for i in 0..2 {
                lab.node(i)
                    .ok("ip route add 192.0.2.3/32 via 192.0.2.3 dev eth0 onlink");
            }
            lab.node(2).ok(
                "ip route add 192.0.2.1/32 via 192.0.2.1 dev eth0 onlink && ip route add 192.0.2.2/32 via 192.0.2.2 dev eth0 onlink",
            );
        },
    );
    let pods = c.pods();
    let first = c.first_packet(&pods[0], &pods[2]);
    for d in &c.weftd {
        let log = d.log();
        assert!(log.contains("IPIP config: DirectRouting=true"), "{log}");
        assert!(
            log.contains("runs in the kernel"),
            "not the kernel path:\n{log}"
        );
    }
    guests::mesh_ping(&pods);

    let sn: Vec<String> = c.lab.nodes().iter().map(|n| n.pod_subnet()).collect();
    for (i, n) in c.lab.nodes().iter().enumerate() {
        let link = n.ok("ip -d link show flannel.ipip");
        for want in [
            "mtu 1480".to_string(),
            format!("ipip remote any local {}", n.addr()),
        ] {
            assert!(link.contains(&want), "node {i}: {want:?} missing:\n{link}");
        }
        assert!(
            link.contains(",UP,"),
            "node {i}: flannel.ipip down:\n{link}"
        );
        let addr = n.ok("ip -4 -o addr show dev flannel.ipip");
        let own = sn[i].trim_end_matches("/24");
        assert!(addr.contains(&format!("inet {own}/32")), "{addr}");
        assert_eq!(c.mtu(i), 1480);
        let routes = n.ok("ip route show");
        for j in (0..3).filter(|j| *j != i) {
            let peer = c.lab.node(j).addr();
            // Only nodes 1 and 2 see each other without a gateway.
            let dev = if i < 2 && j < 2 {
                "eth0"
            } else {
                "flannel.ipip"
            };
            let want = format!("{} via {peer} dev {dev} onlink", sn[j]);
            assert!(
                routes.contains(&want),
                "node {i}: {want:?} missing:\n{routes}"
            );
        }
    }

    // Node 3 -> node 1 through the tunnel: the tunnel carries the bytes.
    let n1 = c.lab.node(0);
    let before = bytes(n1, "flannel.ipip");
    guests::tcp(&pods[0], &pods[2], &pods[2].ip(false));
    let after = bytes(n1, "flannel.ipip");
    assert!(
        after.0 - before.0 > 1 << 20,
        "flannel.ipip on node 1 received {} bytes during a 1 MiB download from node 3",
        after.0 - before.0
    );
    // Node 2 -> node 1 directly: the tunnel stays (almost) idle.
    let before = bytes(n1, "flannel.ipip");
    guests::tcp(&pods[0], &pods[1], &pods[1].ip(false));
    let after = bytes(n1, "flannel.ipip");
    assert!(
        after.0 - before.0 < 64 << 10,
        "a direct-routed 1 MiB download went through flannel.ipip ({} bytes)",
        after.0 - before.0
    );
    // Full MTU with DF: through the tunnel and directly.
    guests::df_ping(&pods[0], &pods[2].ip(false), 1480);
    guests::df_ping(&pods[0], &pods[1].ip(false), 1480);
    guests::df_ping(&pods[2], &pods[1].ip(false), 1480);
    c.report("kernel ipip (3 nodes, DirectRouting)", first);
    println!("vm_ipip wall time {:?}", t0.elapsed());
}
