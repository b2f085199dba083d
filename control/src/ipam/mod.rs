//! weftd's pod IPAM for the CNI plugin's routed mode: pod addresses come
//! from the node's own lease subnet and are handed out by the daemon over a
//! local unix socket, instead of by an exec'd host-local plugin.
//!
//! - [`alloc`]: the allocator (which addresses, idempotency, cursors);
//! - [`state`]: the allocations on disk (atomic, fsynced, strict reading);
//! - the line-delimited JSON protocol: [`weft_compat::ipam`], shared with
//!   the CNI plugin's client;
//! - [`server`]: the socket and the single owner thread that serialises
//!   allocation (no file lock around a CNI ADD is needed).
//!
//! Paths: the socket defaults to `weft.sock` and the state file to
//! `weft-ipam.json` next to `--subnet-file` (so `/run/flannel/weft.sock` and
//! `/run/flannel/weft-ipam.json` by default); when the subnet file is not
//! named `subnet.env`, its stem prefixes both names (`n1.env` →
//! `n1.weft.sock`), so daemons sharing a directory do not collide. The state
//! lives on the same (usually tmpfs) file system as subnet.env: it survives
//! weftd restarts, and goes away on reboot together with every pod.

pub mod alloc;
pub mod host_local;
pub mod server;
pub mod state;

use std::path::{Path, PathBuf};

use weft_compat::ipam::default_socket;
use weft_compat::subnet_env::beside;

pub use server::IpamServer;

use crate::lease::Lease;

/// The IPAM API's socket and state file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Paths {
    /// The unix socket.
    pub socket: PathBuf,
    /// The allocations file.
    pub state: PathBuf,
}

/// The paths from the flags (see the module docs); `None` when the socket
/// flag is set to the empty string (API disabled).
pub fn paths(subnet_file: &Path, socket: Option<&Path>, state: Option<&Path>) -> Option<Paths> {
    if socket.is_some_and(|s| s.as_os_str().is_empty()) {
        return None;
    }
    Some(Paths {
        socket: socket.map_or_else(|| default_socket(subnet_file), Path::to_path_buf),
        state: state
            .filter(|s| !s.as_os_str().is_empty())
            .map_or_else(|| beside(subnet_file, "weft-ipam.json"), Path::to_path_buf),
    })
}

/// Starts the API for the node's lease (weftd's start-up hook); failures are
/// logged, not fatal, because bridge-mode pods do not need it.
pub async fn start(
    subnet_file: &Path,
    socket: Option<&Path>,
    state: Option<&Path>,
    lease: &Lease,
) -> Option<IpamServer> {
    let Some(paths) = paths(subnet_file, socket, state) else {
        tracing::info!("ipam API disabled (--ipam-socket is empty)");
        return None;
    };
    match server::serve(&paths.socket, &paths.state, lease.subnet, lease.ipv6_subnet).await {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!("ipam API not started: {e}");
            None
        }
    }
}

#[cfg(test)]
mod tests;
