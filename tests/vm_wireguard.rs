//! Kernel WireGuard in guests on Debian's stock kernel (this machine's
//! kernel has no wireguard module): three dual-stack nodes with
//! `--dataplane=kernel`, programmed exactly as flannel programs them (spec
//! §2.6, §5): devices `flannel-wg` / `flannel-wg-v6`, one key for both,
//! listen ports 51820 / 51821, MTU cfg − 80, `<subnet IP>/32` (`/128`),
//! routes `Network dev flannel-wg scope link`, per peer endpoint
//! `PublicIP:Port`, allowed-ips = its subnet, the PSK and the keepalive;
//! pods ping across nodes (v4 and v6), carry a TCP transfer and full-MTU
//! pings with DF set.

use std::collections::BTreeMap;

use weft_tests::vm::LabSpec;
use weft_tests::vm::net as guests;

/// A valid WireGuard preshared key (base64 of 32 bytes).
const PSK: &str = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=";

/// `wg show all dump`: interface lines (5 fields) and peer lines (9).
#[derive(Debug, Default)]
struct Dump {
    /// device → (public key, listen port)
    devices: BTreeMap<String, (String, String)>,
    /// (device, peer public key) → [psk, endpoint, allowed-ips, handshake, rx, tx, keepalive]
    peers: BTreeMap<(String, String), Vec<String>>,
}

fn dump(text: &str) -> Dump {
    let mut d = Dump::default();
    for l in text.lines() {
        let f: Vec<&str> = l.split('\t').collect();
        match f.len() {
            5 => {
                d.devices.insert(f[0].into(), (f[2].into(), f[3].into()));
            }
            9 => {
                d.peers.insert(
                    (f[0].into(), f[1].into()),
                    f[2..].iter().map(|s| s.to_string()).collect(),
                );
            }
            _ => panic!("unexpected wg dump line: {l:?}"),
        }
    }
    d
}

#[test]
fn kernel_wireguard_three_dual_stack_nodes_as_flannel() {
    let kit = weft_tests::require_vm!();
    let conf = format!(
        r#"{{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:244::/56","Backend":{{"Type":"wireguard","PSK":"{PSK}","PersistentKeepaliveInterval":25}}}}"#
    );
    let c = guests::net(
        &kit,
        &LabSpec::new("wg", 3).with_ipv6(),
        &conf,
        &["--ip-masq", "--dataplane=kernel"],
        &[],
    );
    let pods = c.pods();
    let first = c.first_packet(&pods[0], &pods[1]);
    for d in &c.weftd {
        let log = d.log();
        assert!(
            log.contains("(kernel module)"),
            "not the kernel path:\n{log}"
        );
    }
    guests::mesh_ping(&pods);

    // Leases: flannel's BackendData / BackendV6Data.
    let dumps: Vec<Dump> = c
        .lab
        .nodes()
        .iter()
        .map(|n| dump(&n.ok("wg show all dump")))
        .collect();
    let mut keys = Vec::new();
    for (i, d) in dumps.iter().enumerate() {
        let (k4, p4) = &d.devices["flannel-wg"];
        let (k6, p6) = &d.devices["flannel-wg-v6"];
        assert_eq!(
            (p4.as_str(), p6.as_str()),
            ("51820", "51821"),
            "node {i} ports"
        );
        assert_eq!(k4, k6, "node {i}: one key serves both devices");
        let lease = c.lease(i);
        assert_eq!(lease["BackendType"], "wireguard");
        assert_eq!(lease["BackendData"]["PublicKey"], k4.as_str(), "{lease}");
        assert_eq!(lease["BackendData"]["Port"], 51820, "{lease}");
        assert_eq!(lease["BackendV6Data"]["PublicKey"], k4.as_str(), "{lease}");
        assert_eq!(lease["BackendV6Data"]["Port"], 51821, "{lease}");
        assert_eq!(lease["PublicIPv6"], format!("fd00::{}", i + 1), "{lease}");
        keys.push(k4.clone());
    }

    // Peers: every other node on both devices, as flannel configures them.
    let subnets: Vec<String> = c.lab.nodes().iter().map(|n| n.pod_subnet()).collect();
    let subnets6: Vec<String> = c
        .envs
        .iter()
        .map(|e| e["FLANNEL_IPV6_SUBNET"].replace("::1/", "::/"))
        .collect();
    for (i, d) in dumps.iter().enumerate() {
        assert_eq!(d.peers.len(), 4, "node {i}: 2 peers x 2 devices: {d:?}");
        for j in (0..3).filter(|j| *j != i) {
            let n = c.lab.node(j);
            let p4 = &d.peers[&("flannel-wg".to_string(), keys[j].clone())];
            let p6 = &d.peers[&("flannel-wg-v6".to_string(), keys[j].clone())];
            assert_eq!(p4[0], PSK, "node {i} peer {j}: psk");
            assert_eq!(p6[0], PSK, "node {i} peer {j}: psk v6");
            assert_eq!(p4[1], format!("{}:51820", n.addr()));
            assert_eq!(p6[1], format!("[{}]:51821", n.addr6().expect("v6")));
            assert_eq!(p4[2], subnets[j], "node {i} peer {j}: allowed-ips");
            assert_eq!(p6[2], subnets6[j], "node {i} peer {j}: allowed-ips v6");
            assert_eq!((p4[6].as_str(), p6[6].as_str()), ("25", "25"), "keepalive");
        }
    }

    // The key file as flannel writes it (spec §5): 44 base64 characters
    // without a newline, mode 0400, and the devices' private key.
    for n in c.lab.nodes() {
        let out = n.ok(
            "stat -c '%a %s' /run/flannel/wgkey; cat /run/flannel/wgkey; echo; wg show flannel-wg private-key; wg show flannel-wg-v6 private-key",
        );
        let l: Vec<&str> = out.lines().collect();
        assert_eq!(l.first(), Some(&"400 44"), "{}: key file: {out}", n.name());
        assert!(
            l.len() == 4 && l[1] == l[2] && l[2] == l[3],
            "{}: {out}",
            n.name()
        );
    }

    // Devices, addresses, routes, MTU on node 1.
    let n = c.lab.node(0);
    let link = n.ok("ip -d link show flannel-wg; ip -d link show flannel-wg-v6");
    assert_eq!(link.matches("mtu 1420").count(), 2, "{link}");
    assert_eq!(link.matches("wireguard").count(), 2, "{link}");
    let a4 = n.ok("ip -4 -o addr show dev flannel-wg");
    let ip4 = subnets[0].trim_end_matches("/24");
    assert!(a4.contains(&format!("inet {ip4}/32")), "{a4}");
    let a6 = n.ok("ip -6 -o addr show dev flannel-wg-v6 scope global");
    let ip6 = subnets6[0].trim_end_matches("/64");
    assert!(a6.contains(&format!("inet6 {ip6}/128")), "{a6}");
    let r4 = n.ok("ip route show dev flannel-wg");
    assert!(r4.contains("10.244.0.0/16 scope link"), "{r4}");
    let r6 = n.ok("ip -6 route show dev flannel-wg-v6");
    assert!(r6.contains("fd00:244::/56"), "{r6}");
    assert_eq!(c.mtu(0), 1420);

    // Traffic: TCP both families, full-MTU pings with DF both families.
    guests::tcp(&pods[0], &pods[1], &pods[1].ip(false));
    guests::tcp(&pods[2], &pods[0], &pods[0].ip(true));
    guests::df_ping(&pods[0], &pods[2].ip(false), 1420);
    guests::df_ping(&pods[1], &pods[2].ip(true), 1420);

    // The traffic went through WireGuard: handshakes done, counters moved.
    let after = dump(&n.ok("wg show all dump"));
    for ((dev, key), p) in &after.peers {
        assert_ne!(p[3], "0", "{dev} peer {key}: no handshake: {p:?}");
        let (rx, tx): (u64, u64) = (p[4].parse().expect("rx"), p[5].parse().expect("tx"));
        assert!(rx > 0 && tx > 0, "{dev} peer {key}: rx {rx} tx {tx}");
    }
    let v4_rx: u64 = after
        .peers
        .iter()
        .filter(|((d, k), _)| d == "flannel-wg" && *k == keys[1])
        .map(|(_, p)| p[4].parse::<u64>().expect("rx"))
        .sum();
    assert!(
        v4_rx > 1 << 20,
        "node 1 got only {v4_rx} bytes from node 2 over flannel-wg after the 1 MiB download"
    );
    c.report("kernel wireguard (3 nodes, dual stack)", first);
}
