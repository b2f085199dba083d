//! The userspace `wireguard` backend end to end, through real weftd daemons
//! (3-node cluster in network namespaces, pods from weft's CNI plugin),
//! pinned to `--dataplane=userspace` and checked in `weft status` on every
//! node, so that a kernel with the wireguard module cannot swap the path
//! under the test: traffic both ways, flannel's devices/routes/lease bytes/key file, interop
//! with an independent implementation (wireguard-go + wg configured as a
//! flannel wireguard node would be), and key rotation.

use std::os::unix::fs::PermissionsExt;
use std::time::Duration;

use weft_testenv::{require_root, require_tool};
use weft_tests::cluster::{self, Cluster, iperf_bytes, wait_ping};
use weft_tests::proc::wait_for;
use weft_tests::weftd::assert_dataplane;
use weft_tests::wggo::WireguardGo;

fn cluster(tag: &str, nodes: u8) -> (tempfile::TempDir, Cluster) {
    cluster_with(
        tag,
        nodes,
        r#"{"Type":"wireguard","PersistentKeepaliveInterval":5}"#,
    )
}

fn cluster_with(tag: &str, nodes: u8, backend: &str) -> (tempfile::TempDir, Cluster) {
    let (w, c) = cluster::start(
        tag,
        &cluster::net_conf(backend),
        nodes,
        &["--traffic-manager=none", "--dataplane=userspace"],
    );
    for i in 0..c.nodes.len() {
        assert_dataplane(&c.subnet_file(i), "wireguard", "userspace");
    }
    (w, c)
}

#[test]
fn wireguard_three_nodes() {
    require_root!();
    let (_w, mut c) = cluster("wg3", 3);
    for n in 0..3 {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
    }
    c.assert_mesh();
    // flannel's shape: device, MTU, address, route, key file, lease bytes.
    let env = c.subnet_env(0).expect("subnet.env");
    assert!(env.contains("FLANNEL_MTU=1420"), "{env}");
    let link = c.nodes[0]
        .ns
        .exec(&["ip", "-d", "link", "show", "flannel-wg"]);
    assert!(link.contains("mtu 1420"), "{link}");
    let routes = c.nodes[0]
        .ns
        .exec(&["ip", "route", "show", "10.244.0.0/16"]);
    assert!(
        routes.contains("dev flannel-wg") && routes.contains("scope link"),
        "{routes}"
    );
    let key_file = c.nodes[0].dir.join("wgkey");
    let meta = std::fs::metadata(&key_file).expect("key file");
    assert_eq!(meta.permissions().mode() & 0o777, 0o400);
    let key_text = std::fs::read_to_string(&key_file).expect("key");
    assert_eq!(key_text.len(), 44);
    let pubkey = c.nodes[0]
        .ns
        .sh(&format!("wg pubkey < {}", key_file.display()));
    let lease = c.lease_of("192.0.2.1");
    assert_eq!(lease["value"]["BackendType"], "wireguard");
    assert_eq!(lease["value"]["BackendData"]["PublicKey"], pubkey.trim());
    assert_eq!(lease["value"]["BackendData"]["Port"], 51820);
    // Full-size packets and TCP both ways.
    c.assert_df_ping(0, 1, 1420, false);
    for (a, b) in [(0, 1), (2, 0)] {
        let bytes = iperf_bytes(&c.pods[a].ns, &c.pods[b].ns, &c.pods[b].ip.clone(), 2);
        assert!(
            bytes > 1_000_000,
            "iperf3 {a}->{b} moved only {bytes} bytes"
        );
    }
    // Devices go with the daemon.
    c.stop_weftd(0);
    let links = c.nodes[0].ns.exec(&["ip", "link"]);
    assert!(
        !links.contains("flannel-wg"),
        "device left behind:\n{links}"
    );
}

/// Node 2 is wireguard-go + wg, configured from node 1's lease exactly as a
/// flannel wireguard node would configure its kernel device.
#[test]
fn interoperates_with_wireguard_go() {
    require_root!();
    require_tool!("wireguard-go", "wireguard-go", "wireguard-go");
    require_tool!("wg", "wg", "wireguard-tools");
    let (_w, mut c) = cluster("wgi", 2);
    c.stop_weftd(1);
    let n1 = c.lease_of("192.0.2.1");
    let n1_subnet = n1["key"].as_str().expect("key").replace('-', "/");
    let n1_pub = n1["value"]["BackendData"]["PublicKey"]
        .as_str()
        .expect("pubkey")
        .to_string();
    let n1_port = n1["value"]["BackendData"]["Port"].as_u64().expect("port");
    let n2 = &c.nodes[1].ns;
    let key_file = c.nodes[1].dir.join("wg-go.key");
    let go = WireguardGo::start(n2, &key_file);
    let n2_pub = go.public_key.clone();
    let (sub2, gw2) = ("10.244.200.0/24", "10.244.200.0");
    n2.sh(&format!(
        "wg set flannel-wg private-key {key} listen-port 51820 peer {n1_pub} allowed-ips {n1_subnet} endpoint 192.0.2.1:{n1_port}
         ip addr add {gw2}/32 dev flannel-wg
         ip link set flannel-wg mtu 1420 up
         ip route replace 10.244.0.0/16 dev flannel-wg scope link
         ip link add cni0 type bridge; ip addr add 10.244.200.1/24 dev cni0; ip link set cni0 up
         sysctl -qw net.ipv4.ip_forward=1",
        key = key_file.display()
    ));
    let data = format!(
        r#"{{"PublicIP":"192.0.2.2","PublicIPv6":null,"BackendType":"wireguard","BackendData":{{"PublicKey":"{n2_pub}","Port":51820}}}}"#
    );
    c.weft_leases(&["put", "10.244.200.0-24", &data])
        .unwrap_or_else(|e| panic!("weft leases put: {e}"));
    let _ = sub2;
    let kp = c.hand_made_pod(1, "10.244.200.2/24", "10.244.200.1");
    c.add_pod(0, "w").expect("pod on the weft node");
    let wpod = c.pods[0].ip.clone();
    wait_for(
        "weft to learn the wireguard-go node",
        Duration::from_secs(30),
        || c.log(0).contains("10.244.200.0-24").then_some(()),
    );
    assert!(
        wait_ping(&c.pods[0].ns, "10.244.200.2"),
        "weft pod -> wireguard-go pod failed; log:\n{}\n{}",
        c.log(0),
        c.nodes[1].ns.exec(&["wg", "show"])
    );
    assert!(wait_ping(&kp, &wpod), "wireguard-go pod -> weft pod failed");
    let shown = c.nodes[1].ns.exec(&["wg", "show", "flannel-wg"]);
    assert!(
        shown.contains("latest handshake"),
        "no handshake on the wireguard-go side:\n{shown}"
    );
    assert!(
        iperf_bytes(&c.pods[0].ns, &kp, "10.244.200.2", 2) > 1_000_000,
        "TCP weft -> wireguard-go"
    );
    assert!(
        iperf_bytes(&kp, &c.pods[0].ns, &wpod, 2) > 1_000_000,
        "TCP wireguard-go -> weft"
    );
}

/// A node that comes back with a new key (key file deleted, restart)
/// publishes it, and every peer re-establishes its session with it.
#[test]
fn key_rotation_reestablishes_every_peer() {
    require_root!();
    let (_w, mut c) = cluster("wgk", 3);
    for n in 0..3 {
        c.add_pod(n, &format!("p{n}")).expect("pod");
    }
    for a in [0, 2] {
        assert!(
            wait_ping(&c.pods[a].ns, &c.pods[1].ip),
            "no initial connectivity {a} -> 1"
        );
    }
    let old = c.lease_of("192.0.2.2")["value"]["BackendData"]["PublicKey"].clone();
    c.stop_weftd(1);
    std::fs::remove_file(c.nodes[1].dir.join("wgkey")).expect("rm key");
    c.start_weftd(1).expect("restart");
    wait_for(
        "node 2 to publish a new key",
        Duration::from_secs(30),
        || {
            let l = c
                .leases()
                .into_iter()
                .find(|l| l["value"]["PublicIP"] == "192.0.2.2")?;
            (l["value"]["BackendData"]["PublicKey"] != old).then_some(())
        },
    );
    for a in [0, 2] {
        assert!(
            wait_ping(&c.pods[a].ns, &c.pods[1].ip),
            "{a} -> 1 after rotation; logs:\n{}\n{}",
            c.log(a),
            c.log(1)
        );
        assert!(
            wait_ping(&c.pods[1].ns, &c.pods[a].ip),
            "1 -> {a} after rotation"
        );
    }
    assert!(
        wait_ping(&c.pods[0].ns, &c.pods[2].ip),
        "untouched pair broke"
    );
}

/// A node restarted with the same key (new process, fresh sessions) is
/// reachable again within a round trip of its start: it sends a handshake
/// initiation to every peer at once, so the peers drop the session they
/// still hold with the old process instead of encrypting into it until
/// their 15 s rekey timer fires. No persistent keepalive, so nothing else
/// would start a handshake early. Prints the gap.
#[test]
fn restart_with_same_key_recovers_at_once() {
    require_root!();
    let (_w, mut c) = cluster_with("wgr", 2, r#"{"Type":"wireguard"}"#);
    for n in 0..2 {
        c.add_pod(n, &format!("p{n}")).expect("pod");
    }
    assert!(
        wait_ping(&c.pods[0].ns, &c.pods[1].ip),
        "no initial connectivity 0 -> 1"
    );
    assert!(
        wait_ping(&c.pods[1].ns, &c.pods[0].ip),
        "no initial connectivity 1 -> 0"
    );
    let key = std::fs::read_to_string(c.nodes[1].dir.join("wgkey")).expect("key");
    c.stop_weftd(1);
    let t0 = std::time::Instant::now();
    c.start_weftd(1).expect("restart");
    c.wait_ready(1, Duration::from_secs(60))
        .expect("ready after restart");
    let ready = t0.elapsed();
    // One reply, probing every 50 ms, for at most 30 s.
    let ip = c.pods[1].ip.clone();
    let out = c.pods[0]
        .ns
        .try_exec(&["ping", "-c", "1", "-i", "0.05", "-w", "30", &ip]);
    let gap = t0.elapsed();
    eprintln!("restart gap: first reply {gap:?} after the restart (weftd ready after {ready:?})");
    assert!(
        out.status.success(),
        "no reply after the restart; logs:\n{}\n{}",
        c.log(0),
        c.log(1)
    );
    assert_eq!(
        std::fs::read_to_string(c.nodes[1].dir.join("wgkey")).expect("key"),
        key,
        "the key was reused"
    );
    // The peer's rekey timer fires 15 s after the last packet it received;
    // a reply well before that came through the restarted node's initiation.
    assert!(
        gap < Duration::from_secs(10),
        "the first reply waited {gap:?}: the peer kept its old session until its rekey timer"
    );
    assert!(
        wait_ping(&c.pods[1].ns, &c.pods[0].ip),
        "1 -> 0 after the restart"
    );
}
