//! CNI versions: what the plugin supports, how a network's `cniVersion` is
//! checked (as Go `skel` does), and the VERSION reply.
//!
//! Contract:
//! - Supported: 0.1.0, 0.2.0, 0.3.0, 0.3.1, 0.4.0, 1.0.0, 1.1.0 (Go's
//!   `version.All`, what flannel advertises).
//! - A missing or empty `cniVersion` means 0.1.0 (Go `DecodeVersion`).
//! - ADD/DEL need the exact version in the supported list; CHECK needs
//!   >= 0.4.0; GC and STATUS need >= 1.1.0 (skel's messages).

use std::cmp::Ordering;

use serde_json::{Value, json};

/// The versions this plugin speaks, oldest first.
pub const SUPPORTED: [&str; 7] = [
    "0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0",
];
/// The newest supported version.
pub const CURRENT: &str = "1.1.0";

/// Version problems, with Go skel's texts.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The network's version is not one we support.
    #[error("incompatible CNI versions")]
    Incompatible {
        /// The network's version.
        config: String,
    },
    /// The verb needs a newer network version.
    #[error("config version does not allow {verb}")]
    VerbNotAllowed {
        /// The verb (`CHECK`, `GC`, `STATUS`).
        verb: &'static str,
    },
    /// A version string that is not `x[.y[.z]]`.
    #[error("invalid version {0:?}: the version is empty or has too many parts")]
    Invalid(String),
}

// === impl VersionError ===

impl VersionError {
    /// The `details` field skel prints for this error.
    pub fn details(&self) -> String {
        match self {
            VersionError::Incompatible { config } => {
                let list: Vec<String> = SUPPORTED.iter().map(|v| format!("{v:?}")).collect();
                format!("config is {config:?}, plugin supports [{}]", list.join(" "))
            }
            _ => String::new(),
        }
    }
}

/// The effective version of a network: `cniVersion`, or 0.1.0 when empty.
pub fn effective(cni_version: &str) -> &str {
    if cni_version.is_empty() {
        "0.1.0"
    } else {
        cni_version
    }
}

/// Checks that `cni_version` is supported (ADD, DEL).
pub fn check_supported(cni_version: &str) -> Result<(), VersionError> {
    let v = effective(cni_version);
    if SUPPORTED.contains(&v) {
        Ok(())
    } else {
        Err(VersionError::Incompatible {
            config: v.to_string(),
        })
    }
}

/// Checks that `cni_version` is supported and at least `min` (CHECK, GC, STATUS).
pub fn check_at_least(
    cni_version: &str,
    min: &str,
    verb: &'static str,
) -> Result<(), VersionError> {
    let v = effective(cni_version);
    if compare(v, min)? == Ordering::Less {
        return Err(VersionError::VerbNotAllowed { verb });
    }
    check_supported(v)
}

/// Compares two `x[.y[.z]]` versions numerically.
pub fn compare(a: &str, b: &str) -> Result<Ordering, VersionError> {
    Ok(parse(a)?.cmp(&parse(b)?))
}

fn parse(v: &str) -> Result<[u64; 3], VersionError> {
    let invalid = || VersionError::Invalid(v.to_string());
    let parts: Vec<&str> = v.split('.').collect();
    if v.is_empty() || parts.len() > 3 {
        return Err(invalid());
    }
    let mut out = [0u64; 3];
    for (slot, part) in out.iter_mut().zip(&parts) {
        if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
            return Err(invalid());
        }
        *slot = part.parse().map_err(|_| invalid())?;
    }
    Ok(out)
}

/// The VERSION reply. It echoes the requested version when we support it
/// (the spec's wording), otherwise names our newest.
pub fn reply(requested: Option<&str>) -> Value {
    let v = match requested {
        Some(r) if SUPPORTED.contains(&r) => r,
        _ => CURRENT,
    };
    json!({ "cniVersion": v, "supportedVersions": SUPPORTED })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn support_and_minimums() {
        assert!(check_supported("").is_ok(), "empty is 0.1.0");
        assert!(check_supported("1.1.0").is_ok());
        let e = check_supported("9.9.9").expect_err("unsupported");
        assert_eq!(e.to_string(), "incompatible CNI versions");
        assert_eq!(
            e.details(),
            r#"config is "9.9.9", plugin supports ["0.1.0" "0.2.0" "0.3.0" "0.3.1" "0.4.0" "1.0.0" "1.1.0"]"#
        );
        assert_eq!(
            check_at_least("0.3.1", "0.4.0", "CHECK"),
            Err(VersionError::VerbNotAllowed { verb: "CHECK" })
        );
        assert!(check_at_least("1.0.0", "0.4.0", "CHECK").is_ok());
        assert_eq!(
            check_at_least("1.0.0", "1.1.0", "GC")
                .expect_err("too old")
                .to_string(),
            "config version does not allow GC"
        );
        assert!(check_at_least("1.1.0", "1.1.0", "STATUS").is_ok());
        assert!(matches!(
            check_at_least("x.y", "1.1.0", "GC"),
            Err(VersionError::Invalid(_))
        ));
        assert!(matches!(
            check_at_least("1.2.0", "1.1.0", "GC"),
            Err(VersionError::Incompatible { .. })
        ));
    }

    #[test]
    fn reply_echoes_supported_versions() {
        assert_eq!(reply(Some("0.3.1"))["cniVersion"], "0.3.1");
        assert_eq!(reply(Some("7.0.0"))["cniVersion"], CURRENT);
        assert_eq!(
            reply(None)["supportedVersions"].as_array().map(Vec::len),
            Some(7)
        );
    }
}
