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

use std::net::SocketAddrV4;

use serde_json::Value;

/// What a node with NAT traversal publishes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NatAttrs {
    /// The address and port the node's WireGuard port was last seen from
    /// by a peer with a reachable address (`None`: not known yet).
    pub endpoint: Option<SocketAddrV4>,
}

impl NatAttrs {
    /// The field's JSON value (compact, keys in this order).
    pub fn to_json(&self) -> String {
        match self.endpoint {
            Some(e) => format!("{{\"Endpoint\":\"{e}\"}}"),
            None => "{}".to_string(),
        }
    }

    /// The field from a decoded value (`None` when it is not an object;
    /// an unreadable endpoint is no endpoint).
    pub fn from_value(v: &Value) -> Option<NatAttrs> {
        let m = v.as_object()?;
        let endpoint = m
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("endpoint"))
            .and_then(|(_, v)| v.as_str())
            .and_then(|s| s.parse().ok());
        Some(NatAttrs { endpoint })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_reads_leniently() {
        let e = NatAttrs {
            endpoint: Some("203.0.113.9:40001".parse().expect("addr")),
        };
        let v: Value = serde_json::from_str(&e.to_json()).expect("json");
        assert_eq!(NatAttrs::from_value(&v), Some(e));
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
