//! The client side of weftd's IPAM API ([`weft_compat::ipam`], the wire
//! types the daemon uses too): one JSON line out, one JSON line back, over
//! the daemon's unix socket.
//!
//! Contract: every call has a timeout ([`TIMEOUT`]); a daemon that cannot be
//! reached is [`ClientError::Unreachable`] (the runtime should retry), a
//! reply that is not the protocol's is [`ClientError::Protocol`], and an
//! error reply keeps its kind and message.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use weft_compat::ipam::{Allocation, ErrorKind, MAX_REPLY, Request, Response};

/// Longest wait for connect + reply.
pub const TIMEOUT: Duration = Duration::from_secs(30);

/// A failed API call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The socket could not be reached or the exchange failed.
    #[error("cannot reach weftd's ipam API at {}: {source}", .socket.display())]
    Unreachable {
        /// The socket path.
        socket: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The daemon's reply is not the protocol's.
    #[error("bad reply from weftd's ipam API at {}: {reason}", .socket.display())]
    Protocol {
        /// The socket path.
        socket: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The daemon refused the request.
    #[error("weftd ipam: {message}")]
    Refused {
        /// Why.
        kind: ErrorKind,
        /// The daemon's message.
        message: String,
    },
}

/// A client for the API at one socket path.
#[derive(Debug, Clone)]
pub struct Client {
    socket: PathBuf,
}

// === impl Client ===

impl Client {
    /// A client for `socket` (nothing is connected yet).
    pub fn new(socket: impl Into<PathBuf>) -> Client {
        Client {
            socket: socket.into(),
        }
    }

    /// Allocates (or returns) the addresses of `(container_id, ifname)`,
    /// avoiding (and recording them in) host-local's `host_local` directory.
    pub fn allocate(
        &self,
        container_id: &str,
        ifname: &str,
        host_local: Option<&str>,
    ) -> Result<Allocation, ClientError> {
        let r = self.call(&Request::Allocate {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
            host_local_dir: host_local.map(str::to_string),
        })?;
        r.allocation
            .ok_or_else(|| self.protocol("allocate reply has no allocation"))
    }

    /// Releases `(container_id, ifname)`; returns what was held.
    pub fn release(
        &self,
        container_id: &str,
        ifname: &str,
        host_local: Option<&str>,
    ) -> Result<Option<Allocation>, ClientError> {
        let r = self.call(&Request::Release {
            container_id: container_id.to_string(),
            ifname: ifname.to_string(),
            host_local_dir: host_local.map(str::to_string),
        })?;
        Ok(r.allocation)
    }

    /// Every allocation.
    pub fn list(&self) -> Result<Vec<Allocation>, ClientError> {
        let r = self.call(&Request::List {})?;
        r.allocations
            .ok_or_else(|| self.protocol("list reply has no allocations"))
    }

    /// Whether the API can serve.
    pub fn status(&self) -> Result<(), ClientError> {
        self.call(&Request::Status {}).map(|_| ())
    }

    fn protocol(&self, reason: impl Into<String>) -> ClientError {
        ClientError::Protocol {
            socket: self.socket.clone(),
            reason: reason.into(),
        }
    }

    fn call(&self, req: &Request) -> Result<Response, ClientError> {
        let unreachable = |source| ClientError::Unreachable {
            socket: self.socket.clone(),
            source,
        };
        let mut stream = UnixStream::connect(&self.socket).map_err(unreachable)?;
        stream
            .set_read_timeout(Some(TIMEOUT))
            .map_err(unreachable)?;
        stream
            .set_write_timeout(Some(TIMEOUT))
            .map_err(unreachable)?;
        stream.write_all(&req.to_line()).map_err(unreachable)?;
        let mut reply = Vec::new();
        BufReader::new(stream.take(MAX_REPLY))
            .read_until(b'\n', &mut reply)
            .map_err(unreachable)?;
        if reply.last() != Some(&b'\n') {
            return Err(self.protocol("connection closed before a complete reply"));
        }
        let r = Response::parse(&reply).map_err(|e| self.protocol(e.to_string()))?;
        if r.ok {
            return Ok(r);
        }
        let e = r
            .error
            .ok_or_else(|| self.protocol("error reply without an error"))?;
        Err(ClientError::Refused {
            kind: e.kind,
            message: e.message,
        })
    }
}
