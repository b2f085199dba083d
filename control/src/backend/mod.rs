//! Backends: what a node does with its lease and its peers' leases.
//!
//! One small trait, one module per backend, and one factory ([`new`]) that is
//! the only place naming them (style: netavark's `NetworkDriver`). The
//! daemon calls, in order: [`Backend::lease_attrs`] (before the lease is
//! acquired: the attributes depend on devices and keys), [`Backend::setup`]
//! (devices for the acquired lease; returns `FLANNEL_MTU`), then
//! [`Backend::apply`] for every peer change and [`Backend::reconcile`] every
//! period, and [`Backend::teardown`] on exit. [`Backend::switch_dataplane`]
//! (any time after `setup`) moves the node between the kernel and userspace
//! implementations of its backend without changing its lease.
//!
//! Every backend except `alloc` is wrapped in a [`dual::Dual`], which picks
//! the kernel or the userspace implementation (`--dataplane`, capability
//! probing in [`probe`]) and does the switching:
//!
//! | type | kernel | userspace |
//! |---|---|---|
//! | vxlan | [`vxlan::kernel`] (probe: vxlan driver) | [`vxlan::userspace`] (engine) |
//! | host-gw | [`host_gw`] (routes only) | – |
//! | ipip | [`ipip::kernel`] (probe: ipip driver) | [`ipip::userspace`] (engine, raw IPIP socket) |
//! | ipsec | [`ipsec`] (charon over VICI + XFRM policies; probe: ESP) | – |
//! | udp | – | [`udp`] (engine) |
//! | wireguard | [`wireguard::kernel`] (probe: wireguard driver) | [`wireguard::userspace`] (engine, boringtun) |
//!
//! A backend with both paths has a folder: `mod.rs` holds what the two
//! share (lease data, MTUs, device names), `kernel.rs` and `userspace.rs`
//! the paths.

pub mod alloc;
pub mod dataplane_ctl;
pub mod dual;
pub mod host_gw;
pub mod ipip;
pub mod ipsec;
pub mod probe;
#[cfg(test)]
mod route_backends_tests;
pub mod route_set;
#[cfg(test)]
mod test_util;
pub mod tunnel;
pub mod udp;
#[cfg(test)]
mod userspace_tests;
pub mod vxlan;
pub mod wireguard;

use std::sync::Arc;

use async_trait::async_trait;

use crate::config::Config;
use crate::config::backend::BackendOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{Client, Netlink, NetlinkError, WgClient, WgNetlink, XfrmClient, XfrmNetlink};

/// Errors from a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The `Backend` object of net-conf.json: an unknown type (flannel's
    /// message) or an option of the wrong type or range.
    #[error(transparent)]
    Options(#[from] crate::config::OptionsError),
    /// A backend flannel knows but weft does not implement (yet).
    #[error("backend type {0:?} is not supported by weft")]
    Unsupported(String),
    /// The backend's options are invalid.
    #[error("{0}")]
    Config(String),
    /// Programming the kernel failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The userspace engine failed.
    #[error("engine: {0}")]
    Engine(String),
    /// The IKE daemon (charon) could not be started or refused a request.
    #[error(transparent)]
    Ike(#[from] ipsec::charon::CharonError),
    /// A device the backend runs on was deleted under it (e.g. `ip link del
    /// flannel.1`); the daemon rebuilds the backend on the same lease.
    #[error("device {0} was deleted")]
    DeviceGone(String),
}

/// What a backend does. See the module docs for the call order.
#[async_trait]
pub trait Backend: Send {
    /// The backend's name as logged and shown in status.
    fn name(&self) -> &'static str;

    /// Which dataplane runs it (`None`: nothing forwards, e.g. `alloc`).
    fn dataplane(&self) -> Option<Dataplane>;

    /// The attributes this node publishes in its lease. `prev` is the lease
    /// the store still holds for this node's public IP, if any (to keep
    /// identities such as the VTEP MAC across restarts).
    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError>;

    /// Creates what the node needs for `lease`; returns `FLANNEL_MTU`.
    async fn setup(&mut self, lease: &Lease) -> Result<u32, BackendError>;

    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn apply(&mut self, change: &Change) -> Result<(), BackendError>;

    /// Hands the changes of the `apply` calls since the last flush to the
    /// dataplane in one step (the userspace engine's peer table). The daemon
    /// calls it after every batch of changes.
    fn flush(&mut self) {}

    /// Restores state that went missing (deleted routes, ...). Called every period.
    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Removes dataplane state of peers the backend does not know: what an
    /// earlier weftd left in kernel devices that outlive it (routes, fdb
    /// entries, neighbours of leases that went while no weftd ran). The
    /// daemon calls it after applying each lease snapshot, so "known" is the
    /// store's full view, never a partial one.
    async fn prune(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Removes what `setup` made that must not outlive the daemon.
    async fn teardown(&mut self);

    /// Removes everything `setup` and `apply` made, including what
    /// `teardown` leaves for a restart (kernel devices, routes); used when
    /// the node moves to another dataplane. Best effort.
    async fn remove_all(&mut self) {
        self.teardown().await;
    }

    /// What `weft status` and `/metrics` show of this backend: its devices
    /// and per-peer counters. Called by the daemon's main loop on request;
    /// reads counters only (no per-packet cost, no kernel round trips).
    fn status(&self) -> crate::status::BackendStatus {
        crate::status::BackendStatus::new(self.name(), self.dataplane())
    }

    /// When another implementation of this backend can take over this one's
    /// peers without the peers refusing it; `None` (the default) or a past
    /// time: at once. [`dual::Dual`] keeps this implementation running until
    /// then when it switches away from it. The userspace WireGuard engine's
    /// peers hold its handshake timestamps, which run 27 s ahead of the
    /// kernel's ([`weft_engine::wg::BORINGTUN_TAI64_AHEAD`]).
    fn handover_at(&self) -> Option<std::time::SystemTime> {
        None
    }

    /// A [`Backend::switch_dataplane`] that is waiting for the running
    /// path's [`Backend::handover_at`]: when to call it again (with the same
    /// choice) to complete it. `None` (the default): nothing pending.
    fn switch_pending(&self) -> Option<std::time::SystemTime> {
        None
    }

    /// Moves the running node to the `to` implementation of this backend,
    /// keeping its lease; returns the dataplane that runs afterwards (the old
    /// one while the switch is pending, see [`Backend::switch_pending`]).
    async fn switch_dataplane(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        let _ = to;
        Err(BackendError::Unsupported(format!(
            "switching the dataplane of {}",
            self.name()
        )))
    }
}

/// How the daemon wants the userspace engine run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineTuning {
    /// Worker threads (0 = one per CPU).
    pub workers: usize,
    /// Use TUN and UDP offloads when the kernel has them.
    pub offload: bool,
    /// How the engine checks the sources of decapsulated packets
    /// (`--anti-spoofing`; see [`weft_engine::antispoof`]).
    pub anti_spoof: weft_engine::AntiSpoofing,
}

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

/// Which dataplane to use where both exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DataplaneChoice {
    /// The kernel when it can, else userspace.
    Auto,
    /// Only the kernel.
    Kernel,
    /// Only the userspace engine.
    Userspace,
}

impl DataplaneChoice {
    /// Parses `auto`, `kernel` or `userspace` (surrounding white space ignored).
    pub fn parse(s: &str) -> Option<DataplaneChoice> {
        match s.trim() {
            "auto" => Some(DataplaneChoice::Auto),
            "kernel" => Some(DataplaneChoice::Kernel),
            "userspace" => Some(DataplaneChoice::Userspace),
            _ => None,
        }
    }

    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            DataplaneChoice::Auto => "auto",
            DataplaneChoice::Kernel => "kernel",
            DataplaneChoice::Userspace => "userspace",
        }
    }
}

/// Builds the backend named by the network config: the factory, the only
/// place naming the backends.
pub fn new(
    cfg: &Config,
    dataplane: DataplaneChoice,
    tuning: EngineTuning,
    nl: &Netlink,
) -> Result<Box<dyn Backend>, BackendError> {
    let client: Arc<dyn Client> = Arc::new(nl.clone());
    let us = tunnel::Userspace {
        nl: client.clone(),
        engines: Arc::new(tunnel::RealEngines),
    };
    let kernel = Kernel {
        client,
        xfrm: Arc::new(XfrmNetlink::new()),
        wg: Arc::new(WgNetlink::new()),
    };
    build(cfg, dataplane, tuning, &us, kernel)
}

/// The kernel clients the kernel paths program through (real ones in
/// [`new`], a [`crate::netlink::FakeNetlink`] in tests).
#[derive(Debug, Clone)]
pub struct Kernel {
    /// Links, addresses, routes, neighbours, fdb (rtnetlink).
    pub client: Arc<dyn Client>,
    /// XFRM policies.
    pub xfrm: Arc<dyn XfrmClient>,
    /// WireGuard devices (generic netlink).
    pub wg: Arc<dyn WgClient>,
}

/// [`new`] with explicit kernel clients for the kernel paths and what the
/// userspace paths run on (engines and their devices' netlink).
pub fn build(
    cfg: &Config,
    dataplane: DataplaneChoice,
    tuning: EngineTuning,
    us: &tunnel::Userspace,
    kernel: Kernel,
) -> Result<Box<dyn Backend>, BackendError> {
    let Kernel { client, xfrm, wg } = kernel;
    let opts = BackendOptions::from_config(&cfg.backend_type, cfg.backend.as_deref())?;
    let (v4, v6) = (cfg.enable_ipv4, cfg.enable_ipv6);
    let dual = |name| dual::Dual::new(name, dataplane, client.clone(), xfrm.clone());
    let c = client.clone();
    let b: Box<dyn Backend> = match opts {
        BackendOptions::Alloc => Box::new(alloc::Alloc::new()),
        BackendOptions::Udp(o) => {
            let network = cfg.network.filter(|_| cfg.enable_ipv4).ok_or_else(|| {
                BackendError::Config("the udp backend needs an IPv4 Network".into())
            })?;
            let us = us.clone();
            Box::new(dual("udp").userspace(Box::new(move || {
                Box::new(udp::Udp::new(o.clone(), network, tuning, us.clone()))
            })))
        }
        BackendOptions::Vxlan(o) => {
            let (ok, ou, us) = (o.clone(), o.clone(), us.clone());
            let names = vec![
                format!("flannel.{}", o.vni),
                format!("flannel-v6.{}", o.vni),
            ];
            Box::new(
                dual("vxlan")
                    .kernel(
                        Some(probe::Capability::Vxlan),
                        Box::new(move || {
                            Box::new(vxlan::kernel::KernelVxlan::new(
                                ok.clone(),
                                v4,
                                v6,
                                c.clone(),
                            ))
                        }),
                    )
                    .userspace(Box::new(move || {
                        Box::new(vxlan::userspace::Vxlan::new(
                            ou.clone(),
                            v4,
                            v6,
                            tuning,
                            us.clone(),
                        ))
                    }))
                    .kernel_links(names),
            )
        }
        BackendOptions::HostGw => Box::new(dual("host-gw").kernel(
            None,
            Box::new(move || Box::new(host_gw::HostGw::new(v4, v6, c.clone()))),
        )),
        BackendOptions::Ipip(o) => {
            let (ok, us) = (o.clone(), us.clone());
            Box::new(
                dual("ipip")
                    .kernel(
                        Some(probe::Capability::Ipip),
                        Box::new(move || Box::new(ipip::kernel::Ipip::new(ok.clone(), c.clone()))),
                    )
                    .userspace(Box::new(move || {
                        Box::new(ipip::userspace::IpipUser::new(
                            o.clone(),
                            tuning,
                            us.clone(),
                        ))
                    }))
                    .kernel_links(vec![ipip::DEVICE.into()]),
            )
        }
        BackendOptions::Ipsec(o) => {
            let x = xfrm.clone();
            Box::new(dual("ipsec").kernel(
                Some(probe::Capability::Esp),
                Box::new(move || Box::new(ipsec::Ipsec::new(o.clone(), x.clone()))),
            ))
        }
        BackendOptions::Wireguard(o) => {
            let (n4, n6) = (cfg.network.filter(|_| v4), cfg.ipv6_network.filter(|_| v6));
            wireguard::userspace::Wireguard::validate(&o, n4, n6)?;
            let (us, ok) = (us.clone(), o.clone());
            Box::new(
                dual("wireguard")
                    .kernel(
                        Some(probe::Capability::Wireguard),
                        Box::new(move || {
                            Box::new(wireguard::kernel::KernelWireguard::new(
                                ok.clone(),
                                n4,
                                n6,
                                c.clone(),
                                wg.clone(),
                            ))
                        }),
                    )
                    .userspace(Box::new(move || {
                        Box::new(wireguard::userspace::Wireguard::new(
                            o.clone(),
                            n4,
                            n6,
                            tuning,
                            us.clone(),
                        ))
                    }))
                    .kernel_links(vec!["flannel-wg".into(), "flannel-wg-v6".into()]),
            )
        }
        other => return Err(BackendError::Unsupported(other.kind().name().to_string())),
    };
    Ok(b)
}
