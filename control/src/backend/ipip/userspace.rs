//! The `ipip` backend on weft's userspace engine (`Encap::Ipip`: a raw
//! `IPPROTO_IPIP` socket), wire-compatible with flannel's kernel ipip nodes
//! (spec §2.4): IPv4-in-IPv4, outer source = this node's IfaceAddr, outer
//! destination = the peer's PublicIP, no extra header. For kernels without
//! the ipip driver; [`super::kernel`] is the kernel path.
//!
//! Same lease as the kernel path (`PublicIP = ExtAddr`, BackendType
//! `"ipip"`, no BackendData), so a node can switch between the two without
//! changing its lease. The device is a TUN named `flannel.ipip` with
//! `<subnet IP>/32` and MTU ext − 20, and one route per peer subnet
//! (`dev flannel.ipip`). With DirectRouting a peer on the external
//! interface's link is routed as the kernel path does it: `via <PublicIP>
//! dev <ext> onlink`. Peer leases of another BackendType are ignored.
//!
//! Anti-spoofing (`--anti-spoofing`, [`weft_engine::antispoof`]): in strict
//! mode IPIP packets are accepted only from a peer's PublicIP, with an inner
//! source in that peer's subnet, so a peer whose PublicIP is not the address
//! its packets leave from (`--public-ip` behind NAT) is dropped as
//! `unknown_peer`; the default (`subnet`) accepts it when the inner source
//! lies in a peer's subnet, and the daemon logs it once per peer.

use std::net::{IpAddr, Ipv4Addr};

use async_trait::async_trait;
use ipnet::IpNet;
use weft_engine::Encap;

use super::{DEVICE, accepts, device_addr, lease_attrs, local, mtu, route};
use crate::backend::tunnel::{self, Tunnel, Userspace, recover_routes};
use crate::backend::{
    ApplyError, Backend, BackendError, Batch, Dataplane, EngineTuning, Observe, Prepared, Running,
    Setup,
};
use crate::config::backend::IpipOptions;
use crate::iface::ExternalInterface;
use crate::lease::Lease;
use crate::lease::watcher::Change;
use crate::netlink::Route;

/// See the module docs: the backend as the factory builds it.
#[derive(Debug)]
pub struct IpipUser {
    opts: IpipOptions,
    tuning: EngineTuning,
    us: Userspace,
}

/// [`IpipUser`] with its lease attributes.
#[derive(Debug)]
struct Ready {
    user: IpipUser,
    ext: ExternalInterface,
}

/// [`IpipUser`] running: its engine and TUN.
#[derive(Debug)]
struct Live {
    opts: IpipOptions,
    us: Userspace,
    ext: ExternalInterface,
    tunnel: Option<Tunnel>,
    /// Direct routes installed for on-link peers (DirectRouting).
    direct: Vec<Route>,
}

impl IpipUser {
    /// A userspace ipip backend.
    pub fn new(opts: IpipOptions, tuning: EngineTuning, us: Userspace) -> IpipUser {
        IpipUser { opts, tuning, us }
    }
}

/// The route the kernel path installs for an on-link peer with DirectRouting.
fn direct_route(
    opts: &IpipOptions,
    ext: &ExternalInterface,
    subnet: IpNet,
    public: Ipv4Addr,
) -> Option<Route> {
    let on_link = ext
        .connected
        .iter()
        .any(|n| n.contains(&IpAddr::V4(public)));
    (opts.direct_routing && on_link).then(|| route(subnet, public, ext.iface.index))
}

impl Live {
    async fn remove_direct(&mut self, subnet: IpNet) {
        if let Some(i) = self.direct.iter().position(|r| r.dst == subnet) {
            let r = self.direct.remove(i);
            if let Err(e) = self.us.nl.route_del(&r).await {
                tracing::error!("Error deleting route to {subnet}: {e}");
            }
        }
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "ipip"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }

    fn view(&self) -> crate::view::BackendView {
        tunnel::view(self.name(), &self.tunnel)
    }
}

#[async_trait]
impl Backend for IpipUser {
    fn name(&self) -> &'static str {
        "ipip"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        let attrs = lease_attrs(&self.opts, ext)?;
        Ok(Prepared {
            attrs,
            backend: Box::new(Ready {
                user: *self,
                ext: ext.clone(),
            }),
        })
    }
}

#[async_trait]
impl Setup for Ready {
    async fn setup(self: Box<Self>, lease: &Lease) -> Result<Box<dyn Running>, BackendError> {
        let Ready { user, ext } = *self;
        let addr = device_addr(lease)?;
        let local = IpAddr::V4(local(&ext)?);
        let mtu = mtu(&ext);
        let cfg = (user.tuning).engine(DEVICE.into(), Encap::Ipip, local, Some(addr.addr()), mtu);
        let t = Tunnel::start(&user.us, cfg, addr, mtu, user.tuning.anti_spoof).await?;
        Ok(Box::new(Live {
            opts: user.opts,
            us: user.us,
            ext,
            tunnel: Some(t),
            direct: Vec::new(),
        }))
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
        if let Some(t) = self.tunnel.as_mut() {
            t.flush();
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        if let Some(t) = self.tunnel.as_mut() {
            t.reconcile().await?;
        }
        recover_routes(&*self.us.nl, &self.direct).await?;
        Ok(())
    }

    async fn teardown(&mut self) {
        if let Some(mut t) = self.tunnel.take() {
            t.stop().await;
        }
    }

    async fn remove_all(&mut self) {
        self.teardown().await;
        for r in std::mem::take(&mut self.direct) {
            let _ = self.us.nl.route_del(&r).await;
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
                let Some(s) = l.subnet else { return Ok(()) };
                let subnet = IpNet::V4(s);
                let direct = direct_route(&self.opts, &self.ext, subnet, l.attrs.public_ip);
                let Some(t) = self.tunnel.as_mut() else {
                    return Ok(());
                };
                // The engine knows every peer (also direct ones: their IPIP packets stay acceptable).
                t.upsert_peer(subnet, IpAddr::V4(l.attrs.public_ip), None);
                match direct {
                    Some(r) => {
                        t.del_route(subnet).await?;
                        self.us.nl.route_replace(&r).await?;
                        self.direct.retain(|d| d.dst != subnet);
                        self.direct.push(r);
                    }
                    None => {
                        self.remove_direct(subnet).await;
                        if let Some(t) = self.tunnel.as_mut() {
                            t.add_route(subnet, false).await?;
                        }
                    }
                }
            }
            Change::Remove(l) => {
                let Some(s) = l.subnet else { return Ok(()) };
                let subnet = IpNet::V4(s);
                if let Some(t) = self.tunnel.as_mut() {
                    t.remove_peer(subnet);
                    if let Err(e) = t.del_route(subnet).await {
                        tracing::error!("Error deleting route to {s}: {e}");
                    }
                }
                self.remove_direct(subnet).await;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::test_util::{block_on, ext, fake, lease, up};
    use crate::backend::tunnel::fake::FakeEngines;

    fn tuning() -> EngineTuning {
        EngineTuning {
            nat: false,
            relay: None,
            tunnel_gso: Default::default(),
            workers: 1,
            offload: true,
            anti_spoof: weft_engine::AntiSpoofing::Strict,
        }
    }

    #[test]
    fn lease_is_the_kernel_paths() {
        block_on(async {
            let mut e = ext();
            e.ext_addr = Some(Ipv4Addr::new(198, 51, 100, 1));
            let (_, us) = FakeEngines::new(&fake(&[], false));
            let u = Box::new(IpipUser::new(IpipOptions::default(), tuning(), us));
            let k = Box::new(super::super::kernel::Ipip::new(
                IpipOptions::default(),
                fake(&["ipip"], false),
            ));
            let a = u.lease_attrs(&e, None).await.expect("attrs").attrs;
            let ka = k.lease_attrs(&e, None).await.expect("kernel attrs").attrs;
            assert_eq!(a, ka);
            assert_eq!(a.public_ip, Ipv4Addr::new(198, 51, 100, 1));
            assert_eq!(a.backend_type, "ipip");
            assert_eq!(a.backend_data, None);
        });
    }

    /// The factory: `auto` runs the kernel path when the probe finds ipip, else this engine path.
    #[test]
    fn auto_falls_back_to_the_engine_without_the_ipip_driver() {
        use crate::backend::{DataplaneChoice, Kernel, build};
        block_on(async {
            let cfg = crate::config::parse_config(
                br#"{"Network":"10.244.0.0/16","Backend":{"Type":"ipip"}}"#,
            )
            .expect("config");
            let cases: [(&[&'static str], DataplaneChoice, Option<&str>); 4] = [
                (&[], DataplaneChoice::Auto, Some("userspace")),
                (&["ipip"], DataplaneChoice::Auto, Some("kernel")),
                (&["ipip"], DataplaneChoice::Userspace, Some("userspace")),
                (&[], DataplaneChoice::Kernel, None),
            ];
            for (kinds, choice, want) in cases {
                let f = fake(kinds, false);
                let kernel = Kernel {
                    client: f.clone(),
                    xfrm: f.clone(),
                    wg: f.clone(),
                    vxlan_tx_csum: Default::default(),
                };
                let (_, us) = FakeEngines::new(&f);
                let b = build(&cfg, choice, tuning(), &us, kernel).expect("backend");
                let own = lease("10.244.1.0/24", "192.0.2.1", "ipip", None);
                let ran = match b.lease_attrs(&ext(), None).await {
                    Ok(p) => Some(p.backend.setup(&own).await.expect("setup")),
                    Err(_) => None,
                };
                assert_eq!(
                    ran.map(|b| Dataplane::name(b.dataplane())),
                    want,
                    "{kinds:?} {choice:?}"
                );
            }
        });
    }

    #[test]
    fn direct_routing_only_for_on_link_peers() {
        block_on(async {
            let direct = IpipOptions {
                direct_routing: true,
            };
            let sn: IpNet = "10.244.2.0/24".parse().expect("cidr");
            let r = direct_route(&direct, &ext(), sn, Ipv4Addr::new(192, 0, 2, 2))
                .expect("on-link peer");
            assert_eq!(
                (r.gateway, r.oif, r.onlink),
                (Some(IpAddr::from([192, 0, 2, 2])), Some(2), true)
            );
            assert_eq!(
                direct_route(&direct, &ext(), sn, Ipv4Addr::new(203, 0, 113, 2)),
                None,
                "off-link peer"
            );
            assert_eq!(
                direct_route(
                    &IpipOptions::default(),
                    &ext(),
                    sn,
                    Ipv4Addr::new(192, 0, 2, 2)
                ),
                None,
                "DirectRouting off"
            );
            // And the running backend uses it: the on-link peer is routed around the TUN.
            let f = fake(&[], false);
            let (_, us) = FakeEngines::new(&f);
            let own = lease("10.244.1.0/24", "192.0.2.1", "ipip", None);
            let mut b = up(IpipUser::new(direct, tuning(), us), &own)
                .await
                .expect("up");
            let peer = lease("10.244.2.0/24", "192.0.2.2", "ipip", None);
            b.apply(Batch::one(&Change::Add(peer))).await.expect("add");
            assert!(f.routes().contains(&r), "{:?}", f.routes());
        });
    }
}
