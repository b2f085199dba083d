//! The status socket: a root-only unix stream socket (mode 0600, created as
//! the IPAM socket is, see [`crate::ipam::server`]) next to `--subnet-file`:
//! `/run/flannel/weft-status.sock` by default, `<stem>.weft-status.sock` for
//! a subnet file not named `subnet.env`.
//!
//! Protocol (line-delimited JSON, like the IPAM API): the client sends one
//! line and the server answers one line, then closes the connection:
//! - `{"op":"status"}` → the [`Status`] object, built from the latest
//!   published snapshots (never by asking the main loop, see [`crate::view`]);
//! - `{"op":"store"}` → the lease store weftd uses ([`StoreInfo`], no
//!   secrets), so that `weft leases` acts on the node's own store;
//! - `{"op":"dataplane","set":"kernel"}` / `{"op":"dataplane","reset":true}`
//!   → handed to the main loop as a [`Command`] (see
//!   `backend::dataplane_ctl`), answered once the switch is done or refused
//!   (at most [`COMMAND_TIMEOUT`]);
//! - any failure → `{"error":"..."}`.
//!
//! Requests larger than [`MAX_REQUEST`] bytes or silent for
//! [`IDLE_TIMEOUT`] are dropped.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::{mpsc, oneshot};

use super::Status;
use crate::store::StoreInfo;
use crate::view::Observer;

/// The socket's file name (see the module docs for the prefix rule).
pub const SOCKET_NAME: &str = "weft-status.sock";
/// Largest request line.
pub const MAX_REQUEST: usize = 1024;
/// How long a connection may stay silent.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a command may take in the main loop (a WireGuard switch to the
/// kernel waits up to 40 s for its peers, then switches).
pub const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);

/// A request the socket hands to weftd's main loop.
#[derive(Debug)]
pub struct Command {
    /// The request line's object.
    pub request: serde_json::Value,
    /// Where the reply object goes (`{"ok":true,...}` or `{"error":"..."}`).
    pub reply: oneshot::Sender<serde_json::Value>,
}

/// What the socket serves besides `status`.
#[derive(Debug, Clone, Default)]
pub struct Extras {
    /// `{"op":"store"}`.
    pub store: Option<StoreInfo>,
    /// `{"op":"dataplane",...}`: where the main loop takes commands.
    pub commands: Option<mpsc::Sender<Command>>,
}

/// Errors of the server and the client.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The socket could not be created.
    #[error(transparent)]
    Bind(#[from] crate::ipam::server::ServerError),
    /// Talking to weftd failed.
    #[error("{path}: {source}")]
    Io {
        /// The socket.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Talking to weftd's HTTP listener failed.
    #[error("http://{addr}/status: {source}")]
    Http {
        /// The listener (`host:port`).
        addr: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// weftd answered with an error.
    #[error("weftd: {0}")]
    Daemon(String),
    /// The answer is not a status object.
    #[error("invalid status from weftd: {0}")]
    Invalid(String),
}

/// The status socket path for `subnet_file`.
pub fn socket_path(subnet_file: &Path) -> PathBuf {
    weft_compat::subnet_env::beside(subnet_file, SOCKET_NAME)
}

/// A running status socket; dropping it stops accepting and removes the socket.
#[derive(Debug)]
pub struct StatusServer {
    socket: crate::ipam::server::OwnedSocket,
    accept: tokio::task::JoinHandle<()>,
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        self.accept.abort();
        self.socket.remove();
    }
}

/// Serves status (and `extras`) on `socket`.
pub fn serve(socket: &Path, view: Observer, extras: Extras) -> Result<StatusServer, StatusError> {
    let (listener, owned) = crate::ipam::server::bind(socket)?;
    tracing::info!("status: serving on {}", socket.display());
    let accept = tokio::spawn(accept_loop(listener, view, extras));
    Ok(StatusServer {
        socket: owned,
        accept,
    })
}

/// weftd's start-up hook: serves next to `subnet_file`; failures are logged, not fatal.
pub fn start(subnet_file: &Path, view: Observer, extras: Extras) -> Option<StatusServer> {
    match serve(&socket_path(subnet_file), view, extras) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!("status socket not started: {e}");
            None
        }
    }
}

async fn accept_loop(listener: UnixListener, view: Observer, extras: Extras) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let (v, x) = (view.clone(), extras.clone());
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, v, x).await {
                        tracing::debug!("status: connection: {e}");
                    }
                });
            }
            Err(e) => {
                tracing::warn!("status: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(stream: UnixStream, view: Observer, extras: Extras) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::with_capacity(64);
    let limit = u64::try_from(MAX_REQUEST).unwrap_or(u64::MAX) + 1;
    let mut reader = BufReader::new(read).take(limit);
    let reply = match tokio::time::timeout(IDLE_TIMEOUT, reader.read_until(b'\n', &mut line)).await
    {
        Err(_) => return Ok(()),
        Ok(r) => {
            r?;
            answer(&line, &view, &extras).await
        }
    };
    write.write_all(reply.as_bytes()).await?;
    write.shutdown().await
}

/// The reply line for one request line.
async fn answer(line: &[u8], view: &Observer, extras: &Extras) -> String {
    let err = |m: &str| format!("{}\n", serde_json::json!({ "error": m }));
    if line.len() > MAX_REQUEST {
        return err(&format!("request longer than {MAX_REQUEST} bytes"));
    }
    let request = serde_json::from_slice::<serde_json::Value>(line).unwrap_or_default();
    let op = request
        .get("op")
        .and_then(|o| o.as_str())
        .map(str::to_string);
    match op.as_deref() {
        Some("store") => match &extras.store {
            Some(s) => serde_json::to_string(s).map_or_else(|e| err(&e.to_string()), |t| t + "\n"),
            None => err("this weftd does not say which store it uses"),
        },
        Some("dataplane") => {
            let Some(commands) = &extras.commands else {
                return err("this weftd takes no dataplane commands");
            };
            let (tx, rx) = oneshot::channel();
            if commands.send(Command { request, reply: tx }).await.is_err() {
                return err("weftd is stopping");
            }
            match tokio::time::timeout(COMMAND_TIMEOUT, rx).await {
                Ok(Ok(v)) => v.to_string() + "\n",
                Ok(Err(_)) => err("weftd dropped the request (stopping?)"),
                Err(_) => err(&format!(
                    "no answer from the main loop within {} s",
                    COMMAND_TIMEOUT.as_secs()
                )),
            }
        }
        Some("status") => match status_json(view).await {
            Some(Ok(t)) => t + "\n",
            Some(Err(e)) => err(&e),
            None => err("weftd has not published its state yet (still starting?)"),
        },
        Some(other) => err(&format!("unknown op {other:?}")),
        None => err(r#"expected {"op":"status"}, {"op":"store"} or {"op":"dataplane",...}"#),
    }
}

/// The node's status as one JSON line body, built from the latest snapshots
/// on a blocking thread (5,000 peers take a few milliseconds to join and
/// encode: never on a runtime thread the main loop may need); `None` until
/// the backend is set up.
pub async fn status_json(view: &Observer) -> Option<Result<String, String>> {
    let view = view.clone();
    tokio::task::spawn_blocking(move || {
        view.status()
            .map(|s| serde_json::to_string(&s).map_err(|e| e.to_string()))
    })
    .await
    .unwrap_or_else(|e| Some(Err(format!("status task: {e}"))))
}

/// Client: asks the weftd serving `socket` for its status (blocking).
pub fn query(socket: &Path, timeout: Duration) -> Result<Status, StatusError> {
    let v = call(socket, &serde_json::json!({"op": "status"}), timeout)?;
    serde_json::from_value(v).map_err(|e| StatusError::Invalid(e.to_string()))
}

/// Client: asks the weftd serving `socket` which store it uses (blocking).
pub fn query_store(socket: &Path, timeout: Duration) -> Result<StoreInfo, StatusError> {
    let v = call(socket, &serde_json::json!({"op": "store"}), timeout)?;
    serde_json::from_value(v).map_err(|e| StatusError::Invalid(e.to_string()))
}

/// Client: sends `request` to the weftd serving `socket` and returns its
/// reply object; an `{"error":...}` reply is [`StatusError::Daemon`].
pub fn call(
    socket: &Path,
    request: &serde_json::Value,
    timeout: Duration,
) -> Result<serde_json::Value, StatusError> {
    let io = |source| StatusError::Io {
        path: socket.to_path_buf(),
        source,
    };
    let mut s = std::os::unix::net::UnixStream::connect(socket).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    s.write_all(format!("{request}\n").as_bytes()).map_err(io)?;
    let mut line = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut line)
        .map_err(io)?;
    let v: serde_json::Value =
        serde_json::from_str(&line).map_err(|e| StatusError::Invalid(e.to_string()))?;
    match v.get("error").and_then(|e| e.as_str()) {
        Some(e) => Err(StatusError::Daemon(e.to_string())),
        None => Ok(v),
    }
}

/// Parses one reply line.
pub fn parse_reply(line: &str) -> Result<Status, StatusError> {
    let v: serde_json::Value =
        serde_json::from_str(line).map_err(|e| StatusError::Invalid(e.to_string()))?;
    if let Some(e) = v.get("error").and_then(|e| e.as_str()) {
        return Err(StatusError::Daemon(e.to_string()));
    }
    serde_json::from_value(v).map_err(|e| StatusError::Invalid(e.to_string()))
}

/// Client: `GET /status` from weftd's HTTP listener (`--healthz-ip:--healthz-port`, blocking).
pub fn query_http(addr: &str, timeout: Duration) -> Result<Status, StatusError> {
    use std::io::Read;
    use std::net::ToSocketAddrs;
    let io = |source| StatusError::Http {
        addr: addr.to_string(),
        source,
    };
    let target = addr.to_socket_addrs().map_err(io)?.next().ok_or_else(|| {
        io(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no address",
        ))
    })?;
    let mut s = std::net::TcpStream::connect_timeout(&target, timeout).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    write!(
        s,
        "GET /status HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(io)?;
    let mut resp = String::new();
    s.take(64 << 20).read_to_string(&mut resp).map_err(io)?;
    let (head, body) = resp
        .split_once("\r\n\r\n")
        .ok_or_else(|| StatusError::Invalid("no HTTP header".into()))?;
    let code = head.split(' ').nth(1).unwrap_or_default();
    if code != "200" {
        let line = head.lines().next().unwrap_or_default();
        return Err(StatusError::Daemon(format!("{line}: {}", body.trim())));
    }
    parse_reply(body.trim_end())
}
