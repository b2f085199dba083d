//! [`PidLock`]: an exclusive, non-blocking `flock` on a file that names its
//! holder's PID; the kernel drops it when the holder dies, however it dies.
//! The file itself is never removed (unlinking a lock file races with the
//! next locker), so a stale one is harmless and simply taken over. Used for
//! one weftd per subnet file (`daemon::node_lock`) and per IPAM state file.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// A held lock; released when dropped.
#[derive(Debug)]
pub struct PidLock {
    _file: File,
    path: PathBuf,
}

/// Why a lock was not taken.
#[derive(Debug, thiserror::Error)]
pub enum PidLockError {
    /// Another process holds it (its PID, when the file names one).
    #[error("{} is held{}", .path.display(), .pid.map_or_else(String::new, |p| format!(" by pid {p}")))]
    Held {
        /// The lock file.
        path: PathBuf,
        /// The holder's PID.
        pid: Option<u32>,
    },
    /// A file system call failed.
    #[error("{op} {}: {source}", .path.display())]
    Io {
        /// The operation.
        op: &'static str,
        /// The path.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl PidLock {
    /// Takes the lock on `path` (creating its directory and the file if
    /// needed) and writes this process's PID into it.
    pub fn take(path: &Path) -> Result<PidLock, PidLockError> {
        let io = |op: &'static str, p: &Path| {
            let path = p.to_path_buf();
            move |source| PidLockError::Io { op, path, source }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(io("create directory", dir))?;
        }
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o644)
            .open(path)
            .map_err(io("open", path))?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                let _ = file.read_to_string(&mut text);
                return Err(PidLockError::Held {
                    path: path.to_path_buf(),
                    pid: text.trim().parse().ok(),
                });
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(io("flock", path)(e)),
        }
        file.set_len(0)
            .and_then(|()| file.rewind())
            .and_then(|()| writeln!(file, "{}", std::process::id()))
            .map_err(io("write", path))?;
        Ok(PidLock {
            _file: file,
            path: path.to_path_buf(),
        })
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}
