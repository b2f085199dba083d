use std::collections::BTreeMap;
use std::time::Duration;

use super::*;

/// Samples by series and types by family name.
type Parsed = (BTreeMap<String, f64>, BTreeMap<String, String>);

/// Parses Prometheus text 0.0.4 strictly enough for tests: `# HELP`/`# TYPE`
/// lines, then `name{k="v",...} value` samples. Returns samples by
/// `name{labels}` and the declared types.
pub(crate) fn parse(text: &str) -> Result<Parsed, String> {
    let mut samples = BTreeMap::new();
    let mut types = BTreeMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest
                .split_once(' ')
                .ok_or(format!("bad TYPE line {line:?}"))?;
            if !["counter", "gauge", "histogram", "untyped", "info"].contains(&ty) {
                return Err(format!("bad type in {line:?}"));
            }
            types.insert(name.to_string(), ty.to_string());
            continue;
        }
        if line.starts_with("# HELP ") || line.is_empty() {
            continue;
        }
        if line.starts_with('#') {
            return Err(format!("unexpected comment {line:?}"));
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or(format!("no value in {line:?}"))?;
        let v: f64 = value
            .parse()
            .map_err(|_| format!("bad value in {line:?}"))?;
        let name = series.split('{').next().unwrap_or_default();
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
        {
            return Err(format!("bad metric name in {line:?}"));
        }
        let labels = &series[name.len()..];
        if !(labels.is_empty() || labels.starts_with('{') && labels.ends_with('}')) {
            return Err(format!("bad labels in {line:?}"));
        }
        samples.insert(series.to_string(), v);
    }
    Ok((samples, types))
}

#[test]
fn daemon_metrics_are_exposed_at_zero_and_count() {
    let m = DaemonMetrics::new();
    let (s, t) = parse(&m.encode(None)).expect("parses");
    assert_eq!(s.get("weft_lease_acquisitions_total"), Some(&0.0));
    assert_eq!(
        s.get(r#"weft_lease_renewals_total{result="error"}"#),
        Some(&0.0)
    );
    assert_eq!(
        t.get("weft_peer_apply_seconds").map(String::as_str),
        Some("histogram")
    );
    m.lease_acquired();
    m.lease_renewed(true);
    m.lease_event("added");
    m.peer_applied(true, Duration::from_millis(3));
    let (s, _) = parse(&m.encode(None)).expect("parses");
    assert_eq!(s.get("weft_lease_acquisitions_total"), Some(&1.0));
    assert_eq!(
        s.get(r#"weft_lease_renewals_total{result="ok"}"#),
        Some(&1.0)
    );
    assert_eq!(
        s.get(r#"weft_lease_events_total{kind="added"}"#),
        Some(&1.0)
    );
    assert_eq!(
        s.get(r#"weft_peer_apply_seconds_count{op="add"}"#),
        Some(&1.0)
    );
    assert_eq!(
        s.get(r#"weft_peer_apply_seconds_bucket{op="add",le="0.004"}"#),
        Some(&1.0)
    );
    assert_eq!(
        s.get(r#"weft_peer_apply_seconds_bucket{op="add",le="0.002"}"#),
        Some(&0.0)
    );
    // No dataplane metrics without a status.
    assert!(!s.keys().any(|k| k.starts_with("weft_tx_packets")));
}

#[test]
fn dataplane_metrics_come_from_the_status() {
    let m = DaemonMetrics::new();
    let st = crate::status::tests::full();
    let text = m.encode(Some(&st));
    let (s, t) = parse(&text).expect("parses");
    let dev = r#"backend="vxlan",dataplane="userspace",device="flannel.1""#;
    assert_eq!(
        s.get(&format!("weft_tx_packets_total{{{dev}}}")),
        Some(&10.0),
        "{text}"
    );
    assert_eq!(
        s.get(&format!("weft_rx_bytes_total{{{dev}}}")),
        Some(&900.0)
    );
    assert_eq!(
        t.get("weft_tx_packets_total").map(String::as_str),
        Some("counter")
    );
    assert_eq!(
        s.get(r#"weft_drops_total{backend="vxlan",device="flannel.1",reason="unknown_peer"}"#),
        Some(&4.0)
    );
    assert_eq!(
        s.get(r#"weft_drops_total{backend="vxlan",device="flannel.1",reason="spoofed_source"}"#),
        Some(&0.0)
    );
    assert_eq!(
        s.get(r#"weft_offload_enabled{backend="vxlan",device="flannel.1",offload="udp_gso"}"#),
        Some(&1.0)
    );
    assert_eq!(
        s.get(r#"weft_offload_enabled{backend="vxlan",device="flannel.1",offload="udp_gro"}"#),
        Some(&0.0)
    );
    assert_eq!(
        s.get(r#"weft_offload_enabled{backend="vxlan",device="flannel.1",offload="tunnel_gso"}"#),
        Some(&1.0)
    );
    assert_eq!(
        s.get(r#"weft_udp_send_calls_total{backend="vxlan",device="flannel.1"}"#),
        Some(&2.0)
    );
    // Every drop reason and batching counter of the engine, by its name.
    for c in <weft_engine::Drops as weft_engine::CounterSet>::COUNTERS {
        let series = format!(
            r#"weft_drops_total{{backend="vxlan",device="flannel.1",reason="{}"}}"#,
            c.name
        );
        assert!(s.contains_key(&series), "{series} missing");
    }
    for c in <weft_engine::Batching as weft_engine::CounterSet>::COUNTERS {
        let family = format!("weft_{}_total", c.metric);
        assert_eq!(
            t.get(&family).map(String::as_str),
            Some("counter"),
            "{family}"
        );
    }
    assert_eq!(
        s.get(r#"weft_backend_info{backend="vxlan",dataplane="userspace"}"#),
        Some(&1.0)
    );
    assert_eq!(s.get(r#"weft_peers{backend="vxlan"}"#), Some(&3.0));
    let peer = r#"backend="vxlan",device="flannel.1",subnet="10.244.2.0/24",endpoint="192.0.2.2""#;
    assert_eq!(
        s.get(&format!("weft_peer_tx_packets_total{{{peer}}}")),
        Some(&10.0),
        "{text}"
    );
    // The peer without counters has no series.
    assert!(!s.keys().any(|k| k.contains("10.244.3.0/24")));
}

#[test]
fn probe_metrics_come_from_the_peers() {
    let text = DaemonMetrics::new().encode(Some(&crate::status::tests::full()));
    let (s, t) = parse(&text).expect("parses");
    let peer = r#"subnet="10.244.2.0/24",public_ip="192.0.2.2""#;
    for (name, want) in [
        ("weft_peer_reachable", 1.0),
        ("weft_peer_rtt_seconds", 0.00042),
        ("weft_peer_path_mtu_bytes", 1450.0),
        ("weft_peer_probe_losses", 0.0),
        ("weft_peer_probes_sent_total", 12.0),
        ("weft_peer_probes_received_total", 12.0),
    ] {
        assert_eq!(
            s.get(&format!("{name}{{{peer}}}")),
            Some(&want),
            "{name}: {text}"
        );
    }
    assert_eq!(
        t.get("weft_peer_rtt_seconds").map(String::as_str),
        Some("gauge")
    );
    // Peers without probe results have no series.
    assert!(
        !s.keys()
            .any(|k| k.starts_with("weft_peer_") && k.contains("192.0.2.3")),
        "{text}"
    );
}

#[test]
fn the_parser_rejects_garbage() {
    assert!(parse("weft_x{a=\"b\" 1").is_err());
    assert!(parse("weft x 1").is_err());
    assert!(parse("weft_x one").is_err());
}

#[test]
fn the_nat_path_is_a_gauge_only_where_known() {
    let mut st = crate::status::tests::full();
    let text = DaemonMetrics::new().encode(Some(&st));
    assert!(!text.contains("weft_peer_path{"), "feature off: {text}");
    st.peers[0].path = Some("punched".into());
    let text = DaemonMetrics::new().encode(Some(&st));
    let (s, t) = parse(&text).expect("parses");
    let series: Vec<_> = s
        .iter()
        .filter(|(k, _)| k.starts_with("weft_peer_path{"))
        .collect();
    assert_eq!(series.len(), 1, "{text}");
    assert!(series[0].0.contains(r#"path="punched""#), "{text}");
    assert_eq!(*series[0].1, 1.0);
    assert_eq!(t.get("weft_peer_path").map(String::as_str), Some("gauge"));
}

#[test]
fn a_roamed_peer_is_a_gauge_naming_its_endpoint() {
    let mut st = crate::status::tests::full();
    st.peers[0].roamed = None;
    let text = DaemonMetrics::new().encode(Some(&st));
    assert!(!text.contains("weft_peer_roamed{"), "none roamed: {text}");
    st.peers[0].endpoint = Some("203.0.113.9:40001".into());
    st.peers[0].roamed = Some(false);
    let text = DaemonMetrics::new().encode(Some(&st));
    assert!(!text.contains("weft_peer_roamed{"), "not roamed: {text}");
    st.peers[0].roamed = Some(true);
    let text = DaemonMetrics::new().encode(Some(&st));
    let (s, _) = parse(&text).expect("parses");
    let series: Vec<_> = (s.iter())
        .filter(|(k, _)| k.starts_with("weft_peer_roamed{"))
        .collect();
    assert_eq!(series.len(), 1, "{text}");
    assert!(
        series[0].0.contains(r#"endpoint="203.0.113.9:40001""#),
        "{text}"
    );
}

#[test]
fn a_relay_exports_its_counters() {
    let mut st = crate::status::tests::full();
    let text = DaemonMetrics::new().encode(Some(&st));
    assert!(!text.contains("weft_nat_relay"), "not a relay: {text}");
    st.backend.relay = Some(crate::view::model::RelayStatus {
        forwarded: 10,
        bytes: 1000,
        registered: 3,
        limited: 7,
        dropped: 2,
    });
    let text = DaemonMetrics::new().encode(Some(&st));
    let (s, t) = parse(&text).expect("parses");
    for (name, v) in [
        ("weft_nat_relay_forwarded_datagrams_total", 10.0),
        ("weft_nat_relay_forwarded_bytes_total", 1000.0),
        ("weft_nat_relay_registrations_total", 3.0),
        ("weft_nat_relay_limited_datagrams_total", 7.0),
        ("weft_nat_relay_dropped_datagrams_total", 2.0),
    ] {
        assert_eq!(s.get(name), Some(&v), "{name}: {text}");
    }
    let ty = t.get("weft_nat_relay_limited_datagrams_total");
    assert_eq!(ty.map(String::as_str), Some("counter"));
}
