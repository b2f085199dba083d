//! Lease stores: where leases and the network config live.
//!
//! Every store implements [`Registry`], a small key-value view shaped after
//! flannel's etcd registry (pkg/subnet/etcd/registry.go). Subnet allocation,
//! renewal and the daemon sit on top of it and do not know which store runs.
//!
//! - [`embedded`]: the default; a locked, checksummed file shared by every
//!   weftd on one host (e.g. one per network namespace in `weft demo`).
//! - [`etcd`]: etcd v3 with flannel's exact keys and values.
//!
//! A store's watch never ends while the store lives: on a lost connection,
//! compaction or a corrupt read it retries with backoff and then sends a new
//! [`LeaseEvent::Snapshot`], so consumers only ever rebuild from snapshots.

pub mod embedded;
pub mod etcd;

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;

use crate::lease::{Lease, LeaseAttrs, LeaseEvent, SubnetKey};

/// flannel's lease TTL (`subnetTTL`, 24 h).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(86_400);

/// Errors from a lease store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A create-if-absent found the key taken (another node won the race).
    #[error("subnet already exists")]
    AlreadyExists,
    /// The key does not exist.
    #[error("key not found")]
    NotFound,
    /// The store cannot be reached right now; retrying may succeed.
    #[error("lease store unavailable: {0}")]
    Unavailable(String),
    /// The store's data is damaged; refusing to guess (no silent data loss).
    #[error("lease store is corrupt: {0}")]
    Corrupt(String),
    /// Any other failure (bad TLS files, permissions, ...).
    #[error("lease store error: {0}")]
    Other(String),
}

impl StoreError {
    /// Whether a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StoreError::Unavailable(_))
    }
}

/// Which store a running weftd uses, as its status socket tells `weft
/// leases` (`{"op":"store"}`): everything needed to reach the same store
/// except secrets (whether a password is needed is said, not the password).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StoreInfo {
    /// `embedded`, `etcd` or `kube`.
    pub kind: String,
    /// The embedded store's directory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_path: Option<std::path::PathBuf>,
    /// The embedded store: weftd's `--net-config-path` (read before the
    /// store's own config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub net_config_path: Option<std::path::PathBuf>,
    /// etcd: `--etcd-endpoints`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_endpoints: Option<String>,
    /// etcd: `--etcd-prefix`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_prefix: Option<String>,
    /// etcd: `--etcd-keyfile` (a path; the key is not read here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_keyfile: Option<String>,
    /// etcd: `--etcd-certfile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_certfile: Option<String>,
    /// etcd: `--etcd-cafile`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_cafile: Option<String>,
    /// etcd: `--etcd-username`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_username: Option<String>,
    /// etcd: whether `--etcd-password` is set (never the password).
    #[serde(default)]
    pub etcd_password_set: bool,
}

/// A lease store. Implementations are cheap to clone handles onto one store.
///
/// Malformed entries (bad keys, undecodable values) are logged and skipped by
/// `list_leases` and the watch; they never fail the whole call.
pub trait Registry: Send + Sync + 'static {
    /// The raw network config text (`<prefix>/config`), if the store has one.
    fn get_network_config(&self)
    -> impl Future<Output = Result<Option<String>, StoreError>> + Send;

    /// Writes the network config (used by tests, the demo and `weft`).
    fn put_network_config(&self, text: &str)
    -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Every current lease.
    fn list_leases(&self) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send;

    /// Every current lease's key and attributes, as cheaply as the store can
    /// list them: `expiration` may be left `None` (the etcd store saves one
    /// TimeToLive RPC per lease, which made listing 5,000 leases take most of
    /// a second). Subnet allocation and the peer table need no more; whoever
    /// needs one lease's expiry asks [`Registry::get_lease`].
    fn list_subnets(&self) -> impl Future<Output = Result<Vec<Lease>, StoreError>> + Send {
        self.list_leases()
    }

    /// One lease, if it exists.
    fn get_lease(
        &self,
        key: &SubnetKey,
    ) -> impl Future<Output = Result<Option<Lease>, StoreError>> + Send;

    /// Creates the lease only if the key is free ([`StoreError::AlreadyExists`]
    /// otherwise). `ttl: None` makes a reservation that never expires.
    /// Returns the expiration.
    fn create_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<Option<SystemTime>, StoreError>> + Send;

    /// Creates or overwrites the lease (renewal, reuse). Returns the expiration.
    fn update_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
    ) -> impl Future<Output = Result<Option<SystemTime>, StoreError>> + Send;

    /// Deletes the lease; deleting a missing lease succeeds.
    fn delete_lease(&self, key: &SubnetKey) -> impl Future<Output = Result<(), StoreError>> + Send;

    /// Watches every lease: first a [`LeaseEvent::Snapshot`], then changes; a
    /// new snapshot after any gap. Ends only when the receiver is dropped.
    fn watch_leases(
        &self,
    ) -> impl Future<Output = Result<mpsc::Receiver<LeaseEvent>, StoreError>> + Send;
}
