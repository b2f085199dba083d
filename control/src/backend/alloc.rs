//! The `alloc` backend: takes a lease and forwards nothing (flannel
//! pkg/backend/alloc). `FLANNEL_MTU` is the external interface's MTU.

use async_trait::async_trait;

use super::{
    ApplyError, Backend, BackendError, Batch, Dataplane, DataplaneChoice, Observe, Prepared,
    Running, Setup, Switch,
};
use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs};

/// See the module docs.
#[derive(Debug, Default)]
pub struct Alloc;

/// alloc once its lease attributes are known, and running.
#[derive(Debug)]
struct Ready {
    mtu: u32,
}

impl Alloc {
    /// An alloc backend.
    pub fn new() -> Alloc {
        Alloc
    }
}

#[async_trait]
impl Backend<dyn Switch> for Alloc {
    fn name(&self) -> &'static str {
        "alloc"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared<dyn Switch>, BackendError> {
        // flannel: PublicIP = ExtAddr, no BackendType, no BackendData.
        let attrs = LeaseAttrs {
            public_ip: ext.ext_addr.unwrap_or(std::net::Ipv4Addr::UNSPECIFIED),
            public_ipv6: ext.ext_v6_addr,
            ..Default::default()
        };
        Ok(Prepared {
            attrs,
            backend: Box::new(Ready { mtu: ext.iface.mtu }),
        })
    }
}

#[async_trait]
impl Setup<dyn Switch> for Ready {
    async fn setup(self: Box<Self>, _lease: &Lease) -> Result<Box<dyn Switch>, BackendError> {
        Ok(self)
    }
}

impl Observe for Ready {
    fn name(&self) -> &'static str {
        "alloc"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        None
    }
}

#[async_trait]
impl Running for Ready {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    async fn apply(&mut self, _batch: Batch<'_>) -> Result<(), ApplyError> {
        Ok(())
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }

    async fn teardown(&mut self) {}
}

/// alloc has no dataplane to switch and nothing to rebuild.
#[async_trait]
impl Switch for Ready {
    fn switch_pending(&self) -> Option<std::time::SystemTime> {
        None
    }

    async fn switch_dataplane(&mut self, _to: DataplaneChoice) -> Result<Dataplane, BackendError> {
        Err(BackendError::Unsupported(format!(
            "switching the dataplane of {}",
            self.name()
        )))
    }

    async fn rebuild(&mut self, _lease: &Lease) -> Result<(), BackendError> {
        Ok(())
    }
}
