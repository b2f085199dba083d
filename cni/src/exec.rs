//! Running a delegate plugin the way libcni's `invoke` package does.
//!
//! Contract:
//! - The plugin is found in `CNI_PATH` (colon-separated, first regular file
//!   wins); a name containing `/` is rejected.
//! - It runs with our whole environment, `CNI_COMMAND` set to the verb and
//!   any further overrides applied (`None` removes a variable), with the
//!   config on stdin. "Text file busy" (a plugin being installed) is retried
//!   up to five times, a second apart.
//! - Exit 0: its stdout is returned. Otherwise its stdout is decoded as a CNI
//!   error and returned as [`ExecError::Plugin`] (code, msg and details kept,
//!   so the caller can pass it through); without a decodable error, the
//!   message is built from stderr as libcni does.
//! - The delegate's stderr is copied to ours after it exits (it is the
//!   runtime's log).

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::Duration;

use serde::Deserialize;

/// Stdin up to this size is written without a helper thread: a pipe holds
/// at least one page even when the user's pipe-buffer quota is used up.
const SMALL_STDIN: usize = 4096;

/// A CNI error object as a plugin prints it.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct PluginError {
    /// `code` (0 when the plugin printed none).
    #[serde(default)]
    pub code: u32,
    /// `msg`.
    #[serde(default)]
    pub msg: String,
    /// `details`.
    #[serde(default)]
    pub details: String,
}

/// Why a delegate could not be run or failed.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The plugin name contains a path separator.
    #[error("invalid plugin name: {0}")]
    InvalidName(String),
    /// The plugin is not in `CNI_PATH`.
    #[error("failed to find plugin {plugin:?} in path [{}]", .paths.join(" "))]
    NotFound {
        /// The plugin type.
        plugin: String,
        /// The directories searched.
        paths: Vec<String>,
    },
    /// The plugin could not be started or talked to.
    #[error("failed to run plugin {}: {source}", .path.display())]
    Spawn {
        /// The plugin binary.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The plugin ran and reported an error.
    #[error("{}", .0.msg)]
    Plugin(PluginError),
    /// The plugin succeeded but printed something that is not a CNI result.
    #[error("plugin {} returned an invalid result: {reason}", .path.display())]
    BadOutput {
        /// The plugin binary.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
}

/// Finds `plugin` in the colon-separated `cni_path`.
pub fn find(plugin: &str, cni_path: &str) -> Result<PathBuf, ExecError> {
    if plugin.is_empty() || plugin.contains('/') {
        return Err(ExecError::InvalidName(plugin.to_string()));
    }
    let paths: Vec<String> = cni_path
        .split(':')
        .filter(|p| !p.is_empty())
        .map(str::to_string)
        .collect();
    for dir in &paths {
        let candidate = Path::new(dir).join(plugin);
        if candidate.metadata().is_ok_and(|m| m.is_file()) {
            return Ok(candidate);
        }
    }
    Err(ExecError::NotFound {
        plugin: plugin.to_string(),
        paths,
    })
}

/// Runs the plugin at `path` for `command` with `stdin`; returns its stdout.
pub fn run(
    path: &Path,
    command: &str,
    overrides: &[(&str, Option<&str>)],
    stdin: &[u8],
) -> Result<Vec<u8>, ExecError> {
    let spawn_err = |source| ExecError::Spawn {
        path: path.to_path_buf(),
        source,
    };
    let mut attempt = 0;
    let out = loop {
        match run_once(path, command, overrides, stdin) {
            Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && attempt < 5 => {
                attempt += 1;
                thread::sleep(Duration::from_secs(1));
            }
            other => break other.map_err(spawn_err)?,
        }
    };
    if !out.stderr.is_empty() {
        let _ = io::stderr().write_all(&out.stderr);
    }
    if out.status.success() {
        return Ok(out.stdout);
    }
    Err(ExecError::Plugin(plugin_error(&out)))
}

fn run_once(
    path: &Path,
    command: &str,
    overrides: &[(&str, Option<&str>)],
    stdin: &[u8],
) -> io::Result<Output> {
    let mut cmd = Command::new(path);
    cmd.env("CNI_COMMAND", command)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (key, value) in overrides {
        match value {
            Some(v) => cmd.env(key, v),
            None => cmd.env_remove(key),
        };
    }
    let mut child = cmd.spawn()?;
    let mut pipe = child.stdin.take();
    if stdin.len() <= SMALL_STDIN {
        // Fits in any pipe buffer: the write cannot block.
        if let Some(p) = pipe.as_mut() {
            let _ = p.write_all(stdin);
        }
        drop(pipe);
        return child.wait_with_output();
    }
    // Feed stdin from a second thread so a plugin that prints before it has
    // read all of its config cannot deadlock us.
    thread::scope(|s| {
        s.spawn(move || {
            if let Some(p) = pipe.as_mut() {
                // A plugin that exits without reading stdin closes the pipe;
                // its exit status tells the story, not EPIPE.
                let _ = p.write_all(stdin);
            }
            drop(pipe);
        });
        child.wait_with_output()
    })
}

/// libcni's `pluginErr`: decode stdout, else fall back to stderr.
fn plugin_error(out: &Output) -> PluginError {
    let status = match out.status.code() {
        Some(c) => format!("exit status {c}"),
        None => "signal: killed".to_string(),
    };
    if out.stdout.is_empty() {
        let msg = if out.stderr.is_empty() {
            format!("netplugin failed with no error message: {status}")
        } else {
            format!(
                "netplugin failed: {:?}",
                String::from_utf8_lossy(&out.stderr)
            )
        };
        return PluginError {
            code: 0,
            msg,
            details: String::new(),
        };
    }
    match serde_json::from_slice::<PluginError>(&out.stdout) {
        Ok(e) => e,
        Err(perr) => PluginError {
            code: 0,
            msg: format!(
                "netplugin failed but error parsing its diagnostic message {:?}: {perr}",
                String::from_utf8_lossy(&out.stdout)
            ),
            details: String::new(),
        },
    }
}

/// Asks the plugin at `path` which CNI versions it supports.
pub fn supported_versions(path: &Path) -> Result<Vec<String>, ExecError> {
    #[derive(Deserialize)]
    struct Reply {
        #[serde(rename = "supportedVersions", default)]
        supported: Vec<String>,
    }
    let stdin = format!(r#"{{"cniVersion":"{}"}}"#, crate::version::CURRENT);
    let out = run(path, "VERSION", &[], stdin.as_bytes())?;
    let reply: Reply = serde_json::from_slice(&out).map_err(|e| ExecError::BadOutput {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })?;
    Ok(reply.supported)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn script(dir: &Path, name: &str, body: &str) {
        let p = dir.join(name);
        std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).expect("write script");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    #[test]
    fn find_searches_path_in_order() {
        let a = tempfile::tempdir().expect("tempdir");
        let b = tempfile::tempdir().expect("tempdir");
        script(b.path(), "fake", "true");
        let cni_path = format!("{}:{}", a.path().display(), b.path().display());
        assert_eq!(
            find("fake", &cni_path).expect("found"),
            b.path().join("fake")
        );
        let e = find("nope", &cni_path).expect_err("missing");
        assert_eq!(
            e.to_string(),
            format!(
                "failed to find plugin \"nope\" in path [{} {}]",
                a.path().display(),
                b.path().display()
            )
        );
        assert!(matches!(
            find("../fake", &cni_path),
            Err(ExecError::InvalidName(_))
        ));
    }

    #[test]
    fn run_passes_env_stdin_and_decodes_errors() {
        let d = tempfile::tempdir().expect("tempdir");
        script(
            d.path(),
            "echo",
            r#"printf '{"cmd":"%s","id":"%s","x":"%s",' "$CNI_COMMAND" "$CNI_CONTAINERID" "${WEFT_TEST_X-unset}"; cat"#,
        );
        let p = d.path().join("echo");
        let out = run(
            &p,
            "ADD",
            &[("CNI_CONTAINERID", Some("c1")), ("WEFT_TEST_X", None)],
            br#""in":1}"#,
        )
        .expect("runs");
        assert_eq!(
            String::from_utf8_lossy(&out),
            r#"{"cmd":"ADD","id":"c1","x":"unset","in":1}"#
        );

        // Larger than a pipe buffer: fed from a helper thread.
        let big = format!("\"{}\"}}", "x".repeat(200_000));
        let out = run(&p, "DEL", &[], big.as_bytes()).expect("runs");
        assert_eq!(
            out.len(),
            r#"{"cmd":"DEL","id":"","x":"unset","#.len() + big.len()
        );

        script(
            d.path(),
            "fail",
            r#"echo '{"code":7,"msg":"bad","details":"d"}'; exit 1"#,
        );
        let e = run(&d.path().join("fail"), "ADD", &[], b"{}").expect_err("fails");
        assert!(
            matches!(e, ExecError::Plugin(PluginError { code: 7, ref msg, ref details }) if msg == "bad" && details == "d")
        );

        script(d.path(), "quiet", "echo oops >&2; exit 3");
        let e = run(&d.path().join("quiet"), "ADD", &[], b"{}").expect_err("fails");
        assert!(
            matches!(e, ExecError::Plugin(PluginError { code: 0, ref msg, .. }) if msg == "netplugin failed: \"oops\\n\"")
        );

        script(d.path(), "silent", "exit 2");
        let e = run(&d.path().join("silent"), "ADD", &[], b"{}").expect_err("fails");
        assert_eq!(
            e.to_string(),
            "netplugin failed with no error message: exit status 2"
        );

        script(
            d.path(),
            "ver",
            r#"echo '{"cniVersion":"1.0.0","supportedVersions":["0.4.0","1.0.0"]}'"#,
        );
        assert_eq!(
            supported_versions(&d.path().join("ver")).expect("version"),
            vec!["0.4.0", "1.0.0"]
        );
    }
}
