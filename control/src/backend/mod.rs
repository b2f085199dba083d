//! Backends: what a node does with its lease and its peers' leases.
//!
//! One module per backend, one factory ([`new`]) that is the only place
//! naming them (style: netavark's `NetworkDriver`), and a lifecycle of three
//! stages, each its own type so that a wrong order does not compile:
//!
//! - [`Backend`] (what the factory builds): [`Backend::lease_attrs`]
//!   (before the lease is acquired: the attributes depend on devices and
//!   keys) gives the [`Prepared`] backend, a [`Setup`];
//! - [`Setup::setup`] (devices for the acquired lease) gives the
//!   [`Running`] backend: [`Running::mtu`] is `FLANNEL_MTU`,
//!   [`Running::apply`] takes every [`Batch`] of peer changes (one
//!   dataplane update per batch; after a lease snapshot the backend also
//!   removes state no known peer accounts for), [`Running::reconcile`]
//!   every period, [`Running::teardown`] on exit;
//! - [`Observe`], what `weft status`, `/metrics` and the log read: name,
//!   dataplane, and the [`crate::view::BackendView`] it publishes;
//! - [`Switch`], the running backend the daemon owns: `weft dataplane set`
//!   ([`Switch::switch_dataplane`] moves the node between the kernel and
//!   userspace implementations of its backend without changing its lease;
//!   a switch the old path must delay is pending,
//!   [`Switch::switch_pending`]) and [`Switch::rebuild`] after a device was
//!   deleted.
//!
//! The stages are generic over what runs: an implementation of one path is
//! a `Backend` (of [`Running`]); what the daemon runs is a
//! `Backend<dyn Switch>`. Every backend except `alloc` is a [`dual::Dual`],
//! which picks the kernel or the userspace implementation (`--dataplane`,
//! capability probing in [`probe`]) and implements [`Switch`] over them
//! (with [`Running::remove_all`] and [`Running::handover_at`]):
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
mod error;
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
use std::time::SystemTime;

use async_trait::async_trait;

use crate::config::Config;
use crate::config::backend::BackendOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{Client, Netlink, WgClient, WgNetlink, XfrmClient, XfrmNetlink};
use crate::view::BackendView;
pub use crate::view::Dataplane;
pub use error::{BackendError, Missing};

/// A backend before its lease, as the factory builds it: the first of three
/// stages, each its own type, so that a wrong order does not compile.
/// [`Backend::lease_attrs`] gives the [`Prepared`] backend (the attributes
/// depend on devices and keys), [`Setup::setup`] the running one (`R`:
/// [`Running`] for the implementations of a path, [`Switch`] for what the
/// daemon runs, a [`dual::Dual`] or `alloc`).
#[async_trait]
pub trait Backend<R: ?Sized + Send = dyn Running>: Send {
    /// The backend's name as logged and shown in status.
    fn name(&self) -> &'static str;

    /// The attributes this node publishes in its lease, and the backend
    /// prepared to set them up. `prev` is the lease the store still holds
    /// for this node's public IP, if any (to keep identities such as the
    /// VTEP MAC across restarts).
    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<Prepared<R>, BackendError>;

    /// The path `to` would give on this kernel, or why it cannot run here;
    /// changes nothing (a persisted choice is checked with it at start).
    /// A backend without paths to choose from (`alloc`) can run none.
    async fn can_run(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        Err(BackendError::Unsupported(format!(
            "choosing the dataplane ({}) of {}",
            to.as_str(),
            self.name()
        )))
    }
}

/// What [`Backend::lease_attrs`] gives: the attributes and the next stage.
pub struct Prepared<R: ?Sized = dyn Running> {
    /// The attributes this node publishes.
    pub attrs: LeaseAttrs,
    /// The backend, ready for [`Setup::setup`].
    pub backend: Box<dyn Setup<R>>,
}

impl<R: ?Sized> std::fmt::Debug for Prepared<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared")
            .field("attrs", &self.attrs)
            .finish_non_exhaustive()
    }
}

/// A backend whose lease attributes are known (the second stage).
#[async_trait]
pub trait Setup<R: ?Sized + Send = dyn Running>: Send {
    /// Creates what the node needs for `lease`; the running backend
    /// ([`Running::mtu`] is `FLANNEL_MTU`).
    async fn setup(self: Box<Self>, lease: &Lease) -> Result<Box<R>, BackendError>;
}

/// A running backend (the third stage): what the daemon's backend task
/// drives for every batch of peer changes and every period.
#[async_trait]
pub trait Running: Observe + Send + std::fmt::Debug {
    /// `FLANNEL_MTU`: the MTU pods get.
    fn mtu(&self) -> u32;

    /// Programs (`Add`) or removes (`Remove`) the batch's peers in order,
    /// then hands the dataplane the result in one step (the userspace
    /// engine gets one new peer table per batch: a snapshot can hold
    /// thousands). A change that fails does not stop the others. After a
    /// [`Batch::snapshot`], "known" is the store's full view, and the
    /// backend also removes dataplane state that no known peer accounts for
    /// (what an earlier weftd left in kernel devices that outlive it).
    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError>;

    /// Restores state that went missing (deleted routes, ...). Called every
    /// period; a deleted device is [`BackendError::DeviceGone`], on which the
    /// daemon rebuilds the backend ([`Switch::rebuild`]) and replays its peers.
    async fn reconcile(&mut self) -> Result<(), BackendError>;

    /// Removes what `setup` made that must not outlive the daemon (kernel
    /// devices and routes stay, so that a restart does not interrupt pods).
    /// Best effort and idempotent.
    async fn teardown(&mut self);

    /// Removes everything `setup` and `apply` made, including what
    /// `teardown` leaves for a restart (kernel devices, routes): the node
    /// moves to another implementation ([`dual::Dual`]). Best effort.
    async fn remove_all(&mut self) {
        self.teardown().await;
    }

    /// When another implementation of this backend can take over this one's
    /// peers without the peers refusing it; `None` (the default) or a past
    /// time: at once. [`dual::Dual`] keeps this implementation running until
    /// then when it switches away from it. The userspace WireGuard engine's
    /// peers hold its handshake timestamps, which run 27 s ahead of the
    /// kernel's ([`weft_engine::wg::BORINGTUN_TAI64_AHEAD`]).
    fn handover_at(&self) -> Option<SystemTime> {
        None
    }
}

/// What a backend shows of itself to `weft status`, `/metrics` and the log.
/// Reads only: no kernel round trips, no per-packet cost.
pub trait Observe {
    /// The backend's name as logged and shown in status.
    fn name(&self) -> &'static str;

    /// Which dataplane runs it (`None`: nothing forwards, e.g. `alloc`).
    fn dataplane(&self) -> Option<Dataplane>;

    /// What it publishes of itself for readers ([`crate::view`]): its
    /// devices, each a probe a reader asks for counters without asking the
    /// backend. Cheap (it clones handles); the backend's task publishes it
    /// after setup and after every step that may change it.
    fn view(&self) -> BackendView {
        BackendView::new(self.name(), self.dataplane())
    }
}

/// The running backend the daemon owns: a [`Running`] that can move
/// between the kernel and userspace implementations of its backend without
/// changing its lease (`weft dataplane set`) and be rebuilt on its lease
/// when a device was deleted. [`dual::Dual`] does it; `alloc`, which
/// forwards nothing, refuses to switch.
#[async_trait]
pub trait Switch: Running {
    /// A [`Switch::switch_dataplane`] that is waiting for the running
    /// implementation's [`Running::handover_at`]: when to call it again
    /// (with the same choice) to complete it. `None`: nothing pending.
    fn switch_pending(&self) -> Option<SystemTime>;

    /// Moves the node to the `to` implementation; returns the dataplane that
    /// runs afterwards (the old one while the switch is pending, see
    /// [`Switch::switch_pending`]). [`BackendError::NoDataplane`]: the new
    /// path failed and the old one could not be restored.
    async fn switch_dataplane(&mut self, to: DataplaneChoice) -> Result<Dataplane, BackendError>;

    /// Tears the running implementation down and sets it up again on
    /// `lease` (a device it runs on was deleted); the daemon replays every
    /// peer afterwards.
    async fn rebuild(&mut self, lease: &Lease) -> Result<(), BackendError>;
}

/// The peer changes of one [`Backend::apply`].
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The changes, applied in this order.
    pub changes: &'a [Change],
    /// Applying them brings the backend to a lease snapshot: afterwards it
    /// knows every peer the store has.
    pub snapshot: bool,
}

impl<'a> Batch<'a> {
    /// Changes to what the backend already has.
    pub fn of(changes: &'a [Change]) -> Batch<'a> {
        Batch {
            changes,
            snapshot: false,
        }
    }

    /// The changes that bring the backend to a lease snapshot.
    pub fn snapshot(changes: &'a [Change]) -> Batch<'a> {
        Batch {
            changes,
            snapshot: true,
        }
    }

    /// One change.
    pub fn one(change: &'a Change) -> Batch<'a> {
        Batch::of(std::slice::from_ref(change))
    }
}

/// What [`Backend::apply`] could not do; the rest of the batch was applied.
#[derive(Debug, Default)]
pub struct ApplyError {
    /// The changes that failed, by position in the batch, and why.
    pub failed: Vec<(usize, BackendError)>,
    /// Why removing the state of unknown peers after a snapshot failed.
    pub prune: Option<BackendError>,
}

impl ApplyError {
    /// Notes how the batch's change `i` went.
    pub fn record(&mut self, i: usize, r: Result<(), BackendError>) {
        if let Err(e) = r {
            self.failed.push((i, e));
        }
    }

    /// `Err(self)` if anything failed.
    pub fn into_result(self) -> Result<(), ApplyError> {
        match self.failed.is_empty() && self.prune.is_none() {
            true => Ok(()),
            false => Err(self),
        }
    }

    /// Whether the batch's change `i` failed.
    pub fn is_failed(&self, i: usize) -> bool {
        self.failed.iter().any(|(j, _)| *j == i)
    }

    /// The failed changes of `changes` (the batch) and why.
    pub fn failures<'a>(
        &'a self,
        changes: &'a [Change],
    ) -> impl Iterator<Item = (&'a Change, &'a BackendError)> {
        self.failed.iter().map(move |(i, e)| (&changes[*i], e))
    }
}

impl std::fmt::Display for ApplyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut sep = "";
        for (i, e) in &self.failed {
            write!(f, "{sep}change {i}: {e}")?;
            sep = "; ";
        }
        if let Some(e) = &self.prune {
            write!(f, "{sep}pruning: {e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ApplyError {}

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
    /// NAT traversal (docs/nat.md): `--nat-traversal` or net-conf.json's
    /// `WeftNATTraversal`; the WireGuard paths act on it (the kernel one
    /// without relays and direct probes).
    pub nat: bool,
    /// Relay for nodes behind NAT (`--nat-relay`, docs/nat.md "Relays"):
    /// only with `nat`, on the userspace WireGuard path.
    pub relay: Option<RelayTuning>,
    /// `--tunnel-gso` (issue 32, [`tunnel::gso::TunnelGso`]): the tunnel TAP
    /// of the userspace IPv4 vxlan and udp engines.
    pub tunnel_gso: tunnel::gso::TunnelGso,
}

/// A relay's settings (`--nat-relay-port`, `--nat-relay-limit`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayTuning {
    /// The UDP port it listens on.
    pub port: u16,
    /// Its bandwidth limit, Mbit/s (`None`: none).
    pub mbit: Option<u64>,
}

impl EngineTuning {
    /// The config of an engine on TUN `tun_name` with `encap`, sending from
    /// `local`, its device at MTU `mtu` (and `tun_addr`, when the engine
    /// answers ICMP for it), run as tuned.
    pub fn engine(
        &self,
        tun_name: String,
        encap: weft_engine::Encap,
        local: std::net::IpAddr,
        tun_addr: Option<std::net::IpAddr>,
        mtu: u32,
    ) -> weft_engine::EngineConfig {
        weft_engine::EngineConfig {
            tun_name,
            encap,
            local_addr: local,
            tun_addr,
            mtu: u16::try_from(mtu).unwrap_or(u16::MAX),
            workers: self.workers,
            offload: self.offload,
            anti_spoof: self.anti_spoof != weft_engine::AntiSpoofing::Off,
            tunnel_tap: None,
        }
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

/// The kernel device names a backend owns in its network namespace: what
/// weftd locks at start (`daemon/node_lock.rs`, so that two daemons
/// never run one device) and what a userspace path clears of a kernel path's
/// leftovers. udp's TUN is `flannel%d` (the kernel picks the number) but its
/// route to the whole network is one per namespace, so it is locked as
/// `flannel0`. Backends without a device of their own (host-gw, ipsec,
/// alloc) have none.
pub fn device_names(opts: &BackendOptions) -> Vec<String> {
    match opts {
        BackendOptions::Vxlan(o) => vec![
            format!("flannel.{}", o.vni),
            format!("flannel-v6.{}", o.vni),
        ],
        BackendOptions::Ipip(_) => vec![ipip::DEVICE.into()],
        BackendOptions::Wireguard(_) => vec!["flannel-wg".into(), "flannel-wg-v6".into()],
        BackendOptions::Udp(_) => vec!["flannel0".into()],
        _ => Vec::new(),
    }
}

/// [`device_names`] of the network config's backend (none when its options
/// do not parse: [`new`] reports that).
pub fn config_device_names(cfg: &Config) -> Vec<String> {
    BackendOptions::from_config(&cfg.backend_type, cfg.backend.as_deref())
        .map(|o| device_names(&o))
        .unwrap_or_default()
}

/// Builds the backend named by the network config: the factory, the only
/// place naming the backends.
pub fn new(
    cfg: &Config,
    dataplane: DataplaneChoice,
    tuning: EngineTuning,
    vxlan_tx_csum: vxlan::TxCsumOffload,
    nl: &Netlink,
) -> Result<Box<dyn Backend<dyn Switch>>, BackendError> {
    let client: Arc<dyn Client> = Arc::new(nl.clone());
    let us = tunnel::Userspace {
        nl: client.clone(),
        engines: Arc::new(tunnel::RealEngines),
    };
    let kernel = Kernel {
        client,
        xfrm: Arc::new(XfrmNetlink::new()),
        wg: Arc::new(WgNetlink::new()),
        vxlan_tx_csum,
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
    /// kernel vxlan's transmit checksum offload (`--vxlan-tx-checksum-offload`).
    pub vxlan_tx_csum: vxlan::TxCsumOffload,
}

/// [`new`] with explicit kernel clients for the kernel paths and what the
/// userspace paths run on (engines and their devices' netlink).
pub fn build(
    cfg: &Config,
    dataplane: DataplaneChoice,
    tuning: EngineTuning,
    us: &tunnel::Userspace,
    kernel: Kernel,
) -> Result<Box<dyn Backend<dyn Switch>>, BackendError> {
    use ipip::{kernel::Ipip, userspace::IpipUser};
    use vxlan::{kernel::KernelVxlan, userspace::Vxlan};
    use wireguard::{kernel::KernelWireguard, userspace::Wireguard};
    let Kernel {
        client,
        xfrm,
        wg,
        vxlan_tx_csum,
    } = kernel;
    let opts = BackendOptions::from_config(&cfg.backend_type, cfg.backend.as_deref())?;
    let links = device_names(&opts);
    let (v4, v6) = (cfg.enable_ipv4, cfg.enable_ipv6);
    let dual = |name| dual::Dual::new(name, dataplane, client.clone(), xfrm.clone());
    let c = client.clone();
    let b: Box<dyn Backend<dyn Switch>> = match opts {
        BackendOptions::Alloc => Box::new(alloc::Alloc::new()),
        BackendOptions::Udp(o) => {
            let network = cfg
                .network
                .filter(|_| cfg.enable_ipv4)
                .ok_or(BackendError::Missing {
                    backend: "udp",
                    what: Missing::NetworkV4,
                })?;
            let us = us.clone();
            Box::new(dual("udp").userspace(Box::new(move || {
                Box::new(udp::Udp::new(o.clone(), network, tuning, us.clone()))
            })))
        }
        BackendOptions::Vxlan(o) => {
            let (ok, ou, us) = (o.clone(), o.clone(), us.clone());
            Box::new(
                dual("vxlan")
                    .kernel(
                        Some(probe::Capability::Vxlan),
                        Box::new(move || {
                            Box::new(
                                KernelVxlan::new(ok.clone(), v4, v6, c.clone())
                                    .with_tx_csum(vxlan_tx_csum, &vxlan::kernel_release()),
                            )
                        }),
                    )
                    .userspace(Box::new(move || {
                        Box::new(Vxlan::new(ou.clone(), v4, v6, tuning, us.clone()))
                    }))
                    .kernel_links(links),
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
                        Box::new(move || Box::new(Ipip::new(ok.clone(), c.clone()))),
                    )
                    .userspace(Box::new(move || {
                        Box::new(IpipUser::new(o.clone(), tuning, us.clone()))
                    }))
                    .kernel_links(links),
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
            wireguard::validate(&o, n4, n6)?;
            let (us, ok) = (us.clone(), o.clone());
            Box::new(
                dual("wireguard")
                    .kernel(
                        Some(probe::Capability::Wireguard),
                        Box::new(move || {
                            Box::new(
                                KernelWireguard::new(ok.clone(), n4, n6, c.clone(), wg.clone())
                                    .with_nat(tuning.nat),
                            )
                        }),
                    )
                    .userspace(Box::new(move || {
                        Box::new(Wireguard::new(o.clone(), n4, n6, tuning, us.clone()))
                    }))
                    .kernel_links(links),
            )
        }
        other => return Err(BackendError::Unsupported(other.kind().name().to_string())),
    };
    Ok(b)
}
