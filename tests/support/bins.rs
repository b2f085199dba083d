//! Paths of the workspace's binaries (built by `cargo build --workspace --bins`
//! before the tests run; see scripts/test.sh).

use std::path::PathBuf;

/// The directory holding the workspace's binaries for the current profile
/// (the test executable lives in `<dir>/deps/`).
pub fn dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("deps dir");
    deps.parent().expect("profile dir").to_path_buf()
}

/// The path of workspace binary `name`; panics with a hint when missing.
pub fn path(name: &str) -> PathBuf {
    let p = dir().join(name);
    assert!(
        p.exists(),
        "{} not built: run `cargo build --workspace --bins` first",
        p.display()
    );
    p
}
