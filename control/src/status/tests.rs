use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::model::*;
use super::*;
use crate::lease::{Lease, LeaseAttrs};

fn lease(subnet: &str, ip: &str) -> Lease {
    Lease {
        subnet: Some(subnet.parse().expect("subnet")),
        ipv6_subnet: None,
        attrs: LeaseAttrs {
            public_ip: ip.parse().expect("ip"),
            backend_type: "vxlan".into(),
            ..Default::default()
        },
        expiration: Some(SystemTime::now() + Duration::from_secs(3600)),
    }
}

/// A status with every optional part filled in.
pub(crate) fn full() -> Status {
    let counters = Counters {
        tx_packets: 10,
        tx_bytes: 1000,
        rx_packets: 9,
        rx_bytes: 900,
    };
    let backend = BackendStatus {
        name: "vxlan".into(),
        dataplane: "userspace".into(),
        requested: "auto".into(),
        devices: vec![DeviceStatus {
            name: "flannel.1".into(),
            kind: "engine".into(),
            workers: Some(2),
            offloads: Some(Offloads {
                tun_vnet_hdr: true,
                udp_gso: true,
                ..Default::default()
            }),
            counters,
            batching: Some(Batching {
                udp_sends: 2,
                udp_recvs: 3,
                ..Default::default()
            }),
            drops: Some(Drops {
                unknown_peer: 4,
                ..Default::default()
            }),
            peers: Some(2),
            poll_window: Some("auto, open (50 us)".into()),
            tunnel_gso: Some(crate::view::TunnelGsoStatus {
                mode: "auto".into(),
                tap: Some("weft-gso0".into()),
                reason: None,
            }),
        }],
        peer_counters: vec![
            PeerCounters {
                subnet: "10.244.2.0/24".parse().expect("net"),
                endpoint: "192.0.2.2".parse().expect("ip"),
                device: "flannel.1".into(),
                counters: Some(counters),
                last_handshake: Some(1_764_547_200),
                current: Some("198.51.100.7:40001".parse().expect("addr")),
                roamed: true,
            },
            PeerCounters {
                subnet: "10.244.3.0/24".parse().expect("net"),
                endpoint: "192.0.2.3".parse().expect("ip"),
                device: "flannel.1".into(),
                counters: None,
                last_handshake: None,
                current: None,
                roamed: false,
            },
        ],
        relay: None,
    };
    let own = lease("10.244.1.0/24", "192.0.2.1");
    let mut st = Status::build(Some(&own), backend, full_peers().iter().map(|l| &**l));
    st.peers[0].probe = Some(crate::view::ProbeStatus {
        reachable: Some(true),
        rtt_us: Some(420),
        losses: 0,
        sent: 12,
        received: 12,
        pmtu: Some(1450),
    });
    st
}

/// The peers of [`full`].
fn full_peers() -> std::sync::Arc<[std::sync::Arc<Lease>]> {
    [
        lease("10.244.2.0/24", "192.0.2.2"),
        lease("10.244.3.0/24", "192.0.2.3"),
        lease("10.244.4.0/24", "192.0.2.4"),
    ]
    .into_iter()
    .map(std::sync::Arc::new)
    .collect()
}

fn shape() -> Value {
    serde_json::from_str(shape::SHAPE).expect("the snapshot is JSON")
}

#[test]
fn peers_are_merged_with_the_dataplane_by_subnet() {
    let s = full();
    assert_eq!(s.peers.len(), 3);
    assert_eq!(s.peers[0].device.as_deref(), Some("flannel.1"));
    assert_eq!(s.peers[0].counters.map(|c| c.tx_packets), Some(10));
    assert_eq!(s.peers[0].last_handshake, Some(1_764_547_200));
    assert_eq!(s.peers[1].last_handshake, None);
    assert_eq!(
        (s.peers[1].device.as_deref(), s.peers[1].counters),
        (Some("flannel.1"), None)
    );
    assert_eq!(
        (s.peers[2].device.as_deref(), s.peers[2].counters),
        (None, None)
    );
    assert_eq!(
        s.lease.as_ref().and_then(|l| l.subnet.as_deref()),
        Some("10.244.1.0/24")
    );
    assert!(s.lease_expires_in().is_some_and(|x| x > 3500 && x <= 3600));
    assert_eq!(s.totals().rx_bytes, 900);
}

#[test]
fn json_matches_the_shape_snapshot_full_and_empty() {
    let full = serde_json::to_value(full()).expect("json");
    shape::check(&full, &shape()).unwrap_or_else(|e| panic!("{e}\n{full:#}"));
    let empty = serde_json::to_value(Status::build(
        None,
        BackendStatus::new("alloc", None),
        [].iter(),
    ))
    .expect("json");
    shape::check(&empty, &shape()).unwrap_or_else(|e| panic!("{e}\n{empty:#}"));
    // The internal per-peer list is not part of the shape.
    assert!(full["backend"].get("peer_counters").is_none());
}

#[test]
fn shape_check_catches_extra_missing_and_retyped_fields() {
    let mut v = serde_json::to_value(full()).expect("json");
    v["backend"]["devices"][0]["extra"] = 1.into();
    assert!(shape::check(&v, &shape()).is_err_and(|e| e.contains("extra")));
    let mut v = serde_json::to_value(full()).expect("json");
    v["peers"][0]
        .as_object_mut()
        .expect("object")
        .remove("public_ip");
    assert!(shape::check(&v, &shape()).is_err_and(|e| e.contains("$.peers[0].public_ip")));
    let mut v = serde_json::to_value(full()).expect("json");
    v["pid"] = "1".into();
    assert!(shape::check(&v, &shape()).is_err());
    let mut v = serde_json::to_value(full()).expect("json");
    v["backend"]["name"] = Value::Null;
    assert!(
        shape::check(&v, &shape()).is_err(),
        "a non-nullable field must not be null"
    );
}

#[test]
fn json_round_trips() {
    let s = full();
    let line = serde_json::to_string(&s).expect("json");
    let back = server::parse_reply(&line).expect("parse");
    assert_eq!(back.peers, s.peers);
    assert_eq!(back.backend.devices, s.backend.devices);
    assert!(
        matches!(server::parse_reply(r#"{"error":"boom"}"#), Err(server::StatusError::Daemon(m)) if m == "boom")
    );
    assert!(matches!(
        server::parse_reply("{}"),
        Err(server::StatusError::Invalid(_))
    ));
    assert!(matches!(
        server::parse_reply("not json"),
        Err(server::StatusError::Invalid(_))
    ));
}

/// The tunnel TAP's line: in use, off, or the failed condition.
#[test]
fn text_says_why_the_tunnel_tap_is_not_used() {
    let mut st = full();
    let why = |st: &Status| {
        render::text(st)
            .lines()
            .find(|l| l.contains("tunnel gso"))
            .map(str::trim)
            .map(String::from)
    };
    st.backend.devices[0].tunnel_gso = Some(crate::view::TunnelGsoStatus {
        mode: "off".into(),
        tap: None,
        reason: Some("off".into()),
    });
    assert_eq!(why(&st).as_deref(), Some("tunnel gso: off"));
    st.backend.devices[0].tunnel_gso = Some(crate::view::TunnelGsoStatus {
        mode: "auto".into(),
        tap: None,
        reason: Some("uplink eth0 has no tx-udp_tnl-segmentation".into()),
    });
    assert_eq!(
        why(&st).as_deref(),
        Some("tunnel gso: auto, UDP sockets: uplink eth0 has no tx-udp_tnl-segmentation")
    );
    st.backend.devices[0].tunnel_gso = None;
    assert_eq!(why(&st), None);
}

#[test]
fn text_shows_the_node_devices_and_every_peer() {
    let t = render::text(&full());
    for want in [
        "10.244.1.0/24",
        "vxlan on the userspace dataplane (requested: auto)",
        "flannel.1 (engine), 2 workers",
        "poll-on window: auto, open (50 us)",
        "tunnel gso: auto, TCP super-packets through weft-gso0",
        "udp-gso",
        "unknown_peer 4",
    ] {
        assert!(t.contains(want), "{want:?} missing in\n{t}");
    }
    // The handshake time shows on the WireGuard peer's line only.
    let line = |p: &str| {
        t.lines()
            .find(|l| l.trim_start().starts_with(p))
            .unwrap_or_default()
    };
    assert!(line("10.244.2.0/24").contains(" ago"), "{t}");
    assert!(!line("10.244.3.0/24").contains("handshake"), "{t}");
    for p in ["10.244.2.0/24", "10.244.3.0/24", "10.244.4.0/24"] {
        assert!(
            t.lines().any(|l| l.trim_start().starts_with(p)),
            "peer {p} missing in\n{t}"
        );
    }
}

#[tokio::test]
async fn the_socket_is_root_only_and_answers_from_the_published_snapshots() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = server::socket_path(&dir.path().join("n1.env"));
    assert_eq!(
        sock.file_name().and_then(|n| n.to_str()),
        Some("n1.weft-status.sock")
    );
    let publisher = crate::view::Publisher::new();
    let store = crate::store::StoreInfo {
        kind: "etcd".into(),
        etcd_endpoints: Some("http://192.0.2.9:2379".into()),
        etcd_password_set: true,
        ..Default::default()
    };
    let extras = server::Extras {
        store: Some(store.clone()),
        commands: None,
    };
    let srv = server::serve(&sock, publisher.observer(), extras.clone()).expect("serve");
    // A second server on a live socket is refused and leaves it alone.
    let e = server::serve(&sock, publisher.observer(), extras).expect_err("live socket");
    assert!(e.to_string().contains("another process is serving"), "{e}");
    let mode = std::fs::metadata(&sock)
        .expect("socket")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    // Nothing published yet (still starting): an error, at once.
    let path = sock.clone();
    let e = tokio::task::spawn_blocking(move || server::query(&path, Duration::from_secs(5)))
        .await
        .expect("join")
        .expect_err("nothing published");
    assert!(e.to_string().contains("still starting"), "{e}");
    // Published: answered from the snapshots, nobody else asked.
    publisher.backend().publish(crate::view::BackendView::new(
        "vxlan",
        Some(crate::view::Dataplane::Kernel),
    ));
    let peers = full_peers();
    publisher.daemon(|d| d.peers = peers);
    let path = sock.clone();
    let got = tokio::task::spawn_blocking(move || server::query(&path, Duration::from_secs(5)))
        .await
        .expect("join")
        .expect("query");
    assert_eq!(got.peers.len(), 3);
    // A bad request gets an error line, not a hang.
    let path = sock.clone();
    let raw = tokio::task::spawn_blocking(move || {
        use std::io::{Read, Write};
        let mut s = std::os::unix::net::UnixStream::connect(&path).expect("connect");
        s.write_all(b"{\"op\":\"reboot\"}\n").expect("write");
        let mut out = String::new();
        s.read_to_string(&mut out).expect("read");
        out
    })
    .await
    .expect("join");
    assert!(raw.contains("unknown op"), "{raw}");
    let path = sock.clone();
    let got =
        tokio::task::spawn_blocking(move || server::query_store(&path, Duration::from_secs(5)))
            .await
            .expect("join")
            .expect("store");
    assert_eq!(got, store);
    let path = sock.clone();
    let e = tokio::task::spawn_blocking(move || {
        server::call(
            &path,
            &serde_json::json!({"op":"dataplane","set":"kernel"}),
            Duration::from_secs(5),
        )
    })
    .await
    .expect("join")
    .expect_err("no commands here");
    assert!(e.to_string().contains("no dataplane commands"), "{e}");
    drop(srv);
    assert!(!sock.exists());
}

/// A server removes its socket on exit only while the path still names the
/// socket it bound: one bound there since by another process stays.
#[tokio::test]
async fn a_socket_replaced_by_another_process_is_not_removed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("weft-status.sock");
    let publisher = crate::view::Publisher::new();
    let srv = server::serve(&sock, publisher.observer(), Default::default()).expect("serve");
    // Another process's socket renamed over ours (what a second weftd did).
    let tmp = dir.path().join("other.sock");
    let _other = std::os::unix::net::UnixListener::bind(&tmp).expect("bind");
    std::fs::rename(&tmp, &sock).expect("rename");
    drop(srv);
    assert!(sock.exists(), "the other process's socket was removed");
}

/// `weft status` without weftd: the socket's path and the OS error, each
/// once (the error's message includes its source, which a chain printer
/// then repeated: `...(os error 2): No such file or directory (os error 2)`).
#[test]
fn a_missing_socket_says_its_cause_once() {
    let dir = tempfile::tempdir().expect("tempdir");
    let sock = dir.path().join("weft-status.sock");
    let e = server::query(&sock, Duration::from_millis(200)).expect_err("no weftd");
    let e = anyhow::Error::new(e).context("cannot reach weftd");
    assert_eq!(
        crate::logging::error_chain(e.as_ref()),
        format!(
            "cannot reach weftd: {}: No such file or directory (os error 2)",
            sock.display()
        )
    );
    let e = server::query_http("127.0.0.1:1", Duration::from_millis(200)).expect_err("no weftd");
    let text = crate::logging::error_chain(&e);
    assert_eq!(text.matches("Connection refused").count(), 1, "{text}");
}

#[test]
fn counter_sets_are_the_engines_in_its_order_and_read_leniently() {
    use weft_engine::CounterSet;
    let mut v = serde_json::to_value(full()).expect("json");
    let keys: Vec<&str> = v["backend"]["devices"][0]["drops"]
        .as_object()
        .expect("drops")
        .keys()
        .map(String::as_str)
        .collect();
    let names: Vec<&str> = Drops::COUNTERS.iter().map(|c| c.name).collect();
    assert_eq!(keys, names);
    // A newer weftd's extra counter is ignored, a missing one reads as 0.
    let drops = v["backend"]["devices"][0]["drops"]
        .as_object_mut()
        .expect("drops");
    drops.remove("unknown_peer");
    drops.insert("from_a_newer_weftd".into(), 7.into());
    v["backend"]["devices"][0]["drops"]["malformed"] = 2.into();
    let back: Status = serde_json::from_value(v).expect("lenient");
    let d = back.backend.devices[0].drops.expect("drops");
    assert_eq!((d.malformed, d.unknown_peer), (2, 0));
    assert_eq!(
        back.backend.devices[0].batching.map(|b| b.udp_recvs),
        Some(3)
    );
}

#[test]
fn thousands_of_peers_are_joined_by_subnet() {
    let n = 5000u32;
    let net = |i: u32| format!("10.{}.{}.0/24", 100 + i / 256, i % 256);
    let leases: Vec<Lease> = (0..n).map(|i| lease(&net(i), "192.0.2.9")).collect();
    let mut backend = BackendStatus::new("vxlan", Some(crate::backend::Dataplane::Userspace));
    // Reported in reverse order, one peer without counters.
    backend.peer_counters = (0..n)
        .rev()
        .map(|i| PeerCounters {
            subnet: net(i).parse().expect("net"),
            endpoint: "192.0.2.9".parse().expect("ip"),
            device: "flannel.1".into(),
            counters: (i != 7).then_some(Counters {
                tx_packets: u64::from(i),
                ..Default::default()
            }),
            last_handshake: None,
            current: None,
            roamed: false,
        })
        .collect();
    let s = Status::build(None, backend, leases.iter());
    assert_eq!(s.peers.len(), 5000);
    for (i, p) in s.peers.iter().enumerate() {
        let want = (i != 7).then_some(i as u64);
        assert_eq!(p.counters.map(|c| c.tx_packets), want, "{:?}", p.subnet);
        assert_eq!(p.device.as_deref(), Some("flannel.1"));
    }
}

/// A dual-stack peer shows both its subnets and both its endpoints
/// (`weft status` showed only the IPv4 side).
#[test]
fn text_shows_both_families_of_a_dual_stack_peer() {
    let mut s = full();
    s.peers[1].ipv6_subnet = Some("fd00:10:0:3::/64".into());
    s.peers[1].public_ipv6 = Some("fd00::3".into());
    let t = render::text(&s);
    let line = t
        .lines()
        .find(|l| l.trim_start().starts_with("10.244.3.0/24"))
        .unwrap_or_default();
    for want in ["fd00:10:0:3::/64", "192.0.2.3", "fd00::3"] {
        assert!(line.contains(want), "{want} missing in {line:?}\n{t}");
    }
}

#[test]
fn a_peer_shows_where_the_engine_sends_now() {
    use crate::lease::NatAttrs;
    let nat = |mut l: Lease, ep: Option<&str>| {
        l.attrs.backend_type = "wireguard".into();
        l.attrs.weft_nat = Some(NatAttrs {
            endpoint: ep.map(|e| e.parse().expect("ep")),
            relay: None,
        });
        l
    };
    let own = nat(lease("10.244.1.0/24", "10.11.0.2"), None);
    let peer = nat(
        lease("10.244.2.0/24", "10.12.0.2"),
        Some("203.0.113.9:40001"),
    );
    let mut relay = nat(lease("10.244.9.0/24", "192.0.2.9"), None);
    relay.attrs.weft_nat = Some(NatAttrs {
        endpoint: None,
        relay: Some(51830),
    });
    let now = SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("time")
        .as_secs();
    let status = |current: Option<&str>| {
        let mut backend =
            BackendStatus::new("wireguard", Some(crate::backend::Dataplane::Userspace));
        let configured: std::net::SocketAddr = "203.0.113.9:40001".parse().expect("addr");
        let current: Option<std::net::SocketAddr> = current.map(|c| c.parse().expect("addr"));
        backend.peer_counters = vec![PeerCounters {
            subnet: "10.244.2.0/24".parse().expect("net"),
            endpoint: configured.ip(),
            device: "flannel-wg".into(),
            counters: None,
            last_handshake: Some(now),
            current,
            roamed: current.is_some_and(|c| c != configured),
        }];
        Status::build(Some(&own), backend, [&peer, &relay])
    };
    let p = status(Some("203.0.113.9:40001")).peers[0].clone();
    assert_eq!(p.path.as_deref(), Some("punched"));
    assert_eq!(p.endpoint.as_deref(), Some("203.0.113.9:40001"));
    assert_eq!(p.roamed, Some(false));
    // WireGuard roamed the peer to the relay: that is its path now.
    let st = status(Some("192.0.2.9:51830"));
    assert!(render::text(&st).contains("path relayed via 192.0.2.9, roamed to 192.0.2.9:51830"));
    let p = st.peers[0].clone();
    assert_eq!(p.path.as_deref(), Some("relayed via 192.0.2.9"));
    assert_eq!(p.endpoint.as_deref(), Some("192.0.2.9:51830"));
    assert_eq!(p.roamed, Some(true));
    // Unknown (another dataplane): the configured endpoint, no field.
    let st = status(None);
    assert!(!render::text(&st).contains("roamed"));
    let p = st.peers[0].clone();
    assert_eq!(p.path.as_deref(), Some("punched"));
    assert_eq!((p.endpoint, p.roamed), (None, None));
}
