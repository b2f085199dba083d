//! The status socket: a root-only unix stream socket (mode 0600, created as
//! the IPAM socket is, see [`crate::ipam::server`]) next to `--subnet-file`:
//! `/run/flannel/weft-status.sock` by default, `<stem>.weft-status.sock` for
//! a subnet file not named `subnet.env`.
//!
//! Protocol (line-delimited JSON, like the IPAM API): the client sends one
//! line, `{"op":"status"}`; the server answers one line, the [`Status`]
//! object, or `{"error":"..."}`, and closes the connection. Requests larger
//! than [`MAX_REQUEST`] bytes or silent for [`IDLE_TIMEOUT`] are dropped.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{UnixListener, UnixStream};

use super::{Handle, Status};

/// The socket's file name (see the module docs for the prefix rule).
pub const SOCKET_NAME: &str = "weft-status.sock";
/// Largest request line.
pub const MAX_REQUEST: usize = 1024;
/// How long a connection may stay silent.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(10);

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
    socket: PathBuf,
    accept: tokio::task::JoinHandle<()>,
}

impl StatusServer {
    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }
}

impl Drop for StatusServer {
    fn drop(&mut self) {
        self.accept.abort();
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Serves status on `socket`.
pub fn serve(socket: &Path, handle: Handle) -> Result<StatusServer, StatusError> {
    let listener = crate::ipam::server::bind(socket)?;
    tracing::info!("status: serving on {}", socket.display());
    let accept = tokio::spawn(accept_loop(listener, handle));
    Ok(StatusServer {
        socket: socket.to_path_buf(),
        accept,
    })
}

/// weftd's start-up hook: serves next to `subnet_file`; failures are logged, not fatal.
pub fn start(subnet_file: &Path, handle: Handle) -> Option<StatusServer> {
    match serve(&socket_path(subnet_file), handle) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::error!("status socket not started: {e}");
            None
        }
    }
}

async fn accept_loop(listener: UnixListener, handle: Handle) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let h = handle.clone();
                tokio::spawn(async move {
                    if let Err(e) = connection(stream, h).await {
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

async fn connection(stream: UnixStream, handle: Handle) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut line = Vec::with_capacity(64);
    let limit = u64::try_from(MAX_REQUEST).unwrap_or(u64::MAX) + 1;
    let mut reader = BufReader::new(read).take(limit);
    let reply = match tokio::time::timeout(IDLE_TIMEOUT, reader.read_until(b'\n', &mut line)).await
    {
        Err(_) => return Ok(()),
        Ok(r) => {
            r?;
            answer(&line, &handle).await
        }
    };
    write.write_all(reply.as_bytes()).await?;
    write.shutdown().await
}

/// The reply line for one request line.
async fn answer(line: &[u8], handle: &Handle) -> String {
    let err = |m: &str| format!("{}\n", serde_json::json!({ "error": m }));
    if line.len() > MAX_REQUEST {
        return err(&format!("request longer than {MAX_REQUEST} bytes"));
    }
    let op = serde_json::from_slice::<serde_json::Value>(line)
        .ok()
        .and_then(|v| v.get("op").and_then(|o| o.as_str()).map(str::to_string));
    match op.as_deref() {
        Some("status") => match handle.status().await {
            Some(s) => match serde_json::to_string(&s) {
                Ok(t) => t + "\n",
                Err(e) => err(&e.to_string()),
            },
            None => err("the main loop did not answer (still starting?)"),
        },
        Some(other) => err(&format!("unknown op {other:?}")),
        None => err(r#"expected {"op":"status"}"#),
    }
}

/// Client: asks the weftd serving `socket` for its status (blocking).
pub fn query(socket: &Path, timeout: Duration) -> Result<Status, StatusError> {
    let io = |source| StatusError::Io {
        path: socket.to_path_buf(),
        source,
    };
    let mut s = std::os::unix::net::UnixStream::connect(socket).map_err(io)?;
    s.set_read_timeout(Some(timeout)).map_err(io)?;
    s.set_write_timeout(Some(timeout)).map_err(io)?;
    s.write_all(b"{\"op\":\"status\"}\n").map_err(io)?;
    let mut line = String::new();
    std::io::BufReader::new(s)
        .read_line(&mut line)
        .map_err(io)?;
    parse_reply(&line)
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
