//! The one guard of weft's tests for what they need from the machine (root,
//! a tool, a device). Every test that cannot run everywhere asks it first:
//!
//! - **present**: the guard returns `true` and the test runs;
//! - **missing, strict** (`CI` or `WEFT_REQUIRE_ALL` set to anything but
//!   empty, `0` or `false`): it panics, naming the test, what is missing and
//!   how to get it, so a CI run without the tools fails instead of passing
//!   with no integration coverage;
//! - **missing otherwise**: it prints `skipped: <test>: <what>` to stderr,
//!   appends that line to the file named by `WEFT_SKIP_LOG` when set
//!   (scripts/test.sh prints the collected lines at the end), and returns
//!   `false`: the test returns early and counts as passed.
//!
//! `<test>` is the test thread's name (libtest names it after the test) and,
//! in parentheses, the source file that asked (`#[track_caller]`: helpers
//! that wrap a guard should be `#[track_caller]` too).
//!
//! ```
//! use weft_testenv::{require_root, require_tool, skip_unless};
//!
//! fn needs_things() {
//!     require_root!();
//!     require_tool!("etcd", "/usr/bin/etcd", "etcd-server");
//!     skip_unless!(
//!         std::path::Path::new("/dev/net/tun").exists(),
//!         "/dev/net/tun (load the tun module: modprobe tun)"
//!     );
//!     // ... the test proper
//! }
//! ```

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::panic::Location;
use std::path::{Path, PathBuf};

/// Set (to anything but empty, `0` or `false`) by CI systems: missing
/// prerequisites fail the test.
pub const CI_ENV: &str = "CI";
/// The same as [`CI_ENV`] for local runs that want every test to run.
pub const REQUIRE_ALL_ENV: &str = "WEFT_REQUIRE_ALL";
/// A file to which every skip appends its `skipped: ...` line.
pub const SKIP_LOG_ENV: &str = "WEFT_SKIP_LOG";

/// What a guard does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything is present: run the test.
    Run,
    /// Something is missing: log it and return from the test.
    Skip,
    /// Something is missing under CI: panic.
    Fail,
}

/// Whether an environment value turns strict mode on: set, non-empty (after
/// trimming) and neither `0` nor `false` (in any case).
pub fn truthy(value: Option<&str>) -> bool {
    match value.map(str::trim) {
        None | Some("" | "0") => false,
        Some(v) => !v.eq_ignore_ascii_case("false"),
    }
}

/// The decision for the values of `CI` and `WEFT_REQUIRE_ALL` (`None`:
/// unset) and whether the prerequisite is present.
pub fn decide(present: bool, ci: Option<&str>, require_all: Option<&str>) -> Outcome {
    if present {
        Outcome::Run
    } else if truthy(ci) || truthy(require_all) {
        Outcome::Fail
    } else {
        Outcome::Skip
    }
}

/// The line a skip prints and logs (with its newline).
pub fn skip_line(test: &str, what: &str) -> String {
    format!("skipped: {test}: {what}\n")
}

/// Appends `line` to `log` in one `write` on an `O_APPEND` descriptor, so
/// lines of tests running at the same time (threads or processes) do not
/// interleave.
pub fn append_line(log: &Path, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)?;
    f.write_all(line.as_bytes())
}

/// The guard: `true` when `present`; otherwise skips (returns `false`) or,
/// under CI, panics. `what` says what is missing and how to get it (the
/// Debian package or the command that brings it), e.g. `"kube-apiserver not
/// built: run scripts/tools/build-kube-apiserver.sh"`.
#[must_use = "return from the test when this is false (or use skip_unless!)"]
#[track_caller]
pub fn require(present: bool, what: &str) -> bool {
    let var = |name| std::env::var(name).ok();
    let (ci, all) = (var(CI_ENV), var(REQUIRE_ALL_ENV));
    match decide(present, ci.as_deref(), all.as_deref()) {
        Outcome::Run => true,
        Outcome::Fail => {
            let why = [(CI_ENV, &ci), (REQUIRE_ALL_ENV, &all)]
                .into_iter()
                .filter(|(_, v)| truthy(v.as_deref()))
                .map(|(k, v)| format!("{k}={}", v.as_deref().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join(" ");
            panic!(
                "{}: {what}\n(with {why} a test whose prerequisites are missing fails instead \
                 of skipping)",
                test_name(Location::caller())
            )
        }
        Outcome::Skip => {
            let line = skip_line(&test_name(Location::caller()), what);
            eprint!("{line}");
            if let Some(log) = std::env::var_os(SKIP_LOG_ENV).filter(|v| !v.is_empty())
                && let Err(e) = append_line(Path::new(&log), &line)
            {
                eprintln!("warning: cannot append to {SKIP_LOG_ENV}={log:?}: {e}");
            }
            false
        }
    }
}

/// [`require`] that the process runs as root (network namespaces, TUN
/// devices, firewall rules).
#[must_use = "return from the test when this is false (or use require_root!)"]
#[track_caller]
pub fn require_root() -> bool {
    require(
        euid() == 0,
        "needs root (namespaces, devices, firewall rules): run the tests as root",
    )
}

/// [`require`] that the tool `name` is an executable at `path`, or, when
/// `path` has no `/`, somewhere in `PATH`; `package` is the Debian package
/// that installs it.
#[must_use = "return from the test when this is false (or use require_tool!)"]
#[track_caller]
pub fn require_tool(name: &str, path: impl AsRef<Path>, package: &str) -> bool {
    let path = path.as_ref();
    let (found, place) = if path.components().count() > 1 {
        (is_executable(path), path.display().to_string())
    } else {
        (
            find_in_path(path).is_some(),
            format!("{} in PATH", path.display()),
        )
    };
    require(
        found,
        &format!("{name} not found ({place}): apt-get install {package}"),
    )
}

/// Returns from the calling test unless `$present`; see [`require`].
#[macro_export]
macro_rules! skip_unless {
    ($present:expr, $what:expr $(,)?) => {
        if !$crate::require($present, $what) {
            return;
        }
    };
}

/// Returns from the calling test unless it runs as root; see [`require_root`].
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::require_root() {
            return;
        }
    };
}

/// Returns from the calling test unless the tool is installed; see [`require_tool`].
#[macro_export]
macro_rules! require_tool {
    ($name:expr, $path:expr, $package:expr $(,)?) => {
        if !$crate::require_tool($name, $path, $package) {
            return;
        }
    };
}

/// `<thread name> (<file>)` of the test that called the guard.
fn test_name(at: &Location<'_>) -> String {
    let thread = std::thread::current();
    format!(
        "{} ({})",
        thread.name().unwrap_or("<unnamed thread>"),
        at.file()
    )
}

fn is_executable(p: &Path) -> bool {
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn find_in_path(name: &Path) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| is_executable(p))
}

fn euid() -> u32 {
    mod sys {
        // SAFETY: geteuid(2) takes no arguments, has no preconditions and
        // cannot fail; uid_t is u32 on Linux.
        unsafe extern "C" {
            pub safe fn geteuid() -> u32;
        }
    }
    sys::geteuid()
}

#[cfg(test)]
mod tests;
