//! [`Dual`]: one backend type with a kernel and/or a userspace
//! implementation, the choice between them (`--dataplane`), capability
//! probing, and live switching.
//!
//! - At start ([`Backend::lease_attrs`]) the path is resolved: `kernel` needs
//!   a kernel implementation and the kernel capability ([`probe`]); `userspace`
//!   needs weft's engine implementation; `auto` takes the kernel when it can,
//!   else the userspace engine with the same wire format. The choice and the
//!   reason are logged, and [`Observe::dataplane`] reports it.
//! - [`Switch::switch_dataplane`] moves the running node to the other path
//!   **without changing its lease**: the new implementation must publish
//!   byte-identical attributes (it is given the current lease as its previous
//!   one, so it keeps e.g. the VTEP MAC), else the switch is refused and the
//!   old path keeps running. The old path is removed completely, the new one
//!   is set up and every known peer is applied again. Both vxlan paths use
//!   the same UDP port and device name, so this is break-before-make; the
//!   gap is one engine stop (≤ 100 ms) plus a few netlink round trips per
//!   peer, and is logged. A failed setup rolls back to the old path.
//! - Before that, the old path may ask for time ([`Implementation::handover_at`]):
//!   peers that got handshake initiations from weft's userspace WireGuard
//!   refuse the kernel's for 27 s after the last one (boringtun's TAI64N
//!   timestamps run 27 s ahead of the kernel's, and a peer only accepts
//!   newer ones), so a userspace → kernel switch keeps the engine running
//!   until then instead of cutting the node off for up to that long. The
//!   switch is then *pending* ([`Switch::switch_pending`]): the call returns
//!   at once with the old path still running, the daemon's main loop goes on
//!   applying lease events, answering status and handling signals, and calls
//!   [`Switch::switch_dataplane`] again when it is due (at the handover
//!   time, at most [`MAX_HANDOVER_WAIT`] after the request). Peers added
//!   meanwhile are in the new path's replay. Asking for the running path
//!   cancels a pending switch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use async_trait::async_trait;

use super::probe::{self, Capability};
use super::{
    ApplyError, Backend, BackendError, Batch, Dataplane, DataplaneChoice, Observe, Switch,
};
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::netlink::{Client, LinkKind, XfrmClient};

/// What [`Dual`] needs of each implementation beyond [`Backend`]: to be
/// removed completely, and to say when another may take over its peers.
#[async_trait]
pub trait Implementation: Backend {
    /// Removes everything `setup` and `apply` made, including what
    /// `teardown` leaves for a restart (kernel devices, routes): the node
    /// moves to the other implementation. Best effort.
    async fn remove_all(&mut self) {
        self.teardown().await;
    }

    /// When another implementation of this backend can take over this one's
    /// peers without the peers refusing it; `None` (the default) or a past
    /// time: at once. [`Dual`] keeps this implementation running until then
    /// when it switches away from it. The userspace WireGuard engine's peers
    /// hold its handshake timestamps, which run 27 s ahead of the kernel's
    /// ([`weft_engine::wg::BORINGTUN_TAI64_AHEAD`]).
    fn handover_at(&self) -> Option<SystemTime> {
        None
    }
}

/// Makes a fresh, not yet set up, implementation.
pub type Make = Box<dyn Fn() -> Box<dyn Implementation> + Send + Sync>;

/// See the module docs.
pub struct Dual {
    core: Core,
    active: Option<(Dataplane, Box<dyn Implementation>)>,
    pending: Option<Pending>,
}

/// A switch waiting for the old path's [`Implementation::handover_at`].
struct Pending {
    path: Dataplane,
    why: String,
    /// The prepared (not set up) implementation.
    next: Box<dyn Implementation>,
    /// [`MAX_HANDOVER_WAIT`] after the request.
    latest: SystemTime,
}

/// Everything but the running implementation (kept `Sync` so that it can be
/// borrowed across awaits while the implementation is borrowed mutably).
struct Core {
    name: &'static str,
    choice: DataplaneChoice,
    /// The kernel implementation and the capability it needs (`None`: always there).
    kernel: Option<(Option<Capability>, Make)>,
    userspace: Option<Make>,
    /// Kernel links of these names are removed before the userspace path
    /// starts (a kernel device left by an earlier run would take the TUN's name).
    kernel_links: Vec<String>,
    nl: Arc<dyn Client>,
    xfrm: Arc<dyn XfrmClient>,
    ext: Option<ExternalInterface>,
    attrs: Option<LeaseAttrs>,
    lease: Option<Lease>,
    mtu: Option<u32>,
    peers: BTreeMap<SubnetKey, Lease>,
}

impl std::fmt::Debug for Dual {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dual")
            .field("name", &self.core.name)
            .field("choice", &self.core.choice)
            .field("active", &self.active.as_ref().map(|a| a.0))
            .field("peers", &self.core.peers.len())
            .finish_non_exhaustive()
    }
}

impl Dual {
    /// A backend named `name` run as `choice` says.
    pub fn new(
        name: &'static str,
        choice: DataplaneChoice,
        nl: Arc<dyn Client>,
        xfrm: Arc<dyn XfrmClient>,
    ) -> Dual {
        let core = Core {
            name,
            choice,
            kernel: None,
            userspace: None,
            kernel_links: Vec::new(),
            nl,
            xfrm,
            ext: None,
            attrs: None,
            lease: None,
            mtu: None,
            peers: BTreeMap::new(),
        };
        Dual {
            core,
            active: None,
            pending: None,
        }
    }

    /// Adds the kernel implementation, which needs `cap` (`None`: nothing to probe).
    pub fn kernel(mut self, cap: Option<Capability>, make: Make) -> Dual {
        self.core.kernel = Some((cap, make));
        self
    }

    /// Adds the userspace implementation.
    pub fn userspace(mut self, make: Make) -> Dual {
        self.core.userspace = Some(make);
        self
    }

    /// Names kernel links the userspace path must remove first.
    pub fn kernel_links(mut self, names: Vec<String>) -> Dual {
        self.core.kernel_links = names;
        self
    }

    /// Which path `choice` gives on this kernel, and why.
    pub async fn resolve(
        &self,
        choice: DataplaneChoice,
    ) -> Result<(Dataplane, String), BackendError> {
        self.core.resolve(choice).await
    }
}

impl Core {
    async fn resolve(&self, choice: DataplaneChoice) -> Result<(Dataplane, String), BackendError> {
        let name = self.name;
        let kernel_ok = match &self.kernel {
            None => None,
            Some((None, _)) => Some(Ok(())),
            Some((Some(cap), _)) => Some(
                match probe::kernel_has(*cap, &*self.nl, &*self.xfrm).await? {
                    true => Ok(()),
                    false => Err(cap.module()),
                },
            ),
        };
        match choice {
            DataplaneChoice::Kernel => match kernel_ok {
                None => Err(BackendError::Unsupported(format!(
                    "{name} with --dataplane=kernel (it has no kernel dataplane)"
                ))),
                Some(Err(m)) => Err(BackendError::Config(format!(
                    "--dataplane=kernel: this kernel cannot run the {name} backend: no {m} support"
                ))),
                Some(Ok(())) => Ok((Dataplane::Kernel, "--dataplane=kernel".into())),
            },
            DataplaneChoice::Userspace => match self.userspace {
                Some(_) => Ok((Dataplane::Userspace, "--dataplane=userspace".into())),
                None => Err(BackendError::Unsupported(format!(
                    "{name} with --dataplane=userspace (weft has no userspace {name} engine)"
                ))),
            },
            DataplaneChoice::Auto => match (kernel_ok, &self.userspace) {
                (Some(Ok(())), _) => Ok((Dataplane::Kernel, "auto: the kernel supports it".into())),
                (Some(Err(m)), Some(_)) => Ok((
                    Dataplane::Userspace,
                    format!("auto: the kernel has no {m} support; same wire format in userspace"),
                )),
                (None, Some(_)) => Ok((Dataplane::Userspace, "auto: userspace only".into())),
                (Some(Err(m)), None) => Err(BackendError::Config(format!(
                    "this kernel cannot run the {name} backend (no {m} support) and weft has no userspace {name} engine yet"
                ))),
                (None, None) => Err(BackendError::Unsupported(format!(
                    "{name} (weft implements neither its kernel nor its userspace dataplane yet)"
                ))),
            },
        }
    }

    fn make(&self, path: Dataplane) -> Option<Box<dyn Implementation>> {
        match path {
            Dataplane::Kernel => self.kernel.as_ref().map(|(_, m)| m()),
            Dataplane::Userspace => self.userspace.as_ref().map(|m| m()),
        }
    }

    /// Removes kernel links that would clash with the userspace devices.
    async fn clear_kernel_links(&self) {
        for name in &self.kernel_links {
            match self.nl.link_detail(name).await {
                Ok(Some(d)) if d.kind != LinkKind::Tun => {
                    tracing::info!("removing kernel device {name} left by the kernel dataplane");
                    if let Err(e) = self.nl.delete_link(d.link.index).await {
                        tracing::warn!("failed to remove {name}: {e}");
                    }
                }
                Ok(_) => {}
                Err(e) => tracing::warn!("{e}"),
            }
        }
    }

    /// A fresh `path` implementation that publishes exactly the current
    /// lease attributes (given the current lease as its previous one).
    async fn prepare(&self, path: Dataplane) -> Result<Box<dyn Implementation>, BackendError> {
        let (Some(ext), Some(lease)) = (&self.ext, &self.lease) else {
            return Err(BackendError::Config("switching before setup".into()));
        };
        let mut b = self
            .make(path)
            .ok_or_else(|| BackendError::Unsupported(format!("{} {}", self.name, path.as_str())))?;
        let attrs = b.lease_attrs(ext, Some(lease)).await?;
        if Some(&attrs) != self.attrs.as_ref() {
            return Err(BackendError::Config(format!(
                "the {} dataplane would publish different lease attributes ({}); not switching",
                path.as_str(),
                attrs.to_json()
            )));
        }
        Ok(b)
    }

    /// Sets `b` (a [`Dual::prepare`]d `path`) up for the current lease and
    /// applies every known peer.
    async fn start(
        &self,
        mut b: Box<dyn Implementation>,
        path: Dataplane,
        deadline: Instant,
    ) -> Result<Box<dyn Implementation>, BackendError> {
        let lease = self
            .lease
            .clone()
            .ok_or_else(|| BackendError::Config("switching before setup".into()))?;
        if path == Dataplane::Userspace {
            self.clear_kernel_links().await;
        }
        // The old path's UDP socket may take a moment to go; retry briefly.
        let mtu = loop {
            match b.setup(&lease).await {
                Ok(m) => break m,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("setup of the {} path failed ({e}); retrying", path.as_str());
                    b.remove_all().await;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => {
                    b.remove_all().await;
                    return Err(e);
                }
            }
        };
        if Some(mtu) != self.mtu {
            tracing::warn!(
                "the {} path has MTU {mtu}, subnet.env says {:?}",
                path.as_str(),
                self.mtu
            );
        }
        let all: Vec<Change> = self.peers.values().cloned().map(Change::Add).collect();
        if let Err(e) = b.apply(Batch::of(&all)).await {
            for (c, e) in e.failures(&all) {
                tracing::error!("failed to apply {} after switching: {e}", c.lease().key());
            }
        }
        Ok(b)
    }
}

impl Observe for Dual {
    fn name(&self) -> &'static str {
        self.core.name
    }

    fn dataplane(&self) -> Option<Dataplane> {
        self.active.as_ref().map(|(p, _)| *p)
    }

    fn view(&self) -> crate::view::BackendView {
        match &self.active {
            Some((_, b)) => crate::view::BackendView {
                name: self.core.name,
                ..b.view()
            },
            None => crate::view::BackendView::new(self.core.name, None),
        }
    }
}

#[async_trait]
impl Backend for Dual {
    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError> {
        let (path, why) = self.core.resolve(self.core.choice).await?;
        tracing::info!(
            "dataplane: the {} backend runs in the {} ({why})",
            self.core.name,
            path.as_str()
        );
        let mut b = self
            .core
            .make(path)
            .ok_or_else(|| BackendError::Unsupported(self.core.name.into()))?;
        let attrs = b.lease_attrs(ext, prev).await?;
        self.core.ext = Some(ext.clone());
        self.core.attrs = Some(attrs.clone());
        self.active = Some((path, b));
        Ok(attrs)
    }

    async fn setup(&mut self, lease: &Lease) -> Result<u32, BackendError> {
        if self
            .active
            .as_ref()
            .is_some_and(|(p, _)| *p == Dataplane::Userspace)
        {
            self.core.clear_kernel_links().await;
        }
        let (_, b) = self
            .active
            .as_mut()
            .ok_or_else(|| BackendError::Config("setup before lease_attrs".into()))?;
        let mtu = b.setup(lease).await?;
        self.core.lease = Some(lease.clone());
        self.core.mtu = Some(mtu);
        Ok(mtu)
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        for change in batch.changes {
            match change {
                Change::Add(l) => self.core.peers.insert(l.key(), l.clone()),
                Change::Remove(l) => self.core.peers.remove(&l.key()),
            };
        }
        match self.active.as_mut() {
            Some((_, b)) => b.apply(batch).await,
            None => Ok(()),
        }
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        match self.active.as_mut() {
            Some((_, b)) => b.reconcile().await,
            None => Ok(()),
        }
    }

    async fn teardown(&mut self) {
        self.pending = None;
        if let Some((_, b)) = self.active.as_mut() {
            b.teardown().await;
        }
    }
}

impl Dual {
    /// The running implementation's [`Implementation::handover_at`].
    fn handover_at(&self) -> Option<SystemTime> {
        self.active.as_ref().and_then(|(_, b)| b.handover_at())
    }
}

#[async_trait]
impl Switch for Dual {
    async fn can_run(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        self.core.resolve(to).await.map(|(path, _)| path)
    }

    fn switch_pending(&self) -> Option<SystemTime> {
        let p = self.pending.as_ref()?;
        Some(self.handover_at().map_or(p.latest, |at| at.min(p.latest)))
    }

    async fn switch_dataplane(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        let (path, why) = self.core.resolve(to).await?;
        let Some(cur) = self.active.as_ref().map(|(p, _)| *p) else {
            return Err(BackendError::Config("switching before setup".into()));
        };
        if path == cur {
            if let Some(p) = self.pending.take() {
                tracing::info!(
                    "dataplane: the pending switch to the {} is cancelled",
                    p.path.as_str()
                );
            }
            tracing::info!(
                "dataplane: the {} backend already runs in the {}",
                self.core.name,
                path.as_str()
            );
            return Ok(path);
        }
        let (next, why) = match self.pending.take() {
            Some(p) if p.path == path => {
                if let Some(left) = handover_left(self.handover_at(), p.latest) {
                    tracing::debug!(
                        "dataplane: switch still pending for {} ms",
                        left.as_millis()
                    );
                    self.pending = Some(p);
                    return Ok(cur);
                }
                if self.handover_at().is_some_and(|at| at > SystemTime::now()) {
                    tracing::warn!(
                        "dataplane: the {} path takes over after waiting {} s; some peers may                          refuse its handshakes for a while",
                        path.as_str(),
                        MAX_HANDOVER_WAIT.as_secs()
                    );
                }
                (p.next, p.why)
            }
            _ => {
                // Refused here, before anything is touched, if the lease would change.
                let next = self.core.prepare(path).await?;
                let latest = SystemTime::now() + MAX_HANDOVER_WAIT;
                if let Some(left) = handover_left(self.handover_at(), latest) {
                    tracing::info!(
                        "dataplane: the {} path of the {} backend takes over in {} ms, until then \
                         the {} path carries the traffic: the peers hold handshake timestamps from \
                         weft's userspace WireGuard (boringtun's run 27 s ahead of the kernel's) \
                         and would refuse the kernel's handshakes until then",
                        path.as_str(),
                        self.core.name,
                        left.as_millis(),
                        cur.as_str()
                    );
                    self.pending = Some(Pending {
                        path,
                        why,
                        next,
                        latest,
                    });
                    return Ok(cur);
                }
                (next, why)
            }
        };
        let t0 = Instant::now();
        tracing::info!(
            "dataplane: switching the {} backend from {} to {} ({why})",
            self.core.name,
            cur.as_str(),
            path.as_str()
        );
        if let Some((_, mut old)) = self.active.take() {
            old.remove_all().await;
        }
        match self
            .core
            .start(next, path, t0 + Duration::from_secs(2))
            .await
        {
            Ok(b) => {
                self.active = Some((path, b));
                let gap = t0.elapsed();
                tracing::info!(
                    "dataplane: the {} backend now runs in the {} (switched in {} ms, {} peers)",
                    self.core.name,
                    path.as_str(),
                    gap.as_millis(),
                    self.core.peers.len()
                );
                Ok(path)
            }
            Err(e) => {
                tracing::error!(
                    "dataplane: switching to {} failed: {e}; going back to {}",
                    path.as_str(),
                    cur.as_str()
                );
                let back = self.core.prepare(cur).await?;
                let b = self
                    .core
                    .start(back, cur, Instant::now() + Duration::from_secs(2))
                    .await?;
                self.active = Some((cur, b));
                Err(e)
            }
        }
    }
}

/// The longest a switch stays pending for [`Implementation::handover_at`] (more
/// than boringtun's 27 s lead plus a rekey during the wait).
const MAX_HANDOVER_WAIT: Duration = Duration::from_secs(40);

/// How long until `handover` (the old path's [`Implementation::handover_at`]), no
/// later than `latest`; `None` when it has passed.
fn handover_left(handover: Option<SystemTime>, latest: SystemTime) -> Option<Duration> {
    let at = handover?.min(latest);
    at.duration_since(SystemTime::now())
        .ok()
        .filter(|d| !d.is_zero())
}

#[cfg(test)]
#[path = "dual_tests.rs"]
mod tests;
