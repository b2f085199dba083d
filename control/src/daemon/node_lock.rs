//! One weftd per node: the locks a weftd takes before it touches anything.
//!
//! - [`SubnetFileLock`]: an exclusive `flock` on `weftd.lock` next to
//!   `--subnet-file` (`/run/flannel/weftd.lock`; `n1.weftd.lock` for a subnet
//!   file `n1.env`, see [`weft_compat::subnet_env::beside`]), holding the
//!   owner's PID as text. weftd takes it first thing, before any socket,
//!   route, device, rule or store is touched; a second weftd on the same
//!   subnet file is refused with the first one's PID. Everything weftd keeps
//!   next to the subnet file (status and IPAM sockets, IPAM state, the
//!   persisted dataplane choice) is therefore owned by the holder alone. The
//!   file is never removed (unlinking a lock file races with the next
//!   locker); the kernel drops the lock when its holder dies, however it
//!   dies, so a stale file is harmless and is simply taken over.
//! - [`DeviceLock`]: one abstract unix socket per kernel device name the
//!   backend owns (`weft/link/flannel.1`, ...), bound and listened on for the
//!   daemon's life. Abstract sockets live in the *network namespace*, so two
//!   weftds with different subnet files but the same devices in one
//!   namespace are refused (the second learns the first one's PID from the
//!   socket's peer credentials), while nodes in different namespaces (the
//!   demo, the tests) never collide. Taken as soon as the network config
//!   names the backend, before any interface or device is looked at.
//!
//! A takeover on purpose (an in-place upgrade) is not offered: the second
//! daemon waits for nothing and fails at once, so its supervisor restarts it
//! after the first has gone (a DaemonSet's rolling update stops the old pod
//! first).

use std::os::unix::net::{SocketAddr, UnixListener, UnixStream};

use std::path::{Path, PathBuf};

use crate::lockfile::PidLockError;

/// The lock file's name (see [`weft_compat::subnet_env::beside`]).
pub const LOCK_NAME: &str = "weftd.lock";

/// Why a lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another weftd holds the subnet file's lock.
    #[error(
        "another weftd{} already runs with --subnet-file={} (it holds {}); stop it first, or give this one its own --subnet-file",
        pid_text(*.pid),
        .subnet_file.display(),
        .lock.display()
    )]
    SubnetFileHeld {
        /// The subnet file.
        subnet_file: PathBuf,
        /// The lock file.
        lock: PathBuf,
        /// The holder's PID, when the file names one.
        pid: Option<u32>,
    },
    /// Another weftd runs the device in this network namespace.
    #[error(
        "another weftd{} in this network namespace already runs device {device} (for its own --subnet-file); stop it first: two daemons on one device would fight over its routes",
        pid_text(*.pid)
    )]
    DeviceHeld {
        /// The device name.
        device: String,
        /// The holder's PID, from the socket's peer credentials.
        pid: Option<u32>,
    },
    /// `--subnet-file` cannot hold a lock next to it.
    #[error("--subnet-file={}: {reason}", .subnet_file.display())]
    BadSubnetFile {
        /// The flag's value.
        subnet_file: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A file system or socket call failed.
    #[error("{op} {what}: {source}")]
    Io {
        /// The operation.
        op: &'static str,
        /// The path or socket name.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

fn pid_text(pid: Option<u32>) -> String {
    pid.map_or_else(String::new, |p| format!(" (pid {p})"))
}

/// The held lock on a subnet file; released when dropped (or when the
/// process dies).
pub type SubnetFileLock = crate::lockfile::PidLock;

/// The lock file for `subnet_file`.
pub fn lock_path(subnet_file: &Path) -> PathBuf {
    weft_compat::subnet_env::beside(subnet_file, LOCK_NAME)
}

/// Takes the subnet file's lock (creating its directory and the lock file
/// if needed) and writes this process's PID into it.
pub fn lock_subnet_file(subnet_file: &Path) -> Result<SubnetFileLock, LockError> {
    let bad = |reason: &str| LockError::BadSubnetFile {
        subnet_file: subnet_file.to_path_buf(),
        reason: reason.to_string(),
    };
    if subnet_file.as_os_str().is_empty() {
        return Err(bad(
            "empty; it must name a file (flannel's default is /run/flannel/subnet.env)",
        ));
    }
    if subnet_file.is_dir() || subnet_file.to_string_lossy().ends_with('/') {
        return Err(bad(
            "is a directory; it must name a file (e.g. /run/flannel/subnet.env)",
        ));
    }
    crate::lockfile::PidLock::take(&lock_path(subnet_file)).map_err(|e| match e {
        PidLockError::Held { path, pid } => LockError::SubnetFileHeld {
            subnet_file: subnet_file.to_path_buf(),
            lock: path,
            pid,
        },
        PidLockError::Io { op, path, source } => LockError::Io {
            op,
            what: path.display().to_string(),
            source,
        },
    })
}

/// The held device locks; released when dropped (the socket closes once its
/// task has been aborted) or when the process dies.
#[derive(Debug)]
pub struct DeviceLock {
    held: Vec<(String, tokio::task::JoinHandle<()>)>,
}

impl Drop for DeviceLock {
    fn drop(&mut self) {
        for (_, task) in &self.held {
            task.abort();
        }
    }
}

impl DeviceLock {
    /// The devices held.
    pub fn devices(&self) -> impl Iterator<Item = &str> {
        self.held.iter().map(|(d, _)| d.as_str())
    }
}

/// The abstract socket name of `device`'s lock.
fn device_lock_name(device: &str) -> String {
    format!("weft/link/{device}")
}

/// Takes the locks of `devices` in this network namespace (all or none).
/// Must be called from a tokio runtime: a task accepts and drops the
/// connections of later weftds that come to ask who holds a device.
pub fn lock_devices(devices: &[String]) -> Result<DeviceLock, LockError> {
    // Dropped (aborting what it holds) on any error: all or none.
    let mut lock = DeviceLock { held: Vec::new() };
    for device in devices {
        let name = device_lock_name(device);
        let io = |op: &'static str| {
            let what = format!("abstract socket @{name}");
            move |source| LockError::Io { op, what, source }
        };
        let addr = {
            use std::os::linux::net::SocketAddrExt;
            SocketAddr::from_abstract_name(name.as_bytes()).map_err(io("name"))?
        };
        let listener = match UnixListener::bind_addr(&addr) {
            Ok(l) => l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                return Err(LockError::DeviceHeld {
                    device: device.clone(),
                    pid: holder_pid(&addr),
                });
            }
            Err(e) => return Err(io("bind")(e)),
        };
        listener
            .set_nonblocking(true)
            .map_err(io("set_nonblocking"))?;
        let listener = tokio::net::UnixListener::from_std(listener).map_err(io("register"))?;
        lock.held
            .push((device.clone(), tokio::spawn(accept_drop(listener))));
    }
    Ok(lock)
}

/// The PID of the process listening on `addr` (`SO_PEERCRED` of a connection).
fn holder_pid(addr: &SocketAddr) -> Option<u32> {
    let s = UnixStream::connect_addr(addr).ok()?;
    let cred = nix::sys::socket::getsockopt(&s, nix::sys::socket::sockopt::PeerCredentials).ok()?;
    u32::try_from(cred.pid()).ok()
}

/// Holds a device lock: accepts and drops connections (only ever PID
/// queries), so that its backlog never fills; never ends on its own.
async fn accept_drop(listener: tokio::net::UnixListener) {
    loop {
        match listener.accept().await {
            Ok((conn, _)) => drop(conn),
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(100)).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_on_one_subnet_file_names_the_first_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = dir.path().join("run/n1.env");
        let first = lock_subnet_file(&env).expect("first lock");
        assert_eq!(first.path(), dir.path().join("run/n1.weftd.lock"));
        let pid = std::fs::read_to_string(first.path()).expect("read");
        assert_eq!(pid.trim(), std::process::id().to_string());
        // flock locks belong to the open file: a second open in this process
        // is refused as a second weftd would be.
        let e = lock_subnet_file(&env).expect_err("held");
        let msg = e.to_string();
        assert!(
            matches!(e, LockError::SubnetFileHeld { pid: Some(p), .. } if p == std::process::id()),
            "{msg}"
        );
        assert!(
            msg.contains("another weftd") && msg.contains("--subnet-file=") && msg.contains("pid"),
            "{msg}"
        );
        // Another subnet file in the same directory is another node.
        let other = lock_subnet_file(&dir.path().join("run/n2.env")).expect("n2");
        drop(first);
        // Released: taken over, the stale PID replaced.
        let again = lock_subnet_file(&env).expect("after release");
        drop((again, other));
    }

    #[test]
    fn subnet_files_that_cannot_hold_a_lock_are_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        for bad in [PathBuf::new(), dir.path().to_path_buf()] {
            let e = lock_subnet_file(&bad).expect_err("refused");
            assert!(matches!(e, LockError::BadSubnetFile { .. }), "{e}");
        }
        let file = dir.path().join("f");
        std::fs::write(&file, "").expect("write");
        let e = lock_subnet_file(&file.join("subnet.env")).expect_err("under a file");
        assert!(matches!(e, LockError::Io { .. }), "{e}");
    }

    /// Lets aborted lock tasks drop their sockets.
    async fn settle() {
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_device_is_locked_once_per_network_namespace() {
        let dev = format!("w29test{}", std::process::id());
        let first = lock_devices(std::slice::from_ref(&dev)).expect("first");
        assert_eq!(first.devices().collect::<Vec<_>>(), vec![dev.as_str()]);
        let e = lock_devices(&["w29other".into(), dev.clone()]).expect_err("held");
        assert!(
            matches!(&e, LockError::DeviceHeld { device, pid: Some(p) } if *device == dev && *p == std::process::id()),
            "{e}"
        );
        // All or none: the other device was released with the failure.
        settle().await;
        drop(lock_devices(&["w29other".into()]).expect("released"));
        drop(first);
        settle().await;
        drop(lock_devices(std::slice::from_ref(&dev)).expect("after release"));
    }
}
