//! The `host-gw` backend (fl:pkg/backend/hostgw, spec §2.3, §4.5): no
//! encapsulation and no device; per peer a route `<peer subnet> via <peer
//! PublicIP> dev <ext iface>` (IPv4 and IPv6), checked every period.
//!
//! Like flannel it refuses to run behind NAT (public IP ≠ interface IP), and
//! like flannel it leaves its routes in place on exit, so that a restart does
//! not interrupt pod traffic.

use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::IpNet;

use super::route_set::RouteSet;
use super::{
    ApplyError, Backend, BackendError, Batch, Dataplane, Observe, Prepared, Running, Setup,
};
use crate::backend::Missing;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{Client, Route};

/// flannel's refusal text.
pub const NAT_ERROR: &str = "your PublicIP differs from interface IP, meaning that probably you're on a NAT, which is not supported by host-gw backend";

/// See the module docs. Built by the factory, prepared by
/// [`Backend::lease_attrs`] and running after [`Setup::setup`] (it needs no
/// device: the stages differ only in what they know).
#[derive(Debug)]
pub struct HostGw {
    v4: bool,
    v6: bool,
    nl: Arc<dyn Client>,
}

/// A running (or prepared) host-gw backend.
#[derive(Debug)]
struct Live {
    v4: bool,
    v6: bool,
    ext: ExternalInterface,
    routes: RouteSet,
}

impl HostGw {
    /// A host-gw backend for the enabled families.
    pub fn new(v4: bool, v6: bool, nl: Arc<dyn Client>) -> HostGw {
        HostGw { v4, v6, nl }
    }
}

impl Live {
    fn route(&self, dst: IpNet, gw: IpAddr) -> Route {
        Route {
            dst,
            gateway: Some(gw),
            oif: Some(self.ext.iface.index),
            onlink: false,
            scope_link: false,
        }
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "host-gw"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Kernel)
    }
}

#[async_trait]
impl Backend for HostGw {
    fn name(&self) -> &'static str {
        "host-gw"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        if ext.ext_addr != ext.iface_addr {
            return Err(BackendError::Config(NAT_ERROR.into()));
        }
        let mut attrs = LeaseAttrs {
            backend_type: "host-gw".into(),
            ..Default::default()
        };
        if self.v4 {
            attrs.public_ip = ext.ext_addr.ok_or(BackendError::Missing {
                backend: "host-gw",
                what: Missing::PublicV4,
            })?;
        }
        if self.v6 {
            attrs.public_ipv6 = Some(ext.ext_v6_addr.ok_or(BackendError::Missing {
                backend: "host-gw",
                what: Missing::PublicV6,
            })?);
        }
        let live = Live {
            v4: self.v4,
            v6: self.v6,
            ext: ext.clone(),
            routes: RouteSet::new(self.nl),
        };
        Ok(Prepared {
            attrs,
            backend: Box::new(live),
        })
    }
}

#[async_trait]
impl Setup for Live {
    async fn setup(self: Box<Self>, _lease: &Lease) -> Result<Box<dyn Running>, BackendError> {
        Ok(self)
    }
}

#[async_trait]
impl Running for Live {
    fn mtu(&self) -> u32 {
        self.ext.iface.mtu
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        let mut out = ApplyError::default();
        for (i, c) in batch.changes.iter().enumerate() {
            out.record(i, self.change(c).await);
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        self.routes.reconcile().await?;
        Ok(())
    }

    async fn teardown(&mut self) {}

    async fn remove_all(&mut self) {
        self.routes.clear().await;
    }
}

impl Live {
    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        match change {
            Change::Add(l) => {
                if l.attrs.backend_type != "host-gw" {
                    tracing::warn!("Ignoring non-host-gw subnet: type={}", l.attrs.backend_type);
                    return Ok(());
                }
                let mut want = Vec::new();
                if let (true, Some(s)) = (self.v4, l.subnet) {
                    want.push(self.route(IpNet::V4(s), IpAddr::V4(l.attrs.public_ip)));
                }
                if let (true, Some(s), Some(gw)) = (self.v6, l.ipv6_subnet, l.attrs.public_ipv6) {
                    want.push(self.route(IpNet::V6(s), IpAddr::V6(gw)));
                }
                for r in want {
                    self.routes.add(r).await?;
                }
            }
            Change::Remove(l) => {
                let dsts = l
                    .subnet
                    .map(IpNet::V4)
                    .into_iter()
                    .chain(l.ipv6_subnet.map(IpNet::V6));
                for dst in dsts {
                    if let Err(e) = self.routes.remove(dst).await {
                        tracing::error!("Error deleting route to {dst}: {e}");
                    }
                }
            }
        }
        Ok(())
    }
}
