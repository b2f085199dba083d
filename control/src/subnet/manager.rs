//! The subnet manager the daemon runs on: allocation and lease watching,
//! whatever the store. [`super::LocalManager`] implements it on any
//! [`crate::store::Registry`] (embedded, etcd); the Kubernetes manager
//! implements it on node objects.

use std::future::Future;

use tokio::sync::mpsc;

use super::SubnetError;
use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs, LeaseEvent};
use crate::store::StoreError;

/// What weftd needs from a subnet manager.
pub trait SubnetManager: Send + Sync + 'static {
    /// The name flanneld logs (`Created subnet manager: <name>`).
    fn name(&self) -> String;

    /// The lease the store still holds for this node, if any, before the new
    /// lease is taken: backends keep identities (a VTEP MAC) from it.
    fn previous_own_lease(
        &self,
        ext: &ExternalInterface,
    ) -> impl Future<Output = Option<Lease>> + Send;

    /// Takes (or re-takes) this node's lease, publishing `attrs`.
    fn acquire_lease(
        &self,
        attrs: &LeaseAttrs,
    ) -> impl Future<Output = Result<Lease, SubnetError>> + Send;

    /// Extends the lease; only called when it has an expiration.
    fn renew_lease(&self, lease: &Lease)
    -> impl Future<Output = Result<Lease, SubnetError>> + Send;

    /// Called once the node is set up (kube: NetworkUnavailable=False).
    fn complete_lease(
        &self,
        _lease: &Lease,
    ) -> impl Future<Output = Result<(), SubnetError>> + Send {
        async { Ok(()) }
    }

    /// Reports the peers weftd's overlay probes cannot reach (kube: the node
    /// condition `WeftPeersReachable`); called when the set changes.
    fn report_peers(
        &self,
        _unreachable: &[String],
    ) -> impl Future<Output = Result<(), SubnetError>> + Send {
        async { Ok(()) }
    }

    /// Every lease: a snapshot, then changes; a new snapshot after any gap.
    fn watch_leases(
        &self,
    ) -> impl Future<Output = Result<mpsc::Receiver<LeaseEvent>, StoreError>> + Send;
}
