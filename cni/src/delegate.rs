//! Building the delegate (bridge) configuration exactly as flannel's
//! `cmdAdd` / `doCmdAdd` / `getDelegateIPAM` do (cni-plugin `flannel.go`,
//! `flannel_linux.go`).
//!
//! Contract (the output of [`build`], serialized with [`to_bytes`], is
//! byte-identical to flannel's `json.Marshal` of the same map):
//! - `delegate` must not carry `name` or `ipam`, and its `type`, if present,
//!   must be a string (flannel's messages).
//! - `runtimeConfig` is copied in; `name` is the network name; `type`
//!   defaults to `bridge`; `ipMasq` to `!FLANNEL_IPMASQ`; `mtu` to
//!   `FLANNEL_MTU`; a bridge gets `isGateway: true` unless set; `cniVersion`
//!   is the network's when it has one.
//! - `ipam` is the network's `ipam` (extra keys kept) with `type` defaulting
//!   to `host-local`, `ranges` = one range set per family of this node's
//!   subnet, and `routes` = the configured routes followed by one route per
//!   `FLANNEL_NETWORK` and `FLANNEL_IPV6_NETWORK`.
//! - Object keys are sorted (Go maps); routes keep Go's struct field order.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value, json};
use weft_compat::gojson::{self, kind as json_kind};
use weft_compat::gonet::{self, CidrError};
use weft_compat::subnet_env::plugin::SubnetEnv;

use crate::config::NetConf;

/// Why the delegate configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DelegateError {
    /// `delegate.type` is not a string.
    #[error("'delegate' dictionary, if present, must have (string) 'type' field")]
    TypeNotString,
    /// `delegate.name` is set; flannel sets it.
    #[error("'delegate' dictionary must not have 'name' field, it'll be set by flannel")]
    NameSet {
        /// The offending value.
        value: Value,
    },
    /// `delegate.ipam` is set; flannel sets it.
    #[error("'delegate' dictionary must not have 'ipam' field, it'll be set by flannel")]
    IpamSet {
        /// The offending value.
        value: Value,
    },
    /// `ipam.routes` is malformed.
    #[error(
        "failed to assemble Delegate IPAM: failed to read IPAM routes: failed to parse ipam.routes: {0}"
    )]
    Routes(String),
}

/// One route as CNI's Go `types.Route` decodes and re-encodes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// `dst`, host bits kept as written.
    pub dst: IpNet,
    /// `gw`.
    pub gw: Option<IpAddr>,
    /// `mtu` (0 = unset).
    pub mtu: i64,
    /// `advmss` (0 = unset).
    pub advmss: i64,
    /// `priority` (0 = unset).
    pub priority: i64,
    /// `table`.
    pub table: Option<i64>,
    /// `scope`.
    pub scope: Option<i64>,
}

// === impl Route ===

impl Route {
    /// A route to `dst` with nothing else set.
    pub fn to(dst: IpNet) -> Route {
        Route {
            dst,
            gw: None,
            mtu: 0,
            advmss: 0,
            priority: 0,
            table: None,
            scope: None,
        }
    }

    /// Decodes one route with Go semantics (case-insensitive keys, unknown
    /// keys dropped).
    fn parse(v: &Value) -> Result<Route, String> {
        let Value::Object(obj) = v else {
            return Err(format!(
                "json: cannot unmarshal {} into Go value of type types.Route",
                json_kind(v)
            ));
        };
        let dst = match gojson::lookup_fold(obj, "dst") {
            Some(Value::String(s)) => {
                let (ip, net) = gonet::parse_cidr(s).map_err(|e: CidrError| e.to_string())?;
                IpNet::new(ip, net.prefix_len()).map_err(|e| e.to_string())?
            }
            None | Some(Value::Null) => return Err("route has no dst".to_string()),
            Some(other) => return Err(field_type(other, "dst", "string")),
        };
        let gw = match gojson::lookup_fold(obj, "gw") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) if s.is_empty() => None,
            Some(Value::String(s)) => Some(
                s.parse::<IpAddr>()
                    .map_err(|_| format!("invalid IP address: {s}"))?,
            ),
            Some(other) => return Err(field_type(other, "gw", "net.IP")),
        };
        let int = |field: &str| -> Result<Option<i64>, String> {
            match gojson::lookup_fold(obj, field) {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Number(n)) => n
                    .as_i64()
                    .or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9.0e15).map(|f| f as i64))
                    .map(Some)
                    .ok_or_else(|| format!("json: cannot unmarshal number {n} into Go struct field route.{field} of type int")),
                Some(other) => Err(field_type(other, field, "int")),
            }
        };
        Ok(Route {
            dst,
            gw,
            mtu: int("mtu")?.unwrap_or(0),
            advmss: int("advmss")?.unwrap_or(0),
            priority: int("priority")?.unwrap_or(0),
            table: int("table")?,
            scope: int("scope")?,
        })
    }

    /// Encodes like Go's `types.Route` (struct order, `omitempty`).
    pub fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("dst".into(), Value::String(self.dst.to_string()));
        if let Some(gw) = self.gw {
            m.insert("gw".into(), Value::String(gw.to_string()));
        }
        for (key, v) in [
            ("mtu", self.mtu),
            ("advmss", self.advmss),
            ("priority", self.priority),
        ] {
            if v != 0 {
                m.insert(key.into(), Value::from(v));
            }
        }
        for (key, v) in [("table", self.table), ("scope", self.scope)] {
            if let Some(v) = v {
                m.insert(key.into(), Value::from(v));
            }
        }
        Value::Object(m)
    }
}

fn field_type(found: &Value, field: &str, go_type: &str) -> String {
    format!(
        "json: cannot unmarshal {} into Go struct field route.{field} of type {go_type}",
        json_kind(found)
    )
}

/// Checks the `delegate` dictionary as flannel's `cmdAdd` does.
pub fn validate(conf: &NetConf) -> Result<(), DelegateError> {
    let Some(d) = &conf.delegate else {
        return Ok(());
    };
    if d.get("type").is_some_and(|t| !t.is_string()) {
        return Err(DelegateError::TypeNotString);
    }
    if let Some(value) = d.get("name") {
        return Err(DelegateError::NameSet {
            value: value.clone(),
        });
    }
    if let Some(value) = d.get("ipam") {
        return Err(DelegateError::IpamSet {
            value: value.clone(),
        });
    }
    Ok(())
}

/// Builds the delegate configuration for `conf` on a node described by `env`.
pub fn build(conf: &NetConf, env: &SubnetEnv) -> Result<Map<String, Value>, DelegateError> {
    validate(conf)?;
    let mut d: Map<String, Value> = match conf.delegate.clone() {
        Some(m) => into_map(gojson::sorted(Value::Object(m))),
        None => Map::new(),
    };
    if let Some(rc) = &conf.runtime_config {
        d.insert(
            "runtimeConfig".into(),
            gojson::sorted(Value::Object(rc.clone())),
        );
    }
    d.insert("name".into(), Value::String(conf.name.clone()));
    d.entry("type")
        .or_insert_with(|| Value::String("bridge".into()));
    d.entry("ipMasq").or_insert(Value::Bool(!env.ipmasq));
    d.entry("mtu").or_insert(Value::from(env.mtu));
    if d.get("type").and_then(Value::as_str) == Some("bridge") {
        d.entry("isGateway").or_insert(Value::Bool(true));
    }
    if !conf.cni_version.is_empty() {
        d.insert("cniVersion".into(), Value::String(conf.cni_version.clone()));
    }
    d.insert("ipam".into(), Value::Object(ipam(conf, env)?));
    Ok(gojson::sort_top(d))
}

/// flannel's `getDelegateIPAM`.
fn ipam(conf: &NetConf, env: &SubnetEnv) -> Result<Map<String, Value>, DelegateError> {
    let mut ipam: Map<String, Value> = match conf.ipam.clone() {
        Some(m) => into_map(gojson::sorted(Value::Object(m))),
        None => Map::new(),
    };
    ipam.entry("type")
        .or_insert_with(|| Value::String("host-local".into()));
    let ranges: Vec<Value> = [env.subnet, env.ipv6_subnet]
        .into_iter()
        .flatten()
        .map(|sn| json!([{ "subnet": sn.to_string() }]))
        .collect();
    // Go marshals a nil slice as null; flannel's subnet.env check makes that
    // unreachable, as one subnet is always present.
    ipam.insert(
        "ranges".into(),
        if ranges.is_empty() {
            Value::Null
        } else {
            Value::Array(ranges)
        },
    );
    let mut routes = match ipam.get("routes") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(items)) => items
            .iter()
            .map(Route::parse)
            .collect::<Result<Vec<_>, _>>()
            .map_err(DelegateError::Routes)?,
        Some(other) => {
            return Err(DelegateError::Routes(format!(
                "json: cannot unmarshal {} into Go value of type []types.Route",
                json_kind(other)
            )));
        }
    };
    routes.extend(
        env.networks
            .iter()
            .chain(&env.ipv6_networks)
            .map(|n| Route::to(*n)),
    );
    ipam.insert(
        "routes".into(),
        Value::Array(routes.iter().map(Route::to_json).collect()),
    );
    Ok(gojson::sort_top(ipam))
}

/// Serializes a delegate configuration as flannel saves and sends it.
pub fn to_bytes(d: &Map<String, Value>) -> Vec<u8> {
    gojson::marshal(&Value::Object(d.clone()))
}

/// A saved delegate config, decoded enough to replay it: the object and its
/// plugin `type` (matched case-insensitively, as Go's `types.NetConf`).
/// `Err` carries why the bytes are unusable.
pub fn parse_saved(bytes: &[u8]) -> Result<(Map<String, Value>, String), String> {
    let value: Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    let Value::Object(map) = value else {
        return Err(format!("expected an object, found {}", json_kind(&value)));
    };
    match gojson::lookup_fold(&map, "type") {
        Some(Value::String(t)) if !t.is_empty() => {
            let t = t.clone();
            Ok((map, t))
        }
        _ => Err("no plugin type".to_string()),
    }
}

fn into_map(v: Value) -> Map<String, Value> {
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

#[cfg(test)]
mod tests;
