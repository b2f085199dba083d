//! strongSwan's IKE daemon `charon` for the ipsec backend: found and started
//! as flannel does (fl:pkg/backend/ipsec/handle_charon.go), or an already
//! running one is used; all talk goes over VICI ([`super::vici`]).
//!
//! - Socket: `/var/run/charon.vici` (flannel's fixed URI); when something
//!   already answers there, that charon is used and never stopped by weft.
//! - Otherwise the executable is searched like flannel: `charon` on `PATH`,
//!   then `/usr/lib/strongswan/charon`, `/usr/lib/ipsec/charon`,
//!   `/usr/libexec/strongswan/charon`, `/usr/libexec/ipsec/charon` (Debian:
//!   package `strongswan-charon`), and started with weftd's stdout/stderr.
//! - Parent-death signal: flannel sets `Pdeathsig: SIGTERM`. weft's control
//!   crate forbids `unsafe` (no `pre_exec`), so when util-linux `setpriv` is
//!   installed charon is started through `setpriv --pdeathsig TERM`, which
//!   sets it and execs charon (same pid). The signal follows the *thread*
//!   that spawned it: weftd spawns from a tokio worker thread, which lives as
//!   long as the runtime. Without `setpriv`, charon is stopped on teardown
//!   only (SIGTERM, then SIGKILL after 5 s), and a killed weftd leaves it
//!   running (the next weftd then reuses it through the socket).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::vici::{Section, ViciClient, ViciError};

/// flannel's VICI socket.
pub const DEFAULT_VICI: &str = "/var/run/charon.vici";

/// Where flannel looks for charon, in order (`charon` alone: on `PATH`).
pub const SEARCH: [&str; 5] = [
    "charon",
    "/usr/lib/strongswan/charon",
    "/usr/lib/ipsec/charon",
    "/usr/libexec/strongswan/charon",
    "/usr/libexec/ipsec/charon",
];

/// Errors starting or reaching charon.
#[derive(Debug, thiserror::Error)]
pub enum CharonError {
    /// No executable at any of the searched places.
    #[error(
        "no valid charon executable found at paths {0:?} (install strongSwan's charon, e.g. Debian package strongswan-charon)"
    )]
    NotFound(Vec<String>),
    /// Spawning failed.
    #[error("error starting charon daemon {path}: {source}")]
    Spawn {
        /// The program.
        path: PathBuf,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// charon exited before opening its socket.
    #[error("charon exited before opening its VICI socket {vici}: {status}")]
    Exited {
        /// The socket waited for.
        vici: PathBuf,
        /// Its exit status.
        status: std::process::ExitStatus,
    },
    /// The socket did not answer in time.
    #[error("charon did not open its VICI socket {0} in time")]
    Timeout(PathBuf),
    /// A VICI request failed.
    #[error(transparent)]
    Vici(#[from] ViciError),
}

/// How to start charon (tests run it in a network namespace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Launch {
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment (e.g. `STRONGSWAN_CONF`).
    pub envs: Vec<(String, String)>,
}

/// An executable file at `p`.
fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// `name` on `PATH` (`exec.LookPath`); a path with a `/` is checked as is.
pub fn look_path(name: &str) -> Option<PathBuf> {
    if name.contains('/') {
        return Some(PathBuf::from(name)).filter(|p| executable(p));
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

/// The first charon of [`SEARCH`].
pub fn find_exec() -> Result<PathBuf, CharonError> {
    for p in SEARCH {
        match look_path(p) {
            Some(found) => return Ok(found),
            None => tracing::warn!("No valid charon executable found at path {p}"),
        }
    }
    Err(CharonError::NotFound(
        SEARCH.iter().map(|s| s.to_string()).collect(),
    ))
}

impl Launch {
    /// charon found as flannel finds it, under `setpriv --pdeathsig TERM` when available.
    pub fn default_charon() -> Result<Launch, CharonError> {
        let charon = find_exec()?;
        Ok(match look_path("setpriv") {
            Some(setpriv) => Launch {
                program: setpriv,
                args: vec![
                    "--pdeathsig".into(),
                    "TERM".into(),
                    "--".into(),
                    charon.to_string_lossy().into_owned(),
                ],
                envs: Vec::new(),
            },
            None => {
                tracing::warn!(
                    "setpriv not found: charon gets no parent-death signal; it is stopped on teardown only"
                );
                Launch {
                    program: charon,
                    args: Vec::new(),
                    envs: Vec::new(),
                }
            }
        })
    }
}

/// A charon weft talks to, and the child process if weft started it.
#[derive(Debug)]
pub struct Charon {
    vici: PathBuf,
    child: Option<tokio::process::Child>,
}

impl Charon {
    /// Uses the charon answering on `vici`, or starts one (`launch`, by
    /// default [`Launch::default_charon`]) and waits up to `wait` for its socket.
    pub async fn connect_or_start(
        vici: &Path,
        launch: Option<Launch>,
        wait: Duration,
    ) -> Result<Charon, CharonError> {
        if ViciClient::connect(vici).await.is_ok() {
            tracing::info!(
                "using the charon daemon already running on {}",
                vici.display()
            );
            return Ok(Charon {
                vici: vici.into(),
                child: None,
            });
        }
        let launch = match launch {
            Some(l) => l,
            None => Launch::default_charon()?,
        };
        let mut cmd = tokio::process::Command::new(&launch.program);
        cmd.args(&launch.args)
            .envs(launch.envs.iter().map(|(k, v)| (k, v)))
            .kill_on_drop(true);
        let mut child = cmd.spawn().map_err(|source| CharonError::Spawn {
            path: launch.program.clone(),
            source,
        })?;
        tracing::info!(
            "Charon daemon started ({} {})",
            launch.program.display(),
            launch.args.join(" ")
        );
        let deadline = Instant::now() + wait;
        loop {
            if ViciClient::connect(vici).await.is_ok() {
                return Ok(Charon {
                    vici: vici.into(),
                    child: Some(child),
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                return Err(CharonError::Exited {
                    vici: vici.into(),
                    status,
                });
            }
            if Instant::now() > deadline {
                let _ = child.start_kill();
                return Err(CharonError::Timeout(vici.into()));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The VICI socket.
    pub fn vici(&self) -> &Path {
        &self.vici
    }

    /// Whether weft started this charon.
    pub fn owned(&self) -> bool {
        self.child.is_some()
    }

    /// One `success = yes|no` command on a fresh connection (as flannel does per call).
    pub async fn call(&self, cmd: &str, args: Section) -> Result<Section, CharonError> {
        let mut c = ViciClient::connect(&self.vici).await?;
        Ok(c.call(cmd, args).await?)
    }

    /// One command whose answer has no `success` key, on a fresh connection.
    pub async fn query(&self, cmd: &str, args: Section) -> Result<Section, CharonError> {
        let mut c = ViciClient::connect(&self.vici).await?;
        Ok(c.request(cmd, args).await?)
    }

    /// Stops charon if weft started it: SIGTERM, then SIGKILL after 5 s.
    pub async fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        match tokio::time::timeout(Duration::from_secs(5), child.wait()).await {
            Ok(_) => tracing::info!("Stopped charon daemon"),
            Err(_) => {
                tracing::warn!("charon did not stop on SIGTERM; killing it");
                let _ = child.kill().await;
            }
        }
    }
}
