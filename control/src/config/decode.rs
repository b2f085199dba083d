//! Go `encoding/json` struct decoding, field by field, in document order.
//!
//! flannel decodes its config structs with Go's decoder; this module reproduces
//! what matters for them (spec §0):
//! - keys match field names case-insensitively ([`fold_key`], including Go's two
//!   non-ASCII runes that fold to ASCII letters);
//! - every occurrence of a key is decoded in document order, so the last one wins,
//!   and a wrong type in *any* occurrence is an error;
//! - types are strict: no string-to-number or number-to-bool coercion, integers
//!   must be integer literals in range;
//! - `null` leaves a plain field untouched (callers handle pointer and
//!   `Unmarshaler` fields, where `null` means something else).
//!
//! serde_json's `Map` merges exact duplicate keys, so documents are read through
//! [`JsonDoc`], which keeps every member with its raw text.
//!
//! Error texts follow Go's `UnmarshalTypeError`:
//! `json: cannot unmarshal string into Go struct field Config.SubnetLen of type uint`.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

/// A JSON value of the wrong type for a Go struct field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("json: cannot unmarshal {value} into Go struct field {strukt}.{field} of type {go_type}")]
pub struct FieldTypeError {
    /// What Go calls the offending value: `string`, `bool`, `number 1.5`, ...
    pub value: String,
    /// The Go struct name (empty for flannel's anonymous backend structs).
    pub strukt: &'static str,
    /// The Go field name.
    pub field: &'static str,
    /// The Go type of the field.
    pub go_type: &'static str,
}

/// Folds a JSON key the way Go matches it against field names: ASCII
/// case-insensitively, with `ſ` (U+017F) ≡ `s` and the Kelvin sign (U+212A) ≡ `k`.
pub(crate) fn fold_key(key: &str) -> String {
    key.chars()
        .map(|c| match c {
            '\u{17f}' => 's',
            '\u{212a}' => 'k',
            c => c.to_ascii_lowercase(),
        })
        .collect()
}

/// A JSON document as Go's decoder sees it before filling a struct: an object
/// keeps **every** member in document order, duplicates included (serde_json's
/// map would merge exact duplicates), with each value's raw text.
#[derive(Debug)]
pub(crate) enum JsonDoc {
    /// `null`: decoding into a struct is a no-op.
    Null,
    /// An object's members, in order.
    Object(Vec<(String, Box<RawValue>)>),
    /// Any other value; the payload is Go's name for its kind.
    Other(&'static str),
}

impl<'de> Deserialize<'de> for JsonDoc {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(DocVisitor)
    }
}

struct DocVisitor;

impl<'de> Visitor<'de> for DocVisitor {
    type Value = JsonDoc;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E>(self) -> Result<JsonDoc, E> {
        Ok(JsonDoc::Null)
    }
    fn visit_bool<E>(self, _: bool) -> Result<JsonDoc, E> {
        Ok(JsonDoc::Other("bool"))
    }
    fn visit_i64<E>(self, _: i64) -> Result<JsonDoc, E> {
        Ok(JsonDoc::Other("number"))
    }
    fn visit_u64<E>(self, _: u64) -> Result<JsonDoc, E> {
        Ok(JsonDoc::Other("number"))
    }
    fn visit_f64<E>(self, _: f64) -> Result<JsonDoc, E> {
        Ok(JsonDoc::Other("number"))
    }
    fn visit_str<E>(self, _: &str) -> Result<JsonDoc, E> {
        Ok(JsonDoc::Other("string"))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonDoc, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(JsonDoc::Other("array"))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonDoc, A::Error> {
        let mut members = Vec::new();
        while let Some(entry) = map.next_entry::<String, Box<RawValue>>()? {
            members.push(entry);
        }
        Ok(JsonDoc::Object(members))
    }
}

/// Parses a whole document (trailing garbage is a syntax error, as in Go).
pub(crate) fn parse_doc(text: &[u8]) -> Result<JsonDoc, serde_json::Error> {
    serde_json::from_slice(text)
}

/// Calls `f(folded_key, raw_value)` for every member in document order and
/// returns the first error (Go also fails the whole decode on any bad member).
pub(crate) fn for_each_member<E>(
    members: &[(String, Box<RawValue>)],
    mut f: impl FnMut(&str, &RawValue) -> Result<(), E>,
) -> Result<(), E> {
    let mut first_err = None;
    for (k, v) in members {
        if let Err(e) = f(&fold_key(k), v)
            && first_err.is_none()
        {
            first_err = Some(e);
        }
    }
    first_err.map_or(Ok(()), Err)
}

/// Describes the Go field a value is decoded into, for error messages.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Field {
    /// Go struct name.
    pub strukt: &'static str,
    /// Go field name.
    pub name: &'static str,
}

impl Field {
    fn err(self, value: String, go_type: &'static str) -> FieldTypeError {
        FieldTypeError {
            value,
            strukt: self.strukt,
            field: self.name,
            go_type,
        }
    }

    fn value(raw: &RawValue) -> Value {
        // The raw text was validated when the document was parsed.
        serde_json::from_str(raw.get()).unwrap_or(Value::Null)
    }

    /// Go `bool`. `null` → `Ok(None)` (field untouched).
    pub fn bool(self, raw: &RawValue) -> Result<Option<bool>, FieldTypeError> {
        match Self::value(raw) {
            Value::Null => Ok(None),
            Value::Bool(b) => Ok(Some(b)),
            other => Err(self.err(kind(&other).to_string(), "bool")),
        }
    }

    /// Go `string`. `null` → `Ok(None)`.
    pub fn string(self, raw: &RawValue) -> Result<Option<String>, FieldTypeError> {
        match Self::value(raw) {
            Value::Null => Ok(None),
            Value::String(s) => Ok(Some(s)),
            other => Err(self.err(kind(&other).to_string(), "string")),
        }
    }

    /// Go `int` (64-bit), or another signed type named `go_type`. `null` → `Ok(None)`.
    /// Like Go's `strconv.ParseInt` on the literal: `1.0` and `1e3` are errors.
    pub fn int(self, raw: &RawValue, go_type: &'static str) -> Result<Option<i64>, FieldTypeError> {
        match Self::value(raw) {
            Value::Null => Ok(None),
            Value::Number(_) => {
                let lit = raw.get().trim();
                lit.parse()
                    .map(Some)
                    .map_err(|_| self.err(format!("number {lit}"), go_type))
            }
            other => Err(self.err(kind(&other).to_string(), go_type)),
        }
    }

    /// Go `uint` (64-bit). `null` → `Ok(None)`.
    pub fn uint(self, raw: &RawValue) -> Result<Option<u64>, FieldTypeError> {
        match Self::value(raw) {
            Value::Null => Ok(None),
            Value::Number(_) => {
                let lit = raw.get().trim();
                lit.parse()
                    .map(Some)
                    .map_err(|_| self.err(format!("number {lit}"), "uint"))
            }
            other => Err(self.err(kind(&other).to_string(), "uint")),
        }
    }
}

/// The name Go uses for a JSON value's kind in `UnmarshalTypeError`.
pub(crate) fn kind(v: &Value) -> &'static str {
    crate::gojson::kind(v)
}

/// What an `UnmarshalJSON` method of flannel's `ip` package parses: the raw
/// JSON text after `bytes.Trim(j, "\"")` (escapes are not decoded).
pub(crate) fn unmarshaler_text(raw: &RawValue) -> &str {
    raw.get().trim().trim_matches('"')
}

/// Go's `net.ParseIP`: IPv4 dotted quad or IPv6 text, no zone.
pub(crate) fn parse_ip(s: &str) -> Option<IpAddr> {
    if s.contains('%') {
        return None;
    }
    s.parse().ok()
}

/// A CIDR that Go's `net.ParseCIDR` rejects: `invalid CIDR address: <s>`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR address: {0}")]
pub struct InvalidCidr(pub String);

/// Go's `net.ParseCIDR`: returns the address (host bits kept) and prefix length.
/// The prefix is ASCII digits only (leading zeros allowed) and at most the
/// address family's bit length.
pub(crate) fn parse_cidr(s: &str) -> Result<(IpAddr, u8), InvalidCidr> {
    let bad = || InvalidCidr(s.to_string());
    let (addr, len) = s.split_once('/').ok_or_else(bad)?;
    let addr = parse_ip(addr).ok_or_else(bad)?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    let digits = len.trim_start_matches('0');
    let n: u32 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| bad())?
    };
    let max = if addr.is_ipv4() { 32 } else { 128 };
    if n > max {
        return Err(bad());
    }
    Ok((addr, n as u8))
}

/// Formats an IPv6 address the way Go's `ip.IP6.String()` (big-int based) does:
/// values in `[2^24, 2^32)` and IPv4-mapped addresses print as dotted quads.
pub fn go_ip6_string(addr: Ipv6Addr) -> String {
    let v = u128::from(addr);
    if (1 << 24..1 << 32).contains(&v) {
        return Ipv4Addr::from(v as u32).to_string();
    }
    match addr.to_ipv4_mapped() {
        Some(v4) => v4.to_string(),
        None => addr.to_string(),
    }
}
