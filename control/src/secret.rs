//! [`Secret`]: a value that is never printed.
//!
//! Contract: `Debug` and `Display` show `<redacted>` for a set value and
//! `""` for an empty one (so a log still says whether it was given), for
//! every secret weftd holds: the etcd password, ipsec and WireGuard PSKs
//! (WireGuard private keys are `weft_engine::WgSecret`, redacted the same
//! way; the netlink requests carrying key bytes have hand-written `Debug`).
//! Code that needs the value calls [`Secret::expose`], and only where it
//! hands it to the party that needs it (etcd, charon, the kernel).

/// See the module docs.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Secret {
        Secret(value.into())
    }

    /// The value, for the one call that needs it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether no value was given.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The clap value parser (keeps the value, hides it in `Debug`).
    pub fn parse(s: &str) -> Result<Secret, std::convert::Infallible> {
        Ok(Secret::new(s))
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Secret {
        Secret(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Secret {
        Secret(s.to_string())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_empty() {
            "\"\""
        } else {
            "<redacted>"
        })
    }
}

/// `Some(<redacted>)` / `None` in a hand-written `Debug` of key bytes.
pub(crate) fn redacted<T>(v: &Option<T>) -> Option<Redacted> {
    v.as_ref().map(|_| Redacted)
}

/// Prints `<redacted>` (for hand-written `Debug` impls).
pub(crate) struct Redacted;

impl std::fmt::Debug for Redacted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new("s3cret-pa55");
        for shown in [format!("{s:?}"), format!("{s}"), format!("{:?}", Some(&s))] {
            assert!(!shown.contains("s3cret"), "{shown}");
            assert!(shown.contains("<redacted>"), "{shown}");
        }
        assert_eq!(s.expose(), "s3cret-pa55");
        assert_eq!(format!("{:?}", Secret::default()), "\"\"");
        assert_eq!(
            format!("{:?}", redacted(&Some([7u8; 32]))),
            "Some(<redacted>)"
        );
        assert_eq!(format!("{:?}", redacted::<[u8; 32]>(&None)), "None");
    }
}
