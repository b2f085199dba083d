//! `LeaseAttrs`, the value of a lease, byte-compatible with flannel
//! (pkg/lease/lease.go):
//!
//! ```json
//! {"PublicIP":"192.0.2.1","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}
//! ```
//!
//! Field order is Go's declaration order. `PublicIP` is always written (`0.0.0.0`
//! when unset), `PublicIPv6` is written as `null` when unset, `BackendType`,
//! `BackendData` and `BackendV6Data` are omitted when empty. Backend data is
//! kept as compact raw JSON text so it round-trips byte for byte.
//! Decoding follows Go's rules ([`weft_compat::gojson`]).
//!
//! weft adds two fields of its own, last and only when set, which flanneld
//! ignores as unknown keys: `WeftNAT` ([`super::nat`], NAT traversal) and
//! `WeftGSO` (`true`: a weft udp node that takes UDP-tunnel GSO datagrams
//! whole, so peers' tunnel TAPs may send to it; weftd's `--tunnel-gso`).
//! A lease without them is byte for byte what flannel writes.

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::Value;
use weft_compat::gojson::{self, GoJsonError};

use super::NatAttrs;

/// What a node publishes about itself in its lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseAttrs {
    /// The node's public (underlay) IPv4 address.
    pub public_ip: Ipv4Addr,
    /// The node's public IPv6 address, if any.
    pub public_ipv6: Option<Ipv6Addr>,
    /// The backend type (`""` for udp and alloc, as flannel writes it).
    pub backend_type: String,
    /// Backend-specific data for IPv4, as compact JSON text.
    pub backend_data: Option<String>,
    /// Backend-specific data for IPv6, as compact JSON text.
    pub backend_v6_data: Option<String>,
    /// weft only: NAT traversal ([`super::nat`]); `None` when off.
    pub weft_nat: Option<NatAttrs>,
    /// weft only: `WeftGSO` (see the module docs); written only when true,
    /// read as true only from a JSON `true`.
    pub weft_gso: bool,
}

impl Default for LeaseAttrs {
    fn default() -> Self {
        LeaseAttrs {
            public_ip: Ipv4Addr::UNSPECIFIED,
            public_ipv6: None,
            backend_type: String::new(),
            backend_data: None,
            backend_v6_data: None,
            weft_nat: None,
            weft_gso: false,
        }
    }
}

/// Errors decoding a lease value.
#[derive(Debug, thiserror::Error)]
pub enum AttrsError {
    /// The value is not a JSON object, or a field has the wrong type.
    #[error(transparent)]
    Json(#[from] GoJsonError),
    /// `PublicIP` is not an IPv4 address.
    #[error("invalid PublicIP {0:?}")]
    PublicIp(String),
    /// `PublicIPv6` is not an IPv6 address.
    #[error("invalid PublicIPv6 {0:?}")]
    PublicIpv6(String),
    /// Backend data could not be re-encoded (cannot happen for parsed JSON).
    #[error("invalid backend data: {0}")]
    BackendData(#[source] serde_json::Error),
}

impl LeaseAttrs {
    /// Encodes exactly as Go's `json.Marshal(LeaseAttrs)` does.
    pub fn to_json(&self) -> String {
        let mut s = String::with_capacity(128);
        s.push_str("{\"PublicIP\":\"");
        s.push_str(&self.public_ip.to_string());
        s.push_str("\",\"PublicIPv6\":");
        match self.public_ipv6 {
            Some(ip) => {
                s.push('"');
                s.push_str(&ip.to_string());
                s.push('"');
            }
            None => s.push_str("null"),
        }
        if !self.backend_type.is_empty() {
            s.push_str(",\"BackendType\":");
            s.push_str(&Value::from(self.backend_type.as_str()).to_string());
        }
        for (name, data) in [
            ("BackendData", &self.backend_data),
            ("BackendV6Data", &self.backend_v6_data),
        ] {
            if let Some(d) = data.as_deref().filter(|d| !d.is_empty()) {
                s.push_str(",\"");
                s.push_str(name);
                s.push_str("\":");
                s.push_str(d);
            }
        }
        if let Some(nat) = &self.weft_nat {
            s.push_str(",\"WeftNAT\":");
            s.push_str(&nat.to_json());
        }
        if self.weft_gso {
            s.push_str(",\"WeftGSO\":true");
        }
        s.push('}');
        s
    }

    /// Decodes a lease value with Go's rules.
    pub fn from_json(text: &[u8]) -> Result<Self, AttrsError> {
        let mut m = gojson::parse_object(text)?;
        let mut attrs = LeaseAttrs::default();
        if let Some(ip) = gojson::take::<String>(&mut m, "publicip")? {
            attrs.public_ip = ip.parse().map_err(|_| AttrsError::PublicIp(ip))?;
        }
        if let Some(ip) = gojson::take::<String>(&mut m, "publicipv6")? {
            attrs.public_ipv6 = Some(ip.parse().map_err(|_| AttrsError::PublicIpv6(ip))?);
        }
        attrs.backend_type = gojson::take::<String>(&mut m, "backendtype")?.unwrap_or_default();
        attrs.backend_data = raw(m.remove("backenddata"))?;
        attrs.backend_v6_data = raw(m.remove("backendv6data"))?;
        attrs.weft_nat = m.remove("weftnat").as_ref().and_then(NatAttrs::from_value);
        attrs.weft_gso = m.remove("weftgso") == Some(Value::Bool(true));
        Ok(attrs)
    }
}

/// Go's `json.RawMessage` keeps the bytes; re-encoding compacts them.
fn raw(v: Option<Value>) -> Result<Option<String>, AttrsError> {
    v.map(|v| serde_json::to_string(&v).map_err(AttrsError::BackendData))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    const FLANNEL_VXLAN: &str = r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;

    #[test]
    fn flannel_lease_round_trips_byte_for_byte() {
        let a = LeaseAttrs::from_json(FLANNEL_VXLAN.as_bytes()).expect("decode");
        assert_eq!(a.public_ip, Ipv4Addr::new(192, 168, 64, 3));
        assert_eq!(a.backend_type, "vxlan");
        assert_eq!(a.to_json(), FLANNEL_VXLAN);
    }

    #[test]
    fn udp_lease_has_no_backend_fields() {
        let a = LeaseAttrs {
            public_ip: Ipv4Addr::new(192, 0, 2, 7),
            ..Default::default()
        };
        assert_eq!(a.to_json(), r#"{"PublicIP":"192.0.2.7","PublicIPv6":null}"#);
    }

    #[test]
    fn dual_stack_and_case_insensitive_keys() {
        let a = LeaseAttrs::from_json(
            br#"{"publicip":"192.0.2.1","PUBLICIPV6":"2001:db8::1","backendtype":"wireguard","backenddata":{"PublicKey":"k","Port":51820},"BackendV6Data":{ "PublicKey" : "k", "Port" : 51821 }}"#,
        )
        .expect("decode");
        assert_eq!(a.public_ipv6, Some("2001:db8::1".parse().expect("v6")));
        assert_eq!(
            a.to_json(),
            r#"{"PublicIP":"192.0.2.1","PublicIPv6":"2001:db8::1","BackendType":"wireguard","BackendData":{"PublicKey":"k","Port":51820},"BackendV6Data":{"PublicKey":"k","Port":51821}}"#
        );
    }

    #[test]
    fn weft_nat_is_last_and_only_when_set() {
        let mut a = LeaseAttrs::from_json(FLANNEL_VXLAN.as_bytes()).expect("decode");
        a.weft_nat = Some(NatAttrs {
            endpoint: Some("203.0.113.9:51820".parse().expect("addr")),
            relay: None,
        });
        let text = a.to_json();
        assert!(
            text.ends_with(r#","WeftNAT":{"Endpoint":"203.0.113.9:51820"}}"#),
            "{text}"
        );
        assert_eq!(LeaseAttrs::from_json(text.as_bytes()).expect("decode"), a);
        // What weft cannot read of it is no field, never a bad lease.
        let odd = br#"{"PublicIP":"192.0.2.1","weftnat":"v9"}"#;
        let b = LeaseAttrs::from_json(odd).expect("decode");
        assert_eq!(b.weft_nat, None);
    }

    #[test]
    fn weft_gso_is_last_only_when_true_and_only_true_reads_as_true() {
        let udp = r#"{"PublicIP":"192.0.2.1","PublicIPv6":null}"#;
        let mut a = LeaseAttrs::from_json(udp.as_bytes()).expect("decode");
        assert_eq!(a.to_json(), udp, "flannel's udp lease, byte for byte");
        a.weft_gso = true;
        a.weft_nat = Some(NatAttrs::default());
        let text = a.to_json();
        assert!(text.ends_with(r#","WeftNAT":{},"WeftGSO":true}"#), "{text}");
        assert_eq!(LeaseAttrs::from_json(text.as_bytes()).expect("decode"), a);
        for odd in [r#""true""#, "1", "null", "{}", "false"] {
            let v = format!(r#"{{"PublicIP":"192.0.2.1","WeftGSO":{odd}}}"#);
            let b = LeaseAttrs::from_json(v.as_bytes()).expect("decode");
            assert!(!b.weft_gso, "{v}");
        }
    }

    #[test]
    fn bad_values_are_errors() {
        for bad in [
            &br#"{"PublicIP":"300.1.1.1"}"#[..],
            br#"{"PublicIP":1}"#,
            br#"{"PublicIPv6":"1.2.3.4"}"#,
            br#"[]"#,
            br#"{"PublicIP":"#,
        ] {
            assert!(
                LeaseAttrs::from_json(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
