//! The one place that executes firewall tools.
//!
//! Everything else in this module builds text; [`Runner`] runs `iptables`, `ip6tables`,
//! `iptables-restore`, `ip6tables-restore` and `nft` with an optional stdin payload and returns
//! their output. A runner can carry a command prefix (e.g. `ip netns exec NAME`), which is how
//! the integration tests run the real drivers inside their own network namespaces.

use std::{
    io::Write,
    process::{Command, Stdio},
};

use super::Error;

/// Runs firewall tools, optionally behind a fixed prefix.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Runner {
    prefix: Vec<String>,
}

/// What a finished tool reported.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Output {
    /// Whether it exited with status 0.
    pub success: bool,
    /// `exit status: N` or the terminating signal.
    pub status: String,
    /// Its stdout, lossily decoded.
    pub stdout: String,
    /// Its stderr, lossily decoded.
    pub stderr: String,
}

// === impl Runner ===

impl Runner {
    /// Runs the tools directly (in the caller's network namespace).
    pub fn new() -> Self {
        Self::default()
    }

    /// Runs every tool as `prefix... program args...`.
    pub fn with_prefix(prefix: Vec<String>) -> Self {
        Self { prefix }
    }

    /// Runs every tool inside the named network namespace (`ip netns exec NAME ...`).
    pub fn in_netns(name: &str) -> Self {
        Self::with_prefix(vec![
            "ip".into(),
            "netns".into(),
            "exec".into(),
            name.into(),
        ])
    }

    /// Runs `program args...` with `stdin` and returns its output whatever its exit status.
    pub fn output(
        &self,
        program: &str,
        args: &[&str],
        stdin: Option<&str>,
    ) -> Result<Output, Error> {
        let mut argv: Vec<&str> = self.prefix.iter().map(String::as_str).collect();
        argv.push(program);
        argv.extend_from_slice(args);
        tracing::trace!(command = %argv.join(" "), stdin = stdin.unwrap_or(""), "running");
        let spawn_err = |source| Error::Spawn {
            program: argv[0].to_string(),
            source,
        };
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(spawn_err)?;
        if let (Some(payload), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // Payloads are a few KiB, far below the pipe buffer, so writing before reading
            // the output cannot deadlock. The pipe is closed when `pipe` drops.
            pipe.write_all(payload.as_bytes()).map_err(spawn_err)?;
        }
        let out = child.wait_with_output().map_err(spawn_err)?;
        Ok(Output {
            success: out.status.success(),
            status: out.status.to_string(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        })
    }

    /// Like [`Self::output`], but a non-zero exit is an [`Error::Command`]; returns stdout.
    pub fn run(&self, program: &str, args: &[&str], stdin: Option<&str>) -> Result<String, Error> {
        let out = self.output(program, args, stdin)?;
        if out.success {
            Ok(out.stdout)
        } else {
            Err(Error::Command {
                command: format!("{program} {}", args.join(" ")),
                status: out.status,
                stderr: out.stderr.trim().to_string(),
            })
        }
    }
}
