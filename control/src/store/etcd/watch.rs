//! The etcd store's watch, shaped after flannel's `WatchLeases`.
//!
//! A cycle lists `<prefix>/subnets/` (revision R), sends the listing as a
//! `Snapshot`, then watches the prefix from R+1 (the client sets
//! require-leader on every request). Put events become `Added` (with the
//! lease's TTL looked up), Delete events `Removed` (subnet from the key only).
//! Compaction, cancellation, a stream error or end, or a lost connection end
//! the cycle; after a backoff (100 ms doubling to 5 s, reset once events flow)
//! the next cycle re-lists and sends a new `Snapshot`. The task ends only when
//! the receiver is dropped.

use std::time::Duration;

use etcd_client::{EventType, WatchOptions};
use tokio::sync::mpsc;
use tracing::{info, warn};

use super::{EtcdStore, call};
use crate::lease::{Lease, LeaseAttrs, LeaseEvent};

const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Starts a watch; with `since`, the first cycle skips the listing and
/// watches from revision `since + 1` (a snapshot follows only after a gap).
pub(super) fn start(store: EtcdStore, since: Option<i64>) -> mpsc::Receiver<LeaseEvent> {
    let (tx, rx) = mpsc::channel(64);
    tokio::spawn(run(store, since, tx));
    rx
}

/// Why a watch cycle ended.
enum End {
    /// The receiver is gone: stop.
    Closed,
    /// Start over after a backoff; `progressed` when events were delivered.
    Retry { progressed: bool },
}

async fn run(store: EtcdStore, mut since: Option<i64>, tx: mpsc::Sender<LeaseEvent>) {
    let mut backoff = MIN_BACKOFF;
    loop {
        match cycle(&store, since.take(), &tx).await {
            End::Closed => return,
            End::Retry { progressed } => {
                if progressed {
                    backoff = MIN_BACKOFF;
                }
                tokio::select! {
                    _ = tx.closed() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// One snapshot-then-watch cycle (no snapshot when resuming at `since`).
async fn cycle(store: &EtcdStore, since: Option<i64>, tx: &mpsc::Sender<LeaseEvent>) -> End {
    let rev = match since {
        Some(rev) => rev,
        // The peer table needs no expirations: skip the TimeToLive per lease.
        None => match store.list_at(false).await {
            Ok((leases, rev)) => {
                if tx.send(LeaseEvent::Snapshot(leases)).await.is_err() {
                    return End::Closed;
                }
                rev
            }
            Err(e) => {
                warn!("etcd lease watch: listing failed: {e}; retrying");
                return End::Retry { progressed: false };
            }
        },
    };
    let opts = WatchOptions::new()
        .with_prefix()
        .with_start_revision(rev + 1);
    let mut client = store.client.clone();
    let mut stream = match call("watch", client.watch(store.subnets_prefix(), Some(opts))).await {
        Ok(s) => s,
        Err(e) => {
            warn!("etcd lease watch: {e}; retrying");
            return End::Retry { progressed: true };
        }
    };
    loop {
        let msg = tokio::select! {
            _ = tx.closed() => return End::Closed,
            m = stream.message() => m,
        };
        let resp = match msg {
            Ok(Some(r)) => r,
            Ok(None) => {
                warn!("etcd lease watch: stream ended; re-listing");
                return End::Retry { progressed: true };
            }
            Err(e) => {
                warn!("etcd lease watch: {e}; re-listing");
                return End::Retry { progressed: true };
            }
        };
        if resp.compact_revision() != 0 {
            info!(
                compact_revision = resp.compact_revision(),
                "etcd lease watch: history compacted; re-listing"
            );
            return End::Retry { progressed: true };
        }
        if resp.canceled() {
            warn!(
                reason = resp.cancel_reason(),
                "etcd lease watch: canceled by the server; re-listing"
            );
            return End::Retry { progressed: true };
        }
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            let event = match ev.event_type() {
                EventType::Put => {
                    let exp = match store.expiration(kv.lease()).await {
                        Ok(e) => e,
                        Err(e) => {
                            warn!("etcd lease watch: {e}; re-listing");
                            return End::Retry { progressed: true };
                        }
                    };
                    store.decode(kv, exp).map(LeaseEvent::Added)
                }
                EventType::Delete => store.parse_key(kv.key()).map(|k| {
                    LeaseEvent::Removed(Lease {
                        subnet: k.v4,
                        ipv6_subnet: k.v6,
                        attrs: LeaseAttrs::default(),
                        expiration: None,
                    })
                }),
            };
            if let Some(event) = event
                && tx.send(event).await.is_err()
            {
                return End::Closed;
            }
        }
    }
}
