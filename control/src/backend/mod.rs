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

use async_trait::async_trait;

use crate::config::Config;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::NetlinkError;

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

    /// The attributes this node publishes in its lease.
    async fn lease_attrs(&mut self, ext: &ExternalInterface) -> Result<LeaseAttrs, BackendError>;

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

/// Builds the backend named by the network config.
pub fn new(cfg: &Config, ext: &ExternalInterface) -> Result<Box<dyn Backend>, BackendError> {
    let kind = cfg.backend_type.as_str();
    match kind {
        "alloc" => Ok(Box::new(alloc::Alloc::new(ext.iface.mtu))),
        "udp" | "vxlan" | "host-gw" | "ipip" | "ipsec" | "wireguard" | "extension" | "tencent-vpc" => {
            Err(BackendError::Unsupported(kind.to_string()))
        }
        other => Err(BackendError::Unknown(other.to_string())),
    }
}
