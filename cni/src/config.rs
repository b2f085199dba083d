//! The flannel plugin's network configuration (stdin), decoded with Go
//! `encoding/json` rules, as flannel's `loadFlannelNetConf` does.
//!
//! Contract:
//! - Top-level keys match case-insensitively (the last matching key wins);
//!   unknown keys are ignored; `null` leaves a field at its default.
//! - `subnetFile` defaults to `/run/flannel/subnet.env`, `dataDir` to
//!   `/var/lib/cni/flannel`.
//! - `delegate`, `ipam` and `runtimeConfig` are kept as JSON objects (their
//!   own keys are matched exactly later, as Go map lookups are).
//! - A field of the wrong JSON type is an error naming the field, like Go's
//!   `json: cannot unmarshal ...`.

use serde_json::{Map, Value};

use weft_compat::gojson::{self, kind as json_kind};

/// Default `subnetFile`.
pub const DEFAULT_SUBNET_FILE: &str = "/run/flannel/subnet.env";
/// Default `dataDir`.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/cni/flannel";

/// Key carrying the valid attachments on GC (CNI 1.1, libcni >= 1.2 and spec HEAD).
pub const VALID_ATTACHMENTS: &str = "cni.dev/valid-attachments";
/// Older spelling of [`VALID_ATTACHMENTS`] (spec-v1.1.0 text); accepted too.
pub const ATTACHMENTS: &str = "cni.dev/attachments";

/// The decoded plugin configuration.
#[derive(Debug, Clone, Default)]
pub struct NetConf {
    /// `cniVersion` as written (empty if absent).
    pub cni_version: String,
    /// `name`, the network name.
    pub name: String,
    /// `subnetFile`.
    pub subnet_file: String,
    /// `dataDir`, where delegate configs are saved per container.
    pub data_dir: String,
    /// `delegate`, the base of the delegate config.
    pub delegate: Option<Map<String, Value>>,
    /// `ipam`, the base of the delegate's IPAM config.
    pub ipam: Option<Map<String, Value>>,
    /// `runtimeConfig`, copied into the delegate config.
    pub runtime_config: Option<Map<String, Value>>,
    /// `prevResult` (the cached ADD result on CHECK/DEL).
    pub prev_result: Option<Map<String, Value>>,
    /// `mode` (weft): `bridge` (flannel's delegation, the default) or `routed`.
    pub mode: Mode,
    /// `ipamSocket` (weft, routed mode): weftd's IPAM API socket.
    pub ipam_socket: Option<String>,
    /// The whole document, for keys only some verbs read.
    raw: Map<String, Value>,
}

/// How pods are attached (`mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// flannel's delegation to bridge + host-local (absent, empty or `bridge`).
    #[default]
    Bridge,
    /// weft's routed datapath with daemon-side IPAM (`routed`).
    Routed,
}

/// One still-valid attachment listed on GC.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Attachment {
    /// `containerID`.
    pub container_id: String,
    /// `ifname`.
    pub ifname: String,
}

/// Why the configuration could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// stdin is not JSON.
    #[error("failed to load netconf: {0}")]
    Syntax(#[source] serde_json::Error),
    /// stdin is JSON but not an object.
    #[error(
        "failed to load netconf: json: cannot unmarshal {found} into Go value of type main.NetConf"
    )]
    NotObject {
        /// The JSON kind found.
        found: &'static str,
    },
    /// A field has the wrong JSON type.
    #[error(
        "failed to load netconf: json: cannot unmarshal {found} into Go struct field NetConf.{field} of type {go_type}"
    )]
    FieldType {
        /// The JSON kind found.
        found: &'static str,
        /// The field name.
        field: &'static str,
        /// The Go type expected.
        go_type: &'static str,
    },
    /// `mode` names no known mode.
    #[error("unsupported mode {value:?}: expected \"bridge\" or \"routed\"")]
    UnknownMode {
        /// The value as written.
        value: String,
    },
    /// The GC attachment list is malformed.
    #[error("invalid {key}: {reason}")]
    Attachments {
        /// The key holding the list.
        key: &'static str,
        /// What is wrong.
        reason: String,
    },
}

// === impl NetConf ===

impl NetConf {
    /// Decodes stdin.
    pub fn parse(bytes: &[u8]) -> Result<NetConf, ConfigError> {
        let value: Value = serde_json::from_slice(bytes).map_err(ConfigError::Syntax)?;
        let Value::Object(raw) = value else {
            return Err(ConfigError::NotObject {
                found: json_kind(&value),
            });
        };
        // `type` is not used, but Go rejects a non-string one.
        string_field(&raw, "type")?;
        Ok(NetConf {
            cni_version: string_field(&raw, "cniVersion")?.unwrap_or_default(),
            name: string_field(&raw, "name")?.unwrap_or_default(),
            subnet_file: string_field(&raw, "subnetFile")?
                .unwrap_or_else(|| DEFAULT_SUBNET_FILE.to_string()),
            data_dir: string_field(&raw, "dataDir")?
                .unwrap_or_else(|| DEFAULT_DATA_DIR.to_string()),
            delegate: map_field(&raw, "delegate")?,
            ipam: map_field(&raw, "ipam")?,
            runtime_config: map_field(&raw, "runtimeConfig")?,
            prev_result: map_field(&raw, "prevResult")?,
            mode: match string_field(&raw, "mode")?.as_deref() {
                None | Some("" | "bridge") => Mode::Bridge,
                Some("routed") => Mode::Routed,
                Some(other) => {
                    return Err(ConfigError::UnknownMode {
                        value: other.to_string(),
                    });
                }
            },
            ipam_socket: string_field(&raw, "ipamSocket")?.filter(|s| !s.is_empty()),
            raw,
        })
    }

    /// The delegate plugin's type: `delegate.type`, or `bridge`.
    pub fn delegate_type(&self) -> &str {
        self.delegate
            .as_ref()
            .and_then(|d| d.get("type"))
            .and_then(Value::as_str)
            .unwrap_or("bridge")
    }

    /// The union of `cni.dev/valid-attachments` and `cni.dev/attachments`
    /// (GC). Absent keys mean "no valid attachments".
    pub fn gc_attachments(&self) -> Result<Vec<Attachment>, ConfigError> {
        let mut out = Vec::new();
        for key in [VALID_ATTACHMENTS, ATTACHMENTS] {
            let Some(list) = gojson::lookup_fold(&self.raw, key) else {
                continue;
            };
            let bad = |reason: String| ConfigError::Attachments { key, reason };
            let items = match list {
                Value::Null => continue,
                Value::Array(items) => items,
                other => {
                    return Err(bad(format!(
                        "expected an array, found {}",
                        json_kind(other)
                    )));
                }
            };
            for item in items {
                let Value::Object(obj) = item else {
                    return Err(bad(format!(
                        "expected an object, found {}",
                        json_kind(item)
                    )));
                };
                let get = |field: &str| match gojson::lookup_fold(obj, field) {
                    None | Some(Value::Null) => Ok(String::new()),
                    Some(Value::String(s)) => Ok(s.clone()),
                    Some(other) => Err(bad(format!(
                        "{field} must be a string, found {}",
                        json_kind(other)
                    ))),
                };
                let attachment = Attachment {
                    container_id: get("containerID")?,
                    ifname: get("ifname")?,
                };
                if !out.contains(&attachment) {
                    out.push(attachment);
                }
            }
        }
        Ok(out)
    }
}

/// A string field; `null` is a no-op in Go, so the last non-null key wins.
fn string_field(
    raw: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<String>, ConfigError> {
    let last = raw
        .iter()
        .rev()
        .find(|(k, v)| k.eq_ignore_ascii_case(field) && !v.is_null())
        .map(|(_, v)| v);
    match last {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ConfigError::FieldType {
            found: json_kind(other),
            field,
            go_type: "string",
        }),
    }
}

/// A map field; `null` resets a Go map to nil, so the last key wins.
fn map_field(
    raw: &Map<String, Value>,
    field: &'static str,
) -> Result<Option<Map<String, Value>>, ConfigError> {
    match gojson::lookup_fold(raw, field) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(other) => Err(ConfigError::FieldType {
            found: json_kind(other),
            field,
            go_type: "map[string]interface {}",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_case_insensitive_keys() {
        let c = NetConf::parse(br#"{"cniVersion":"0.3.1","NAME":"cbr0","type":"flannel","delegate":{"hairpinMode":true}}"#).expect("valid");
        assert_eq!(c.name, "cbr0");
        assert_eq!(c.subnet_file, DEFAULT_SUBNET_FILE);
        assert_eq!(c.data_dir, DEFAULT_DATA_DIR);
        assert_eq!(c.delegate_type(), "bridge");
        let c = NetConf::parse(br#"{"subnetfile":"/x","DataDir":"/y","subnetFile":null}"#)
            .expect("valid");
        assert_eq!((c.subnet_file.as_str(), c.data_dir.as_str()), ("/x", "/y"));
    }

    #[test]
    fn mode_and_ipam_socket() {
        let c = NetConf::parse(br#"{"name":"n"}"#).expect("valid");
        assert_eq!((c.mode, c.ipam_socket), (Mode::Bridge, None));
        let c = NetConf::parse(br#"{"mode":"routed","ipamSocket":"/x/s.sock"}"#).expect("valid");
        assert_eq!(
            (c.mode, c.ipam_socket.as_deref()),
            (Mode::Routed, Some("/x/s.sock"))
        );
        let e = NetConf::parse(br#"{"mode":"ipvlan"}"#).expect_err("unknown mode");
        assert_eq!(
            e.to_string(),
            r#"unsupported mode "ipvlan": expected "bridge" or "routed""#
        );
        assert!(NetConf::parse(br#"{"mode":1}"#).is_err());
    }

    #[test]
    fn type_errors_name_the_field() {
        let e = NetConf::parse(br#"{"dataDir":5}"#).expect_err("bad type");
        assert_eq!(
            e.to_string(),
            "failed to load netconf: json: cannot unmarshal number into Go struct field NetConf.dataDir of type string"
        );
        let e = NetConf::parse(br#"{"delegate":[]}"#).expect_err("bad type");
        assert!(e.to_string().contains("NetConf.delegate"), "{e}");
        assert!(matches!(
            NetConf::parse(b"[1]"),
            Err(ConfigError::NotObject { found: "array" })
        ));
        assert!(matches!(NetConf::parse(b"{"), Err(ConfigError::Syntax(_))));
        assert!(matches!(NetConf::parse(b""), Err(ConfigError::Syntax(_))));
    }

    #[test]
    fn gc_attachments_merge_both_keys() {
        let c = NetConf::parse(
            br#"{"cni.dev/valid-attachments":[{"containerID":"a","ifname":"eth0"}],
                 "cni.dev/attachments":[{"containerID":"a","ifname":"eth0"},{"containerID":"b","ifname":"net1"}]}"#,
        )
        .expect("valid");
        let got = c.gc_attachments().expect("valid list");
        assert_eq!(got.len(), 2);
        assert_eq!(
            got[1],
            Attachment {
                container_id: "b".into(),
                ifname: "net1".into()
            }
        );
        let c = NetConf::parse(br#"{"cni.dev/valid-attachments":{"x":1}}"#).expect("valid json");
        assert!(c.gc_attachments().is_err());
        assert!(
            NetConf::parse(b"{}")
                .expect("valid")
                .gc_attachments()
                .expect("empty")
                .is_empty()
        );
    }
}
