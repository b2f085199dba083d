//! Control-plane targets: net-conf.json, lease JSON and keys, subnet.env, the
//! embedded store's data file, VXLAN backend data and Node annotations. Every decoder that has
//! an encoder is checked for a round trip (decode, encode, decode gives the
//! same value; encoding is a fixpoint).

use std::str::FromStr;

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use weft_control::backend::ipsec::vici;
use weft_control::backend::vxlan::{backend_data, fmt_mac, parse_backend_data};
use weft_control::compat::subnet_env::SubnetEnv;
use weft_control::config::{BackendOptions, parse_config};
use weft_control::kube::Annotations;
use weft_control::kube::node;
use weft_control::lease::{LeaseAttrs, SubnetKey};
use weft_control::store::embedded::file;

/// net-conf.json / the etcd config value, then what weftd derives from it:
/// the backend's options and MTU, and (etcd and embedded modes)
/// `check_network_config` with the allocator's candidate walk.
pub fn net_conf(data: &[u8]) {
    let Ok(mut cfg) = parse_config(data) else {
        return;
    };
    if let Ok(opts) = BackendOptions::from_config(&cfg.backend_type, cfg.backend.as_deref()) {
        for ext in [0, 68, 1500, 9001, u32::MAX] {
            assert!(opts.mtu(ext) <= ext.max(opts.mtu(0)));
        }
        let again = BackendOptions::parse(opts.kind(), cfg.backend.as_deref())
            .expect("options decoded once decode again");
        assert_eq!(again.kind(), opts.kind());
    }
    let _ = cfg.ip_family();
    if cfg.check_network_config().is_err() {
        return;
    }
    if cfg.enable_ipv4 {
        let net = cfg.network.expect("a checked IPv4 config has a network");
        for sn in cfg.subnet_candidates().take(4) {
            assert!(net.contains(&sn), "candidate {sn} outside {net}");
            assert!(cfg.is_subnet_compatible(Some(sn)));
        }
    }
    if cfg.enable_ipv6 {
        let net = cfg
            .ipv6_network
            .expect("a checked IPv6 config has a network");
        for sn in cfg.ipv6_subnet_candidates().take(4) {
            assert!(net.contains(&sn), "candidate {sn} outside {net}");
            assert!(cfg.is_ipv6_subnet_compatible(Some(sn)));
        }
    }
    let mut twice = cfg.clone();
    twice
        .check_network_config()
        .expect("a checked config passes the check again");
    assert_eq!(twice, cfg, "check_network_config is not idempotent");
}

/// A lease value from the store: Go-rules decode, re-encode, decode again.
/// Known and accepted: BackendData is kept as a re-serialized JSON value, and
/// serde_json (without its `float_roundtrip` feature) may move a float by one
/// ulp per round, so floats are compared to 12 significant digits.
pub fn lease_attrs(data: &[u8]) {
    let Ok(attrs) = LeaseAttrs::from_json(data) else {
        return;
    };
    let text = attrs.to_json();
    let again = LeaseAttrs::from_json(text.as_bytes()).expect("to_json output decodes");
    assert_eq!(again.public_ip, attrs.public_ip);
    assert_eq!(again.public_ipv6, attrs.public_ipv6);
    assert_eq!(again.backend_type, attrs.backend_type);
    for (a, b) in [
        (&again.backend_data, &attrs.backend_data),
        (&again.backend_v6_data, &attrs.backend_v6_data),
    ] {
        assert_eq!(
            a.as_deref().map(coarse),
            b.as_deref().map(coarse),
            "{a:?} != {b:?}"
        );
    }
    for d in [&attrs.backend_data, &attrs.backend_v6_data]
        .into_iter()
        .flatten()
    {
        let _ = parse_backend_data(d);
    }
}

/// A JSON text as a value whose floats are rounded to 12 significant digits.
fn coarse(text: &str) -> Value {
    fn walk(v: Value) -> Value {
        match v {
            Value::Number(n) if n.is_f64() => {
                Value::String(format!("{:.11e}", n.as_f64().unwrap_or(0.0)))
            }
            Value::Array(a) => Value::Array(a.into_iter().map(walk).collect()),
            Value::Object(m) => Value::Object(m.into_iter().map(|(k, v)| (k, walk(v))).collect()),
            v => v,
        }
    }
    walk(serde_json::from_str(text).expect("stored backend data is JSON"))
}

/// A lease key (`10.244.1.0-24[&fc00::-64]`): parse, print, parse.
pub fn subnet_key(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(key) = SubnetKey::from_str(text) else {
        return;
    };
    let printed = key.to_string();
    let again = SubnetKey::from_str(&printed)
        .unwrap_or_else(|e| panic!("{printed:?} (printed from {text:?}) does not parse: {e}"));
    assert_eq!(again, key);
}

/// subnet.env as flanneld reads it at startup; what it writes reads back the
/// same (for lease prefixes below /32 and /128: the file holds the subnet's
/// first address plus one).
pub fn subnet_env(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let env = SubnetEnv::parse(text);
    let Ok(out) = env.render() else {
        return;
    };
    let host_v4 = env.subnet.is_some_and(|s| s.prefix_len() == 32);
    let host_v6 = env.ipv6_subnet.is_some_and(|s| s.prefix_len() == 128);
    if !host_v4 && !host_v6 {
        assert_eq!(
            SubnetEnv::parse(&out),
            env,
            "render output {out:?} reads back differently"
        );
    }
}

/// 64-bit FNV-1a, the data file's checksum.
fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in parts.iter().flat_map(|p| p.iter()) {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The embedded store's data file. Input: a mode byte, then the file (bit 0
/// clear) or only its body, for which the harness writes a valid header with
/// length and checksum (bit 0 set). A decoded generation must encode to a
/// file that decodes to the same generation, and re-encode byte for byte.
pub fn store_file(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let bytes = if mode & 1 == 0 {
        rest.to_vec()
    } else {
        let mut out = format!("weft-store 1 {} {} ", u64::from(mode >> 1), rest.len()).into_bytes();
        let sum = fnv1a64(&[&out, rest]);
        out.extend_from_slice(format!("{sum:016x}\n").as_bytes());
        out.extend_from_slice(rest);
        out
    };
    let Ok(decoded) = file::decode(&bytes) else {
        return;
    };
    let encoded = file::encode(&decoded);
    let again = file::decode(&encoded).expect("encode output decodes");
    assert_eq!(again.revision, decoded.revision);
    assert_eq!(again.config, decoded.config);
    assert!(again.leases.keys().eq(decoded.leases.keys()));
    for (a, b) in again.leases.values().zip(decoded.leases.values()) {
        assert_eq!(a.expires_ms, b.expires_ms);
        // encode turns line breaks inside a value into spaces (same JSON value).
        let b_attrs: String = b
            .attrs
            .chars()
            .map(|c| if c == '\r' { ' ' } else { c })
            .collect();
        assert_eq!(a.attrs, b_attrs);
    }
    assert!(file::encode(&again) == encoded, "encode is not a fixpoint");
    // What the store does with each entry when listing leases.
    for (key, entry) in &decoded.leases {
        let _ = SubnetKey::from_str(key);
        let _ = LeaseAttrs::from_json(entry.attrs.as_bytes());
    }
}

/// A VXLAN lease's BackendData (`{"VNI":1,"VtepMAC":"..."}`).
pub fn vxlan_backend_data(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Some((vni, mac)) = parse_backend_data(text) else {
        return;
    };
    assert_eq!(fmt_mac(mac).len(), 17);
    let printed = backend_data(vni, mac);
    assert_eq!(parse_backend_data(&printed), Some((vni, mac)), "{printed}");
}

/// A Node object from the apiserver (kube mode): flannel's annotations and
/// podCIDRs as a peer lease, the user's public-IP annotations, and the
/// annotation patch a daemon owning that lease would write. The patch must
/// converge: once applied, the same attributes ask for no further change.
pub fn node_annotations(data: &[u8]) {
    let Ok(node) = serde_json::from_slice::<Node>(data) else {
        return;
    };
    let ann = Annotations::new("flannel.alpha.coreos.com").expect("flannel's default prefix");
    let _ = node::is_managed(&node, &ann);
    let _ = node::pod_cidrs(&node);
    let _ = node::stored_public_ips(&node, &ann);
    let cfg =
        parse_config(br#"{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fc00::/48"}"#)
            .expect("fixed config");
    for (v4, v6) in [(true, false), (false, true), (true, true)] {
        let Ok(Some(lease)) = node::node_to_lease(&node, &ann, v4, v6) else {
            continue;
        };
        for d in [&lease.attrs.backend_data, &lease.attrs.backend_v6_data]
            .into_iter()
            .flatten()
        {
            let _ = parse_backend_data(d);
        }
        let _ = node::own_lease(&node, &cfg, &lease.attrs);
        let mut current = node::annotations(&node).clone();
        let updates = node::annotation_updates(&current, &ann, &lease.attrs);
        let _ = node::annotation_patch(&updates);
        current.extend(updates);
        let again = node::annotation_updates(&current, &ann, &lease.attrs);
        assert!(
            again.is_empty(),
            "annotation patch does not converge: {again:?}"
        );
    }
}

/// A VICI packet body from charon's socket (IPsec backend): decode, encode,
/// decode again gives the same packet, and encoding is a fixpoint.
pub fn vici(data: &[u8]) {
    let Ok(p) = vici::Packet::decode(data) else {
        return;
    };
    let Ok(bytes) = p.encode() else {
        return;
    };
    let len = u32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
    assert_eq!(usize::try_from(len).ok(), Some(bytes.len() - 4));
    let again = vici::Packet::decode(&bytes[4..]).expect("encode output decodes");
    assert_eq!(again, p);
    assert!(
        bytes[4..] == *data,
        "decode accepted a non-canonical encoding"
    );
}

/// A datagram on weftd's probe port (`probe::wire::Msg::parse`): anything
/// may arrive there. What parses writes back to the same 24-byte header (a
/// probe with its padding zeroed, an ack as exactly the header) and parses
/// again to the same message.
pub fn probe_msg(data: &[u8]) {
    use weft_control::probe::wire::{HEADER, Kind, Msg};
    let Ok(m) = Msg::parse(data) else {
        return;
    };
    let mut out = vec![0xa5u8; data.len()];
    let n = m
        .write(&mut out)
        .expect("a parsed message fits its own datagram");
    assert_eq!(out[..HEADER], data[..HEADER], "header written differently");
    match m.kind {
        Kind::Probe => assert!(n == data.len() && out[HEADER..].iter().all(|b| *b == 0)),
        Kind::Ack { .. } => assert_eq!(n, HEADER),
    }
    assert_eq!(Msg::parse(&out[..n]), Ok(m), "does not read back");
}
