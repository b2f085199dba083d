//! weft's test kit for the root integration tests, in tiers:
//!
//! - unit fakes live beside the code they stand in for (the recording
//!   `FakeNetlink`, `tunnel/fake.rs`) and in each crate's own tests
//!   (`control/tests/registry_contract`: one `Registry` contract for every
//!   store; `engine/tests/common`, `cni/tests/common`);
//! - a cluster in network namespaces on this machine's CPU: [`cluster`]
//!   (on the pieces `weft demo` uses), [`netns`], [`weftd`], [`etcd`],
//!   [`proxy`], [`ping`] (one ping-stream parser for every tier);
//! - guests on a stock kernel under software emulation: [`vm`] and
//!   [`vm::net`] (a weft network of guests);
//! - a real Kubernetes cluster: [`k8s`].
//!
//! Shared by every tier: child processes that die with the test ([`proc`]),
//! the paths of the workspace's binaries ([`bins`]).
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
pub mod cluster;
pub mod etcd;
pub mod k8s;
pub mod nat;
pub mod nat_story;
pub mod netns;
pub mod ping;
pub mod proc;
pub mod proxy;
pub mod vm;
pub mod weftd;
pub mod wggo;

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

/// weftd's reconcile period (`RECONCILE_PERIOD` in control/src/daemon/run.rs,
/// no flag changes it): kernel state deleted by hand is restored at the
/// next tick, so within one period plus the restore's own work.
pub const RECONCILE_PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

/// How long after state is deleted by hand a test on this machine's real
/// CPU waits for weftd to restore it: one [`RECONCILE_PERIOD`] and 2 s for
/// the restore itself and a late timer on a loaded machine. Measured on
/// this 2-vCPU machine on 2026-12-03 at load average 6-9: restores 9.0-10.0 s
/// after the delete in 6 runs (tests/kernel_backends.rs: route, neighbour
/// and fdb entry 9.5-9.8 s, flannel.1 10.0 s, a host-gw route 9.8-9.9 s;
/// tests/faults.rs: a TUN or flannel.1 9.0-9.1 s, pings back 9.0 s after),
/// the deletes landing just after a tick. A backend that misses its first
/// tick takes 20 s and fails; a reconcile period of 15 s fails too.
pub const RESTORED_WITHIN: std::time::Duration = std::time::Duration::from_secs(12);
