//! Go struct fields, decoded one JSON member at a time with Go's strict types.
//!
//! Error texts follow Go's `UnmarshalTypeError`:
//! `json: cannot unmarshal string into Go struct field Config.SubnetLen of type uint`.

use serde_json::Value;
use serde_json::value::RawValue;

use super::kind;

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

/// Describes the Go field a value is decoded into, for error messages.
#[derive(Debug, Clone, Copy)]
pub struct Field {
    /// Go struct name.
    pub strukt: &'static str,
    /// Go field name.
    pub name: &'static str,
}

// === impl Field ===

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

/// What an `UnmarshalJSON` method of flannel's `ip` package parses: the raw
/// JSON text after `bytes.Trim(j, "\"")` (escapes are not decoded).
pub fn unmarshaler_text(raw: &RawValue) -> &str {
    raw.get().trim().trim_matches('"')
}
