//! [`Dual`]: one backend type with a kernel and/or a userspace
//! implementation, the choice between them (`--dataplane`), capability
//! probing, and live switching.
//!
//! - Its stages are [`Dual`] (as built: the paths), a prepared path
//!   ([`Setup`]) and the running node ([`Switch`]). At start
//!   ([`Backend::lease_attrs`]) the path is resolved: `kernel` needs
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
//!   peer, and is logged. A failed setup rolls back to the old path; when
//!   that fails too the switch ends in [`BackendError::NoDataplane`] (the
//!   daemon exits and its supervisor restarts it).
//! - Before that, the old path may ask for time ([`Running::handover_at`]):
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
    ApplyError, Backend, BackendError, Batch, Dataplane, DataplaneChoice, Observe, Prepared,
    Running, Setup, Switch,
};
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::netlink::{Client, LinkKind, XfrmClient};
use crate::view::BackendView;

/// Makes a fresh implementation of one path, as the factory builds it.
pub type Make = Box<dyn Fn() -> Box<dyn Backend> + Send + Sync>;

/// See the module docs: the backend as the factory builds it (its paths,
/// not yet chosen).
pub struct Dual {
    core: Core,
}

/// A [`Dual`] whose path is chosen and prepared ([`Setup`]).
struct Ready {
    core: Core,
    ext: ExternalInterface,
    attrs: LeaseAttrs,
    path: Dataplane,
    next: Box<dyn Setup>,
}

/// A running [`Dual`]: the running implementation, and everything a switch
/// or a rebuild needs to make another that publishes the same lease.
struct Live {
    core: Core,
    cx: Cx,
    path: Dataplane,
    active: Box<dyn Running>,
    pending: Option<Pending>,
    /// Every peer applied so far (replayed into a new path).
    peers: BTreeMap<SubnetKey, Lease>,
}

/// What a new path is prepared and set up with (kept apart from the
/// implementations, so that it can be borrowed across awaits while one is
/// borrowed mutably).
struct Cx {
    ext: ExternalInterface,
    attrs: LeaseAttrs,
    lease: Lease,
    /// `FLANNEL_MTU` as subnet.env says it (the first path's).
    mtu: u32,
}

/// A switch waiting for the old path's [`Running::handover_at`].
struct Pending {
    path: Dataplane,
    why: String,
    /// The prepared (not set up) implementation.
    next: Box<dyn Setup>,
    /// [`MAX_HANDOVER_WAIT`] after the request.
    latest: SystemTime,
}

/// The paths and how to probe and make them.
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
}

impl std::fmt::Debug for Dual {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dual")
            .field("name", &self.core.name)
            .field("choice", &self.core.choice)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Live {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dual")
            .field("name", &self.core.name)
            .field("path", &self.path)
            .field("peers", &self.peers.len())
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
        Dual {
            core: Core {
                name,
                choice,
                kernel: None,
                userspace: None,
                kernel_links: Vec::new(),
                nl,
                xfrm,
            },
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
                Some(Err(m)) => Err(BackendError::KernelLacks {
                    backend: name,
                    feature: m,
                    forced: true,
                    userspace: self.userspace.is_some(),
                }),
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
                (Some(Err(m)), None) => Err(BackendError::KernelLacks {
                    backend: name,
                    feature: m,
                    forced: false,
                    userspace: false,
                }),
                (None, None) => Err(BackendError::Unsupported(format!(
                    "{name} (weft implements neither its kernel nor its userspace dataplane yet)"
                ))),
            },
        }
    }

    fn make(&self, path: Dataplane) -> Result<Box<dyn Backend>, BackendError> {
        let made = match path {
            Dataplane::Kernel => self.kernel.as_ref().map(|(_, m)| m()),
            Dataplane::Userspace => self.userspace.as_ref().map(|m| m()),
        };
        made.ok_or_else(|| BackendError::Unsupported(format!("{} {}", self.name, path.as_str())))
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
    /// attributes (given the current lease as its previous one).
    async fn prepare(&self, path: Dataplane, cx: &Cx) -> Result<Box<dyn Setup>, BackendError> {
        let p = self
            .make(path)?
            .lease_attrs(&cx.ext, Some(&cx.lease))
            .await?;
        if p.attrs != cx.attrs {
            return Err(BackendError::AttrsDiffer {
                path,
                attrs: p.attrs.to_json(),
            });
        }
        Ok(p.backend)
    }
}

impl Core {
    /// Sets `first` (a [`Core::prepare`]d `path`) up for the current lease
    /// (retrying with fresh ones until `deadline`: the old path's UDP socket
    /// may take a moment to go) and applies `replay`, every known peer.
    async fn start(
        &self,
        cx: &Cx,
        first: Box<dyn Setup>,
        path: Dataplane,
        deadline: Instant,
        replay: Option<&BTreeMap<SubnetKey, Lease>>,
    ) -> Result<Box<dyn Running>, BackendError> {
        if path == Dataplane::Userspace {
            self.clear_kernel_links().await;
        }
        let mut next = first;
        let mut b = loop {
            match next.setup(&cx.lease).await {
                Ok(b) => break b,
                Err(e) if Instant::now() < deadline => {
                    tracing::debug!("setup of the {} path failed ({e}); retrying", path.as_str());
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    next = self.prepare(path, cx).await?;
                }
                Err(e) => return Err(e),
            }
        };
        if b.mtu() != cx.mtu {
            tracing::warn!(
                "the {} path has MTU {}, subnet.env says {}",
                path.as_str(),
                b.mtu(),
                cx.mtu
            );
        }
        if let Some(peers) = replay {
            let all: Vec<Change> = peers.values().cloned().map(Change::Add).collect();
            if let Err(e) = b.apply(Batch::of(&all)).await {
                for (c, e) in e.failures(&all) {
                    tracing::error!("failed to apply {} after switching: {e}", c.lease().key());
                }
            }
        }
        Ok(b)
    }
}

impl Live {
    /// The running implementation's [`Running::handover_at`].
    fn handover(&self) -> Option<SystemTime> {
        self.active.handover_at()
    }
}

#[async_trait]
impl Backend<dyn Switch> for Dual {
    fn name(&self) -> &'static str {
        self.core.name
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<Prepared<dyn Switch>, BackendError> {
        let core = self.core;
        let (path, why) = core.resolve(core.choice).await?;
        tracing::info!(
            "dataplane: the {} backend runs in the {} ({why})",
            core.name,
            path.as_str()
        );
        let Prepared { attrs, backend } = core.make(path)?.lease_attrs(ext, prev).await?;
        let ready = Ready {
            core,
            ext: ext.clone(),
            attrs: attrs.clone(),
            path,
            next: backend,
        };
        Ok(Prepared {
            attrs,
            backend: Box::new(ready),
        })
    }

    async fn can_run(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        self.core.resolve(to).await.map(|(path, _)| path)
    }
}

#[async_trait]
impl Setup<dyn Switch> for Ready {
    async fn setup(self: Box<Self>, lease: &Lease) -> Result<Box<dyn Switch>, BackendError> {
        let Ready {
            core,
            ext,
            attrs,
            path,
            next,
        } = *self;
        if path == Dataplane::Userspace {
            core.clear_kernel_links().await;
        }
        let active = next.setup(lease).await?;
        let cx = Cx {
            ext,
            attrs,
            lease: lease.clone(),
            mtu: active.mtu(),
        };
        Ok(Box::new(Live {
            core,
            cx,
            path,
            active,
            pending: None,
            peers: BTreeMap::new(),
        }))
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        self.core.name
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(self.path)
    }

    fn view(&self) -> BackendView {
        BackendView {
            name: self.core.name,
            ..self.active.view()
        }
    }
}

#[async_trait]
impl Running for Live {
    fn mtu(&self) -> u32 {
        self.cx.mtu
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        for change in batch.changes {
            match change {
                Change::Add(l) => self.peers.insert(l.key(), l.clone()),
                Change::Remove(l) => self.peers.remove(&l.key()),
            };
        }
        self.active.apply(batch).await
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        self.active.reconcile().await
    }

    async fn teardown(&mut self) {
        self.pending = None;
        self.active.teardown().await;
    }

    fn handover_at(&self) -> Option<SystemTime> {
        self.handover()
    }
}

#[async_trait]
impl Switch for Live {
    fn switch_pending(&self) -> Option<SystemTime> {
        let p = self.pending.as_ref()?;
        Some(self.handover().map_or(p.latest, |at| at.min(p.latest)))
    }

    async fn switch_dataplane(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        let (path, why) = self.core.resolve(to).await?;
        let cur = self.path;
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
                if let Some(left) = handover_left(self.handover(), p.latest) {
                    tracing::debug!(
                        "dataplane: switch still pending for {} ms",
                        left.as_millis()
                    );
                    self.pending = Some(p);
                    return Ok(cur);
                }
                if self.handover().is_some_and(|at| at > SystemTime::now()) {
                    tracing::warn!(
                        "dataplane: the {} path takes over after waiting {} s; some peers may \
                         refuse its handshakes for a while",
                        path.as_str(),
                        MAX_HANDOVER_WAIT.as_secs()
                    );
                }
                (p.next, p.why)
            }
            _ => {
                // Refused here, before anything is touched, if the lease would change.
                let next = self.core.prepare(path, &self.cx).await?;
                let latest = SystemTime::now() + MAX_HANDOVER_WAIT;
                if let Some(left) = handover_left(self.handover(), latest) {
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
        self.active.remove_all().await;
        let deadline = t0 + Duration::from_secs(2);
        let started = (self.core)
            .start(&self.cx, next, path, deadline, Some(&self.peers))
            .await;
        match started {
            Ok(b) => {
                self.active = b;
                self.path = path;
                tracing::info!(
                    "dataplane: the {} backend now runs in the {} (switched in {} ms, {} peers)",
                    self.core.name,
                    path.as_str(),
                    t0.elapsed().as_millis(),
                    self.peers.len()
                );
                Ok(path)
            }
            Err(e) => {
                tracing::error!(
                    "dataplane: switching to {} failed: {e}; going back to {}",
                    path.as_str(),
                    cur.as_str()
                );
                let deadline = Instant::now() + Duration::from_secs(2);
                let back = match self.core.prepare(cur, &self.cx).await {
                    Ok(back) => {
                        (self.core)
                            .start(&self.cx, back, cur, deadline, Some(&self.peers))
                            .await
                    }
                    Err(e) => Err(e),
                };
                match back {
                    Ok(b) => {
                        self.active = b;
                        Err(e)
                    }
                    Err(restore) => Err(BackendError::NoDataplane {
                        to: path,
                        from: cur,
                        error: Box::new(e),
                        restore: Box::new(restore),
                    }),
                }
            }
        }
    }

    async fn rebuild(&mut self, lease: &Lease) -> Result<(), BackendError> {
        self.pending = None;
        self.active.teardown().await;
        self.cx.lease = lease.clone();
        let next = self.core.prepare(self.path, &self.cx).await?;
        let deadline = Instant::now() + Duration::from_secs(2);
        self.active = (self.core)
            .start(&self.cx, next, self.path, deadline, None)
            .await?;
        Ok(())
    }
}

/// The longest a switch stays pending for [`Running::handover_at`] (more
/// than boringtun's 27 s lead plus a rekey during the wait).
const MAX_HANDOVER_WAIT: Duration = Duration::from_secs(40);

/// How long until `handover` (the old path's [`Running::handover_at`]), no
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
