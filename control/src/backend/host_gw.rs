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

use super::dual::Implementation;
use super::route_set::RouteSet;
use super::{ApplyError, Backend, BackendError, Batch, Dataplane, Observe};
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::{Client, Route};

/// flannel's refusal text.
pub const NAT_ERROR: &str = "your PublicIP differs from interface IP, meaning that probably you're on a NAT, which is not supported by host-gw backend";

/// See the module docs.
#[derive(Debug)]
pub struct HostGw {
    v4: bool,
    v6: bool,
    ext: Option<ExternalInterface>,
    routes: RouteSet,
}

impl HostGw {
    /// A host-gw backend for the enabled families.
    pub fn new(v4: bool, v6: bool, nl: Arc<dyn Client>) -> HostGw {
        HostGw {
            v4,
            v6,
            ext: None,
            routes: RouteSet::new(nl),
        }
    }

    fn route(&self, dst: IpNet, gw: IpAddr) -> Option<Route> {
        let oif = self.ext.as_ref()?.iface.index;
        Some(Route {
            dst,
            gateway: Some(gw),
            oif: Some(oif),
            onlink: false,
            scope_link: false,
        })
    }
}

impl Observe for HostGw {
    fn name(&self) -> &'static str {
        "host-gw"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Kernel)
    }
}

#[async_trait]
impl Backend for HostGw {
    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError> {
        if ext.ext_addr != ext.iface_addr {
            return Err(BackendError::Config(NAT_ERROR.into()));
        }
        self.ext = Some(ext.clone());
        let mut attrs = LeaseAttrs {
            backend_type: "host-gw".into(),
            ..Default::default()
        };
        if self.v4 {
            attrs.public_ip = ext
                .ext_addr
                .ok_or_else(|| BackendError::Config("host-gw: no IPv4 public address".into()))?;
        }
        if self.v6 {
            attrs.public_ipv6 =
                Some(ext.ext_v6_addr.ok_or_else(|| {
                    BackendError::Config("host-gw: no IPv6 public address".into())
                })?);
        }
        Ok(attrs)
    }

    async fn setup(&mut self, _lease: &Lease) -> Result<u32, BackendError> {
        let ext = self
            .ext
            .as_ref()
            .ok_or_else(|| BackendError::Config("setup before lease_attrs".into()))?;
        Ok(ext.iface.mtu)
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
}

#[async_trait]
impl Implementation for HostGw {
    async fn remove_all(&mut self) {
        self.routes.clear().await;
    }
}

impl HostGw {
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
                    want.extend(self.route(IpNet::V4(s), IpAddr::V4(l.attrs.public_ip)));
                }
                if let (true, Some(s), Some(gw)) = (self.v6, l.ipv6_subnet, l.attrs.public_ipv6) {
                    want.extend(self.route(IpNet::V6(s), IpAddr::V6(gw)));
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
