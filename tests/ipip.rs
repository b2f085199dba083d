//! The `ipip` backend's userspace path through real weftd daemons: every
//! node runs `--dataplane=userspace` (the engine on a raw IPPROTO_IPIP
//! socket, same wire format as flannel's kernel ipip nodes) and `weft
//! status` must say so, whatever ipip support the kernel has (auto's choice
//! is tested in tests/vm_switch.rs, on this kernel and a stock one).
//!
//! - A 3-node cluster: `flannel.ipip` with `<subnet IP>/32` and MTU ext − 20,
//!   a route per peer, full-mesh ping, DF pings of exactly the MTU, TCP both
//!   ways, and IPv4 protocol 4 between the nodes' addresses on the underlay.
//! - Hand-made IPIP packets sent to a node (unknown outer source, inner
//!   source outside the sending peer's subnet, malformed inner packets) never
//!   reach the pod and are counted by reason in the status; a valid one does.

use std::process::Stdio;
use std::time::Duration;

use weft_control::status::model::Drops;
use weft_testenv::require_root;
use weft_tests::cluster::{self, Cluster};
use weft_tests::weftd::assert_dataplane;

fn cluster(tag: &str, nodes: u8) -> (tempfile::TempDir, Cluster) {
    cluster::start(
        tag,
        &cluster::net_conf(r#"{"Type":"ipip"}"#),
        nodes,
        &["--traffic-manager=none", "--dataplane=userspace"],
    )
}

fn engine_drops(c: &Cluster, n: usize) -> Drops {
    let st = c.status(n);
    let dev = st
        .backend
        .devices
        .iter()
        .find(|d| d.name == "flannel.ipip")
        .expect("flannel.ipip in status");
    dev.drops.expect("engine drops")
}

#[test]
fn ipip_three_nodes_userspace_full_mesh() {
    require_root!();
    let (_w, mut c) = cluster("ip", 3);
    for n in 0..3 {
        c.add_pod(n, &format!("p{n}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
        assert_dataplane(&c.subnet_file(n), "ipip", "userspace");
        // The device as flannel's: /32 of the subnet IP, MTU ext - 20.
        assert_eq!(c.env_var(n, "FLANNEL_MTU"), "1480");
        let sn = c.env_var(n, "FLANNEL_SUBNET");
        let ip = sn.split('/').next().expect("ip").to_string();
        let net = format!("{}.0/32", ip.rsplit_once('.').expect("dotted").0);
        let link = c.nodes[n]
            .ns
            .exec(&["ip", "-o", "addr", "show", "dev", "flannel.ipip"]);
        assert!(link.contains(&net), "address {net} on flannel.ipip: {link}");
        let l = c.nodes[n]
            .ns
            .exec(&["ip", "-o", "link", "show", "dev", "flannel.ipip"]);
        assert!(l.contains("mtu 1480"), "{l}");
    }
    c.assert_mesh();
    // One route per peer subnet on the device.
    let routes = c.nodes[0]
        .ns
        .exec(&["ip", "route", "show", "dev", "flannel.ipip"]);
    assert_eq!(
        routes.lines().filter(|l| l.starts_with("10.244.")).count(),
        2,
        "{routes}"
    );
    // DF pings of exactly the MTU pass; one byte more does not.
    c.assert_df_ping(0, 1, 1480, true);
    // The underlay carries IPv4 protocol 4 between the nodes' addresses.
    let dump = c.nodes[1]
        .ns
        .command("tcpdump")
        .args([
            "-n",
            "-c",
            "1",
            "-i",
            "eth0",
            "ip proto 4 and src 192.0.2.1",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("tcpdump");
    std::thread::sleep(Duration::from_millis(800));
    assert!(c.pods[0].ns.ping(&c.pods[1].ip, 2));
    let text =
        String::from_utf8_lossy(&dump.wait_with_output().expect("tcpdump").stdout).to_string();
    // (The first echo request may be the node's own, from its flannel.ipip address.)
    let sub1 = c.env_var(1, "FLANNEL_SUBNET");
    let dst_net = sub1.rsplit_once('.').expect("dotted").0;
    assert!(
        text.contains("192.0.2.1 > 192.0.2.2: IP 10.244.")
            && text.contains(&format!("> {dst_net}."))
            && text.contains("ICMP echo request"),
        "IPIP on the wire: {text}"
    );
    // TCP both ways.
    for (a, b) in [(0, 1), (2, 0), (1, 2)] {
        let bytes = c.iperf_bytes(a, b, 2);
        assert!(
            bytes > 1_000_000,
            "iperf3 {a}->{b} moved only {bytes} bytes"
        );
    }
    let d = engine_drops(&c, 0);
    assert_eq!(
        d.malformed + d.unknown_peer + d.spoofed_source + d.udp_send_error + d.io_error,
        0,
        "{d:?}"
    );
}

/// A python3 script sending IPIP packets from this namespace with any outer
/// source (IPPROTO_RAW builds the outer header itself). `packets` are
/// `(outer_src, inner_src, kind)`, kind one of valid, truncated, inner6, empty.
fn raw_sender(dst: &str, pod: &str, packets: &[(&str, &str, &str)]) -> String {
    let list: Vec<String> = packets
        .iter()
        .map(|(o, i, k)| format!("('{o}','{i}','{k}')"))
        .collect();
    format!(
        r#"
import socket, struct
def csum(b):
    s = sum(struct.unpack('!%dH' % (len(b) // 2), b))
    s = (s >> 16) + (s & 0xffff); s += s >> 16
    return (~s) & 0xffff
def ip(src, dst, proto, payload):
    h = struct.pack('!BBHHHBBH4s4s', 0x45, 0, 20 + len(payload), 1, 0x4000, 64, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack('!H', csum(h)) + h[12:] + payload
s = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW)
for outer, inner_src, kind in [{list}]:
    data = ('weft-' + kind + '-' + outer + '-' + inner_src).encode()
    inner = ip(inner_src, '{pod}', 17, struct.pack('!HHHH', 5000, 9999, 8 + len(data), 0) + data)
    if kind == 'truncated': inner = inner[:24]
    if kind == 'inner6': inner = bytes([0x60]) + inner[1:]
    if kind == 'empty': inner = b''
    s.sendto(ip(outer, '{dst}', 4, inner), ('{dst}', 0))
"#,
        list = list.join(",")
    )
}

#[test]
fn ipip_spoofed_and_malformed_packets_are_dropped_and_counted() {
    require_root!();
    let (_w, mut c) = cluster("is", 2);
    assert_dataplane(&c.subnet_file(0), "ipip", "userspace");
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    assert!(
        c.wait_ping(1, 0),
        "no initial connectivity; logs:\n{}",
        c.log(0)
    );
    let pod = c.pods[0].ip.clone();
    // Node 1's own subnet (a source it may use) and one it does not own.
    let own = c
        .env_var(1, "FLANNEL_SUBNET")
        .split('/')
        .next()
        .expect("ip")
        .to_string();
    let base = own.rsplit_once('.').expect("dotted").0.to_string();
    let (good_src, foreign_src) = (format!("{base}.77"), "10.244.250.9".to_string());
    let listener = c.pods[0]
        .ns
        .command("python3")
        .args([
            "-c",
            &format!(
                "import socket,sys\ns=socket.socket(2,2)\ns.bind(('{pod}',9999))\ns.settimeout(6)\n\
                 try:\n    while True: print(s.recv(2000).decode(), flush=True)\nexcept Exception: pass\n"
            ),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("listener");
    std::thread::sleep(Duration::from_millis(500));
    let before = engine_drops(&c, 0);
    let script = raw_sender(
        "192.0.2.1",
        &pod,
        &[
            // No peer's address, no peer's subnet (a source in node 2's
            // subnet would pass --anti-spoofing=subnet, the default).
            ("192.0.2.77", &foreign_src, "valid"),
            ("192.0.2.2", &foreign_src, "valid"),
            ("192.0.2.2", &good_src, "truncated"),
            ("192.0.2.2", &good_src, "inner6"),
            ("192.0.2.2", &good_src, "empty"),
            ("192.0.2.2", &good_src, "valid"),
        ],
    );
    let out = c.nodes[1].ns.try_exec(&["python3", "-c", &script]);
    assert!(
        out.status.success(),
        "raw sender: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let got =
        String::from_utf8_lossy(&listener.wait_with_output().expect("listener").stdout).to_string();
    assert!(
        got.contains(&format!("weft-valid-192.0.2.2-{good_src}")),
        "the valid packet arrived: {got:?}"
    );
    assert_eq!(
        got.lines().count(),
        1,
        "only the valid packet reaches the pod: {got:?}"
    );
    let after = engine_drops(&c, 0);
    assert_eq!(after.unknown_peer, before.unknown_peer + 1, "{after:?}");
    assert_eq!(after.spoofed_source, before.spoofed_source + 1, "{after:?}");
    assert_eq!(after.malformed, before.malformed + 3, "{after:?}");
    // Still healthy.
    assert!(c.wait_ping(1, 0));
}
