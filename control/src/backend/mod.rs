//! Backends: what a node does with its lease and its peers' leases.
//!
//! One small trait, one module per backend, and one factory ([`new`]) that is
//! the only place naming them (style: netavark's `NetworkDriver`). The
//! daemon calls, in order: [`Backend::lease_attrs`] (before the lease is
//! acquired: the attributes depend on devices and keys), [`Backend::setup`]
//! (devices for the acquired lease; returns `FLANNEL_MTU`), then
//! [`Backend::apply`] for every peer change and [`Backend::reconcile`] every
//! period, and [`Backend::teardown`] on exit.

pub mod alloc;
pub mod tunnel;
pub mod udp;
pub mod vxlan;

use async_trait::async_trait;

use crate::config::Config;
use crate::config::backend::BackendOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{Netlink, NetlinkError};

/// Errors from a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// flannel's message for a type it does not know.
    #[error("unknown backend type: {0}")]
    Unknown(String),
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
}

/// What a backend does. See the module docs for the call order.
#[async_trait]
pub trait Backend: Send {
    /// The backend's name as logged and shown in status.
    fn name(&self) -> &'static str;

    /// Which dataplane runs it ("kernel", "userspace" or "none").
    fn dataplane(&self) -> &'static str;

    /// The attributes this node publishes in its lease. `prev` is the lease
    /// the store still holds for this node's public IP, if any (to keep
    /// identities such as the VTEP MAC across restarts).
    async fn lease_attrs(&mut self, ext: &ExternalInterface, prev: Option<&Lease>) -> Result<LeaseAttrs, BackendError>;

    /// Creates what the node needs for `lease`; returns `FLANNEL_MTU`.
    async fn setup(&mut self, lease: &Lease) -> Result<u32, BackendError>;

    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn apply(&mut self, change: &Change) -> Result<(), BackendError>;

    /// Restores state that went missing (deleted routes, ...). Called every period.
    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    /// Removes what `setup` made that must not outlive the daemon.
    async fn teardown(&mut self);
}

/// How the daemon wants the userspace engine run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineTuning {
    /// Worker threads (0 = one per CPU).
    pub workers: usize,
    /// Use TUN and UDP offloads when the kernel has them.
    pub offload: bool,
    /// Drop decapsulated packets from unknown peers or with spoofed sources.
    pub anti_spoof: bool,
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

/// Builds the backend named by the network config: the factory, the only
/// place naming the backends.
pub fn new(
    cfg: &Config,
    dataplane: DataplaneChoice,
    tuning: EngineTuning,
    nl: &Netlink,
) -> Result<Box<dyn Backend>, BackendError> {
    let opts = BackendOptions::from_config(&cfg.backend_type, cfg.backend.as_deref())
        .map_err(|e| match e {
            crate::config::backend::BackendError::UnknownType(t) => BackendError::Unknown(t),
            other => BackendError::Config(other.to_string()),
        })?;
    let kernel_only = |name: &str| {
        if dataplane == DataplaneChoice::Kernel {
            Err(BackendError::Unsupported(format!("{name} with --dataplane=kernel")))
        } else {
            Ok(())
        }
    };
    match opts {
        BackendOptions::Alloc => Ok(Box::new(alloc::Alloc::new())),
        BackendOptions::Udp(o) => {
            let network = cfg.network.filter(|_| cfg.enable_ipv4).ok_or_else(|| {
                BackendError::Config("the udp backend needs an IPv4 Network".into())
            })?;
            Ok(Box::new(udp::Udp::new(o, network, tuning, nl.clone())))
        }
        BackendOptions::Vxlan(o) => {
            // The kernel vxlan path is not built yet: auto runs userspace.
            kernel_only("vxlan")?;
            Ok(Box::new(vxlan::Vxlan::new(o, cfg.enable_ipv4, cfg.enable_ipv6, tuning, nl.clone())))
        }
        other => Err(BackendError::Unsupported(other.kind().name().to_string())),
    }
}
