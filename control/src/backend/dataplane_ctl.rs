//! The operator's handle on the dataplane of a running weftd.
//!
//! - `weft-dataplane`, a file next to the subnet file (`/run/flannel/` by
//!   default), written by the operator or `weft dataplane set`: one word,
//!   `auto`, `kernel` or `userspace`. It overrides `--dataplane` at start and
//!   is re-read on SIGHUP, when weftd switches the running backend to it (see
//!   [`super::dual`]). A missing file means the flag's value.
//! - What runs is read from weftd's status socket ([`crate::status`]): the
//!   backend, its dataplane, and `requested`, the choice weftd last acted on.
//!   `weft dataplane` shows it; `weft dataplane set` waits on it.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{DataplaneChoice, Switch};
use crate::status::server::{self, StatusError};

/// The override file's name.
pub const OVERRIDE_FILE: &str = "weft-dataplane";

/// See the module docs.
#[derive(Debug, Clone)]
pub struct DataplaneControl {
    override_path: PathBuf,
    flag: DataplaneChoice,
    /// What the last start-up or SIGHUP acted on.
    requested: DataplaneChoice,
}

/// The override file next to `subnet_file`.
fn override_path(subnet_file: &Path) -> PathBuf {
    subnet_file
        .parent()
        .unwrap_or(Path::new("."))
        .join(OVERRIDE_FILE)
}

/// What runs, as `weft dataplane` shows it.
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

impl DataplaneControl {
    /// The override file next to `subnet_file`; `flag` is `--dataplane`.
    pub fn new(subnet_file: &Path, flag: DataplaneChoice) -> DataplaneControl {
        let mut ctl = DataplaneControl {
            override_path: override_path(subnet_file),
            flag,
            requested: flag,
        };
        ctl.requested = ctl.wanted();
        ctl
    }

    /// The choice the last start-up or SIGHUP acted on.
    pub fn requested(&self) -> DataplaneChoice {
        self.requested
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

    /// SIGHUP: switch `backend` to what the override file (or flag) asks
    /// for, then record it as requested. Errors are logged; the backend keeps
    /// running on whichever path it ends up on.
    pub async fn on_hup(&mut self, backend: &mut dyn Switch) {
        let want = self.wanted();
        tracing::info!(
            "SIGHUP: dataplane {} requested for the {} backend",
            want.as_str(),
            backend.name()
        );
        self.requested = want;
        self.switch(backend).await;
    }

    /// A pending switch is due ([`Switch::switch_pending`]): completes it.
    pub async fn on_due(&mut self, backend: &mut dyn Switch) {
        self.switch(backend).await;
    }

    async fn switch(&self, backend: &mut dyn Switch) {
        match backend.switch_dataplane(self.requested).await {
            Ok(now) if backend.switch_pending().is_some() => tracing::info!(
                "dataplane: {} runs in the {now} until the pending switch is due",
                backend.name()
            ),
            Ok(now) => tracing::info!("dataplane: {} runs in the {now}", backend.name()),
            Err(e) => tracing::error!("dataplane switch failed: {e}"),
        }
    }
}

/// Why `weft dataplane set` failed.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    /// The override file could not be written.
    #[error("cannot write {0}: {1}")]
    Write(String, #[source] std::io::Error),
    /// weftd's status socket did not answer: weftd is not running (or uses
    /// another subnet file).
    #[error("is weftd running with this --subnet-file? {0}")]
    NoDaemon(#[source] StatusError),
    /// Signalling weftd failed.
    #[error("cannot signal weftd (pid {0}): {1}")]
    Signal(u32, #[source] nix::Error),
    /// weftd did not report the requested dataplane in time.
    #[error("weftd still reports {0:?} after {1:?}; see its log")]
    Timeout(Option<String>, Duration),
}

/// `weft dataplane set`: writes the override file next to `subnet_file`,
/// sends weftd SIGHUP and waits until its status shows that it acted on
/// `want` (and, unless `auto`, runs it). Returns the final status.
pub fn request(
    subnet_file: &Path,
    want: DataplaneChoice,
    timeout: Duration,
) -> Result<Status, RequestError> {
    let ask = Duration::from_secs(5).min(timeout);
    let before = Status::query(subnet_file, ask).map_err(RequestError::NoDaemon)?;
    let override_path = override_path(subnet_file);
    std::fs::write(&override_path, format!("{}\n", want.as_str()))
        .map_err(|e| RequestError::Write(override_path.display().to_string(), e))?;
    let pid = nix::unistd::Pid::from_raw(i32::try_from(before.pid).unwrap_or(i32::MAX));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGHUP)
        .map_err(|e| RequestError::Signal(before.pid, e))?;
    let deadline = Instant::now() + timeout;
    loop {
        let now = Status::query(subnet_file, ask).ok();
        if let Some(st) = &now
            && st.requested == want.as_str()
            && (want == DataplaneChoice::Auto || st.dataplane == want.as_str())
        {
            return Ok(st.clone());
        }
        if Instant::now() > deadline {
            return Err(RequestError::Timeout(now.map(|s| s.dataplane), timeout));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn override_file_wins_over_the_flag_and_bad_values_are_ignored() {
        let dir = tempfile::tempdir().expect("tempdir");
        let env = dir.path().join("subnet.env");
        let ctl = DataplaneControl::new(&env, DataplaneChoice::Auto);
        assert_eq!(
            (ctl.wanted(), ctl.requested()),
            (DataplaneChoice::Auto, DataplaneChoice::Auto)
        );
        std::fs::write(dir.path().join(OVERRIDE_FILE), "userspace\n").expect("write");
        assert_eq!(ctl.wanted(), DataplaneChoice::Userspace);
        // Only a start-up or SIGHUP acts on the file.
        assert_eq!(ctl.requested(), DataplaneChoice::Auto);
        assert_eq!(
            DataplaneControl::new(&env, DataplaneChoice::Auto).requested(),
            DataplaneChoice::Userspace
        );
        std::fs::write(dir.path().join(OVERRIDE_FILE), "fast").expect("write");
        assert_eq!(ctl.wanted(), DataplaneChoice::Auto);
    }

    #[test]
    fn request_without_a_daemon_says_so() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = request(
            &dir.path().join("subnet.env"),
            DataplaneChoice::Kernel,
            Duration::from_millis(200),
        )
        .expect_err("no weftd");
        assert!(matches!(err, RequestError::NoDaemon(_)), "{err}");
        assert!(err.to_string().contains("is weftd running"), "{err}");
        assert!(
            !dir.path().join(OVERRIDE_FILE).exists(),
            "nothing written without a daemon"
        );
    }
}
