//! Running real `weftd` processes for tests.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::proc::{Proc, wait_for, wait_for_or_show};

/// A weftd process with its own subnet.env and log in `dir`.
#[derive(Debug)]
pub struct Weftd {
    /// The process.
    pub proc: Proc,
    /// Its subnet.env path.
    pub subnet_env: PathBuf,
    /// Its arguments, for restarts.
    args: Vec<String>,
    netns: Option<String>,
    name: String,
    dir: PathBuf,
    starts: u32,
}

impl Weftd {
    /// Starts `weftd <args> --subnet-file <dir>/<name>.env` (inside `netns` if
    /// given), logging to `<dir>/<name>.log`.
    pub fn start(name: &str, dir: &Path, netns: Option<&str>, args: &[String]) -> Weftd {
        let subnet_env = dir.join(format!("{name}.env"));
        Weftd {
            proc: spawn(name, dir, netns, args, &subnet_env, 1),
            subnet_env,
            args: args.to_vec(),
            netns: netns.map(str::to_string),
            name: name.to_string(),
            dir: dir.to_path_buf(),
            starts: 1,
        }
    }

    /// Changes the arguments used by the next [`Weftd::restart`].
    pub fn set_args(&mut self, args: &[String]) {
        self.args = args.to_vec();
    }

    /// Starts the same daemon again (after it exited or was killed).
    pub fn restart(&mut self) {
        self.starts += 1;
        self.proc = spawn(
            &self.name,
            &self.dir,
            self.netns.as_deref(),
            &self.args,
            &self.subnet_env,
            self.starts,
        );
    }

    /// Waits until subnet.env exists and returns its variables.
    pub fn wait_ready(&mut self, timeout: Duration) -> BTreeMap<String, String> {
        self.wait_env(timeout, |_| true)
    }

    /// Waits until subnet.env exists and `accept`s its variables.
    pub fn wait_env(
        &mut self,
        timeout: Duration,
        accept: impl Fn(&BTreeMap<String, String>) -> bool,
    ) -> BTreeMap<String, String> {
        let path = self.subnet_env.clone();
        let mut dead = false;
        let env = wait_for(&format!("{} subnet.env", self.name), timeout, || {
            if !dead && !self.proc.running() {
                dead = true;
            }
            if dead {
                return Some(None);
            }
            read_env(&path).filter(|e| accept(e)).map(Some)
        });
        env.unwrap_or_else(|| {
            panic!(
                "{} exited before it was ready; log:\n{}",
                self.name,
                self.proc.log()
            )
        })
    }

    /// Waits until the log contains `needle`.
    /// On timeout the panic carries the whole log (a bare "timed out" left
    /// a CI failure undiagnosable).
    pub fn wait_log(&self, needle: &str, timeout: Duration) {
        wait_for_or_show(
            &format!("{needle:?} in {}'s log", self.name),
            timeout,
            || self.proc.log().contains(needle).then_some(()),
            || format!(":\n{}", self.proc.log()),
        );
    }
}

fn spawn(name: &str, dir: &Path, netns: Option<&str>, args: &[String], env: &Path, n: u32) -> Proc {
    let bin = crate::bins::path("weftd");
    let mut cmd = match netns {
        Some(ns) => {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", ns]).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    cmd.args(args)
        .arg(format!("--subnet-file={}", env.display()));
    Proc::spawn(name, cmd, &dir.join(format!("{name}.{n}.log")))
}

/// Parses a subnet.env file (`None` if missing or empty).
pub fn read_env(path: &Path) -> Option<BTreeMap<String, String>> {
    let text = std::fs::read_to_string(path).ok()?;
    if text.is_empty() {
        return None;
    }
    Some(
        text.lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    )
}

/// The status of the weftd whose subnet file is `subnet_file` (its status
/// socket, as `weft status --json` reads it); panics if it does not answer
/// within 5 s.
#[track_caller]
pub fn status(subnet_file: &Path) -> weft_control::status::model::Status {
    use weft_control::status::server::{query, socket_path};
    query(&socket_path(subnet_file), Duration::from_secs(5))
        .unwrap_or_else(|e| panic!("weft status of {}: {e}", subnet_file.display()))
}

/// Asserts that the weftd of `subnet_file` runs `backend` on `dataplane`
/// (`kernel` or `userspace`), as `weft status` reports it: a test that names
/// a path must be running it, whatever the kernel offers.
#[track_caller]
pub fn assert_dataplane(subnet_file: &Path, backend: &str, dataplane: &str) {
    let st = status(subnet_file);
    assert_eq!(
        (st.backend.name.as_str(), st.backend.dataplane.as_str()),
        (backend, dataplane),
        "{}: {:?}",
        subnet_file.display(),
        st.backend
    );
    let kind = if dataplane == "userspace" {
        "engine"
    } else {
        "kernel"
    };
    assert!(
        !st.backend.devices.is_empty() && st.backend.devices.iter().all(|d| d.kind == kind),
        "{}: {dataplane} should run on {kind} devices: {:?}",
        subnet_file.display(),
        st.backend.devices
    );
}
