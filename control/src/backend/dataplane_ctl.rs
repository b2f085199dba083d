//! The operator's handle on the dataplane of a running weftd: two small
//! files next to the subnet file (`/run/flannel/` by default).
//!
//! - `weft-dataplane` (written by the operator or `weft dataplane set`): one
//!   word, `auto`, `kernel` or `userspace`. It overrides `--dataplane` at
//!   start and is re-read on SIGHUP, when weftd switches the running backend
//!   to it (see [`super::dual`]). A missing file means the flag's value.
//! - `weft-status.json` (written by weftd after start-up and after every
//!   switch): `{"pid":1234,"backend":"vxlan","dataplane":"kernel","requested":"auto"}`.
//!   `weft dataplane` reads it to find the daemon and show what runs.

use std::path::{Path, PathBuf};

use super::{Backend, DataplaneChoice};

/// The override file's name.
pub const OVERRIDE_FILE: &str = "weft-dataplane";
/// The status file's name.
pub const STATUS_FILE: &str = "weft-status.json";

/// See the module docs.
#[derive(Debug, Clone)]
pub struct DataplaneControl {
    override_path: PathBuf,
    status_path: PathBuf,
    flag: DataplaneChoice,
}

/// The status weftd publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    /// weftd's pid.
    pub pid: u32,
    /// The backend type.
    pub backend: String,
    /// What runs: `kernel`, `userspace` or `none`.
    pub dataplane: String,
    /// What was asked for (`auto`, `kernel`, `userspace`).
    pub requested: String,
}

impl Status {
    /// Reads a status file.
    pub fn read(path: &Path) -> Option<Status> {
        let v: serde_json::Value = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
        Some(Status {
            pid: u32::try_from(v["pid"].as_u64()?).ok()?,
            backend: v["backend"].as_str()?.to_string(),
            dataplane: v["dataplane"].as_str()?.to_string(),
            requested: v["requested"].as_str()?.to_string(),
        })
    }
}

impl DataplaneControl {
    /// The files next to `subnet_file`; `flag` is `--dataplane`.
    pub fn new(subnet_file: &Path, flag: DataplaneChoice) -> DataplaneControl {
        let dir = subnet_file.parent().unwrap_or(Path::new("."));
        DataplaneControl {
            override_path: dir.join(OVERRIDE_FILE),
            status_path: dir.join(STATUS_FILE),
            flag,
        }
    }

    /// The dataplane asked for: the override file if it holds a valid
    /// value, else the flag.
    pub fn wanted(&self) -> DataplaneChoice {
        match std::fs::read_to_string(&self.override_path) {
            Ok(text) => DataplaneChoice::parse(&text).unwrap_or_else(|| {
                tracing::warn!(
                    "{}: {:?} is not auto, kernel or userspace; using --dataplane={}",
                    self.override_path.display(),
                    text.trim(),
                    self.flag.as_str()
                );
                self.flag
            }),
            Err(_) => self.flag,
        }
    }

    /// Writes the status file (atomically); failures are logged.
    pub fn write_status(&self, backend: &dyn Backend) {
        let v = serde_json::json!({
            "pid": std::process::id(),
            "backend": backend.name(),
            "dataplane": backend.dataplane(),
            "requested": self.wanted().as_str(),
        });
        let tmp = self.status_path.with_extension("json.tmp");
        let res = std::fs::write(&tmp, format!("{v}\n"))
            .and_then(|()| std::fs::rename(&tmp, &self.status_path));
        if let Err(e) = res {
            tracing::warn!("failed to write {}: {e}", self.status_path.display());
        }
    }

    /// SIGHUP: switch `backend` to what the override file (or flag) asks
    /// for, then update the status file. Errors are logged; the backend keeps
    /// running on whichever path it ends up on.
    pub async fn on_hup(&self, backend: &mut dyn Backend) {
        let want = self.wanted();
        tracing::info!(
            "SIGHUP: dataplane {} requested for the {} backend",
            want.as_str(),
            backend.name()
        );
        match backend.switch_dataplane(want).await {
            Ok(now) => tracing::info!("dataplane: {} runs in the {now}", backend.name()),
            Err(e) => tracing::error!("dataplane switch failed: {e}"),
        }
        self.write_status(backend);
    }
}

/// Why `weft dataplane set` failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The override file could not be written.
    #[error("cannot write {0}: {1}")]
    Write(String, #[source] std::io::Error),
    /// No status file: weftd is not running (or uses another subnet file).
    #[error("no weftd status in {0}: is weftd running with this --subnet-file?")]
    NoDaemon(String),
    /// Signalling weftd failed.
    #[error("cannot signal weftd (pid {0}): {1}")]
    Signal(u32, #[source] nix::Error),
    /// weftd did not report the requested dataplane in time.
    #[error("weftd still reports {0:?} after {1:?}; see its log")]
    Timeout(Option<String>, std::time::Duration),
}

/// `weft dataplane set`: writes the override file next to `subnet_file`,
/// sends weftd SIGHUP and waits until its status shows `want` (for `auto`:
/// until the status file is rewritten). Returns the final status.
pub fn request(
    subnet_file: &Path,
    want: DataplaneChoice,
    timeout: std::time::Duration,
) -> Result<Status, RequestError> {
    let ctl = DataplaneControl::new(subnet_file, want);
    let before = Status::read(&ctl.status_path)
        .ok_or_else(|| RequestError::NoDaemon(ctl.status_path.display().to_string()))?;
    let stamp = std::fs::metadata(&ctl.status_path)
        .and_then(|m| m.modified())
        .ok();
    std::fs::write(&ctl.override_path, format!("{}\n", want.as_str()))
        .map_err(|e| RequestError::Write(ctl.override_path.display().to_string(), e))?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(before.pid).unwrap_or(i32::MAX));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)
        .map_err(|e| RequestError::Signal(before.pid, e))?;
    let deadline = std::time::Instant::now() + timeout;
    loop {
        let now = Status::read(&ctl.status_path);
        let rewritten = std::fs::metadata(&ctl.status_path)
            .and_then(|m| m.modified())
            .ok()
            != stamp;
        if let Some(st) = &now {
            let done = match want {
                DataplaneChoice::Auto => rewritten || st.requested == "auto",
                other => st.dataplane == other.as_str(),
            };
            if done && (rewritten || st.requested == want.as_str()) {
                return Ok(st.clone());
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(RequestError::Timeout(now.map(|s| s.dataplane), timeout));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_file_wins_over_the_flag_and_bad_values_are_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ctl = DataplaneControl::new(&dir.path().join("subnet.env"), DataplaneChoice::Auto);
        assert_eq!(ctl.wanted(), DataplaneChoice::Auto);
        std::fs::write(dir.path().join(OVERRIDE_FILE), "userspace\n").expect("write");
        assert_eq!(ctl.wanted(), DataplaneChoice::Userspace);
        std::fs::write(dir.path().join(OVERRIDE_FILE), "fast").expect("write");
        assert_eq!(ctl.wanted(), DataplaneChoice::Auto);
        let b = crate::backend::alloc::Alloc::new();
        ctl.write_status(&b);
        let st = Status::read(&dir.path().join(STATUS_FILE)).expect("status");
        assert_eq!(
            (
                st.backend.as_str(),
                st.dataplane.as_str(),
                st.requested.as_str()
            ),
            ("alloc", "none", "auto")
        );
        assert_eq!(st.pid, std::process::id());
    }
}
