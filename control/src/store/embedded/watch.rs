//! The embedded store's watch: inotify on the store directory plus a poll.
//!
//! Each wake-up stats the data file; when it is a new generation the file is
//! read, and the live leases are diffed against what the consumer was last
//! told (new or changed lease: `Added`, gone or expired: `Removed`). The first
//! message is a `Snapshot`. A failed read (a corrupt file, an I/O error) is
//! logged and retried with backoff (100 ms .. 5 s); the first good read after
//! it sends a fresh `Snapshot`. The poll runs every `poll_interval` and also at
//! the next lease expiry, so expired leases are reported on time even when no
//! one writes. The task ends when the receiver is dropped.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::sync::Arc;
use std::time::Duration;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use tokio::io::unix::AsyncFd;
use tokio::sync::mpsc;
use tracing::warn;

use super::file::{self, Data, Entry, FileId, Paths};
use super::to_lease;
use crate::lease::{Lease, LeaseEvent, SubnetKey};
use crate::store::StoreError;

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Lets tokio poll the inotify descriptor.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// The last generation read, and which file it came from.
struct Cache {
    id: Option<FileId>,
    data: Data,
}

/// Starts a watch on the store in `paths.dir`. Must run inside a tokio runtime.
pub(super) fn start(
    paths: Arc<Paths>,
    poll: Duration,
) -> Result<mpsc::Receiver<LeaseEvent>, StoreError> {
    file::ensure_dir(&paths)?;
    let other = |what: &str, e: &dyn std::fmt::Display| StoreError::Other(format!("{what}: {e}"));
    let ino = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)
        .map_err(|e| other("inotify_init", &e))?;
    ino.add_watch(
        &paths.dir,
        AddWatchFlags::IN_MOVED_TO
            | AddWatchFlags::IN_MOVED_FROM
            | AddWatchFlags::IN_CLOSE_WRITE
            | AddWatchFlags::IN_CREATE
            | AddWatchFlags::IN_DELETE,
    )
    .map_err(|e| other(&format!("inotify watch on {}", paths.dir.display()), &e))?;
    // `AsyncFd::new` is deprecated because a caller could close the fd while it
    // is registered; here the AsyncFd owns the Inotify that owns the fd, so it
    // stays open until deregistered (and `register` would need `unsafe`).
    #[allow(deprecated)]
    let fd = AsyncFd::new(InotifyFd(ino)).map_err(|e| other("register inotify", &e))?;
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(run(paths, poll, fd, tx));
    Ok(rx)
}

/// Reads the data file unless it is still the generation in `cache`.
fn refresh(paths: &Paths, cache: Option<Cache>) -> Result<Cache, StoreError> {
    let id = file::file_id(paths)?;
    if let Some(c) = cache
        && c.id == id
    {
        return Ok(c);
    }
    let (data, id) = file::read(paths)?;
    Ok(Cache { id, data })
}

/// Decoded leases by key text, kept across reads so that only new or changed
/// entries are decoded again (and a bad entry is logged once, not per poll).
type Decoded = BTreeMap<String, (Entry, Option<Lease>)>;

/// The live leases of `data`, decoding only what `decoded` does not hold.
fn live(data: &Data, now_ms: u64, decoded: &mut Decoded) -> BTreeMap<SubnetKey, Lease> {
    let mut fresh = Decoded::new();
    for (k, e) in &data.leases {
        let lease = match decoded.remove(k) {
            Some((old, lease)) if old == *e => lease,
            _ => to_lease(k, e),
        };
        fresh.insert(k.clone(), (e.clone(), lease));
    }
    *decoded = fresh;
    decoded
        .values()
        .filter(|(e, _)| !e.expired(now_ms))
        .filter_map(|(_, l)| l.clone())
        .map(|l| (l.key(), l))
        .collect()
}

fn diff(old: &BTreeMap<SubnetKey, Lease>, new: &BTreeMap<SubnetKey, Lease>) -> Vec<LeaseEvent> {
    let removed = old
        .iter()
        .filter(|(k, _)| !new.contains_key(k))
        .map(|(_, l)| LeaseEvent::Removed(l.clone()));
    let added = new
        .iter()
        .filter(|(k, l)| old.get(k) != Some(l))
        .map(|(_, l)| LeaseEvent::Added(l.clone()));
    removed.chain(added).collect()
}

async fn run(
    paths: Arc<Paths>,
    poll: Duration,
    fd: AsyncFd<InotifyFd>,
    tx: mpsc::Sender<LeaseEvent>,
) {
    let mut cache: Option<Cache> = None;
    let mut decoded = Decoded::new();
    // What the consumer knows; `None` until a snapshot went out (or after an error).
    let mut sent: Option<BTreeMap<SubnetKey, Lease>> = None;
    let mut backoff = MIN_BACKOFF;
    loop {
        let p = paths.clone();
        let prev = cache.take();
        let res = tokio::task::spawn_blocking(move || refresh(&p, prev))
            .await
            .unwrap_or_else(|e| Err(StoreError::Other(format!("store task failed: {e}"))));
        let wait = match res {
            Ok(c) => {
                let now = file::now_ms();
                let current = live(&c.data, now, &mut decoded);
                let events = match &sent {
                    None => vec![LeaseEvent::Snapshot(current.values().cloned().collect())],
                    Some(old) => diff(old, &current),
                };
                for ev in events {
                    if tx.send(ev).await.is_err() {
                        return;
                    }
                }
                let next_expiry = c
                    .data
                    .leases
                    .values()
                    .filter_map(|e| e.expires_ms)
                    .filter(|&e| e > now)
                    .min();
                sent = Some(current);
                cache = Some(c);
                backoff = MIN_BACKOFF;
                match next_expiry {
                    Some(e) => poll.min(Duration::from_millis(e - now + 1)),
                    None => poll,
                }
            }
            Err(e) => {
                warn!("lease store watch: {e}; retrying in {backoff:?}");
                sent = None;
                let wait = backoff;
                backoff = (backoff * 2).min(MAX_BACKOFF);
                wait
            }
        };
        tokio::select! {
            _ = tx.closed() => return,
            _ = tokio::time::sleep(wait) => {}
            r = fd.readable() => match r {
                Ok(mut guard) => loop {
                    match guard.try_io(|i| i.get_ref().0.read_events().map_err(io::Error::from)) {
                        Ok(Ok(_)) => continue,
                        Ok(Err(e)) => {
                            warn!("lease store watch: reading inotify events: {e}");
                            tokio::time::sleep(wait).await;
                            break;
                        }
                        Err(_would_block) => break,
                    }
                },
                Err(e) => {
                    warn!("lease store watch: inotify: {e}");
                    tokio::time::sleep(wait).await;
                }
            },
        }
    }
}
