//! The IPAM API server: a unix stream socket speaking [`weft_compat::ipam`], and
//! one owner thread that holds the allocator and the state file.
//!
//! Contract:
//! - The socket is created root-only (mode 0600) before anyone can connect:
//!   it is bound under a temporary name, chmod-ed, then renamed into place
//!   (which also replaces a stale socket of an earlier run; a socket another
//!   process still serves is refused, never replaced). On exit the socket is
//!   unlinked only if the path still names the socket this process bound.
//! - Every request goes through one channel to the owner thread, which
//!   applies it, persists the change (fsync) and only then replies: requests
//!   are serialised without any file lock, and an address is never handed
//!   out before it is on disk. If persisting fails, the change is undone and
//!   the request fails (`unavailable`).
//! - A corrupt state file does not stop weftd (bridge-mode pods do not need
//!   IPAM): the server runs and answers every request with `unavailable` and
//!   the file's problem, so CNI ADD/STATUS fail with a clear message.
//! - A connection may carry several requests; each read waits at most
//!   [`IDLE_TIMEOUT`]. Dropping the [`IpamServer`] stops accepting and
//!   removes the socket.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::{Ipv4Net, Ipv6Net};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};
use weft_compat::ipam::{Allocation, ErrorKind, MAX_REQUEST, Request, Response};

use super::alloc::{AllocError, Allocator};
use super::host_local::{self, HostLocalDir};
use super::state::StateFile;

/// How long a connection may stay silent before it is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests queued for the owner thread before connections wait.
const QUEUE: usize = 256;

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The socket could not be created.
    #[error("{op} {path}: {source}")]
    Socket {
        /// What was being done.
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The owner thread could not be started.
    #[error("cannot start the ipam thread: {0}")]
    Thread(#[source] std::io::Error),
    /// Another weftd keeps its allocations in the same state file.
    #[error(
        "ipam state {state} is in use by another weftd ({0}): give each weftd its own --ipam-state",
        state = .1.display()
    )]
    StateInUse(#[source] crate::lockfile::PidLockError, PathBuf),
}

type Job = (Request, oneshot::Sender<Response>);

/// A running IPAM API; see the module docs.
#[derive(Debug)]
pub struct IpamServer {
    socket: OwnedSocket,
    accept: tokio::task::JoinHandle<()>,
    _state_lock: crate::lockfile::PidLock,
}

impl IpamServer {
    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket.path
    }
}

impl Drop for IpamServer {
    fn drop(&mut self) {
        self.accept.abort();
        self.socket.remove();
    }
}

/// Loads the state file and serves the API on `socket` for the lease subnets.
pub async fn serve(
    socket: &Path,
    state: &Path,
    subnet: Option<Ipv4Net>,
    ipv6_subnet: Option<Ipv6Net>,
) -> Result<IpamServer, ServerError> {
    // One owner per state file: two daemons sharing one (an explicit
    // --ipam-state) would hand out each other's addresses.
    let state_lock = crate::lockfile::PidLock::take(&state_lock_path(state))
        .map_err(|e| ServerError::StateInUse(e, state.to_path_buf()))?;
    let file = StateFile::new(state);
    let mut dirs = BTreeSet::new();
    let alloc = match file.load(subnet, ipv6_subnet) {
        Ok((a, d)) => {
            tracing::info!(
                "ipam: {} allocations restored from {}",
                a.len(),
                state.display()
            );
            dirs.extend(d.iter().filter_map(|d| HostLocalDir::new(d).ok()));
            Ok(a)
        }
        Err(e) => {
            tracing::error!("ipam: {e}; refusing to allocate until it is fixed");
            Err(e.to_string())
        }
    };
    let (tx, rx) = mpsc::channel::<Job>(QUEUE);
    let mut owner = Owner { file, alloc, dirs };
    std::thread::Builder::new()
        .name("weft-ipam".into())
        .spawn(move || owner.run(rx))
        .map_err(ServerError::Thread)?;
    let (listener, socket) = bind(socket)?;
    tracing::info!("ipam: serving on {}", socket.path.display());
    let accept = tokio::spawn(accept_loop(listener, tx));
    Ok(IpamServer {
        socket,
        accept,
        _state_lock: state_lock,
    })
}

/// The state file's lock: `.<name>.lock` beside it (the state file itself is
/// replaced by every write, so it cannot carry the lock).
fn state_lock_path(state: &Path) -> PathBuf {
    let name = state
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    state.with_file_name(format!(".{name}.lock"))
}

/// A socket path this process bound; [`OwnedSocket::remove`] unlinks it only
/// while the path still names that socket (same device and inode), so a
/// process never removes a socket another one bound at the same path since.
#[derive(Debug)]
pub(crate) struct OwnedSocket {
    path: PathBuf,
    id: (u64, u64),
}

impl OwnedSocket {
    /// Unlinks the socket if it is still ours.
    pub(crate) fn remove(&self) {
        use std::os::unix::fs::MetadataExt;
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if (m.dev(), m.ino()) == self.id => {
                let _ = std::fs::remove_file(&self.path);
            }
            Ok(_) => tracing::warn!(
                "{}: not removed, another process has bound it since",
                self.path.display()
            ),
            Err(_) => {}
        }
    }
}

/// Binds `socket` with mode 0600 from the start (temporary name, chmod, rename);
/// also used by the status socket ([`crate::status::server`]). A socket
/// already at `socket` is replaced only when nothing answers on it (a stale
/// one from an earlier run); one that another process serves, or a path
/// that is not a socket, is refused and left alone.
pub(crate) fn bind(socket: &Path) -> Result<(UnixListener, OwnedSocket), ServerError> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    let err = |op: &'static str, p: &Path| {
        let path = p.to_path_buf();
        move |source| ServerError::Socket { op, path, source }
    };
    let dir = match socket.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&dir).map_err(err("create directory", &dir))?;
    match std::fs::symlink_metadata(socket) {
        Ok(m) if !m.file_type().is_socket() => {
            return Err(err("replace", socket)(std::io::Error::other(
                "exists and is not a socket; remove it or choose another path",
            )));
        }
        Ok(_) if std::os::unix::net::UnixStream::connect(socket).is_ok() => {
            return Err(err("replace", socket)(std::io::Error::other(
                "another process is serving on it (another weftd with this socket path?); stop it or choose another path",
            )));
        }
        _ => {}
    }
    let name = socket
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let listener = UnixListener::bind(&tmp).map_err(err("bind", &tmp))?;
    let setup = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600))
        .map_err(err("chmod", &tmp))
        .and_then(|()| std::fs::symlink_metadata(&tmp).map_err(err("stat", &tmp)))
        .and_then(|m| {
            std::fs::rename(&tmp, socket).map_err(err("rename", socket))?;
            Ok((m.dev(), m.ino()))
        });
    match setup {
        Ok(id) => Ok((
            listener,
            OwnedSocket {
                path: socket.to_path_buf(),
                id,
            },
        )),
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(e)
        }
    }
}

async fn accept_loop(listener: UnixListener, tx: mpsc::Sender<Job>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                tokio::spawn(connection(stream, tx.clone()));
            }
            Err(e) => {
                tracing::warn!("ipam: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Serves one connection: request lines in, reply lines out.
async fn connection(stream: UnixStream, tx: mpsc::Sender<Job>) {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::with_capacity(256);
    loop {
        line.clear();
        let limit = u64::try_from(MAX_REQUEST).unwrap_or(u64::MAX) + 1;
        let read = tokio::time::timeout(
            IDLE_TIMEOUT,
            (&mut reader).take(limit).read_until(b'\n', &mut line),
        )
        .await;
        let n = match read {
            Ok(Ok(n)) => n,
            Ok(Err(e)) => {
                tracing::debug!("ipam: read: {e}");
                return;
            }
            Err(_) => return,
        };
        if n == 0 {
            return;
        }
        let complete = line.last() == Some(&b'\n');
        if complete {
            line.pop();
        }
        let (reply, close) = if !complete && line.len() > MAX_REQUEST {
            (
                Response::error(
                    ErrorKind::Invalid,
                    format!("request longer than {MAX_REQUEST} bytes"),
                ),
                true,
            )
        } else {
            match Request::parse(&line) {
                Err(reason) => (Response::error(ErrorKind::Invalid, reason), false),
                Ok(req) => (ask(&tx, req).await, false),
            }
        };
        if write.write_all(&reply.to_line()).await.is_err() || close || !complete {
            return;
        }
    }
}

async fn ask(tx: &mpsc::Sender<Job>, req: Request) -> Response {
    let (reply_tx, reply_rx) = oneshot::channel();
    if tx.send((req, reply_tx)).await.is_err() {
        return Response::error(ErrorKind::Unavailable, "the ipam thread has stopped");
    }
    reply_rx
        .await
        .unwrap_or_else(|_| Response::error(ErrorKind::Unavailable, "the ipam thread has stopped"))
}

/// The single owner of the allocations.
struct Owner {
    file: StateFile,
    /// The allocator, or why it cannot be used.
    alloc: Result<Allocator, String>,
    /// host-local directories the allocations are mirrored in.
    dirs: BTreeSet<HostLocalDir>,
}

// === impl Owner ===

impl Owner {
    fn run(&mut self, mut rx: mpsc::Receiver<Job>) {
        while let Some((req, reply)) = rx.blocking_recv() {
            let _ = reply.send(self.handle(req));
        }
    }

    fn handle(&mut self, req: Request) -> Response {
        let alloc = match &mut self.alloc {
            Ok(a) => a,
            Err(reason) => return Response::error(ErrorKind::Unavailable, reason.clone()),
        };
        match req {
            Request::Status {} => Response {
                subnet: alloc.subnet(),
                ipv6_subnet: alloc.ipv6_subnet(),
                ..Response::ok()
            },
            Request::List {} => Response {
                allocations: Some(alloc.list()),
                ..Response::ok()
            },
            Request::Allocate { .. } | Request::Release { .. } => self.change(&req),
        }
    }

    /// `allocate` or `release`: applied, mirrored in host-local's directory,
    /// persisted, then answered.
    fn change(&mut self, req: &Request) -> Response {
        let unavailable = |m: String| Response::error(ErrorKind::Unavailable, m);
        let Some(key) = req.key() else {
            return Response::error(ErrorKind::Invalid, "no key");
        };
        let dir = match req.host_local_dir().map(HostLocalDir::new).transpose() {
            Ok(d) => d,
            Err(e) => return Response::error(ErrorKind::Invalid, e),
        };
        // host-local's own lock: no host-local runs while this one is held.
        let _lock = match dir.as_ref().map(HostLocalDir::lock).transpose() {
            Ok(l) => l,
            Err(e) => {
                let d = dir.as_ref().map(|d| d.path().display().to_string());
                return unavailable(format!(
                    "host-local directory {}: {e}",
                    d.unwrap_or_default()
                ));
            }
        };
        let Ok(alloc) = &mut self.alloc else {
            return unavailable("the allocator is not available".into());
        };
        let before = (alloc.clone(), self.dirs.clone());
        if let Some(d) = &dir
            && !self.dirs.contains(d)
        {
            mirror_all(d, alloc);
            self.dirs.insert(d.clone());
        }
        let allocate = matches!(req, Request::Allocate { .. });
        let (allocation, changed) = if allocate {
            let avoid = match &dir {
                Some(d) => match d.taken() {
                    Ok(t) => host_local::others(&t, &alloc.list()),
                    Err(e) => return unavailable(format!("{}: {e}", d.path().display())),
                },
                None => BTreeSet::new(),
            };
            match alloc.allocate_avoiding(&key, &avoid) {
                Ok((a, changed)) => {
                    if let Some(d) = &dir {
                        match d.reserve(&a) {
                            Ok(c) => report_conflicts(d, &a, &c),
                            Err(e) => {
                                (*alloc, self.dirs) = before;
                                return unavailable(format!("{}: {e}", d.path().display()));
                            }
                        }
                    }
                    (Some(a), changed)
                }
                Err(e @ AllocError::Exhausted(_)) => {
                    return Response::error(ErrorKind::Exhausted, e.to_string());
                }
                Err(e) => return unavailable(e.to_string()),
            }
        } else {
            let released = alloc.release(&key);
            let changed = released.is_some();
            (released, changed)
        };
        let dirs_changed = self.dirs != before.1;
        if changed || dirs_changed {
            let dirs: Vec<String> = self
                .dirs
                .iter()
                .map(|d| d.path().display().to_string())
                .collect();
            if let Err(e) = self.file.save(alloc, &dirs) {
                if let (Some(a), Some(d), true) = (&allocation, &dir, allocate && changed) {
                    d.release(a);
                }
                (*alloc, self.dirs) = before;
                tracing::error!("ipam: {e}");
                return unavailable(format!("cannot persist the change: {e}"));
            }
        }
        if let (Some(a), false) = (&allocation, allocate) {
            for d in &self.dirs {
                d.release(a);
            }
        }
        if changed {
            let op = if allocate { "allocated" } else { "released" };
            tracing::debug!("ipam: {op} {allocation:?}");
        }
        Response {
            allocation,
            ..Response::ok()
        }
    }
}

/// First sight of a host-local directory: writes a file there for every
/// allocation held (weftd's allocations from before), reporting any address
/// host-local already gave another container.
fn mirror_all(d: &HostLocalDir, alloc: &Allocator) {
    let list = alloc.list();
    tracing::info!(
        "ipam: mirroring {} allocations into host-local's {} (bridge and routed pods share the node's subnet)",
        list.len(),
        d.path().display()
    );
    for a in &list {
        match d.reserve(a) {
            Ok(c) => report_conflicts(d, a, &c),
            Err(e) => tracing::error!("ipam: {}: {e}", d.path().display()),
        }
    }
}

fn report_conflicts(d: &HostLocalDir, a: &Allocation, conflicts: &[(std::net::IpAddr, String)]) {
    for (ip, held) in conflicts {
        tracing::error!(
            "ipam: {ip} is held by host-local in {} for {held} and by weftd for {}/{}: two pods have one \
             address (made before weft reserved host-local's addresses); re-create one of them",
            d.path().display(),
            a.container_id,
            a.ifname
        );
    }
}
