//! The `udp` backend on weft's userspace engine, wire-compatible with
//! flannel's (spec §2.1, §3): TUN `flannel0` with `<subnet IP>/32`, MTU
//! ext − 28, route `Network dev flannel0`, bare IPv4 in UDP on port 8285.
//!
//! As in flannel, the lease carries no BackendType and no BackendData, every
//! node sends to `peerPublicIP:<its own Port>`, and peer leases are not
//! filtered by backend type. Unlike flannel's, it is fast and not amd64-only.
//!
//! `--tunnel-gso` (issue 32, [`gso`]): with `auto` or `on` the lease gets
//! weft's `WeftGSO` (this node takes UDP-tunnel GSO datagrams whole) and
//! the engine writes TCP super-packets whole to the tunnel TAP for peers
//! whose lease has it too; peers without it (flanneld, weft with `off`)
//! get the sockets' datagrams, since across an uplink that passes the skb
//! whole flanneld's socket would read one oversized datagram.

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net};
use weft_engine::Encap;

use super::tunnel::gso::{self, TunnelGso};
use super::tunnel::nat::TunnelNat;
use super::tunnel::{self, Tunnel, Userspace};
use super::{
    ApplyError, Backend, BackendError, Batch, Dataplane, EngineTuning, Observe, Prepared, Running,
    Setup,
};
use crate::backend::Missing;
use crate::config::backend::UdpOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs, NatAttrs};
use crate::view::BackendView;

/// See the module docs.
#[derive(Debug)]
pub struct Udp {
    opts: UdpOptions,
    network: Ipv4Net,
    tuning: EngineTuning,
    us: Userspace,
}

/// [`Udp`] with its lease attributes: what setup needs of the interface.
#[derive(Debug)]
struct Ready {
    udp: Udp,
    /// The interface's IPv4 address (the engine sends from it), MTU and
    /// name (the tunnel TAP's uplink).
    local: std::net::Ipv4Addr,
    iface_mtu: u32,
    uplink: String,
}

/// [`Udp`] running: its engine and TUN.
#[derive(Debug)]
struct Live {
    mtu: u32,
    tunnel: Option<Tunnel>,
    /// NAT traversal (docs/nat.md "vxlan and udp"), when on.
    nat: Option<TunnelNat>,
}

impl Udp {
    /// A udp backend for the IPv4 `network`.
    pub fn new(opts: UdpOptions, network: Ipv4Net, tuning: EngineTuning, us: Userspace) -> Udp {
        Udp {
            opts,
            network,
            tuning,
            us,
        }
    }
}

#[async_trait]
impl Backend for Udp {
    fn name(&self) -> &'static str {
        "udp"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        let attrs = LeaseAttrs {
            public_ip: ext.ext_addr.ok_or(BackendError::Missing {
                backend: "udp",
                what: Missing::PublicV4,
            })?,
            weft_nat: self.tuning.nat.then(NatAttrs::default),
            weft_gso: self.tuning.tunnel_gso != TunnelGso::Off,
            ..Default::default()
        };
        let local = ext.iface_addr.ok_or(BackendError::Missing {
            backend: "udp",
            what: Missing::InterfaceV4,
        })?;
        Ok(Prepared {
            attrs,
            backend: Box::new(Ready {
                udp: *self,
                local,
                iface_mtu: ext.iface.mtu,
                uplink: ext.iface.name.clone(),
            }),
        })
    }
}

#[async_trait]
impl Setup for Ready {
    async fn setup(self: Box<Self>, lease: &Lease) -> Result<Box<dyn Running>, BackendError> {
        let Ready {
            udp,
            local,
            iface_mtu,
            uplink,
        } = *self;
        let subnet = lease.subnet.ok_or(BackendError::Missing {
            backend: "udp",
            what: Missing::LeaseV4,
        })?;
        let mtu = iface_mtu.saturating_sub(28);
        let encap = Encap::FlannelUdp {
            port: udp.opts.port,
        };
        let tun_addr = Some(subnet.network().into());
        let cfg = (udp.tuning).engine("flannel%d".into(), encap, local.into(), tun_addr, mtu);
        let addr = IpNet::from(std::net::IpAddr::V4(subnet.network()));
        let (anti, mode) = (udp.tuning.anti_spoof, udp.tuning.tunnel_gso);
        let mut t = gso::start(&udp.us, cfg, (addr, mtu), anti, mode, &uplink).await?;
        t.add_route(IpNet::V4(udp.network), true).await?;
        let nat = udp.tuning.nat.then(|| {
            t.set_discovery(true, Vec::new());
            TunnelNat::new(lease.attrs.public_ip, udp.opts.port)
        });
        Ok(Box::new(Live {
            mtu,
            tunnel: Some(t),
            nat,
        }))
    }
}

impl Observe for Live {
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
impl Running for Live {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        let Some(t) = self.tunnel.as_mut() else {
            return Ok(());
        };
        for c in batch.changes {
            change(t, c, self.nat.as_mut());
        }
        nat_sync(t, self.nat.as_mut());
        t.flush();
        Ok(())
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        match self.tunnel.as_mut() {
            Some(t) => {
                nat_sync(t, self.nat.as_mut());
                t.reconcile().await
            }
            None => Ok(()),
        }
    }

    async fn teardown(&mut self) {
        if let Some(mut t) = self.tunnel.take() {
            t.stop().await;
        }
    }
}

/// Programs (`Add`) or removes (`Remove`) one peer, with its NAT path
/// when NAT traversal is on.
fn change(t: &mut Tunnel, change: &Change, nat: Option<&mut TunnelNat>) {
    match change {
        Change::Add(l) => {
            if let Some(s) = l.subnet {
                t.upsert_peer(IpNet::V4(s), l.attrs.public_ip.into(), None);
                t.set_peer_tunnel_gso(IpNet::V4(s), l.attrs.weft_gso);
                let path = nat.and_then(|n| n.path(l, true, t.seen()));
                t.set_nat(IpNet::V4(s), path);
            }
        }
        Change::Remove(l) => {
            if let Some(s) = l.subnet {
                if let Some(n) = nat {
                    n.path(l, false, None);
                }
                t.remove_peer(IpNet::V4(s));
            }
        }
    }
}

/// NAT traversal: discovery's servers to the engine, and every NAT peer's
/// path chosen again when this node's endpoint moved.
fn nat_sync(t: &mut Tunnel, nat: Option<&mut TunnelNat>) {
    let Some(n) = nat else {
        return;
    };
    for l in n.sync(t) {
        change(t, &Change::Add(l), Some(&mut *n));
    }
    t.flush();
}
