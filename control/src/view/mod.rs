//! What weftd shows of itself, published as snapshots: the neutral ground
//! that the backends (which publish), the daemon's main loop (which
//! publishes) and the readers (`weft status`'s socket, `/status`,
//! `/metrics`, `/healthz`, `/readyz`) all use, and that imports none of them.
//!
//! - [`model`]: the status model (`weft status --json`, fixed by a snapshot);
//! - [`devices`]: device reports from an engine or a kernel device;
//! - [`Dataplane`]: which implementation carries a backend's traffic;
//! - [`BackendView`]: what a backend publishes of itself after each step
//!   (name, dataplane, its devices as [`DeviceProbe`]s);
//! - [`DaemonView`]: what the main loop publishes (the own lease, the peer
//!   leases it knows, the dataplane choice, what readiness hangs on);
//! - [`ProbeView`]: what weftd's overlay prober publishes (each probed
//!   peer's reachability, round trip and path MTU), merged into the peers;
//! - [`Publisher`] / [`Observer`]: the two ends.
//!
//! Contract: **observation never waits for work.** A reader takes the
//! latest snapshots (a `tokio::sync::watch` borrow, held only to clone an
//! `Arc` or two) and builds its answer itself: an engine's counters are read
//! lock-free from the engine the backend published ([`devices::EngineProbe`],
//! `weft_engine::Engine::report` sums the per-worker blocks without asking
//! the workers), a kernel device's from sysfs. Nobody waits for the main
//! loop or the backend task, whatever they are doing: a 5,000-peer batch, a
//! dataplane switch or a slow netlink call (firecracker's rule: the API
//! thread is never on the slow path). Nothing is counted per request on the
//! packet path.

pub mod devices;
pub mod model;
pub mod path;

use std::sync::Arc;
use std::time::SystemTime;

use tokio::sync::watch;

pub use model::{
    BackendStatus, Batching, Counters, DeviceStatus, Drops, PeerStatus, ProbeStatus, Status,
    TunnelGsoStatus,
};

/// What weftd's overlay prober publishes: each probed peer's health, by
/// the peer's subnet.
pub type ProbeView = Arc<std::collections::HashMap<ipnet::Ipv4Net, ProbeStatus>>;

use crate::lease::Lease;

/// Which implementation carries a backend's traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dataplane {
    /// The kernel's drivers.
    Kernel,
    /// weft's userspace engine.
    Userspace,
}

impl std::fmt::Display for Dataplane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Dataplane {
    /// "kernel" or "userspace" (status, logs, `--dataplane`).
    pub fn as_str(self) -> &'static str {
        match self {
            Dataplane::Kernel => "kernel",
            Dataplane::Userspace => "userspace",
        }
    }

    /// [`Dataplane::as_str`], "none" for a backend that forwards nothing.
    pub fn name(d: Option<Dataplane>) -> &'static str {
        d.map_or("none", Dataplane::as_str)
    }
}

/// A device whose report a reader makes on demand, without asking its owner:
/// an engine's TUN (counters read from the engine's per-worker blocks), a
/// kernel device (its sysfs statistics). Gone devices report nothing.
pub trait DeviceProbe: Send + Sync + std::fmt::Debug {
    /// Adds the device (and the peers it carries) to `st`.
    fn report(&self, st: &mut BackendStatus);
    /// The endpoint this node was last seen from by endpoint discovery
    /// (docs/nat.md; `None`: off, unknown, or not an engine).
    fn nat_seen(&self) -> Option<std::net::SocketAddrV4> {
        None
    }
}

/// What a backend publishes of itself (after setup and after every step
/// that may change it: a switch, a rebuild).
#[derive(Debug, Clone)]
pub struct BackendView {
    /// The backend's name as logged and shown in status.
    pub name: &'static str,
    /// Which dataplane runs it (`None`: nothing forwards, e.g. `alloc`).
    pub dataplane: Option<Dataplane>,
    /// Its devices.
    pub devices: Vec<Arc<dyn DeviceProbe>>,
}

impl BackendView {
    /// A backend with no devices.
    pub fn new(name: &'static str, dataplane: Option<Dataplane>) -> BackendView {
        BackendView {
            name,
            dataplane,
            devices: Vec::new(),
        }
    }

    /// Adds a device.
    pub fn device(mut self, probe: Arc<dyn DeviceProbe>) -> BackendView {
        self.devices.push(probe);
        self
    }

    /// The backend's status now: each device asked for its report.
    pub fn read(&self) -> BackendStatus {
        let mut st = BackendStatus::new(self.name, self.dataplane);
        for d in &self.devices {
            d.report(&mut st);
        }
        st
    }
}

/// What the daemon's main loop publishes.
#[derive(Debug, Clone, Default)]
pub struct DaemonView {
    /// The node's own lease (`None` until acquired).
    pub lease: Option<Lease>,
    /// Every peer lease the node knows, in subnet order.
    pub peers: Arc<[Arc<Lease>]>,
    /// The dataplane choice in effect or being switched to (`requested` in status).
    pub requested: String,
    /// subnet.env is written (flannel's readiness).
    pub subnet_env: bool,
    /// The backend has applied the latest lease snapshot (after a start, a
    /// watch gap or a rebuild): every peer the store had then is programmed.
    pub synced: bool,
}

impl DaemonView {
    /// Why the node is not ready, if it is not: readiness is real state,
    /// checked at the time of asking (a lease that expired while its
    /// renewals failed makes the node unready without anyone publishing).
    pub fn unready(&self, now: SystemTime) -> Option<&'static str> {
        let Some(lease) = &self.lease else {
            return Some("no lease yet");
        };
        if !self.subnet_env {
            return Some("subnet.env not written yet");
        }
        if lease.expiration.is_some_and(|e| e <= now) {
            return Some("the lease expired (renewals failing)");
        }
        if !self.synced {
            return Some("the dataplane is not programmed for the latest lease snapshot yet");
        }
        None
    }
}

/// The publishing end: the main loop's [`DaemonView`] and the backend task's
/// [`BackendView`].
#[derive(Debug)]
pub struct Publisher {
    daemon: watch::Sender<Option<DaemonView>>,
    backend: watch::Sender<Option<BackendView>>,
    probes: watch::Sender<Option<ProbeView>>,
}

/// The readers' end (cheap to clone; never waits for the publishers).
#[derive(Debug, Clone)]
pub struct Observer {
    daemon: watch::Receiver<Option<DaemonView>>,
    backend: watch::Receiver<Option<BackendView>>,
    probes: watch::Receiver<Option<ProbeView>>,
}

impl Default for Publisher {
    fn default() -> Self {
        Publisher::new()
    }
}

// === impl Publisher ===

impl Publisher {
    /// Nothing published yet.
    pub fn new() -> Publisher {
        Publisher {
            daemon: watch::Sender::new(None),
            backend: watch::Sender::new(None),
            probes: watch::Sender::new(None),
        }
    }

    /// A reader's end.
    pub fn observer(&self) -> Observer {
        Observer {
            daemon: self.daemon.subscribe(),
            backend: self.backend.subscribe(),
            probes: self.probes.subscribe(),
        }
    }

    /// Publishes the daemon's state (`f` edits the latest, or a default).
    pub fn daemon(&self, f: impl FnOnce(&mut DaemonView)) {
        self.daemon
            .send_modify(|v| f(v.get_or_insert_with(DaemonView::default)));
    }

    /// Where the overlay prober publishes its [`ProbeView`].
    pub fn probes(&self) -> ProbePublisher {
        ProbePublisher(self.probes.clone())
    }

    /// Where the backend task publishes its [`BackendView`].
    pub fn backend(&self) -> BackendPublisher {
        BackendPublisher(self.backend.clone())
    }
}

/// The backend task's end of a [`Publisher`].
#[derive(Debug, Clone)]
pub struct BackendPublisher(watch::Sender<Option<BackendView>>);

impl BackendPublisher {
    /// Publishes `view`.
    pub fn publish(&self, view: BackendView) {
        self.0.send_replace(Some(view));
    }
}

/// The prober's end of a [`Publisher`].
#[derive(Debug, Clone)]
pub struct ProbePublisher(watch::Sender<Option<ProbeView>>);

impl ProbePublisher {
    /// Publishes `view`.
    pub fn publish(&self, view: ProbeView) {
        self.0.send_replace(Some(view));
    }
}

// === impl Observer ===

impl Observer {
    /// The latest daemon snapshot (`None` before the first).
    pub fn daemon(&self) -> Option<DaemonView> {
        self.daemon.borrow().clone()
    }

    /// The latest backend snapshot (`None` before the backend is set up).
    pub fn backend(&self) -> Option<BackendView> {
        self.backend.borrow().clone()
    }

    /// The node's status now, from the latest snapshots and the devices'
    /// counters; `None` until the backend is set up.
    pub fn status(&self) -> Option<Status> {
        let backend = self.backend()?;
        let daemon = self.daemon().unwrap_or_default();
        let mut st = backend.read();
        st.requested = daemon.requested.clone();
        let mut status =
            Status::build(daemon.lease.as_ref(), st, daemon.peers.iter().map(|l| &**l));
        if let Some(probes) = self.probes.borrow().clone() {
            for p in &mut status.peers {
                let net = p.subnet.as_deref().and_then(|s| s.parse().ok());
                p.probe = net.and_then(|n| probes.get(&n).cloned());
            }
        }
        Some(status)
    }

    /// Waits until the prober publishes again and returns what it
    /// published (`None`: the publisher is gone).
    pub async fn probes_changed(&mut self) -> Option<ProbeView> {
        self.probes.changed().await.ok()?;
        self.probes.borrow_and_update().clone()
    }

    /// Why the node is not ready (`/readyz`), if it is not.
    pub fn unready(&self) -> Option<&'static str> {
        match self.daemon.borrow().as_ref() {
            Some(d) => d.unready(SystemTime::now()),
            None => Some("starting"),
        }
    }
}

#[cfg(test)]
mod tests;
