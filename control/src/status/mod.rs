//! `weft status`: what a running weftd reports about itself: its lease, its
//! backend and dataplane (kernel or userspace, which offloads), its devices'
//! counters and every peer with its counters.
//!
//! - [`model`]: the JSON shape (fixed by a snapshot, see its docs);
//! - [`devices`]: device reports from an engine or a kernel device;
//! - [`server`]: the root-only unix socket (`weft-status.sock` next to
//!   `--subnet-file`) and its client;
//! - [`render`]: the human-readable form;
//! - [`shape`]: the snapshot of the JSON shape and its checker.
//!
//! Contract: the dataplane pays nothing for this. weftd's main loop owns the
//! backend; a reader (the socket, `/metrics`) sends a [`Request`] through
//! [`Handle`], and the main loop answers it between lease events by reading
//! the engine's per-worker counters once ([`Source::next`]). Workers are never
//! asked anything and nothing is counted per request on the hot path.

pub mod devices;
pub mod model;
pub mod render;
pub mod server;
pub mod shape;

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

pub use model::{BackendStatus, Counters, DeviceStatus, PeerStatus, Status};

use crate::metrics::DaemonMetrics;

/// How long a reader waits for the main loop (it may be applying a peer).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(3);
/// Requests queued for the main loop before readers wait.
const QUEUE: usize = 16;

/// A request for a [`Status`], answered by weftd's main loop.
pub type Request = oneshot::Sender<Status>;

/// The main loop's end: the request queue and the daemon's metrics.
#[derive(Debug)]
pub struct Source {
    rx: mpsc::Receiver<Request>,
    handle: Handle,
}

/// The readers' end (cheap to clone).
#[derive(Debug, Clone)]
pub struct Handle {
    tx: mpsc::Sender<Request>,
    metrics: Arc<DaemonMetrics>,
}

impl Default for Source {
    fn default() -> Self {
        Source::new()
    }
}

// === impl Source ===

impl Source {
    /// A new queue with fresh daemon metrics.
    pub fn new() -> Source {
        let (tx, rx) = mpsc::channel(QUEUE);
        Source {
            rx,
            handle: Handle {
                tx,
                metrics: Arc::new(DaemonMetrics::new()),
            },
        }
    }

    /// A handle for readers.
    pub fn handle(&self) -> Handle {
        self.handle.clone()
    }

    /// The daemon's metrics (updated by the main loop).
    pub fn metrics(&self) -> &DaemonMetrics {
        &self.handle.metrics
    }

    /// The next request (pending forever once every reader is gone, so it
    /// can sit in a `select!`).
    pub async fn next(&mut self) -> Request {
        match self.rx.recv().await {
            Some(r) => r,
            None => std::future::pending().await,
        }
    }
}

// === impl Handle ===

impl Handle {
    /// Asks the main loop for a status; `None` when it does not answer
    /// within [`ANSWER_TIMEOUT`] (not started yet, or stopped).
    pub async fn status(&self) -> Option<Status> {
        let (tx, rx) = oneshot::channel();
        tokio::time::timeout(ANSWER_TIMEOUT, async {
            self.tx.send(tx).await.ok()?;
            rx.await.ok()
        })
        .await
        .ok()
        .flatten()
    }

    /// The daemon's metrics.
    pub fn metrics(&self) -> &DaemonMetrics {
        &self.metrics
    }

    /// The Prometheus text exposition: the daemon's metrics and, when the
    /// main loop answers, the dataplane's.
    pub async fn prometheus(&self) -> String {
        let status = self.status().await;
        self.metrics.encode(status.as_ref())
    }
}

#[cfg(test)]
pub(crate) mod tests;
