//! The `udp` backend on weft's userspace engine, wire-compatible with
//! flannel's (spec §2.1, §3): TUN `flannel0` with `<subnet IP>/32`, MTU
//! ext − 28, route `Network dev flannel0`, bare IPv4 in UDP on port 8285.
//!
//! As in flannel, the lease carries no BackendType and no BackendData, every
//! node sends to `peerPublicIP:<its own Port>`, and peer leases are not
//! filtered by backend type. Unlike flannel's, it is fast and not amd64-only.

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net};
use weft_engine::Encap;

use super::dual::Implementation;
use super::tunnel::{self, Tunnel, Userspace};
use super::{ApplyError, Backend, BackendError, Batch, Dataplane, EngineTuning, Observe};
use crate::config::backend::UdpOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::view::BackendView;

/// See the module docs.
#[derive(Debug)]
pub struct Udp {
    opts: UdpOptions,
    network: Ipv4Net,
    ext: Option<ExternalInterface>,
    tuning: EngineTuning,
    us: Userspace,
    tunnel: Option<Tunnel>,
}

impl Udp {
    /// A udp backend for the IPv4 `network`.
    pub fn new(opts: UdpOptions, network: Ipv4Net, tuning: EngineTuning, us: Userspace) -> Udp {
        Udp {
            opts,
            network,
            ext: None,
            tuning,
            us,
            tunnel: None,
        }
    }
}

impl Observe for Udp {
    fn name(&self) -> &'static str {
        "udp"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }

    fn view(&self) -> BackendView {
        tunnel::view(self.name(), &self.tunnel)
    }
}

#[async_trait]
impl Backend for Udp {
    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError> {
        self.ext = Some(ext.clone());
        Ok(LeaseAttrs {
            public_ip: ext
                .ext_addr
                .ok_or_else(|| BackendError::Config("udp backend needs IPv4".into()))?,
            ..Default::default()
        })
    }

    async fn setup(&mut self, lease: &Lease) -> Result<u32, BackendError> {
        let ext = self
            .ext
            .as_ref()
            .ok_or_else(|| BackendError::Config("setup before lease_attrs".into()))?;
        let subnet = lease
            .subnet
            .ok_or_else(|| BackendError::Config("udp backend needs an IPv4 lease".into()))?;
        let local = ext.iface_addr.ok_or_else(|| {
            BackendError::Config("udp backend needs an IPv4 interface address".into())
        })?;
        let mtu = ext.iface.mtu.saturating_sub(28);
        let encap = Encap::FlannelUdp {
            port: self.opts.port,
        };
        let tun_addr = Some(subnet.network().into());
        let cfg = (self.tuning).engine("flannel%d".into(), encap, local.into(), tun_addr, mtu);
        let addr = IpNet::from(std::net::IpAddr::V4(subnet.network()));
        let mut t = Tunnel::start(&self.us, cfg, addr, mtu, self.tuning.anti_spoof).await?;
        t.add_route(IpNet::V4(self.network), true).await?;
        self.tunnel = Some(t);
        Ok(mtu)
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        let mut out = ApplyError::default();
        for (i, c) in batch.changes.iter().enumerate() {
            out.record(i, self.change(c).await);
        }
        if let Some(t) = self.tunnel.as_mut() {
            t.flush();
        }

        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        match self.tunnel.as_mut() {
            Some(t) => t.reconcile().await,
            None => Ok(()),
        }
    }

    async fn teardown(&mut self) {
        if let Some(mut t) = self.tunnel.take() {
            t.stop().await;
        }
    }
}

#[async_trait]
impl Implementation for Udp {}

impl Udp {
    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        let Some(t) = self.tunnel.as_mut() else {
            return Ok(());
        };
        match change {
            Change::Add(l) => {
                if let Some(s) = l.subnet {
                    t.upsert_peer(IpNet::V4(s), l.attrs.public_ip.into(), None);
                }
            }
            Change::Remove(l) => {
                if let Some(s) = l.subnet {
                    t.remove_peer(IpNet::V4(s));
                }
            }
        }
        Ok(())
    }
}
