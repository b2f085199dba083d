//! Observability end to end (issue 11), on 2-node clusters in network
//! namespaces: `weft status` (text and `--json`, whose shape is fixed by the
//! snapshot `control/src/status/snapshots/status.shape.json`), the status
//! counters against what ping and iperf3 sent, drop counters raised by
//! crafted VXLAN datagrams (unknown peer, spoofed inner source, bad VNI, bad
//! inner MAC), `/metrics` on the healthz listener parsed as Prometheus
//! text, and the per-peer counters and last handshake of the userspace
//! WireGuard and IPIP engines, read over the HTTP listener (`--http`); and
//! that status, health and lease renewal never wait for a slow backend
//! (issue 33).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::Duration;

use serde_json::Value;
use weft_testenv::require_root;
use weft_tests::cluster::{self, Cluster};
use weft_tests::proc::wait_for;
use weft_tests::proxy::in_netns;

const HEALTHZ_PORT: u16 = 9099;

fn cluster(tag: &str, dataplane: &str) -> (tempfile::TempDir, Cluster) {
    cluster_of(tag, "vxlan", dataplane)
}

fn cluster_of(tag: &str, backend: &str, dataplane: &str) -> (tempfile::TempDir, Cluster) {
    cluster::start(
        tag,
        &cluster::net_conf(&format!(r#"{{"Type":"{backend}"}}"#)),
        2,
        &[
            "--traffic-manager=none",
            &format!("--dataplane={dataplane}"),
            &format!("--healthz-port={HEALTHZ_PORT}"),
            "--engine-workers=2",
            // The counters are checked to the packet: no overlay probes.
            "--probe-port=0",
        ],
    )
}

fn weft(args: &[&str]) -> std::process::Output {
    std::process::Command::new(weft_tests::bins::path("weft"))
        .args(args)
        .output()
        .expect("run weft")
}

fn subnet_file(c: &Cluster, node: usize) -> String {
    format!(
        "--subnet-file={}",
        c.nodes[node].dir.join("subnet.env").display()
    )
}

/// `weft status --json` of `node`, checked against the shape snapshot.
fn status(c: &Cluster, node: usize) -> Value {
    checked_status(weft(&["status", "--json", &subnet_file(c, node)]))
}

/// The JSON that a `weft status --json` run printed, checked against the shape snapshot.
fn checked_status(out: std::process::Output) -> Value {
    assert!(
        out.status.success(),
        "weft status failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("weft status --json prints JSON");
    let shape: Value =
        serde_json::from_str(weft_control::status::shape::SHAPE).expect("shape snapshot");
    weft_control::status::shape::check(&v, &shape).unwrap_or_else(|e| panic!("shape: {e}\n{v:#}"));
    v
}

fn own_subnet(c: &Cluster, node: usize) -> String {
    let env = c.subnet_env(node).expect("subnet.env");
    let s = env
        .lines()
        .find_map(|l| l.strip_prefix("FLANNEL_SUBNET="))
        .expect("FLANNEL_SUBNET");
    s.replace(".1/", ".0/")
}

fn dev_counter(v: &Value, field: &str) -> u64 {
    v["backend"]["devices"][0]["counters"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no counter {field} in {v:#}"))
}

fn peer<'a>(v: &'a Value, subnet: &str) -> &'a Value {
    v["peers"]
        .as_array()
        .and_then(|ps| ps.iter().find(|p| p["subnet"] == subnet))
        .unwrap_or_else(|| panic!("no peer {subnet} in {v:#}"))
}

fn drop_count(v: &Value, reason: &str) -> u64 {
    v["backend"]["devices"][0]["drops"][reason]
        .as_u64()
        .unwrap_or_else(|| panic!("no drop counter {reason} in {v:#}"))
}

fn assert_within(what: &str, got: u64, lo: u64, hi: u64) {
    assert!(
        (lo..=hi).contains(&got),
        "{what}: {got} not within [{lo}, {hi}]"
    );
}

fn wait_ping(c: &Cluster, a: usize, b: usize) {
    assert!(
        c.wait_ping(a, b),
        "pod {a} cannot reach pod {b}; log:\n{}",
        c.log(a)
    );
}

/// 20 pings of 128-byte IP packets, 50 ms apart, from pod 0 to pod 1.
fn ping_20(c: &Cluster) -> std::process::Output {
    c.pods[0].ns.try_exec(&[
        "ping",
        "-c",
        "20",
        "-i",
        "0.05",
        "-s",
        "100",
        "-W",
        "2",
        &c.pods[1].ip,
    ])
}

/// `GET /metrics` from inside node `node`; parsed as Prometheus text.
fn metrics(c: &Cluster, node: usize) -> BTreeMap<String, f64> {
    let addr: SocketAddr = format!("{}:{HEALTHZ_PORT}", c.nodes[node].addr)
        .parse()
        .expect("addr");
    let raw = in_netns(&c.nodes[node].ns.path(), move || {
        let mut s =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).expect("connect to healthz");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    });
    let (head, body) = raw.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    parse_prometheus(body)
        .unwrap_or_else(|e| panic!("/metrics is not Prometheus text: {e}\n{body}"))
}

/// Prometheus text 0.0.4: `# HELP`/`# TYPE` comments, `name{labels} value` samples.
fn parse_prometheus(text: &str) -> Result<BTreeMap<String, f64>, String> {
    let mut out = BTreeMap::new();
    let mut typed = std::collections::BTreeSet::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').ok_or(format!("bad TYPE {line:?}"))?;
            if !["counter", "gauge", "histogram"].contains(&ty) {
                return Err(format!("unexpected type {line:?}"));
            }
            typed.insert(name.to_string());
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').ok_or(format!("no value: {line:?}"))?;
        let v: f64 = value.parse().map_err(|_| format!("bad value: {line:?}"))?;
        let name = series.split('{').next().unwrap_or_default();
        let valid = !name.is_empty()
            && name
                .chars()
                .all(|ch| ch.is_ascii_alphanumeric() || ch == '_');
        let labels = &series[name.len()..];
        if !valid || !(labels.is_empty() || labels.starts_with('{') && labels.ends_with('}')) {
            return Err(format!("bad series: {line:?}"));
        }
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|s| name.strip_suffix(s))
            .filter(|f| typed.contains(*f));
        if !typed.contains(name) && family.is_none() {
            return Err(format!("sample without a TYPE: {line:?}"));
        }
        out.insert(series.to_string(), v);
    }
    Ok(out)
}

/// A VXLAN datagram carrying a small IPv4/UDP packet.
fn vxlan_datagram(vni: u32, dst_mac: [u8; 6], inner_src: [u8; 4], inner_dst: [u8; 4]) -> Vec<u8> {
    let mut p = vec![0x08, 0, 0, 0];
    p.extend_from_slice(&(vni << 8).to_be_bytes());
    p.extend_from_slice(&dst_mac);
    p.extend_from_slice(&[0x02, 0, 0, 0, 0, 0x42, 0x08, 0x00]);
    let payload = b"weft observability";
    let total = u16::try_from(20 + 8 + payload.len()).expect("len");
    let mut ip = vec![0x45, 0];
    ip.extend_from_slice(&total.to_be_bytes());
    ip.extend_from_slice(&[0, 1, 0x40, 0, 64, 17, 0, 0]);
    ip.extend_from_slice(&inner_src);
    ip.extend_from_slice(&inner_dst);
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    let ck = !u16::try_from(sum).expect("folded");
    ip[10..12].copy_from_slice(&ck.to_be_bytes());
    p.extend_from_slice(&ip);
    p.extend_from_slice(&[0x30, 0x39, 0x30, 0x39]);
    p.extend_from_slice(&u16::try_from(8 + payload.len()).expect("len").to_be_bytes());
    p.extend_from_slice(&[0, 0]);
    p.extend_from_slice(payload);
    p
}

/// Sends `n` copies of `dgram` from `src` (inside namespace `ns`, a path) to `dst`.
fn send(ns: &str, src: &str, dst: SocketAddr, dgram: &[u8], n: usize) {
    let src: SocketAddr = format!("{src}:0").parse().expect("src");
    in_netns(ns, || {
        let s = UdpSocket::bind(src).expect("bind sender");
        for _ in 0..n {
            s.send_to(dgram, dst).expect("send");
            std::thread::sleep(Duration::from_millis(2));
        }
    });
}

fn parse_mac(s: &str) -> [u8; 6] {
    let v: Vec<u8> = s
        .split(':')
        .map(|h| u8::from_str_radix(h, 16).expect("hex"))
        .collect();
    v.try_into().expect("6 bytes")
}

fn ipv4(s: &str) -> [u8; 4] {
    s.parse::<std::net::Ipv4Addr>().expect("ipv4").octets()
}

/// Userspace VXLAN: status shows both nodes' peers, the counters match
/// ping and iperf3, crafted datagrams raise the right drop counters, and
/// /metrics agrees.
#[test]
fn userspace_counters_drops_status_and_metrics() {
    require_root!();
    let (_w, mut c) = cluster("ob", "userspace");
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    wait_ping(&c, 0, 1);
    let (s0, s1) = (own_subnet(&c, 0), own_subnet(&c, 1));

    // Both nodes show each other, in text and JSON.
    for (node, other, other_ip) in [(0, &s1, "192.0.2.2"), (1, &s0, "192.0.2.1")] {
        let v = status(&c, node);
        assert_eq!(v["backend"]["name"], "vxlan");
        assert_eq!(v["backend"]["dataplane"], "userspace");
        assert_eq!(v["backend"]["devices"][0]["kind"], "engine");
        // The default window, open or not as the node's CPU allows.
        let window = v["backend"]["devices"][0]["poll_window"].as_str();
        assert!(window.is_some_and(|w| w.starts_with("auto, ")), "{v:#}");
        assert_eq!(v["peers"].as_array().map(Vec::len), Some(1), "{v:#}");
        assert_eq!(peer(&v, other)["public_ip"], other_ip);
        assert_eq!(peer(&v, other)["device"], "flannel.1");
        let out = weft(&["status", &subnet_file(&c, node)]);
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && text.contains(other.as_str()) && text.contains(other_ip),
            "{text}"
        );
        assert!(text.contains("vxlan on the userspace dataplane"), "{text}");
        assert!(text.contains("poll-on window: auto, "), "{text}");
    }

    // ping: N echo requests of 128-byte IP packets, N replies.
    const N: u64 = 20;
    let (b0, b1) = (status(&c, 0), status(&c, 1));
    let out = ping_20(&c);
    assert!(
        out.status.success(),
        "ping failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::thread::sleep(Duration::from_millis(500));
    let (a0, a1) = (status(&c, 0), status(&c, 1));
    let delta = |a: &Value, b: &Value, f: &str| dev_counter(a, f) - dev_counter(b, f);
    assert_within("node 1 tx packets", delta(&a0, &b0, "tx_packets"), N, N + 3);
    assert_within(
        "node 1 tx bytes",
        delta(&a0, &b0, "tx_bytes"),
        N * 128,
        N * 128 + 3 * 1500,
    );
    assert_within("node 1 rx packets", delta(&a0, &b0, "rx_packets"), N, N + 3);
    assert_within("node 2 rx packets", delta(&a1, &b1, "rx_packets"), N, N + 3);
    assert_within(
        "node 2 rx bytes",
        delta(&a1, &b1, "rx_bytes"),
        N * 128,
        N * 128 + 3 * 1500,
    );
    assert_within("node 2 tx packets", delta(&a1, &b1, "tx_packets"), N, N + 3);
    // Per peer: node 1's only peer carried all of it.
    let pc = |v: &Value, f: &str| {
        peer(v, &s1)["counters"][f]
            .as_u64()
            .unwrap_or_else(|| panic!("no peer counters: {v:#}"))
    };
    assert_within(
        "peer tx packets",
        pc(&a0, "tx_packets") - pc(&b0, "tx_packets"),
        N,
        N + 3,
    );
    assert_within(
        "peer rx bytes",
        pc(&a0, "rx_bytes") - pc(&b0, "rx_bytes"),
        N * 128,
        N * 128 + 3 * 1500,
    );

    // iperf3, pod a -> pod b: node 1 sends at least what was received, and
    // not much more than what was sent (TCP/IP headers, a few retransmits).
    let (b0, b1) = (status(&c, 0), status(&c, 1));
    let server = &c.pods[1];
    server
        .ns
        .exec(&["iperf3", "-s", "-1", "-D", "-B", &server.ip]);
    std::thread::sleep(Duration::from_millis(300));
    let out = c.pods[0]
        .ns
        .try_exec(&["iperf3", "-c", &server.ip, "-t", "2", "-J"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let (sent, received) = (
        v["end"]["sum_sent"]["bytes"].as_u64().unwrap_or(0),
        v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0),
    );
    assert!(
        received > 1_000_000,
        "iperf3 moved only {received} bytes: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    std::thread::sleep(Duration::from_millis(500));
    let (a0, a1) = (status(&c, 0), status(&c, 1));
    let hi = sent + sent / 10 + 1_000_000;
    assert_within(
        "node 1 tx bytes under iperf3",
        delta(&a0, &b0, "tx_bytes"),
        received,
        hi,
    );
    assert_within(
        "node 2 rx bytes under iperf3",
        delta(&a1, &b1, "rx_bytes"),
        received,
        hi,
    );
    assert_within(
        "peer tx bytes under iperf3",
        pc(&a0, "tx_bytes") - pc(&b0, "tx_bytes"),
        received,
        hi,
    );
    let batching = &a0["backend"]["devices"][0]["batching"];
    assert!(
        batching["udp_sends"].as_u64().unwrap_or(0) > 0,
        "{batching}"
    );

    // Crafted datagrams to node 1's VXLAN port.
    let leases = weft(&[
        "leases",
        "--json",
        &format!("--store-path={}", c.work().join("store").display()),
    ]);
    let leases: Value = serde_json::from_slice(&leases.stdout).expect("leases json");
    let mac0 = leases
        .as_array()
        .and_then(|ls| ls.iter().find(|l| l["value"]["PublicIP"] == "192.0.2.1"))
        .and_then(|l| l["value"]["BackendData"]["VtepMAC"].as_str())
        .map(parse_mac)
        .expect("node 1 VtepMAC");
    let pod_a = ipv4(&c.pods[0].ip);
    let legit_src = ipv4(&c.pods[1].ip);
    let to: SocketAddr = "192.0.2.1:8472".parse().expect("addr");
    let ns1 = c.nodes[1].ns.path();
    c.nodes[1]
        .ns
        .exec(&["ip", "addr", "add", "192.0.2.77/24", "dev", "eth0"]);
    let before = status(&c, 0);
    const K: u64 = 10;
    let k = usize::try_from(K).expect("k");
    // From an address that is no peer, with an inner source in no peer's
    // subnet (one in node 2's would be delivered by --anti-spoofing=subnet,
    // the default).
    send(
        &ns1,
        "192.0.2.77",
        to,
        &vxlan_datagram(1, mac0, ipv4("10.244.251.7"), pod_a),
        k,
    );
    send(
        &ns1,
        "192.0.2.2",
        to,
        &vxlan_datagram(1, mac0, ipv4("10.244.250.7"), pod_a),
        k,
    );
    send(
        &ns1,
        "192.0.2.2",
        to,
        &vxlan_datagram(2, mac0, legit_src, pod_a),
        k,
    );
    send(
        &ns1,
        "192.0.2.2",
        to,
        &vxlan_datagram(1, [0x02, 0, 0, 0, 0, 0x99], legit_src, pod_a),
        k,
    );
    let after = wait_for("the drop counters", Duration::from_secs(20), || {
        let v = status(&c, 0);
        let done = ["unknown_peer", "spoofed_source", "bad_vni", "wrong_dst_mac"]
            .iter()
            .all(|r| drop_count(&v, r) - drop_count(&before, r) >= K);
        done.then_some(v)
    });
    for r in ["unknown_peer", "spoofed_source", "bad_vni", "wrong_dst_mac"] {
        assert_eq!(
            drop_count(&after, r) - drop_count(&before, r),
            K,
            "drops for {r}: {after:#}"
        );
    }
    assert_eq!(
        drop_count(&after, "malformed"),
        drop_count(&before, "malformed")
    );

    // /metrics agrees with status and carries the daemon metrics.
    let m = metrics(&c, 0);
    let dev = r#"backend="vxlan",dataplane="userspace",device="flannel.1""#;
    let get = |k: String| {
        *m.get(&k)
            .unwrap_or_else(|| panic!("no {k} in /metrics: {:?}", m.keys().collect::<Vec<_>>()))
    };
    let now = status(&c, 0);
    let tx = get(format!("weft_tx_packets_total{{{dev}}}"));
    assert!(
        tx >= dev_counter(&after, "tx_packets") as f64
            && tx <= dev_counter(&now, "tx_packets") as f64,
        "{tx}"
    );
    for r in ["unknown_peer", "spoofed_source", "bad_vni", "wrong_dst_mac"] {
        let d = get(format!(
            r#"weft_drops_total{{backend="vxlan",device="flannel.1",reason="{r}"}}"#
        ));
        assert_eq!(d, drop_count(&after, r) as f64, "metric drops for {r}");
    }
    let peer_tx = get(format!(
        r#"weft_peer_tx_packets_total{{backend="vxlan",device="flannel.1",subnet="{s1}",endpoint="192.0.2.2"}}"#
    ));
    assert!(peer_tx >= (N + 1) as f64, "{peer_tx}");
    assert_eq!(
        get(r#"weft_backend_info{backend="vxlan",dataplane="userspace"}"#.into()),
        1.0
    );
    assert_eq!(get(r#"weft_peers{backend="vxlan"}"#.into()), 1.0);
    assert_eq!(get("weft_lease_acquisitions_total".into()), 1.0);
    assert!(get(r#"weft_peer_apply_seconds_count{op="add"}"#.into()) >= 1.0);
    assert!(get(r#"weft_udp_send_calls_total{backend="vxlan",device="flannel.1"}"#.into()) > 0.0);
    assert!(m.contains_key(
        r#"weft_offload_enabled{backend="vxlan",device="flannel.1",offload="udp_gso"}"#
    ));
    assert_eq!(
        get(r#"weft_engine_workers{backend="vxlan",device="flannel.1"}"#.into()),
        2.0
    );
}

/// Kernel VXLAN: status reports the kernel device and its statistics move
/// with traffic; the peer is listed without per-peer counters.
#[test]
fn kernel_dataplane_status_and_metrics() {
    require_root!();
    let (_w, mut c) = cluster("ok", "kernel");
    c.add_pod(0, "a").expect("pod a");
    c.add_pod(1, "b").expect("pod b");
    wait_ping(&c, 0, 1);
    let s1 = own_subnet(&c, 1);
    let before = status(&c, 0);
    assert_eq!(before["backend"]["dataplane"], "kernel");
    let d = &before["backend"]["devices"][0];
    assert_eq!(
        (d["name"].as_str(), d["kind"].as_str()),
        (Some("flannel.1"), Some("kernel")),
        "{before:#}"
    );
    assert!(d["offloads"].is_null() && d["drops"].is_null() && d["poll_window"].is_null());
    let out = ping_20(&c);
    assert!(out.status.success());
    let after = status(&c, 0);
    // The kernel device counts Ethernet frames (inner packet + 14 bytes).
    assert_within(
        "kernel tx packets",
        dev_counter(&after, "tx_packets") - dev_counter(&before, "tx_packets"),
        20,
        26,
    );
    assert_within(
        "kernel tx bytes",
        dev_counter(&after, "tx_bytes") - dev_counter(&before, "tx_bytes"),
        20 * 128,
        20 * 142 + 6 * 1514,
    );
    assert!(peer(&after, &s1)["counters"].is_null());
    assert_eq!(peer(&after, &s1)["public_ip"], "192.0.2.2");
    let m = metrics(&c, 0);
    assert_eq!(
        m.get(r#"weft_backend_info{backend="vxlan",dataplane="kernel"}"#),
        Some(&1.0)
    );
    assert!(m.contains_key(
        r#"weft_tx_packets_total{backend="vxlan",dataplane="kernel",device="flannel.1"}"#
    ));
    assert!(
        !m.keys().any(|k| k.starts_with("weft_drops_total")),
        "the kernel dataplane has no drop reasons"
    );
}

/// `weft status --http` of `node`, run inside the node's namespace, checked
/// against the shape snapshot.
fn status_http(c: &Cluster, node: usize) -> Value {
    let weft = weft_tests::bins::path("weft");
    let addr = format!("{}:{HEALTHZ_PORT}", c.nodes[node].addr);
    checked_status(c.nodes[node].ns.try_exec(&[
        weft.to_str().expect("utf-8 path"),
        "status",
        "--json",
        "--http",
        &addr,
    ]))
}

fn peer_counter(v: &Value, subnet: &str, field: &str) -> u64 {
    peer(v, subnet)["counters"][field]
        .as_u64()
        .unwrap_or_else(|| panic!("no peer counter {field} for {subnet} in {v:#}"))
}

/// The userspace WireGuard and IPIP engines keep per-peer counters that
/// match ping; WireGuard peers show a recent last handshake (in JSON, text
/// and /metrics); `weft status --http` reads the same status over HTTP.
#[test]
fn wireguard_and_ipip_peer_counters_handshake_and_http() {
    require_root!();
    for (tag, backend) in [("ow", "wireguard"), ("oi", "ipip")] {
        let (_w, mut c) = cluster_of(tag, backend, "auto");
        c.add_pod(0, "a").expect("pod a");
        c.add_pod(1, "b").expect("pod b");
        wait_ping(&c, 0, 1);
        let s1 = own_subnet(&c, 1);
        let before = status_http(&c, 0);
        assert_eq!(before["backend"]["dataplane"], "userspace", "{before:#}");
        const N: u64 = 20;
        let out = ping_20(&c);
        assert!(out.status.success(), "{backend}: ping failed");
        std::thread::sleep(Duration::from_millis(500));
        let after = status_http(&c, 0);
        let d = |f: &str| peer_counter(&after, &s1, f) - peer_counter(&before, &s1, f);
        // Keepalives and handshakes are not inner packets: only the pings count.
        assert_within(
            &format!("{backend} peer tx packets"),
            d("tx_packets"),
            N,
            N + 3,
        );
        assert_within(
            &format!("{backend} peer rx packets"),
            d("rx_packets"),
            N,
            N + 3,
        );
        assert_within(
            &format!("{backend} peer tx bytes"),
            d("tx_bytes"),
            N * 128,
            (N + 3) * 1500,
        );
        assert_within(
            &format!("{backend} peer rx bytes"),
            d("rx_bytes"),
            N * 128,
            (N + 3) * 1500,
        );
        // The socket and HTTP give the same peers.
        let sock = status(&c, 0);
        assert_eq!(
            sock["peers"].as_array().map(Vec::len),
            after["peers"].as_array().map(Vec::len)
        );
        let hs = &peer(&after, &s1)["last_handshake"];
        let m = metrics(&c, 0);
        if backend == "wireguard" {
            let now = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .expect("clock")
                .as_secs();
            let at = hs
                .as_u64()
                .unwrap_or_else(|| panic!("no last_handshake in {after:#}"));
            assert_within("last handshake", at, now - 180, now + 1);
            let text =
                String::from_utf8_lossy(&weft(&["status", &subnet_file(&c, 0)]).stdout).to_string();
            let line = text
                .lines()
                .find(|l| l.contains(s1.as_str()))
                .unwrap_or_default();
            assert!(
                line.contains("handshake") && line.contains(" ago"),
                "{text}"
            );
            assert!(
                m.keys()
                    .any(|k| k.starts_with("weft_peer_last_handshake_seconds{")),
                "no handshake gauge in /metrics"
            );
        } else {
            assert!(hs.is_null(), "ipip has no handshake: {after:#}");
        }
        let key = m
            .keys()
            .find(|k| k.starts_with("weft_peer_rx_packets_total{") && k.contains(s1.as_str()))
            .unwrap_or_else(|| panic!("{backend}: no per-peer rx counter in /metrics"))
            .clone();
        assert!(m[&key] >= N as f64, "{key} = {}", m[&key]);
    }
}

/// The longest `weft status` or `/healthz` may take while the backend is
/// busy. Measured on the 2-core CI machine with debug builds and a loaded
/// host: p99 under 10 ms, worst seen ~40 ms (the socket's answer for a
/// handful of peers); before issue 33 it was the whole batch (here 4 s) or
/// the 3 s timeout. 500 ms leaves an order of magnitude for noise and still
/// fails any answer that waits for the batch.
const ANSWER_BOUND: Duration = Duration::from_millis(500);

/// Observation never waits for work (issue 33). The backend's task takes
/// 4 s per batch of peer changes (`--test-apply-delay-ms`, a slow kernel);
/// meanwhile `weft status` and `/healthz` answer within [`ANSWER_BOUND`],
/// the main loop keeps taking lease events (status lists leases written
/// during a slow batch before any is applied), keeps renewing the lease on
/// time (TTL 4 s: one due every 2 s), and `/readyz` says 503 until the
/// first lease snapshot is programmed. alloc backend on `lo` in the host's
/// namespace: no device, route or rule is made (as tests/leases.rs).
#[test]
fn status_health_and_renewal_never_wait_for_a_slow_backend() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(
        dir.path().join("net-conf.json"),
        r#"{"Network":"10.244.0.0/16","SubnetMax":"10.244.63.0","Backend":{"Type":"alloc"}}"#,
    )
    .expect("net-conf");
    let store = dir.path().join("store");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("free port")
        .port();
    let args: Vec<String> = vec![
        "--iface=lo".into(),
        "--traffic-manager=none".into(),
        "--public-ip=192.0.2.1".into(),
        format!(
            "--net-config-path={}",
            dir.path().join("net-conf.json").display()
        ),
        "--store=embedded".into(),
        format!("--store-path={}", store.display()),
        "--healthz-ip=127.0.0.1".into(),
        format!("--healthz-port={port}"),
        "--lease-ttl=4".into(),
        "--test-apply-delay-ms=4000".into(),
    ];
    let mut d = weft_tests::weftd::Weftd::start("slow", dir.path(), None, &args);
    d.wait_ready(Duration::from_secs(60));
    let get = |path: &str| -> (u16, Duration) {
        let t = std::time::Instant::now();
        let mut c = TcpStream::connect(("127.0.0.1", port))
            .unwrap_or_else(|e| panic!("GET {path}: {e}; weftd's log:\n{}", d.proc.log()));
        c.set_read_timeout(Some(Duration::from_secs(30)))
            .expect("timeout");
        write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
        let mut s = String::new();
        c.read_to_string(&mut s).expect("read");
        let code = s.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
        (code, t.elapsed())
    };
    let metric = |name: &str| -> f64 {
        let mut c = TcpStream::connect(("127.0.0.1", port)).expect("connect");
        c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let mut s = String::new();
        c.read_to_string(&mut s).expect("read");
        let body = s.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        parse_prometheus(body)
            .expect("prometheus")
            .get(name)
            .copied()
            .unwrap_or(0.0)
    };
    // subnet.env is written; the first (empty) snapshot's batch takes 4 s.
    assert_eq!(
        get("/readyz").0,
        503,
        "ready before the snapshot is programmed"
    );
    wait_for("/readyz 200", Duration::from_secs(20), || {
        (get("/readyz").0 == 200).then_some(())
    });
    let socket = weft_control::status::server::socket_path(&d.subnet_env);
    let mut worst = (Duration::ZERO, Duration::ZERO);
    let probe = |worst: &mut (Duration, Duration)| -> serde_json::Value {
        let t = std::time::Instant::now();
        let st = weft_control::status::server::query(&socket, Duration::from_secs(30))
            .expect("weft status");
        worst.0 = worst.0.max(t.elapsed());
        let (code, took) = get("/healthz");
        assert_eq!(code, 200);
        worst.1 = worst.1.max(took);
        serde_json::to_value(st).expect("json")
    };
    let put = |i: u32| {
        let out = weft(&[
            "leases",
            "put",
            &format!("10.244.{}.0-24", 100 + i),
            &format!(
                r#"{{"PublicIP":"192.0.2.{}","BackendType":"alloc"}}"#,
                10 + i
            ),
            &format!("--store-path={}", store.display()),
            &format!(
                "--net-config-path={}",
                dir.path().join("net-conf.json").display()
            ),
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let applied = || metric(r#"weft_peer_apply_seconds_count{op="add"}"#);
    let renewals = || metric(r#"weft_lease_renewals_total{result="ok"}"#);
    // Lease 0 starts a 4 s batch; leases 1-5 arrive while it runs.
    put(0);
    wait_for("lease 0 seen", Duration::from_secs(10), || {
        d.proc
            .log()
            .contains("Subnet added: 10.244.100.0-24")
            .then_some(())
    });
    let busy = std::time::Instant::now();
    let renewed = renewals();
    for i in 1..=5 {
        put(i);
    }
    let st = wait_for(
        "status to list the 6 leases",
        Duration::from_secs(10),
        || {
            let st = probe(&mut worst);
            (st["peers"].as_array().map_or(0, Vec::len) == 6).then_some(st)
        },
    );
    let listed = busy.elapsed();
    assert_eq!(
        applied(),
        0.0,
        "status listed them only after the backend applied them ({listed:?}): {st}"
    );
    // Every change applied: lease 0's batch, then 1-5 in one more.
    while applied() < 6.0 {
        probe(&mut worst);
        assert!(
            busy.elapsed() < Duration::from_secs(30),
            "not applied in 30 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let took = busy.elapsed();
    eprintln!(
        "MEASURED while the backend was busy for {took:?}: weft status at most {:?}, /healthz at most {:?}; the 6 leases listed after {listed:?}",
        worst.0, worst.1
    );
    assert!(
        listed < Duration::from_secs(4),
        "the loop took the events only after the slow batch ({listed:?})"
    );
    assert!(
        worst.0 < ANSWER_BOUND && worst.1 < ANSWER_BOUND,
        "weft status took {:?}, /healthz {:?} while the backend was busy",
        worst.0,
        worst.1
    );
    // Renewals (due every 2 s) went on while the backend was busy (>= 6 s), none late.
    assert!(
        renewals() - renewed >= 2.0,
        "renewals stalled while the backend was busy:\n{}",
        d.proc.log()
    );
    let late = metric("weft_lease_renew_delay_seconds_count")
        - metric(r#"weft_lease_renew_delay_seconds_bucket{le="0.256"}"#);
    assert_eq!(late, 0.0, "a renewal started more than 0.256 s late");
}
