//! The `ipip` backend on the kernel's ipip driver (fl:pkg/backend/ipip,
//! spec §2.4, checklist 22): device `flannel.ipip` (local = interface IP,
//! remote any, MTU ext − 20, `<subnet IP>/32`, up) and per peer `ip route
//! replace <peer subnet> via <peer PublicIP> dev flannel.ipip onlink`; with
//! DirectRouting a peer on the same link is routed via the external interface
//! instead (onlink kept). IPv4 only. Routes are checked every period (§4.5).
//!
//! An existing `flannel.ipip` is reused when its local address matches and
//! its remote is "any", else recreated; a non-ipip link of that name is an
//! error (flannel's text). The device stays on exit.
//!
//! On a kernel without ipip, `--dataplane=auto` runs [`super::userspace`]
//! (the same wire format in weft's engine) instead (see [`crate::backend::probe`]).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::IpNet;

use super::{DEVICE, accepts, device_addr, lease_attrs, local, mtu, route};
use crate::backend::route_set::RouteSet;
use crate::backend::{
    ApplyError, Backend, BackendError, Batch, Dataplane, Observe, Prepared, Running, Setup,
};
use crate::config::backend::IpipOptions;
use crate::iface::ExternalInterface;
use crate::lease::Lease;
use crate::lease::watcher::Change;
use crate::netlink::{Client, IpipLink, LinkKind, LinkSpec, NetlinkError, Route};

/// See the module docs: the backend as the factory builds it.
#[derive(Debug)]
pub struct Ipip {
    opts: IpipOptions,
    nl: Arc<dyn Client>,
}

/// [`Ipip`] with its lease attributes.
#[derive(Debug)]
struct Ready {
    opts: IpipOptions,
    nl: Arc<dyn Client>,
    ext: ExternalInterface,
}

/// [`Ipip`] running: its device and routes.
#[derive(Debug)]
struct Live {
    opts: IpipOptions,
    nl: Arc<dyn Client>,
    ext: ExternalInterface,
    /// `flannel.ipip`'s index and address.
    index: u32,
    addr: IpNet,
    routes: RouteSet,
}

impl Ipip {
    /// A kernel ipip backend.
    pub fn new(opts: IpipOptions, nl: Arc<dyn Client>) -> Ipip {
        Ipip { opts, nl }
    }
}

impl Live {
    /// Creates or reuses `flannel.ipip`, sets MTU, address, up; returns the MTU.
    async fn bring_up(&mut self) -> Result<u32, BackendError> {
        let local = local(&self.ext)?;
        let want = mtu(&self.ext);
        let mut link = self.nl.link_detail(DEVICE).await?;
        if let Some(d) = &link {
            match d.kind {
                LinkKind::Ipip {
                    local: l,
                    remote: None,
                } if l == Some(local) => {}
                LinkKind::Ipip { .. } => {
                    tracing::warn!(
                        "{DEVICE} exists with a different local or remote address; recreating it"
                    );
                    self.nl.delete_link(d.link.index).await?;
                    link = None;
                }
                _ => {
                    return Err(BackendError::ForeignDevice {
                        name: DEVICE.into(),
                        why: "isn't an ipip mode device".into(),
                    });
                }
            }
        }
        if link.is_none() {
            self.nl
                .add_link(&LinkSpec::Ipip(IpipLink {
                    name: DEVICE.into(),
                    local,
                }))
                .await?;
            link = self.nl.link_detail(DEVICE).await?;
        }
        let d = link.ok_or_else(|| NetlinkError::NoSuchLink(DEVICE.into()))?;
        self.index = d.link.index;
        let mtu = (d.link.mtu > want || d.link.mtu == 0).then_some(want);
        let addr = self.addr;
        for a in self.nl.addrs_on(self.index).await? {
            if a.net != addr && a.net.addr().is_ipv4() {
                self.nl.remove_addr(self.index, a.net).await?;
            }
        }
        if !self
            .nl
            .addrs_on(self.index)
            .await?
            .iter()
            .any(|a| a.net == addr)
        {
            self.nl.add_addr(self.index, addr).await?;
        }
        self.nl.link_up(self.index, mtu).await?;
        Ok(want)
    }

    async fn route_for(&self, subnet: IpNet, public: Ipv4Addr) -> Route {
        let mut oif = self.index;
        if self.opts.direct_routing
            && let Ok(r) = self.nl.route_get(IpAddr::V4(public)).await
            && r.len() == 1
            && r[0].gateway.is_none()
        {
            oif = self.ext.iface.index;
        }
        route(subnet, public, oif)
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "ipip"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Kernel)
    }

    fn view(&self) -> crate::view::BackendView {
        let v = crate::view::BackendView::new(self.name(), self.dataplane());
        match self.index {
            0 => v,
            _ => v.device(crate::view::devices::KernelDevice::probe(DEVICE)),
        }
    }
}

#[async_trait]
impl Backend for Ipip {
    fn name(&self) -> &'static str {
        "ipip"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        let attrs = lease_attrs(&self.opts, ext)?;
        let ready = Ready {
            opts: self.opts,
            nl: self.nl,
            ext: ext.clone(),
        };
        Ok(Prepared {
            attrs,
            backend: Box::new(ready),
        })
    }
}

#[async_trait]
impl Setup for Ready {
    async fn setup(self: Box<Self>, lease: &Lease) -> Result<Box<dyn Running>, BackendError> {
        let Ready { opts, nl, ext } = *self;
        let mut live = Live {
            addr: device_addr(lease)?,
            routes: RouteSet::new(nl.clone()),
            opts,
            nl,
            ext,
            index: 0,
        };
        live.bring_up().await?;
        Ok(Box::new(live))
    }
}

#[async_trait]
impl Running for Live {
    fn mtu(&self) -> u32 {
        mtu(&self.ext)
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        let mut out = ApplyError::default();
        for (i, c) in batch.changes.iter().enumerate() {
            out.record(i, self.change(c).await);
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        let present = self.nl.link_detail(DEVICE).await?;
        if !present.is_some_and(|d| d.link.index == self.index && d.link.up) {
            tracing::warn!("{DEVICE} is gone or down; recreating it");
            let old = self.index;
            self.bring_up().await?;
            if old != self.index {
                let routes: Vec<Route> = self.routes.routes().cloned().collect();
                for mut r in routes {
                    if r.oif == Some(old) {
                        r.oif = Some(self.index);
                    }
                    self.routes.add(r).await?;
                }
            }
        }
        self.routes.reconcile().await?;
        Ok(())
    }

    async fn teardown(&mut self) {}

    async fn remove_all(&mut self) {
        self.routes.clear().await;
        if let Ok(Some(d)) = self.nl.link_detail(DEVICE).await {
            let _ = self.nl.delete_link(d.link.index).await;
        }
    }
}

impl Live {
    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        match change {
            Change::Add(l) => {
                if !accepts(l) {
                    return Ok(());
                }
                if let Some(s) = l.subnet {
                    let r = self.route_for(IpNet::V4(s), l.attrs.public_ip).await;
                    self.routes.add(r).await?;
                }
            }
            Change::Remove(l) => {
                if let Some(s) = l.subnet
                    && let Err(e) = self.routes.remove(IpNet::V4(s)).await
                {
                    tracing::error!("Error deleting route to {s}: {e}");
                }
            }
        }
        Ok(())
    }
}
