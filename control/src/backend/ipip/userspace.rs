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
use crate::backend::dual::Implementation;
use crate::backend::tunnel::{self, Tunnel, Userspace, recover_routes};
use crate::backend::{ApplyError, Backend, BackendError, Batch, Dataplane, EngineTuning, Observe};
use crate::config::backend::IpipOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::Route;

/// See the module docs.
#[derive(Debug)]
pub struct IpipUser {
    opts: IpipOptions,
    tuning: EngineTuning,
    us: Userspace,
    ext: Option<ExternalInterface>,
    tunnel: Option<Tunnel>,
    /// Direct routes installed for on-link peers (DirectRouting).
    direct: Vec<Route>,
}

impl IpipUser {
    /// A userspace ipip backend.
    pub fn new(opts: IpipOptions, tuning: EngineTuning, us: Userspace) -> IpipUser {
        IpipUser {
            opts,
            tuning,
            us,
            ext: None,
            tunnel: None,
            direct: Vec::new(),
        }
    }

    fn ext(&self) -> Result<&ExternalInterface, BackendError> {
        self.ext
            .as_ref()
            .ok_or_else(|| BackendError::Config("setup before lease_attrs".into()))
    }

    /// The route the kernel path installs for an on-link peer with DirectRouting.
    fn direct_route(&self, subnet: IpNet, public: Ipv4Addr) -> Option<Route> {
        let ext = self.ext.as_ref()?;
        let on_link = ext
            .connected
            .iter()
            .any(|n| n.contains(&IpAddr::V4(public)));
        (self.opts.direct_routing && on_link).then(|| route(subnet, public, ext.iface.index))
    }

    async fn remove_direct(&mut self, subnet: IpNet) {
        if let Some(i) = self.direct.iter().position(|r| r.dst == subnet) {
            let r = self.direct.remove(i);
            if let Err(e) = self.us.nl.route_del(&r).await {
                tracing::error!("Error deleting route to {subnet}: {e}");
            }
        }
    }
}

impl Observe for IpipUser {
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
    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError> {
        self.ext = Some(ext.clone());
        lease_attrs(&self.opts, ext)
    }

    async fn setup(&mut self, lease: &Lease) -> Result<u32, BackendError> {
        let ext = self.ext()?;
        let addr = device_addr(lease)?;
        let local = local(ext)?;
        let mtu = mtu(ext);
        let local = IpAddr::V4(local);
        let cfg = (self.tuning).engine(DEVICE.into(), Encap::Ipip, local, Some(addr.addr()), mtu);
        self.tunnel = Some(Tunnel::start(&self.us, cfg, addr, mtu, self.tuning.anti_spoof).await?);
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
}

#[async_trait]
impl Implementation for IpipUser {
    async fn remove_all(&mut self) {
        self.teardown().await;
        for r in std::mem::take(&mut self.direct) {
            let _ = self.us.nl.route_del(&r).await;
        }
    }
}

impl IpipUser {
    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        match change {
            Change::Add(l) => {
                if !accepts(l) {
                    return Ok(());
                }
                let Some(s) = l.subnet else { return Ok(()) };
                let subnet = IpNet::V4(s);
                let direct = self.direct_route(subnet, l.attrs.public_ip);
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
    use crate::backend::test_util::{block_on, ext, fake};
    use crate::backend::tunnel::fake::FakeEngines;

    fn tuning() -> EngineTuning {
        EngineTuning {
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
            let mut u = IpipUser::new(IpipOptions::default(), tuning(), us);
            let mut k =
                super::super::kernel::Ipip::new(IpipOptions::default(), fake(&["ipip"], false));
            let a = u.lease_attrs(&e, None).await.expect("attrs");
            assert_eq!(a, k.lease_attrs(&e, None).await.expect("kernel attrs"));
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
                };
                let (_, us) = FakeEngines::new(&f);
                let mut b = build(&cfg, choice, tuning(), &us, kernel).expect("backend");
                let r = b.lease_attrs(&ext(), None).await;
                assert_eq!(
                    r.is_ok().then(|| Dataplane::name(b.dataplane())),
                    want,
                    "{kinds:?} {choice:?}"
                );
            }
        });
    }

    #[test]
    fn direct_routing_only_for_on_link_peers() {
        block_on(async {
            let (_, us) = FakeEngines::new(&fake(&[], false));
            let mut u = IpipUser::new(
                IpipOptions {
                    direct_routing: true,
                },
                tuning(),
                us.clone(),
            );
            let _ = u.lease_attrs(&ext(), None).await.expect("attrs");
            let sn: IpNet = "10.244.2.0/24".parse().expect("cidr");
            let r = u
                .direct_route(sn, Ipv4Addr::new(192, 0, 2, 2))
                .expect("on-link peer");
            assert_eq!(
                (r.gateway, r.oif, r.onlink),
                (Some(IpAddr::from([192, 0, 2, 2])), Some(2), true)
            );
            assert_eq!(
                u.direct_route(sn, Ipv4Addr::new(203, 0, 113, 2)),
                None,
                "off-link peer"
            );
            let mut plain = IpipUser::new(IpipOptions::default(), tuning(), us);
            let _ = plain.lease_attrs(&ext(), None).await.expect("attrs");
            assert_eq!(
                plain.direct_route(sn, Ipv4Addr::new(192, 0, 2, 2)),
                None,
                "DirectRouting off"
            );
        });
    }
}
