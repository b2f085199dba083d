//! Support for weft's root integration tests: throwaway network namespaces,
//! child processes that die with the test, a real etcd on loopback, and the
//! paths of the workspace's binaries.
//!
//! Every helper cleans up in `Drop`, so a failing (panicking) test still
//! removes what it made.

pub mod bins;
pub mod etcd;
pub mod netns;
pub mod proc;
pub mod weftd;

/// Skips the calling test (returns from it) unless running as root.
#[macro_export]
macro_rules! require_root {
    () => {
        if !$crate::is_root() {
            eprintln!("skipped: needs root");
            return;
        }
    };
}

/// Whether the process runs as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A short prefix unique to this test process and `tag`, for names of
/// namespaces and links (interface names must stay under 16 bytes).
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("w{}{}{}", tag, std::process::id() % 10_000, n)
}
