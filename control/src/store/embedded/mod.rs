//! The embedded lease store: no server, one directory on the host's filesystem.
//!
//! Several weftd processes on one host (for example one per network namespace
//! in the demo) share a store by pointing at the same directory
//! ([`DEFAULT_DIR`] by default). The format and the locking protocol are in
//! [`file`]; in short, writes are serialised by an exclusive `flock`, every
//! generation is published by an atomic rename with a checksummed header, and
//! the previous generation is kept as `leases.db.prev`.
//!
//! Contracts:
//! - `create_lease` is create-if-absent across threads and processes: of
//!   several concurrent creators of one key exactly one wins, the others get
//!   [`StoreError::AlreadyExists`]. An expired lease counts as absent.
//! - Expiry is wall-clock time (`SystemTime`), shared by every process on the
//!   host. Expired leases are hidden from readers at once and removed from the
//!   file by the next writer; watchers report them as `Removed`.
//! - A damaged or truncated data file is [`StoreError::Corrupt`] naming the file
//!   and its backup: never read as empty, never overwritten by a writer.
//! - The watch uses inotify on the directory plus a slow poll (which also
//!   catches expiry); see [`watch`].
//! - Every call does blocking file I/O on tokio's blocking pool.

pub mod file;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tracing::warn;

use self::file::{Data, Entry, Paths};
use super::{Registry, StoreError};
use crate::lease::{Lease, LeaseAttrs, LeaseEvent, SubnetKey};

/// Where weftd keeps the embedded store unless told otherwise.
pub const DEFAULT_DIR: &str = "/var/lib/weft/store";

/// How often a watch re-checks the store when inotify reports nothing.
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// A handle on an embedded store directory. Cheap to clone; handles on the
/// same directory (in this or other processes) see each other's writes.
#[derive(Debug, Clone)]
pub struct EmbeddedStore {
    paths: Arc<Paths>,
    poll_interval: Duration,
}

impl EmbeddedStore {
    /// Opens (creating the directory if needed) the store in `dir` and checks
    /// that its data file is readable: a damaged file fails here with
    /// [`StoreError::Corrupt`].
    pub async fn open(dir: impl Into<PathBuf>) -> Result<EmbeddedStore, StoreError> {
        let store = EmbeddedStore {
            paths: Arc::new(Paths::new(dir.into())),
            poll_interval: DEFAULT_POLL_INTERVAL,
        };
        store
            .blocking(|p| {
                file::ensure_dir(p)?;
                file::read(p).map(|_| ())
            })
            .await?;
        Ok(store)
    }

    /// Opens the store in `dir` only if one is there (its data file exists):
    /// what `weft leases` does, so that a mistyped path never creates a store.
    pub async fn open_existing(dir: impl Into<PathBuf>) -> Result<EmbeddedStore, StoreError> {
        let dir = dir.into();
        let data = dir.join(file::DATA_FILE);
        if !data.is_file() {
            return Err(StoreError::NotFound);
        }
        EmbeddedStore::open(dir).await
    }

    /// Sets how often a watch polls besides inotify (default
    /// [`DEFAULT_POLL_INTERVAL`]); expiry is also noticed at the exact time.
    pub fn with_poll_interval(mut self, interval: Duration) -> EmbeddedStore {
        self.poll_interval = interval.max(Duration::from_millis(10));
        self
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.paths.dir
    }

    /// The data file (`<dir>/leases.db`).
    pub fn data_file(&self) -> &Path {
        &self.paths.data
    }

    /// The backup of the previous generation (`<dir>/leases.db.prev`).
    pub fn backup_file(&self) -> &Path {
        &self.paths.prev
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Paths) -> Result<T, StoreError> + Send + 'static,
    ) -> Result<T, StoreError> {
        let paths = self.paths.clone();
        tokio::task::spawn_blocking(move || f(&paths))
            .await
            .map_err(|e| StoreError::Other(format!("store task failed: {e}")))?
    }

    async fn write_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
        only_if_absent: bool,
    ) -> Result<Option<SystemTime>, StoreError> {
        let key = key.to_string();
        let attrs = attrs.to_json();
        self.blocking(move |p| {
            file::modify(p, |data, now| {
                if only_if_absent && data.leases.contains_key(&key) {
                    return Err(StoreError::AlreadyExists);
                }
                let expires_ms = ttl
                    .map(|t| now.saturating_add(u64::try_from(t.as_millis()).unwrap_or(u64::MAX)));
                let entry = Entry { attrs, expires_ms };
                let expiration = entry.expiration();
                data.leases.insert(key, entry);
                Ok((expiration, true))
            })
        })
        .await
    }
}

/// Decodes the live leases of a generation, skipping (and logging) bad ones.
fn live_leases(data: &Data, now_ms: u64) -> Vec<Lease> {
    data.leases
        .iter()
        .filter(|(_, e)| !e.expired(now_ms))
        .filter_map(|(k, e)| to_lease(k, e))
        .collect()
}

fn to_lease(key: &str, e: &Entry) -> Option<Lease> {
    let k: SubnetKey = match key.parse() {
        Ok(k) => k,
        Err(err) => {
            warn!(key, "skipping lease with a bad key: {err}");
            return None;
        }
    };
    match LeaseAttrs::from_json(e.attrs.as_bytes()) {
        Ok(attrs) => Some(Lease {
            subnet: k.v4,
            ipv6_subnet: k.v6,
            attrs,
            expiration: e.expiration(),
        }),
        Err(err) => {
            warn!(key, "skipping lease with a bad value: {err}");
            None
        }
    }
}

impl Registry for EmbeddedStore {
    async fn get_network_config(&self) -> Result<Option<String>, StoreError> {
        self.blocking(|p| file::read(p).map(|(d, _)| d.config))
            .await
    }

    async fn put_network_config(&self, text: &str) -> Result<(), StoreError> {
        let text = text.to_string();
        self.blocking(move |p| {
            file::modify(p, |data, _| {
                let changed = data.config.as_deref() != Some(text.as_str());
                data.config = Some(text);
                Ok(((), changed))
            })
        })
        .await
    }

    async fn list_leases(&self) -> Result<Vec<Lease>, StoreError> {
        self.blocking(|p| file::read(p).map(|(d, _)| live_leases(&d, file::now_ms())))
            .await
    }

    async fn get_lease(&self, key: &SubnetKey) -> Result<Option<Lease>, StoreError> {
        let key = key.to_string();
        self.blocking(move |p| {
            let (d, _) = file::read(p)?;
            Ok(d.leases
                .get(&key)
                .filter(|e| !e.expired(file::now_ms()))
                .and_then(|e| to_lease(&key, e)))
        })
        .await
    }

    async fn create_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.write_lease(key, attrs, ttl, true).await
    }

    async fn update_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.write_lease(key, attrs, ttl, false).await
    }

    async fn delete_lease(&self, key: &SubnetKey) -> Result<(), StoreError> {
        let key = key.to_string();
        self.blocking(move |p| {
            file::modify(p, |data, _| Ok(((), data.leases.remove(&key).is_some())))
        })
        .await
    }

    async fn watch_leases(&self) -> Result<mpsc::Receiver<LeaseEvent>, StoreError> {
        watch::start(self.paths.clone(), self.poll_interval)
    }
}
