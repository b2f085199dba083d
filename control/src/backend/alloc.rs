//! The `alloc` backend: takes a lease and forwards nothing (flannel
//! pkg/backend/alloc). `FLANNEL_MTU` is the external interface's MTU.

use async_trait::async_trait;

use super::{
    ApplyError, Backend, BackendError, Batch, Dataplane, DataplaneChoice, Observe, Switch,
};
use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Alloc {
    mtu: u32,
}

impl Alloc {
    /// An alloc backend.
    pub fn new() -> Alloc {
        Alloc::default()
    }
}

impl Observe for Alloc {
    fn name(&self) -> &'static str {
        "alloc"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        None
    }
}

#[async_trait]
impl Backend for Alloc {
    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError> {
        self.mtu = ext.iface.mtu;
        // flannel: PublicIP = ExtAddr, no BackendType, no BackendData.
        Ok(LeaseAttrs {
            public_ip: ext.ext_addr.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
            public_ipv6: ext.ext_v6_addr,
            ..Default::default()
        })
    }

    async fn setup(&mut self, _lease: &Lease) -> Result<u32, BackendError> {
        Ok(self.mtu)
    }

    async fn apply(&mut self, _batch: Batch<'_>) -> Result<(), ApplyError> {
        Ok(())
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn teardown(&mut self) {}
}

/// alloc has no dataplane to switch.
#[async_trait]
impl Switch for Alloc {
    fn switch_pending(&self) -> Option<std::time::SystemTime> {
        None
    }

    async fn switch_dataplane(&mut self, _to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        Err(BackendError::Unsupported(format!(
            "switching the dataplane of {}",
            self.name()
        )))
    }
}
