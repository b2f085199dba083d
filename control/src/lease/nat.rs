//! `WeftNAT`, weft's own field of a lease (docs/nat.md): present when the
//! node runs NAT traversal (it answers endpoint discovery on its WireGuard
//! port and punches holes), with the endpoint it was last seen from once it
//! knows it:
//!
//! ```json
//! {"PublicIP":"10.12.0.2",...,"BackendData":{...},"WeftNAT":{"Endpoint":"203.0.113.9:51820"}}
//! ```
//!
//! flanneld decodes a lease with Go's `encoding/json` into `LeaseAttrs`,
//! which ignores keys it does not know (spec §0), so it never sees this
//! field; weft nodes with the feature off decode it and ignore it. Decoding
//! is lenient for the same reason: a value weft cannot read is treated as
//! absent, never as a bad lease, so a newer format cannot cut a node off.
//!
//! A relay (`--nat-relay`, docs/nat.md "Relays") adds
//! `"Relay":true,"RelayPort":<port>`: it forwards WireGuard datagrams for
//! nodes that register on that UDP port. `Relay` without a readable
//! `RelayPort` (1-65535) is no relay.

use std::net::SocketAddrV4;

use serde_json::Value;

/// What a node with NAT traversal publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NatAttrs {
    /// The address and port the node's WireGuard port was last seen from
    /// by a peer with a reachable address (`None`: not known yet).
    pub endpoint: Option<SocketAddrV4>,
    /// The node relays on this UDP port (`"Relay":true,"RelayPort":port`).
    pub relay: Option<u16>,
}

impl NatAttrs {
    /// The field's JSON value (compact, keys in this order).
    pub fn to_json(&self) -> String {
        let mut parts = Vec::new();
        if let Some(e) = self.endpoint {
            parts.push(format!("\"Endpoint\":\"{e}\""));
        }
        if let Some(p) = self.relay {
            parts.push(format!("\"Relay\":true,\"RelayPort\":{p}"));
        }
        format!("{{{}}}", parts.join(","))
    }

    /// The field from a decoded value (`None` when it is not an object;
    /// an unreadable endpoint is no endpoint).
    pub fn from_value(v: &Value) -> Option<NatAttrs> {
        let m = v.as_object()?;
        let get = |name: &str| {
            m.iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(name))
                .map(|(_, v)| v)
        };
        let endpoint = get("endpoint")
            .and_then(|v| v.as_str())
            .and_then(|s| s.parse().ok());
        let port = get("relayport")
            .and_then(Value::as_u64)
            .and_then(|p| u16::try_from(p).ok())
            .filter(|p| *p != 0);
        let relay = port.filter(|_| get("relay").and_then(Value::as_bool) == Some(true));
        Some(NatAttrs { endpoint, relay })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_leniently() {
        let e = NatAttrs {
            endpoint: Some("203.0.113.9:40001".parse().expect("addr")),
            relay: None,
        };
        let v: Value = serde_json::from_str(&e.to_json()).expect("json");
        assert_eq!(NatAttrs::from_value(&v), Some(e));
        let r = NatAttrs {
            endpoint: Some("192.0.2.11:51820".parse().expect("addr")),
            relay: Some(51830),
        };
        assert_eq!(
            r.to_json(),
            r#"{"Endpoint":"192.0.2.11:51820","Relay":true,"RelayPort":51830}"#
        );
        let v: Value = serde_json::from_str(&r.to_json()).expect("json");
        assert_eq!(NatAttrs::from_value(&v), Some(r));
        let relay_only = |text: &str| {
            let v: Value = serde_json::from_str(text).expect("json");
            NatAttrs::from_value(&v).and_then(|n| n.relay)
        };
        assert_eq!(
            relay_only(r#"{"Relay":true,"RelayPort":51830}"#),
            Some(51830)
        );
        assert_eq!(relay_only(r#"{"Relay":true}"#), None, "no port");
        assert_eq!(relay_only(r#"{"Relay":"yes","RelayPort":1}"#), None);
        assert_eq!(relay_only(r#"{"Relay":true,"RelayPort":70000}"#), None);
        assert_eq!(relay_only(r#"{"Relay":false,"RelayPort":1}"#), None);
        assert_eq!(NatAttrs::default().to_json(), "{}");
        for (text, want) in [
            ("{}", Some(NatAttrs::default())),
            (r#"{"endpoint":"bogus"}"#, Some(NatAttrs::default())),
            (r#"{"Endpoint":7}"#, Some(NatAttrs::default())),
            ("[]", None),
            ("null", None),
        ] {
            let v: Value = serde_json::from_str(text).expect("json");
            assert_eq!(NatAttrs::from_value(&v), want, "{text}");
        }
    }
}
