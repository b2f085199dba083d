//! The fixed JSON shape of [`super::Status`] ([`SHAPE`], the snapshot file
//! `snapshots/status.shape.json`) and a checker for it.
//!
//! A shape is JSON: `"string"`, `"number"` or `"bool"` for a scalar; an
//! object with the same keys for an object, where a key ending in `?` may
//! also be `null`; a one-element array for an array of elements of that
//! shape. [`check`] demands exactly the shape's keys, so adding, removing or
//! retyping a field fails until the snapshot is updated on purpose.

use serde_json::Value;

/// The snapshot of `weft status --json`.
pub const SHAPE: &str = include_str!("snapshots/status.shape.json");

/// Checks `v` against `shape`; the error names the first mismatching path.
pub fn check(v: &Value, shape: &Value) -> Result<(), String> {
    walk(v, shape, "$")
}

fn walk(v: &Value, shape: &Value, at: &str) -> Result<(), String> {
    match shape {
        Value::String(t) => {
            let ok = match t.as_str() {
                "string" => v.is_string(),
                "number" => v.is_u64() || v.is_i64() || v.is_f64(),
                "bool" => v.is_boolean(),
                other => return Err(format!("{at}: bad shape type {other:?}")),
            };
            if ok {
                Ok(())
            } else {
                Err(format!("{at}: expected {t}, got {v}"))
            }
        }
        Value::Array(el) => {
            let [el] = el.as_slice() else {
                return Err(format!("{at}: array shapes have one element"));
            };
            let items = v
                .as_array()
                .ok_or_else(|| format!("{at}: expected an array, got {v}"))?;
            items
                .iter()
                .enumerate()
                .try_for_each(|(i, x)| walk(x, el, &format!("{at}[{i}]")))
        }
        Value::Object(fields) => {
            let obj = v
                .as_object()
                .ok_or_else(|| format!("{at}: expected an object, got {v}"))?;
            for (k, s) in fields {
                let (name, nullable) = match k.strip_suffix('?') {
                    Some(n) => (n, true),
                    None => (k.as_str(), false),
                };
                let path = format!("{at}.{name}");
                match obj.get(name) {
                    None => return Err(format!("{path}: missing")),
                    Some(Value::Null) if nullable => {}
                    Some(x) => walk(x, s, &path)?,
                }
            }
            match obj.keys().find(|k| {
                !fields.contains_key(k.as_str()) && !fields.contains_key(&format!("{k}?"))
            }) {
                Some(extra) => Err(format!("{at}.{extra}: not in the shape snapshot")),
                None => Ok(()),
            }
        }
        other => Err(format!("{at}: bad shape {other}")),
    }
}
