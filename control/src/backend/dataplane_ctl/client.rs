//! The CLI's side of [`super`]: what runs (`weft dataplane`) and a switch
//! (`weft dataplane set` / `reset`), both over weftd's status socket.

use std::path::Path;
use std::time::Duration;

use crate::backend::DataplaneChoice;
use crate::status::server::{self, StatusError};

/// What runs, as `weft dataplane` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// weftd's pid.
    pub pid: u32,
    /// The backend type.
    pub backend: String,
    /// What runs: `kernel`, `userspace` or `none`.
    pub dataplane: String,
    /// The choice in effect or being switched to (`auto`, `kernel`, `userspace`).
    pub requested: String,
}

impl Status {
    /// Asks the weftd whose subnet file is `subnet_file` (its status socket).
    pub fn query(subnet_file: &Path, timeout: Duration) -> Result<Status, StatusError> {
        let st = server::query(&server::socket_path(subnet_file), timeout)?;
        Ok(Status {
            pid: st.pid,
            backend: st.backend.name,
            dataplane: st.backend.dataplane,
            requested: st.backend.requested,
        })
    }
}

/// What a switch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Switched {
    /// What runs now.
    pub status: Status,
    /// weftd's `--dataplane`.
    pub flag: String,
    /// The file now holding the choice (`None`: the flag's choice is in effect).
    pub persisted: Option<String>,
    /// Set when the switch happened but could not be persisted.
    pub warning: Option<String>,
}

/// Why a switch request failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// weftd's status socket did not answer: weftd is not running (or uses
    /// another subnet file).
    #[error("cannot reach weftd (is it running with --subnet-file={0}?): {1}")]
    NoDaemon(String, #[source] StatusError),
    /// weftd refused (its own reason) or did not finish in time.
    #[error("weftd refused: {0}")]
    Refused(String),
    /// The reply is not the protocol's.
    #[error("invalid reply from weftd: {0}")]
    Invalid(String),
}

/// Asks the weftd of `subnet_file` to switch to `want` (`None`: back to its
/// `--dataplane`) and waits for its answer, at most `timeout`.
pub fn request(
    subnet_file: &Path,
    want: Option<DataplaneChoice>,
    timeout: Duration,
) -> Result<Switched, RequestError> {
    let req = match want {
        Some(w) => serde_json::json!({"op": "dataplane", "set": w.as_str()}),
        None => serde_json::json!({"op": "dataplane", "reset": true}),
    };
    let socket = server::socket_path(subnet_file);
    let v = match server::call(&socket, &req, timeout) {
        Ok(v) => v,
        Err(StatusError::Daemon(m)) => return Err(RequestError::Refused(m)),
        Err(e @ StatusError::Io { .. })
            if matches!(&e, StatusError::Io { source, .. }
                if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut)) =>
        {
            return Err(RequestError::Refused(format!(
                "no answer within {} s ({e}); the switch may still complete: see `weft dataplane`",
                timeout.as_secs()
            )));
        }
        Err(e) => return Err(RequestError::NoDaemon(subnet_file.display().to_string(), e)),
    };
    let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
    let (Some(backend), Some(dataplane), Some(requested), Some(pid)) = (
        s("backend"),
        s("dataplane"),
        s("requested"),
        v.get("pid").and_then(|p| p.as_u64()),
    ) else {
        return Err(RequestError::Invalid(v.to_string()));
    };
    Ok(Switched {
        status: Status {
            pid: u32::try_from(pid).unwrap_or(u32::MAX),
            backend,
            dataplane,
            requested,
        },
        flag: s("flag").unwrap_or_default(),
        persisted: s("persisted"),
        warning: s("warning"),
    })
}
