//! The per-container delegate configs in `dataDir`, as flannel keeps them.
//!
//! Contract:
//! - `<dataDir>/<containerID>` holds the exact delegate config bytes sent on
//!   ADD (flannel's format, so flannel and weft can DEL each other's pods).
//!   The directory is created 0700, the file 0600; it is written to a temp
//!   file and renamed into place, so readers never see a torn file, and
//!   fsynced (in the background, overlapping the delegate's run; ADD waits
//!   for it before it reports success).
//! - `<dataDir>/.weft-ifnames/<containerID>` records the interface name of
//!   the attachment (flannel does not keep it); GC needs it to release the
//!   right IPAM reservation. Absent means `eth0`.
//! - `<dataDir>/.weft.lock` is flocked: shared by ADD and DEL (they run in
//!   parallel for different containers), exclusive by GC (which the runtime
//!   must not run concurrently with ADD/DEL, but we do not rely on that).
//! - Names starting with `.` are never container IDs (skel forbids them).

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use weft_compat::goio::io_error_text;

const LOCK_FILE: &str = ".weft.lock";
const IFNAME_DIR: &str = ".weft-ifnames";
/// The interface name assumed for configs saved without one (by flannel).
pub const DEFAULT_IFNAME: &str = "eth0";

/// A filesystem operation on the data dir failed.
#[derive(Debug, thiserror::Error)]
#[error("{op} {}: {}", .path.display(), io_error_text(.source))]
pub struct StoreError {
    /// The operation (`open`, `write`, `rename`, ...).
    pub op: &'static str,
    /// The path involved.
    pub path: PathBuf,
    /// The cause.
    #[source]
    pub source: io::Error,
}

/// The data dir.
#[derive(Debug, Clone)]
pub struct Store {
    dir: PathBuf,
}

/// The background fsync of a saved config.
#[derive(Debug)]
pub struct PendingSync {
    handle: std::thread::JoinHandle<Result<(), StoreError>>,
}

// === impl PendingSync ===

impl PendingSync {
    /// Waits for the fsync to finish.
    pub fn wait(self) -> Result<(), StoreError> {
        match self.handle.join() {
            Ok(result) => result,
            Err(_) => Err(StoreError {
                op: "sync",
                path: PathBuf::new(),
                source: io::Error::other("sync thread panicked"),
            }),
        }
    }
}

/// A held flock on the data dir; released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
}

fn err<'a>(op: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> StoreError + 'a {
    move |source| StoreError {
        op,
        path: path.to_path_buf(),
        source,
    }
}

// === impl Store ===

impl Store {
    /// The store at `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> Store {
        Store { dir: dir.into() }
    }

    /// Whether the data dir exists (if not, nothing was ever saved).
    pub fn exists(&self) -> bool {
        self.dir.is_dir()
    }

    /// Creates the data dir (0700) if needed and takes the shared lock.
    pub fn lock_shared(&self) -> Result<DirLock, StoreError> {
        self.lock(false)
    }

    /// Creates the data dir (0700) if needed and takes the exclusive lock.
    pub fn lock_exclusive(&self) -> Result<DirLock, StoreError> {
        self.lock(true)
    }

    fn lock(&self, exclusive: bool) -> Result<DirLock, StoreError> {
        DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)
            .map_err(err("mkdir", &self.dir))?;
        let path = self.dir.join(LOCK_FILE);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(err("open", &path))?;
        if exclusive {
            file.lock()
        } else {
            file.lock_shared()
        }
        .map_err(err("flock", &path))?;
        Ok(DirLock { _file: file })
    }

    /// The path of a container's saved config.
    pub fn path(&self, container_id: &str) -> PathBuf {
        self.dir.join(container_id)
    }

    /// Saves `config` for `container_id` (atomically) and remembers `ifname`.
    ///
    /// The file is in place when this returns; its fsync runs in the
    /// background (it costs milliseconds) and must be awaited with
    /// [`PendingSync::wait`] before the ADD reports success.
    pub fn save(
        &self,
        container_id: &str,
        ifname: &str,
        config: &[u8],
    ) -> Result<PendingSync, StoreError> {
        if ifname != DEFAULT_IFNAME {
            let dir = self.dir.join(IFNAME_DIR);
            DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(&dir)
                .map_err(err("mkdir", &dir))?;
            write_atomic(&dir, container_id, ifname.as_bytes())?;
        } else {
            // A stale record from an earlier attachment with the same ID.
            let _ = fs::remove_file(self.dir.join(IFNAME_DIR).join(container_id));
        }
        let (file, path) = write_atomic(&self.dir, container_id, config)?;
        let handle = std::thread::spawn(move || file.sync_all().map_err(err("sync", &path)));
        Ok(PendingSync { handle })
    }

    /// The saved config of `container_id`, `None` if there is none.
    pub fn load(&self, container_id: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.path(container_id);
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(err("read", &path)(e)),
        }
    }

    /// The interface name recorded for `container_id`.
    pub fn ifname(&self, container_id: &str) -> String {
        fs::read_to_string(self.dir.join(IFNAME_DIR).join(container_id))
            .ok()
            .filter(|s| !s.is_empty())
            .unwrap_or_else(|| DEFAULT_IFNAME.to_string())
    }

    /// Removes the saved config and interface record; missing is fine.
    pub fn remove(&self, container_id: &str) -> Result<(), StoreError> {
        let _ = fs::remove_file(self.dir.join(IFNAME_DIR).join(container_id));
        let path = self.path(container_id);
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(err("remove", &path)(e)),
            _ => Ok(()),
        }
    }

    /// The container IDs with a saved config, sorted.
    pub fn list(&self) -> Result<Vec<String>, StoreError> {
        let mut out = Vec::new();
        let entries = match fs::read_dir(&self.dir) {
            Ok(e) => e,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(err("open", &self.dir)(e)),
        };
        for entry in entries {
            let entry = entry.map_err(err("readdir", &self.dir))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            out.push(name);
        }
        out.sort();
        Ok(out)
    }

    /// Removes interface records whose config is gone; returns how many.
    pub fn prune_ifnames(&self) -> usize {
        let Ok(entries) = fs::read_dir(self.dir.join(IFNAME_DIR)) else {
            return 0;
        };
        let mut n = 0;
        for entry in entries.flatten() {
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            if !name.starts_with('.')
                && !self.path(&name).exists()
                && fs::remove_file(entry.path()).is_ok()
            {
                n += 1;
            }
        }
        n
    }
}

/// Writes `dir/name` via a temp file (0600) and rename; returns the open
/// file (for a later fsync) and its final path.
fn write_atomic(dir: &Path, name: &str, data: &[u8]) -> Result<(File, PathBuf), StoreError> {
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(err("open", &tmp))?;
        f.write_all(data).map_err(err("write", &tmp))?;
        let target = dir.join(name);
        fs::rename(&tmp, &target).map_err(err("rename", &target))?;
        Ok((f, target))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn save_load_list_remove() {
        let t = tempfile::tempdir().expect("tempdir");
        let s = Store::new(t.path().join("flannel"));
        assert!(!s.exists());
        assert_eq!(s.list().expect("empty"), Vec::<String>::new());
        let _lock = s.lock_shared().expect("lock");
        s.save("c1", "eth0", b"{\"a\":1}")
            .expect("save")
            .wait()
            .expect("sync");
        s.save("c2", "net1", b"{}")
            .expect("save")
            .wait()
            .expect("sync");
        let mode = |p: &Path| fs::metadata(p).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode(&t.path().join("flannel")), 0o700);
        assert_eq!(mode(&s.path("c1")), 0o600);
        assert_eq!(s.load("c1").expect("read"), Some(b"{\"a\":1}".to_vec()));
        assert_eq!(s.load("c3").expect("read"), None);
        assert_eq!(s.list().expect("list"), vec!["c1", "c2"]);
        assert_eq!(
            (s.ifname("c1").as_str(), s.ifname("c2").as_str()),
            ("eth0", "net1")
        );
        s.remove("c2").expect("remove");
        s.remove("c2").expect("remove twice");
        assert_eq!(s.ifname("c2"), "eth0", "record removed with the config");
        assert_eq!(s.list().expect("list"), vec!["c1"]);
    }

    #[test]
    fn exclusive_lock_excludes_shared() {
        let t = tempfile::tempdir().expect("tempdir");
        let s = Store::new(t.path());
        let held = s.lock_exclusive().expect("lock");
        let f = File::open(t.path().join(LOCK_FILE)).expect("open");
        assert!(f.try_lock_shared().is_err(), "shared lock must wait for GC");
        drop(held);
        // Another test's child process may still hold a copy of the
        // descriptor between fork and exec (flock belongs to the open file,
        // not the fd), so the lock is released within moments, not at once.
        let free = (0..5000).any(|_| {
            f.try_lock_shared().is_ok() || {
                std::thread::sleep(std::time::Duration::from_millis(1));
                false
            }
        });
        assert!(free, "shared lock still refused 5 s after the GC lock went");
    }
}
