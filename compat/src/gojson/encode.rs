//! `json.Marshal`'s output, for documents flannel's plugin writes (the
//! delegate config it saves and passes on).
//!
//! Contracts:
//! - [`marshal`] is `json.Marshal` of already key-ordered values: compact, with
//!   Go's HTML escaping (`<`, `>`, `&`, U+2028, U+2029) and integral floats
//!   printed as integers (Go decodes every JSON number into `float64`).
//! - [`sorted`] orders object keys recursively, as Go marshals `map[string]any`.

use serde_json::{Map, Value};

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
