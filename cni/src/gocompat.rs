//! Small pieces of Go behaviour that flannel's plugin exposes to users and that
//! a drop-in replacement must reproduce byte for byte.
//!
//! Contracts:
//! - [`parse_cidr`] is `net.ParseCIDR`: it returns the address as written and
//!   the *network* (host bits cleared); errors read `invalid CIDR address: <s>`.
//! - [`marshal`] is `json.Marshal` of already key-ordered values: compact, with
//!   Go's HTML escaping (`<`, `>`, `&`, U+2028, U+2029) and integral floats
//!   printed as integers (Go decodes every JSON number into `float64`).
//! - [`sorted`] orders object keys recursively, as Go marshals `map[string]any`.
//! - [`io_error_text`] renders an errno the way Go's `syscall.Errno` does
//!   (`no such file or directory`, not `No such file or directory (os error 2)`).
//! - [`lookup_fold`] finds a struct field the way `encoding/json` does: the
//!   last key that matches exactly or ASCII-case-insensitively wins.

use std::io;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Map, Value};

/// Error of [`parse_cidr`]; the text is Go's `*net.ParseError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR address: {0}")]
pub struct CidrError(pub String);

/// Parses `s` like Go's `net.ParseCIDR`: returns `(address, network)`.
pub fn parse_cidr(s: &str) -> Result<(IpAddr, IpNet), CidrError> {
    let err = || CidrError(s.to_string());
    let (addr, mask) = s.split_once('/').ok_or_else(err)?;
    // Rust's parser, like Go's netip, rejects IPv4 octets with leading zeros
    // and IPv6 zones; both are invalid in a CIDR.
    let ip: IpAddr = addr.parse().map_err(|_| err())?;
    let bits: u32 = if ip.is_ipv4() { 32 } else { 128 };
    // Go's dtoi: ASCII digits only (leading zeros allowed), no sign, no spaces.
    if mask.is_empty() || !mask.bytes().all(|b| b.is_ascii_digit()) || mask.len() > 3 {
        return Err(err());
    }
    let prefix: u32 = mask.parse().map_err(|_| err())?;
    if prefix > bits {
        return Err(err());
    }
    let prefix = u8::try_from(prefix).map_err(|_| err())?;
    let net = IpNet::new(ip, prefix).map_err(|_| err())?.trunc();
    Ok((ip, net))
}

/// Sorts the keys of every object in `v`, recursively (Go's map marshalling).
pub fn sorted(v: Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut entries: Vec<(String, Value)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Value::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// Sorts only the top-level keys of `map`.
pub fn sort_top(map: Map<String, Value>) -> Map<String, Value> {
    let mut entries: Vec<(String, Value)> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().collect()
}

/// Serializes `v` compactly as Go's `json.Marshal` would, keeping the key
/// order `v` already has.
pub fn marshal(v: &Value) -> Vec<u8> {
    let normalized = go_numbers(v.clone());
    // Serializing a `Value` cannot fail (keys are strings, floats are finite).
    let text = serde_json::to_string(&normalized).unwrap_or_default();
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.into_bytes()
}

/// Prints integral floats as integers, as Go's `float64` formatting does
/// below 1e21 (`1.0` → `1`).
fn go_numbers(v: Value) -> Value {
    match v {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(0.0);
            if f.fract() == 0.0 && f.abs() < 9.0e15 {
                // Exact: |f| < 2^53, so the cast cannot lose precision.
                Value::from(f as i64)
            } else {
                Value::Number(n)
            }
        }
        Value::Object(map) => {
            Value::Object(map.into_iter().map(|(k, v)| (k, go_numbers(v))).collect())
        }
        Value::Array(items) => Value::Array(items.into_iter().map(go_numbers).collect()),
        other => other,
    }
}

/// Go's rendering of an I/O error: the errno text with a lower-case first
/// letter, without Rust's ` (os error N)` suffix.
pub fn io_error_text(e: &io::Error) -> String {
    let text = match e.raw_os_error() {
        Some(code) => {
            let full = io::Error::from_raw_os_error(code).to_string();
            match full.rfind(" (os error ") {
                Some(i) => full[..i].to_string(),
                None => full,
            }
        }
        None => e.to_string(),
    };
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => text,
    }
}

/// Finds the value of struct field `field` in a decoded JSON object the way
/// Go's `encoding/json` matches keys: exact or ASCII-case-insensitive, and
/// when several keys match, the last one in the document wins.
pub fn lookup_fold<'a>(map: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    map.iter()
        .rev()
        .find(|(k, _)| k.eq_ignore_ascii_case(field))
        .map(|(_, v)| v)
}

/// The Go name of a JSON value's kind, for unmarshal error messages.
pub fn json_kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "bool",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn parse_cidr_returns_network() {
        let (ip, net) = parse_cidr("10.1.17.1/24").expect("valid");
        assert_eq!(ip.to_string(), "10.1.17.1");
        assert_eq!(net.to_string(), "10.1.17.0/24");
        let (_, net6) = parse_cidr("2001:cafe:42::1/64").expect("valid v6");
        assert_eq!(net6.to_string(), "2001:cafe:42::/64");
        assert_eq!(
            parse_cidr("10.0.0.0/08")
                .expect("leading zero mask")
                .1
                .to_string(),
            "10.0.0.0/8"
        );
    }

    #[test]
    fn parse_cidr_rejects_like_go() {
        for bad in [
            "",
            "10.0.0.0",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "10.0.0.0/ 8",
            "010.0.0.0/8",
            "x/8",
            "::1/129",
            "10.0.0.0/8 ",
        ] {
            assert_eq!(parse_cidr(bad), Err(CidrError(bad.to_string())), "{bad:?}");
        }
        assert_eq!(CidrError("x".into()).to_string(), "invalid CIDR address: x");
    }

    #[test]
    fn marshal_is_go_compatible() {
        let v = sorted(json!({"b": 1.0, "a": {"z": "<&>", "y": [0.5, 2]}}));
        assert_eq!(
            String::from_utf8(marshal(&v)).expect("utf8"),
            r#"{"a":{"y":[0.5,2],"z":"\u003c\u0026\u003e"},"b":1}"#
        );
    }

    #[test]
    fn io_error_text_is_go_errno() {
        let e = io::Error::from_raw_os_error(2);
        assert_eq!(io_error_text(&e), "no such file or directory");
    }

    #[test]
    fn lookup_fold_last_match_wins() {
        let v = json!({"subnetFile": "a", "SUBNETFILE": "b", "other": 1});
        let map = v.as_object().expect("object");
        assert_eq!(lookup_fold(map, "subnetFile"), Some(&json!("b")));
        assert_eq!(lookup_fold(map, "missing"), None);
    }
}
