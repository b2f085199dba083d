//! JSON the way Go's `encoding/json` reads and writes it (flannel-compat spec §0).
//!
//! flannel decodes every document it reads (net-conf.json, the etcd config
//! key, the `Backend` object, lease values, node annotations, the CNI
//! config) with Go's decoder, which differs from serde's defaults:
//! - object keys match struct fields **case-insensitively** ([`fold_key`],
//!   including Go's two non-ASCII runes that fold to ASCII letters);
//! - unknown keys are ignored;
//! - every occurrence of a key is decoded in document order, so the
//!   **last** one wins, and a wrong type in *any* occurrence is an error;
//! - types are strict: no string-to-number or number-to-bool coercion,
//!   integers must be integer literals in range ([`Field`]);
//! - a JSON `null` for a non-pointer field leaves the field unchanged
//!   (callers handle pointer and `Unmarshaler` fields, where `null` means
//!   something else).
//!
//! serde_json's `Map` merges exact duplicate keys, so documents are read
//! through [`JsonDoc`], which keeps every member with its raw text.
//! [`parse_object`] folds an object's keys with those rules applied, so that
//! a serde struct with lower-case field names (and `Option` for fields that
//! may be absent or null) decodes like Go would; [`lookup_fold`] finds one
//! field in an already decoded object.
//!
//! Writing: [`marshal`] is `json.Marshal`'s output, with Go's HTML escaping and
//! number formatting; [`sorted`] orders keys as Go marshals a map.

mod encode;
mod field;

use std::fmt;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use serde_json::{Map, Value};

pub use encode::{marshal, sort_top, sorted};
pub use field::{Field, FieldTypeError, unmarshaler_text};

/// Errors from Go-style decoding of a whole object ([`parse_object`], [`take`]).
#[derive(Debug, thiserror::Error)]
pub enum GoJsonError {
    /// The text is not valid JSON.
    #[error("invalid JSON: {0}")]
    Syntax(#[source] serde_json::Error),
    /// The document is valid JSON but not an object.
    #[error("expected a JSON object, found {0}")]
    NotAnObject(&'static str),
    /// A field has the wrong JSON type.
    #[error("cannot decode field {field}: {source}")]
    Field {
        /// The (lower-cased) field name.
        field: String,
        /// Why the value did not fit.
        #[source]
        source: serde_json::Error,
    },
}

/// Folds one character the way Go matches keys against field names.
fn fold_char(c: char) -> char {
    match c {
        '\u{17f}' => 's',
        '\u{212a}' => 'k',
        c => c.to_ascii_lowercase(),
    }
}

/// Folds a JSON key the way Go matches it against field names: ASCII
/// case-insensitively, with `ſ` (U+017F) ≡ `s` and the Kelvin sign (U+212A) ≡ `k`.
/// (Go folds every rune to its smallest case variant; those two are the
/// only non-ASCII runes whose variants include an ASCII letter, so for
/// ASCII field names this is exactly Go's match.)
pub fn fold_key(key: &str) -> String {
    key.chars().map(fold_char).collect()
}

/// Whether `key` matches field name `field` under Go's folding.
fn fold_eq(key: &str, field: &str) -> bool {
    key.chars().map(fold_char).eq(field.chars().map(fold_char))
}

/// A JSON document as Go's decoder sees it before filling a struct: an object
/// keeps **every** member in document order, duplicates included (serde_json's
/// map would merge exact duplicates), with each value's raw text.
#[derive(Debug)]
pub enum JsonDoc {
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
pub fn parse_doc(text: &[u8]) -> Result<JsonDoc, serde_json::Error> {
    serde_json::from_slice(text)
}

/// Calls `f(folded_key, raw_value)` for every member in document order and
/// returns the first error (Go also fails the whole decode on any bad member).
pub fn for_each_member<E>(
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

/// Parses `text` as a JSON object and folds its keys (see the module docs).
/// Every member is seen in document order, exact duplicates included (serde's
/// own map would merge those before the last-wins rule could apply), with
/// Go's key folding ([`fold_key`]).
pub fn parse_object(text: &[u8]) -> Result<Map<String, Value>, GoJsonError> {
    match parse_doc(text).map_err(GoJsonError::Syntax)? {
        JsonDoc::Object(members) => {
            let mut out = Map::with_capacity(members.len());
            for (k, raw) in members {
                let v: Value = serde_json::from_str(raw.get()).map_err(GoJsonError::Syntax)?;
                // A null leaves the field as it was, in Go too.
                if !v.is_null() {
                    out.insert(fold_key(&k), v);
                }
            }
            Ok(out)
        }
        JsonDoc::Null => Err(GoJsonError::NotAnObject("null")),
        JsonDoc::Other(kind) => Err(GoJsonError::NotAnObject(kind)),
    }
}

/// Takes field `name` (lower-case) out of a folded object and decodes it.
/// Absent (or null) → `Ok(None)`; wrong type → an error naming the field.
pub fn take<T: serde::de::DeserializeOwned>(
    map: &mut Map<String, Value>,
    name: &str,
) -> Result<Option<T>, GoJsonError> {
    match map.remove(name) {
        None => Ok(None),
        Some(v) => serde_json::from_value(v)
            .map(Some)
            .map_err(|source| GoJsonError::Field {
                field: name.to_string(),
                source,
            }),
    }
}

/// Finds the value of struct field `field` in a decoded JSON object the way
/// Go's `encoding/json` matches keys ([`fold_key`]), and when several keys
/// match, the last one in the map wins.
pub fn lookup_fold<'a>(map: &'a Map<String, Value>, field: &str) -> Option<&'a Value> {
    map.iter()
        .rev()
        .find(|(k, _)| fold_eq(k, field))
        .map(|(_, v)| v)
}

/// The name Go uses for a JSON value's kind in its error messages.
pub fn kind(v: &Value) -> &'static str {
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
mod tests;
