//! The allocations on disk: one small JSON file, rewritten atomically after
//! every change, so that weftd restarts neither lose nor double-hand-out an
//! address.
//!
//! Format (version 1; addresses without prefix length):
//!
//! ```json
//! {"version":1,"subnet":"10.244.1.0/24","ipv6Subnet":null,
//!  "lastIPv4":"10.244.1.7","lastIPv6":null,
//!  "allocations":[{"containerID":"abc","ifname":"eth0","ipv4":"10.244.1.7"}],
//!  "hostLocalDirs":["/var/lib/cni/networks/cbr0"]}
//! ```
//!
//! `hostLocalDirs` (absent when empty) lists the host-local directories
//! weftd has mirrored its allocations into (see [`super::host_local`]), so
//! that a release removes their files there too.
//!
//! Contract:
//! - Writing: a temporary file (mode 0600) in the same directory, fsynced,
//!   renamed over the target, then the directory fsynced. Readers see the
//!   old or the new file, never a torn one; a crash loses no acknowledged
//!   change.
//! - Reading: a missing file is an empty state. Anything else that is not a
//!   valid version-1 document (bad JSON, unknown keys, a duplicate key or
//!   address) is [`StateError::Corrupt`], naming the file and the problem; it
//!   is never silently replaced.
//! - `subnet`/`ipv6Subnet` record the lease the file was written under; on
//!   load the allocator takes the *current* lease's subnets and keeps the
//!   old allocations held (see [`super::alloc`]).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use ipnet::{Ipv4Net, Ipv6Net};
use serde::{Deserialize, Serialize};
use weft_compat::ipam::Allocation;

use super::alloc::Allocator;

/// The only format version.
const VERSION: u32 = 1;
/// Largest state file accepted (a /16 of allocations is far below this).
const MAX_STATE_BYTES: u64 = 64 * 1024 * 1024;

/// Errors reading or writing the state file.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// The file exists but cannot be used; it is left in place.
    #[error(
        "ipam state file {path} is corrupt: {reason}; fix or move it away (pods holding its addresses must then be re-created)"
    )]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Document {
    version: u32,
    #[serde(default)]
    subnet: Option<Ipv4Net>,
    #[serde(default)]
    ipv6_subnet: Option<Ipv6Net>,
    #[serde(default, rename = "lastIPv4")]
    last_ipv4: Option<Ipv4Addr>,
    #[serde(default, rename = "lastIPv6")]
    last_ipv6: Option<Ipv6Addr>,
    allocations: Vec<Allocation>,
    #[serde(
        default,
        rename = "hostLocalDirs",
        skip_serializing_if = "Vec::is_empty"
    )]
    host_local_dirs: Vec<String>,
}

/// The state file at one path.
#[derive(Debug, Clone)]
pub struct StateFile {
    path: PathBuf,
}

// === impl StateFile ===

impl StateFile {
    /// The state file at `path` (nothing is read yet).
    pub fn new(path: impl Into<PathBuf>) -> StateFile {
        StateFile { path: path.into() }
    }

    /// Its path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Loads the allocations into an allocator for the current lease
    /// subnets, and the host-local directories they are mirrored in.
    pub fn load(
        &self,
        subnet: Option<Ipv4Net>,
        ipv6_subnet: Option<Ipv6Net>,
    ) -> Result<(Allocator, Vec<String>), StateError> {
        let fresh = Allocator::new(subnet, ipv6_subnet);
        let bytes = match read_bounded(&self.path) {
            Ok(b) => b,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((fresh, Vec::new())),
            Err(source) => {
                return Err(StateError::Io {
                    op: "read",
                    path: self.path.clone(),
                    source,
                });
            }
        };
        let corrupt = |reason: String| StateError::Corrupt {
            path: self.path.clone(),
            reason,
        };
        let doc: Document = serde_json::from_slice(&bytes).map_err(|e| corrupt(e.to_string()))?;
        if doc.version != VERSION {
            return Err(corrupt(format!(
                "unsupported version {} (expected {VERSION})",
                doc.version
            )));
        }
        let alloc = fresh
            .restore(doc.allocations, doc.last_ipv4, doc.last_ipv6)
            .map_err(|e| corrupt(e.to_string()))?;
        Ok((alloc, doc.host_local_dirs))
    }

    /// Writes the allocator's state (and the mirror directories) atomically
    /// and durably.
    pub fn save(&self, alloc: &Allocator, host_local_dirs: &[String]) -> Result<(), StateError> {
        let (last_ipv4, last_ipv6) = alloc.cursors();
        let doc = Document {
            version: VERSION,
            subnet: alloc.subnet(),
            ipv6_subnet: alloc.ipv6_subnet(),
            last_ipv4,
            last_ipv6,
            allocations: alloc.list(),
            host_local_dirs: host_local_dirs.to_vec(),
        };
        let mut bytes = serde_json::to_vec(&doc).map_err(|e| StateError::Io {
            op: "encode",
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        bytes.push(b'\n');
        write_atomic(&self.path, &bytes)
    }
}

fn read_bounded(path: &Path) -> io::Result<Vec<u8>> {
    use std::io::Read;
    let file = File::open(path)?;
    let mut bytes = Vec::new();
    file.take(MAX_STATE_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_STATE_BYTES {
        return Err(io::Error::other(format!(
            "larger than {MAX_STATE_BYTES} bytes"
        )));
    }
    Ok(bytes)
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StateError> {
    let err = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |source| StateError::Io {
            op,
            path: p,
            source,
        }
    };
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&dir).map_err(err("create directory", &dir))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.tmp"));
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(err("create", &tmp))?;
    f.write_all(bytes).map_err(err("write", &tmp))?;
    f.sync_all().map_err(err("fsync", &tmp))?;
    drop(f);
    fs::rename(&tmp, path).map_err(err("rename", path))?;
    File::open(&dir)
        .and_then(|d| d.sync_all())
        .map_err(err("fsync", &dir))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use weft_compat::ipam::Key;

    fn key(id: &str) -> Key {
        Key {
            container_id: id.into(),
            ifname: "eth0".into(),
        }
    }

    #[test]
    fn round_trip_keeps_allocations_and_cursor() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = StateFile::new(dir.path().join("sub/ipam.json"));
        let net: Ipv4Net = "10.244.5.0/24".parse().expect("net");
        let v6: Ipv6Net = "fd00:5::/64".parse().expect("net");
        let (mut a, dirs) = file
            .load(Some(net), Some(v6))
            .expect("missing file is empty");
        assert!(dirs.is_empty());
        assert!(a.is_empty());
        for id in ["a", "b", "c"] {
            a.allocate(&key(id)).expect("alloc");
        }
        a.release(&key("b"));
        file.save(&a, &["/var/lib/cni/networks/cbr0".into()])
            .expect("save");
        let mode = fs::metadata(file.path()).expect("stat");
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
            0o600
        );
        let (mut b, dirs) = file.load(Some(net), Some(v6)).expect("load");
        assert_eq!(dirs, vec!["/var/lib/cni/networks/cbr0".to_string()]);
        assert_eq!(b, a);
        // The cursor survived: the next address is .5, not b's released .3.
        let (x, _) = b.allocate(&key("d")).expect("alloc");
        assert_eq!(x.ipv4, Some("10.244.5.5".parse().expect("ip")));
        assert_eq!(x.ipv6, Some("fd00:5::5".parse().expect("ip")));
        let left: Vec<String> = fs::read_dir(dir.path().join("sub"))
            .expect("dir")
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(left, vec!["ipam.json"], "no temporary file left behind");
    }

    #[test]
    fn corrupt_files_are_clear_errors_and_left_alone() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ipam.json");
        let file = StateFile::new(&path);
        let net = Some("10.244.5.0/24".parse().expect("net"));
        let cases: [(&str, &str); 6] = [
            ("{\"version\":1,\"allocations\":[", "EOF"),
            ("[]", "expected struct Document"),
            (
                "{\"version\":2,\"allocations\":[]}",
                "unsupported version 2",
            ),
            (
                "{\"version\":1,\"allocations\":[],\"extra\":1}",
                "unknown field `extra`",
            ),
            (
                "{\"version\":1,\"allocations\":[{\"containerID\":\"a\",\"ifname\":\"eth0\",\"ipv4\":\"10.244.5.2\"},{\"containerID\":\"b\",\"ifname\":\"eth0\",\"ipv4\":\"10.244.5.2\"}]}",
                "duplicate address 10.244.5.2",
            ),
            (
                "{\"version\":1,\"allocations\":[{\"containerID\":\"a\",\"ifname\":\"eth0\",\"ipv4\":\"10.244.5.300\"}]}",
                "invalid",
            ),
        ];
        for (text, want) in cases {
            fs::write(&path, text).expect("write");
            let e = file.load(net, None).expect_err(text);
            let msg = e.to_string();
            assert!(matches!(e, StateError::Corrupt { .. }), "{msg}");
            assert!(
                msg.contains(want) && msg.contains("ipam.json"),
                "{text}: {msg}"
            );
            assert_eq!(
                fs::read_to_string(&path).expect("read"),
                text,
                "file untouched"
            );
        }
    }
}
