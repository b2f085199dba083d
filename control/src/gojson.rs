//! Decoding JSON the way Go's `encoding/json` does (flannel-compat spec §0).
//!
//! flannel decodes every document it reads (net-conf.json, the etcd config key,
//! the `Backend` object, lease values, node annotations) with Go's decoder, which
//! differs from serde's defaults:
//! - object keys match struct fields **case-insensitively**;
//! - unknown keys are ignored;
//! - when a key appears twice (in any case), the **last** value wins;
//! - a JSON `null` for a non-pointer field leaves the field unchanged.
//!
//! [`parse_object`] turns an object into one whose keys are folded with
//! those rules applied, so that a serde struct with lower-case field names (and
//! `Option` for fields that may be absent or null) decodes like Go would.

use serde_json::{Map, Value};

/// Errors from Go-style decoding.
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

/// Parses `text` as a JSON object and folds its keys (see the module docs).
/// Every member is seen in document order, exact duplicates included (serde's
/// own map would merge those before the last-wins rule could apply), with
/// Go's key folding ([`crate::config::decode::fold_key`]).
pub fn parse_object(text: &[u8]) -> Result<Map<String, Value>, GoJsonError> {
    use crate::config::decode::{JsonDoc, fold_key, parse_doc};
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
mod tests {
    use super::*;

    #[test]
    fn keys_fold_and_last_duplicate_wins() {
        let m = parse_object(br#"{"Network":"10.0.0.0/8","network":"10.3.0.0/16","X":1}"#)
            .expect("valid");
        assert_eq!(m.get("network"), Some(&Value::from("10.3.0.0/16")));
        assert_eq!(m.get("x"), Some(&Value::from(1)));
        assert!(m.get("Network").is_none());
    }

    #[test]
    fn exact_duplicate_then_null_keeps_the_first_value() {
        // serde_json's map would merge these before folding; Go keeps "a".
        let m = parse_object(br#"{"PublicIP":"a","PublicIP":null}"#).expect("valid");
        assert_eq!(m.get("publicip"), Some(&Value::from("a")));
    }

    #[test]
    fn null_leaves_field_untouched() {
        let m = parse_object(br#"{"EnableIPv4":false,"enableipv4":null}"#).expect("valid");
        assert_eq!(m.get("enableipv4"), Some(&Value::Bool(false)));
    }

    #[test]
    fn strict_types() {
        let mut m = parse_object(br#"{"Port":"8472"}"#).expect("valid");
        let err = take::<u16>(&mut m, "port").expect_err("string is not an int");
        assert!(err.to_string().contains("port"), "{err}");
    }

    #[test]
    fn non_object_is_an_error() {
        assert!(matches!(
            parse_object(b"[1]"),
            Err(GoJsonError::NotAnObject("array"))
        ));
        assert!(matches!(parse_object(b"{"), Err(GoJsonError::Syntax(_))));
    }
}
