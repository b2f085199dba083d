//! flannel's network config (`subnet.Config`, flannel pkg/subnet/config.go).
//!
//! The same JSON document comes from net-conf.json (kube mode) or the etcd key
//! `<prefix>/config`. [`parse_config`] decodes it exactly as Go's
//! `encoding/json` would decode flannel's struct (spec §0, §1):
//! - keys match case-insensitively, unknown keys (including the removed
//!   `Networks`/`IPv6Networks`) are ignored, the last duplicate wins, types are strict;
//! - `EnableIPv4` defaults to `true`;
//! - `Network`/`IPv6Network` are masked to their network address;
//! - a missing `Backend` means backend type `"udp"`; a `Backend` without `Type`
//!   (`{}` or `null`) gives `""`, which [`backend::BackendKind`] later rejects
//!   with `unknown backend type: `.
//!
//! [`Config::check_network_config`] is flannel's `CheckNetworkConfig` (run by the
//! etcd/embedded lease managers only, never in kube mode): it fills in
//! SubnetLen/SubnetMin/SubnetMax and their IPv6 counterparts and validates them
//! with flannel's exact error strings. Unset values follow Go's zero values:
//! `subnet_len == 0`, `subnet_min == 0.0.0.0`, `ipv6_subnet_min == None` (or `::`).
//!
//! Deliberate differences from flannel: an IPv4 CIDR given as `IPv6Network` is an
//! error (`invalid IPv6 CIDR format`) instead of a mapped-address network, and an
//! IPv6 address given as `SubnetMin`/`SubnetMax` is `Invalid IP address format`
//! instead of a Go panic.

pub mod backend;
mod check;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use serde_json::value::RawValue;
use weft_compat::gojson::{
    Field, FieldTypeError, JsonDoc, for_each_member, parse_doc, unmarshaler_text,
};
use weft_compat::gonet::{CidrError, parse_cidr, parse_ip};

pub use backend::{BackendKind, BackendOptions, OptionsError};
pub use check::IpStack;

/// Errors from [`parse_config`] and [`Config::check_network_config`]. The texts
/// are flannel's (or Go's) own.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The text is not JSON.
    #[error("invalid JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    /// The document is JSON but not an object (or `null`).
    #[error("json: cannot unmarshal {0} into Go value of type subnet.Config")]
    NotAnObject(&'static str),
    /// A field has the wrong JSON type.
    #[error(transparent)]
    FieldType(#[from] FieldTypeError),
    /// `Network`/`IPv6Network` is not a CIDR (Go's `net.ParseCIDR` error).
    #[error(transparent)]
    InvalidCidr(#[from] CidrError),
    /// `Network` is an IPv6 CIDR.
    #[error("invalid IPv4 CIDR format")]
    NotIpv4Cidr,
    /// `IPv6Network` is an IPv4 CIDR (weft rejects it; see the module docs).
    #[error("invalid IPv6 CIDR format")]
    NotIpv6Cidr,
    /// `SubnetMin`/`SubnetMax`/`IPv6SubnetMin`/`IPv6SubnetMax` is not an address.
    #[error("Invalid IP address format")]
    InvalidIp,
    /// The `Backend` value has no readable `Type`.
    #[error("error decoding Backend property of config: {0}")]
    BackendProperty(String),
    /// IPv4 is enabled but `Network` is missing.
    #[error("please define a correct Network parameter in the flannel config")]
    NoNetwork,
    /// An explicit `SubnetLen` above 30.
    #[error("SubnetLen must be less than /31")]
    SubnetLenTooLong,
    /// An explicit (IPv4 or IPv6) subnet length that leaves fewer than four subnets.
    #[error("network must be able to accommodate at least four subnets")]
    TooFewSubnets,
    /// `Network` longer than /28 with no explicit `SubnetLen`.
    #[error("network is too small. Minimum useful network prefix is /28")]
    NetworkTooSmall,
    /// `SubnetMin` outside `Network`.
    #[error("SubnetMin is not in the range of the Network")]
    SubnetMinOutOfRange,
    /// `SubnetMax` outside `Network`.
    #[error("SubnetMax is not in the range of the Network")]
    SubnetMaxOutOfRange,
    /// `SubnetMin` not aligned to `SubnetLen`.
    #[error("SubnetMin is not on a SubnetLen boundary: {0}")]
    SubnetMinMisaligned(Ipv4Addr),
    /// `SubnetMax` not aligned to `SubnetLen`.
    #[error("SubnetMax is not on a SubnetLen boundary: {0}")]
    SubnetMaxMisaligned(Ipv4Addr),
    /// IPv6 is enabled but `IPv6Network` is missing.
    #[error("please define a correct IPv6Network parameter in the flannel config")]
    NoIpv6Network,
    /// An explicit `IPv6SubnetLen` above 126.
    #[error("SubnetLen must be less than /127")]
    Ipv6SubnetLenTooLong,
    /// `IPv6Network` longer than /124 with no explicit `IPv6SubnetLen`.
    #[error("IPv6Network is too small. Minimum useful network prefix is /124")]
    Ipv6NetworkTooSmall,
    /// `IPv6SubnetMin` outside `IPv6Network`.
    #[error("IPv6SubnetMin is not in the range of the IPv6Network")]
    Ipv6SubnetMinOutOfRange,
    /// `IPv6SubnetMax` outside `IPv6Network`.
    #[error("IPv6SubnetMax is not in the range of the IPv6Network")]
    Ipv6SubnetMaxOutOfRange,
    /// `IPv6SubnetMin` not aligned to `IPv6SubnetLen` (address in Go's format).
    #[error("IPv6SubnetMin is not on a SubnetLen boundary: {0}")]
    Ipv6SubnetMinMisaligned(String),
    /// `IPv6SubnetMax` not aligned to `IPv6SubnetLen` (address in Go's format).
    #[error("IPv6SubnetMax is not on a SubnetLen boundary: {0}")]
    Ipv6SubnetMaxMisaligned(String),
    /// Both `EnableIPv4` and `EnableIPv6` are false.
    #[error("none defined stack")]
    NoStack,
}

/// flannel's `subnet.Config`.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `EnableIPv4` (default true).
    pub enable_ipv4: bool,
    /// `EnableIPv6` (default false).
    pub enable_ipv6: bool,
    /// `EnableNFTables`: use nftables instead of iptables.
    pub enable_nftables: bool,
    /// `Network`, masked. `Some(0.0.0.0/0)` counts as missing, as in Go.
    pub network: Option<Ipv4Net>,
    /// `IPv6Network`, masked. `Some(::/0)` counts as missing.
    pub ipv6_network: Option<Ipv6Net>,
    /// `SubnetLen`; 0 = unset (computed by `check_network_config`). Values above
    /// `u32::MAX` saturate (they are rejected by the check anyway).
    pub subnet_len: u32,
    /// `SubnetMin`; `0.0.0.0` = unset.
    pub subnet_min: Ipv4Addr,
    /// `SubnetMax`; `0.0.0.0` = unset.
    pub subnet_max: Ipv4Addr,
    /// `IPv6SubnetLen`; 0 = unset.
    pub ipv6_subnet_len: u32,
    /// `IPv6SubnetMin`; `None` or `::` = unset.
    pub ipv6_subnet_min: Option<Ipv6Addr>,
    /// `IPv6SubnetMax`; `None` or `::` = unset.
    pub ipv6_subnet_max: Option<Ipv6Addr>,
    /// The backend type, lower-cased: `"udp"` when `Backend` is absent, `""` when
    /// it has no `Type`.
    pub backend_type: String,
    /// The raw JSON text of `Backend`, like Go's `json.RawMessage` (`None` when
    /// absent, `Some("null")` for `null`); decode it with [`BackendOptions::parse`].
    pub backend: Option<String>,
    /// weft only: `WeftNATTraversal` (docs/nat.md), default false. flanneld
    /// decodes net-conf.json with Go's `encoding/json`, which ignores keys
    /// its struct does not have (spec §0), so the key is safe in a network
    /// shared with flanneld nodes.
    pub weft_nat_traversal: bool,
}

impl Default for Config {
    /// What Go's `ParseConfig("{}")` returns.
    fn default() -> Self {
        Config {
            enable_ipv4: true,
            enable_ipv6: false,
            enable_nftables: false,
            network: None,
            ipv6_network: None,
            subnet_len: 0,
            subnet_min: Ipv4Addr::UNSPECIFIED,
            subnet_max: Ipv4Addr::UNSPECIFIED,
            ipv6_subnet_len: 0,
            ipv6_subnet_min: None,
            ipv6_subnet_max: None,
            backend_type: "udp".to_string(),
            backend: None,
            weft_nat_traversal: false,
        }
    }
}

const fn field(name: &'static str) -> Field {
    Field {
        strukt: "Config",
        name,
    }
}

/// flannel's `ParseConfig`: decodes net-conf.json / the etcd config value.
/// Does not compute defaults; see [`Config::check_network_config`].
pub fn parse_config(text: &[u8]) -> Result<Config, ConfigError> {
    let mut cfg = Config::default();
    match parse_doc(text).map_err(ConfigError::Syntax)? {
        // Go: unmarshalling `null` into a struct pointer is a no-op.
        JsonDoc::Null => {}
        JsonDoc::Object(members) => decode_members(&mut cfg, &members)?,
        JsonDoc::Other(kind) => return Err(ConfigError::NotAnObject(kind)),
    }
    cfg.backend_type = backend_type(cfg.backend.as_deref())?.to_lowercase();
    Ok(cfg)
}

fn decode_members(
    cfg: &mut Config,
    members: &[(String, Box<RawValue>)],
) -> Result<(), ConfigError> {
    for_each_member(members, |key, v| -> Result<(), ConfigError> {
        match key {
            "enableipv4" => set(&mut cfg.enable_ipv4, field("EnableIPv4").bool(v)?),
            "enableipv6" => set(&mut cfg.enable_ipv6, field("EnableIPv6").bool(v)?),
            "enablenftables" => set(&mut cfg.enable_nftables, field("EnableNFTables").bool(v)?),
            "subnetlen" => set(
                &mut cfg.subnet_len,
                field("SubnetLen").uint(v)?.map(saturate),
            ),
            "ipv6subnetlen" => set(
                &mut cfg.ipv6_subnet_len,
                field("IPv6SubnetLen").uint(v)?.map(saturate),
            ),
            // Non-pointer fields with an UnmarshalJSON method: Go passes `null`
            // to the method, which fails to parse it.
            "network" => {
                let IpNet::V4(net) = parse_cidr(unmarshaler_text(v))?.1 else {
                    return Err(ConfigError::NotIpv4Cidr);
                };
                cfg.network = Some(net);
            }
            "ipv6network" => {
                let IpNet::V6(net) = parse_cidr(unmarshaler_text(v))?.1 else {
                    return Err(ConfigError::NotIpv6Cidr);
                };
                cfg.ipv6_network = Some(net);
            }
            "subnetmin" => cfg.subnet_min = parse_ip4_field(v)?,
            "subnetmax" => cfg.subnet_max = parse_ip4_field(v)?,
            // Pointer fields: `null` sets them back to nil.
            "ipv6subnetmin" => cfg.ipv6_subnet_min = parse_ip6_field(v)?,
            "ipv6subnetmax" => cfg.ipv6_subnet_max = parse_ip6_field(v)?,
            // json.RawMessage keeps any value, `null` included.
            "backend" => cfg.backend = Some(v.get().to_string()),
            "weftnattraversal" => set(
                &mut cfg.weft_nat_traversal,
                field("WeftNATTraversal").bool(v)?,
            ),
            _ => {}
        }
        Ok(())
    })
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

fn saturate(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// flannel `ip.IP4.UnmarshalJSON`: `net.ParseIP` then `To4`.
fn parse_ip4_field(v: &RawValue) -> Result<Ipv4Addr, ConfigError> {
    match parse_ip(unmarshaler_text(v)) {
        Some(IpAddr::V4(ip)) => Ok(ip),
        Some(IpAddr::V6(ip)) => ip.to_ipv4_mapped().ok_or(ConfigError::InvalidIp),
        None => Err(ConfigError::InvalidIp),
    }
}

/// flannel `*ip.IP6` field: `null` → nil; else `net.ParseIP` then `To16`.
fn parse_ip6_field(v: &RawValue) -> Result<Option<Ipv6Addr>, ConfigError> {
    if v.get() == "null" {
        return Ok(None);
    }
    match parse_ip(unmarshaler_text(v)) {
        Some(IpAddr::V6(ip)) => Ok(Some(ip)),
        Some(IpAddr::V4(ip)) => Ok(Some(ip.to_ipv6_mapped())),
        None => Err(ConfigError::InvalidIp),
    }
}

/// flannel `parseBackendType`: absent → `udp`; otherwise decode `{Type string}`.
fn backend_type(raw: Option<&str>) -> Result<String, ConfigError> {
    let Some(raw) = raw else {
        return Ok("udp".to_string());
    };
    // The raw text came out of a parsed document, so it is valid JSON.
    match parse_doc(raw.as_bytes()).map_err(ConfigError::Syntax)? {
        JsonDoc::Null => Ok(String::new()),
        JsonDoc::Object(members) => {
            let mut ty = String::new();
            for_each_member(&members, |key, v| {
                if key == "type" {
                    let f = Field {
                        strukt: "",
                        name: "Type",
                    };
                    set(&mut ty, f.string(v)?);
                }
                Ok::<(), FieldTypeError>(())
            })
            .map_err(|e| ConfigError::BackendProperty(e.to_string()))?;
            Ok(ty)
        }
        JsonDoc::Other(kind) => Err(ConfigError::BackendProperty(format!(
            "json: cannot unmarshal {kind} into Go value of type struct {{ Type string }}"
        ))),
    }
}

#[cfg(test)]
mod tests;
