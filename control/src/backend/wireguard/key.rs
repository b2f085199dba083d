//! The WireGuard private key file, compatible with flannel's (spec §5):
//! `/run/flannel/wgkey` or `$WIREGUARD_KEY_FILE`; generated once (Curve25519,
//! clamped like `wgtypes.GeneratePrivateKey`), parent directory created 0755,
//! the file created with mode 0400 holding the 44-character standard base64
//! key with **no** trailing newline; read back and reused on every start.
//!
//! Line breaks: flannel parses the file with Go's `base64.StdEncoding`, which
//! skips `\r` and `\n` anywhere in its input, so a key file written by hand
//! with `wg genkey > wgkey` (trailing newline) works with flannel. weft accepts
//! it the same way and logs a warning; anything else that is not exactly one
//! base64 key (spaces, a short key, garbage) is an error, as in flannel.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use weft_engine::WgSecret;
use weft_engine::wg::{key_from_base64, key_to_base64};

/// flannel's default key file.
pub const DEFAULT_KEY_FILE: &str = "/run/flannel/wgkey";
/// The environment variable overriding it.
pub const KEY_FILE_ENV: &str = "WIREGUARD_KEY_FILE";

/// Errors reading or creating the key file.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// The file exists but does not hold one base64 key.
    #[error("could not parse private key from file {0}")]
    Parse(PathBuf),
    /// Reading, creating or writing the file failed.
    #[error("wireguard key file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// The system random source failed.
    #[error("cannot generate a private key: {0}")]
    Random(String),
}

/// `$WIREGUARD_KEY_FILE` if set and non-empty, else [`DEFAULT_KEY_FILE`].
pub fn key_file_path() -> PathBuf {
    match std::env::var_os(KEY_FILE_ENV) {
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => PathBuf::from(DEFAULT_KEY_FILE),
    }
}

/// Parses a key file's contents (see the module docs for line breaks).
/// Returns the key and whether line breaks had to be skipped.
pub fn parse_key_text(text: &str) -> Option<(WgSecret, bool)> {
    let stripped: String = text.chars().filter(|c| *c != '\r' && *c != '\n').collect();
    let key = key_from_base64(&stripped)?;
    Some((WgSecret(key), stripped.len() != text.len()))
}

/// A fresh Curve25519 private key from the OS random source, clamped.
pub fn generate() -> Result<WgSecret, KeyError> {
    use rand::TryRngCore;
    let mut k = [0u8; 32];
    rand::rngs::OsRng
        .try_fill_bytes(&mut k)
        .map_err(|e| KeyError::Random(e.to_string()))?;
    k[0] &= 248;
    k[31] = (k[31] & 127) | 64;
    Ok(WgSecret(k))
}

/// Reads the key at `path`, or generates and stores one if the file does not exist.
pub fn load_or_generate(path: &Path) -> Result<WgSecret, KeyError> {
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| KeyError::Parse(path.to_path_buf()))?;
            let (key, had_breaks) =
                parse_key_text(&text).ok_or_else(|| KeyError::Parse(path.to_path_buf()))?;
            if had_breaks {
                tracing::warn!(
                    "wireguard key file {} contains line breaks; ignored as flannel's Go base64 decoder does",
                    path.display()
                );
            }
            Ok(key)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = generate()?;
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(dir)
                    .map_err(io)?;
            }
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o400)
                .open(path)
                .map_err(io)?;
            // The umask cannot widen 0400, but a chmod makes the mode exact as flannel's does.
            f.set_permissions(std::fs::Permissions::from_mode(0o400))
                .map_err(io)?;
            f.write_all(key_to_base64(&key.0).as_bytes()).map_err(io)?;
            f.sync_all().map_err(io)?;
            tracing::info!(
                "generated a new wireguard private key in {}",
                path.display()
            );
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_once_then_reuses_with_flannels_format() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("sub/dir/wgkey");
        let k1 = load_or_generate(&path).expect("generate");
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.len(), 44, "44 base64 chars, no newline: {text:?}");
        assert!(!text.ends_with('\n'));
        assert_eq!(key_from_base64(&text), Some(k1.0));
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o400);
        let dmode = std::fs::metadata(path.parent().expect("dir"))
            .expect("meta")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(dmode & 0o700, 0o700);
        assert_eq!(k1.0[0] & 7, 0, "clamped");
        assert_eq!(k1.0[31] & 0xc0, 0x40, "clamped");
        // Reused across restarts.
        let k2 = load_or_generate(&path).expect("reuse");
        assert_eq!(k1, k2);
        assert_ne!(generate().expect("gen").0, k1.0);
    }

    #[test]
    fn line_breaks_are_skipped_like_go_and_junk_is_rejected() {
        let good = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=";
        assert_eq!(parse_key_text(good).map(|(_, b)| b), Some(false));
        assert_eq!(
            parse_key_text(&format!("{good}\n")).map(|(_, b)| b),
            Some(true)
        );
        assert_eq!(
            parse_key_text(&format!("{good}\r\n")).map(|(_, b)| b),
            Some(true)
        );
        assert!(parse_key_text(&format!("{good} ")).is_none());
        assert!(parse_key_text(&good[..40]).is_none());
        assert!(parse_key_text("").is_none());
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wgkey");
        std::fs::write(&path, "not a key").expect("write");
        assert!(matches!(load_or_generate(&path), Err(KeyError::Parse(_))));
        std::fs::write(&path, format!("{good}\n")).expect("write");
        assert_eq!(
            load_or_generate(&path).expect("newline tolerated").0[0],
            0x85
        );
    }

    #[test]
    fn env_overrides_the_default_path() {
        // Read-only check of the default; the env override is exercised by the
        // integration tests (setting env vars in a threaded test is racy).
        if std::env::var_os(KEY_FILE_ENV).is_none() {
            assert_eq!(key_file_path(), PathBuf::from(DEFAULT_KEY_FILE));
        }
    }
}
