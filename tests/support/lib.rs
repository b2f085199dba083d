//! Support for weft's root integration tests: throwaway network namespaces,
//! child processes that die with the test, a real etcd on loopback, and the
//! paths of the workspace's binaries.
//!
//! Every helper cleans up in `Drop`, so a failing (panicking) test still
//! removes what it made.
//!
//! What a test needs from the machine is checked by the workspace's one
//! guard, `weft_testenv`: `weft_testenv::require_root!()`,
//! `weft_testenv::require_tool!(..)`, `weft_testenv::skip_unless!(..)`, and
//! [`require_etcd!`] here. When everything is there the test runs. When
//! something is missing the test skips (returns early, passing) and prints
//! `skipped: <test> (<file>): <what is missing and how to get it>`, also
//! appended to the file named by `WEFT_SKIP_LOG` (scripts/test.sh lists
//! them at the end); under `CI` (set, not empty/`0`/`false`) or
//! `WEFT_REQUIRE_ALL=1` it fails with that message instead, so CI never
//! passes without the integration tests having run.

pub mod bins;
pub mod etcd;
pub mod k8s;
pub mod netns;
pub mod proc;
pub mod proxy;
pub mod vm;
pub mod weftd;

/// Returns from the calling test unless etcd is installed (see
/// [`etcd::require`]; fails under CI).
#[macro_export]
macro_rules! require_etcd {
    () => {
        if !$crate::etcd::require() {
            return;
        }
    };
}

/// A short prefix unique to this test process and `tag`, for names of
/// namespaces and links (interface names must stay under 16 bytes).
pub fn unique(tag: &str) -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    format!("w{}{}{}", tag, std::process::id() % 10_000, n)
}
