//! The `vxlan` backend on weft's userspace engine, wire-compatible with
//! Linux kernel vxlan peers configured the way flannel configures them
//! (spec §2.2, §4): VNI (default 1), UDP port 8472, inner Ethernet from our
//! VTEP MAC to the peer's, lease BackendData `{"VNI":1,"VtepMAC":"..."}`.
//!
//! Devices are TUNs named like flannel's: `flannel.<VNI>` (IPv4) and
//! `flannel-v6.<VNI>` (IPv6), each with `<subnet IP>/32` (`/128`), the MTUs
//! of [`Mtus`] (cfg.MTU − 50 for IPv4, − 70 for IPv6), and one route per peer subnet. With DirectRouting, a peer on
//! the same link is reached by a plain route via its public IP, as flannel does.
//!
//! The VTEP MAC persists across restarts (flannel loses it in etcd mode): it
//! is taken from this node's previous lease when that has one, else derived
//! from the node's public IP and the VNI, so it is stable without state.
//!
//! NAT traversal (`--nat-traversal` / `WeftNATTraversal`, docs/nat.md
//! "vxlan and udp", [`TunnelNat`]): the lease gets `WeftNAT`, the IPv4
//! engine discovers this node's endpoint on the VXLAN port, and peers with
//! `WeftNAT` get their path (`punched` to their published endpoint, kept
//! alive) from the lease store.

use std::net::IpAddr;

use async_trait::async_trait;
use ipnet::IpNet;
use weft_engine::Encap;

use super::{Mtus, direct_route, lease_attrs, log_config, peer_change};
use crate::backend::Missing;
use crate::backend::tunnel::gso;
use crate::backend::tunnel::nat::TunnelNat;
use crate::backend::tunnel::{self, Tunnel, Userspace, recover_routes};
use crate::backend::{
    ApplyError, Backend, BackendError, Batch, Dataplane, EngineTuning, Observe, Prepared, Running,
    Setup,
};
use crate::config::backend::VxlanOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, NatAttrs};
use crate::netlink::Route;

/// One address family's device.
#[derive(Debug)]
struct Family {
    mac: [u8; 6],
    tunnel: Option<Tunnel>,
}

/// See the module docs: the backend as the factory builds it.
#[derive(Debug)]
pub struct Vxlan {
    opts: VxlanOptions,
    v4: bool,
    v6: bool,
    tuning: EngineTuning,
    us: Userspace,
}

/// A userspace vxlan backend with its lease attributes ([`Setup`]) and, once
/// set up, running.
#[derive(Debug)]
struct Live {
    opts: VxlanOptions,
    v4: Option<Family>,
    v6: Option<Family>,
    ext: ExternalInterface,
    tuning: EngineTuning,
    us: Userspace,
    /// `FLANNEL_MTU`.
    mtu: u32,
    /// Direct routes installed for on-link peers (DirectRouting).
    direct: Vec<Route>,
    /// NAT traversal (IPv4), when on.
    nat: Option<TunnelNat>,
}

impl Vxlan {
    /// A userspace vxlan backend for the enabled families.
    pub fn new(
        opts: VxlanOptions,
        v4: bool,
        v6: bool,
        tuning: EngineTuning,
        us: Userspace,
    ) -> Vxlan {
        Vxlan {
            opts,
            v4,
            v6,
            tuning,
            us,
        }
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "vxlan"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }

    fn view(&self) -> crate::view::BackendView {
        let families = [&self.v4, &self.v6].into_iter().flatten();
        tunnel::view(self.name(), families.filter_map(|f| f.tunnel.as_ref()))
    }
}

#[async_trait]
impl Backend for Vxlan {
    fn name(&self) -> &'static str {
        "vxlan"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        if self.opts.gbp {
            return Err(BackendError::Config(
                "VXLAN GBP is not supported by the userspace engine".into(),
            ));
        }
        log_config(&self.opts);
        let (mut attrs, vteps) = lease_attrs(self.opts.vni, ext, prev, self.v4, self.v6)?;
        let nat = match ext.ext_addr {
            Some(own) if self.tuning.nat && self.v4 => {
                attrs.weft_nat = Some(NatAttrs::default());
                Some(TunnelNat::new(own, self.opts.effective_port()))
            }
            _ => None,
        };
        let fam = |mac: Option<[u8; 6]>| mac.map(|mac| Family { mac, tunnel: None });
        let live = Live {
            v4: fam(vteps.v4.filter(|_| self.v4)),
            v6: fam(vteps.v6.filter(|_| self.v6)),
            mtu: Mtus::new(ext.backend_mtu(self.opts.mtu), self.v6).env,
            opts: self.opts,
            ext: ext.clone(),
            tuning: self.tuning,
            us: self.us,
            direct: Vec::new(),
            nat,
        };
        Ok(Prepared {
            attrs,
            backend: Box::new(live),
        })
    }
}

#[async_trait]
impl Setup for Live {
    async fn setup(mut self: Box<Self>, lease: &Lease) -> Result<Box<dyn Running>, BackendError> {
        let ext = &self.ext;
        let mtus = Mtus::new(ext.backend_mtu(self.opts.mtu), self.v6.is_some());
        let (vni, port, tuning) = (self.opts.vni, self.opts.effective_port(), self.tuning);
        let engine = |name: String, mac: [u8; 6], local: IpAddr, tun_addr: IpAddr, mtu: u32| {
            let encap = Encap::Vxlan {
                vni,
                port,
                local_mac: mac,
            };
            tuning.engine(name, encap, local, Some(tun_addr), mtu)
        };
        let (ext_v4, ext_v6) = (ext.ext_addr, ext.ext_v6_addr);
        if let (Some(f), Some(sn)) = (self.v4.as_mut(), lease.subnet) {
            let local = ext_v4.map(IpAddr::V4).ok_or(BackendError::Missing {
                backend: "vxlan",
                what: Missing::PublicV4,
            })?;
            let mtu = mtus.v4;
            let cfg = engine(
                format!("flannel.{vni}"),
                f.mac,
                local,
                sn.network().into(),
                mtu,
            );
            let addr = IpNet::from(IpAddr::V4(sn.network()));
            let (mode, uplink) = (tuning.tunnel_gso, &ext.iface.name);
            let t = gso::start(&self.us, cfg, (addr, mtu), tuning.anti_spoof, mode, uplink).await?;
            if self.nat.is_some() {
                t.set_discovery(true, Vec::new());
            }
            f.tunnel = Some(t);
        }
        if let (Some(f), Some(sn)) = (self.v6.as_mut(), lease.ipv6_subnet) {
            let local = ext_v6.map(IpAddr::V6).ok_or(BackendError::Missing {
                backend: "vxlan",
                what: Missing::PublicV6,
            })?;
            let cfg = engine(
                format!("flannel-v6.{vni}"),
                f.mac,
                local,
                sn.network().into(),
                mtus.v6,
            );
            let addr = IpNet::from(IpAddr::V6(sn.network()));
            f.tunnel = Some(Tunnel::start(&self.us, cfg, addr, mtus.v6, tuning.anti_spoof).await?);
        }
        Ok(self)
    }
}

#[async_trait]
impl Running for Live {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        let mut out = ApplyError::default();
        for (i, c) in batch.changes.iter().enumerate() {
            out.record(i, self.change(c).await);
        }
        for f in [self.v4.as_mut(), self.v6.as_mut()].into_iter().flatten() {
            if let Some(t) = f.tunnel.as_mut() {
                t.flush();
            }
        }
        if let Err(e) = self.nat_sync().await {
            // Retried at the next reconcile, which reports it.
            tracing::warn!("NAT: {e}");
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        self.nat_sync().await?;
        for f in [self.v4.as_mut(), self.v6.as_mut()].into_iter().flatten() {
            if let Some(t) = f.tunnel.as_mut() {
                t.reconcile().await?;
            }
        }
        recover_routes(&*self.us.nl, &self.direct).await?;
        Ok(())
    }

    async fn teardown(&mut self) {
        for f in [self.v4.as_mut(), self.v6.as_mut()].into_iter().flatten() {
            if let Some(mut t) = f.tunnel.take() {
                t.stop().await;
            }
        }
    }
}

impl Live {
    /// NAT traversal: discovery's servers to the engine, and every NAT
    /// peer's path chosen again when this node's endpoint moved.
    async fn nat_sync(&mut self) -> Result<(), BackendError> {
        let (Some(n), Some(t)) = (
            self.nat.as_mut(),
            self.v4.as_mut().and_then(|f| f.tunnel.as_mut()),
        ) else {
            return Ok(());
        };
        let again = n.sync(t);
        for l in again {
            self.change(&Change::Add(l)).await?;
        }
        if let Some(t) = self.v4.as_mut().and_then(|f| f.tunnel.as_mut()) {
            t.flush();
        }
        Ok(())
    }

    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        let Some((add, targets)) = peer_change(change) else {
            return Ok(());
        };
        let lease = match change {
            Change::Add(l) | Change::Remove(l) => l,
        };
        let direct = self.opts.direct_routing;
        let mut direct_routes = Vec::new();
        for target in targets {
            let subnet = target.subnet;
            let fam = match subnet {
                IpNet::V4(_) => self.v4.as_mut(),
                IpNet::V6(_) => self.v6.as_mut(),
            };
            let Some(t) = fam.and_then(|f| f.tunnel.as_mut()) else {
                continue;
            };
            let nat = match (subnet, self.nat.as_mut()) {
                (IpNet::V4(_), Some(n)) => n.path(lease, add, t.seen()),
                _ => None,
            };
            if !add {
                t.remove_peer(subnet);
                t.del_route(subnet).await?;
                direct_routes.push((subnet, None));
                continue;
            }
            let Some(endpoint) = target.public else {
                continue;
            };
            if direct && on_link(&self.ext, endpoint) {
                direct_routes.push((subnet, Some(endpoint)));
                continue;
            }
            let Some(mac) = target.vtep_mac() else {
                continue;
            };
            t.upsert_peer(subnet, endpoint, Some(mac));
            t.set_nat(subnet, nat);
            t.add_route(subnet, false).await?;
        }
        for (subnet, via) in direct_routes {
            self.direct.retain(|r| r.dst != subnet);
            let r = direct_route(subnet, via);
            match via {
                Some(_) => {
                    self.us.nl.route_replace(&r).await?;
                    self.direct.push(r);
                }
                None => {
                    let _ = self.us.nl.route_del(&r).await;
                }
            }
        }
        Ok(())
    }
}

/// Whether `ip` is on one of the external interface's connected prefixes
/// (flannel: `ip route get` gives a single route without a gateway).
fn on_link(ext: &ExternalInterface, ip: IpAddr) -> bool {
    ext.connected.iter().any(|n| n.contains(&ip))
}
