//! The `vxlan` backend on the Linux kernel's vxlan driver, programmed exactly
//! as flannel programs it (spec §4.1-4.3, checklist 16-18):
//!
//! - device `flannel.<VNI>` / `flannel-v6.<VNI>`: nolearning, `dev <ext
//!   iface>`, `local <public IP>`, `dstport` only when `Port` is set, MTU
//!   cfg.MTU − 50 (− 70 for IPv6: [`super::Mtus`]), the persisted VTEP MAC, `accept_ra=0`, address `<subnet
//!   IP>/32` (`/128`), up. An existing device is reused when compatible
//!   (flannel's `vxlanLinksIncompat`, plus the MAC), else recreated.
//!   weft, not flannel: its transmit checksum offload as
//!   `--vxlan-tx-checksum-offload` wants it ([`super::TxCsumOffload`]: off
//!   below kernel 5.7), at setup and every reconcile.
//! - per peer, in this order, with rollback on failure: a permanent neighbour
//!   `<peer subnet IP> lladdr <VtepMAC>`, a permanent self fdb entry
//!   `<VtepMAC> dst <peer PublicIP>`, and `ip route replace <peer subnet> via
//!   <peer subnet IP> dev flannel.<VNI> onlink`. Removal deletes all three.
//! - DirectRouting: a peer on the same link gets only `<subnet> via <PublicIP>`.
//!
//! The lease (BackendData `{"VNI":n,"VtepMAC":"..."}`) is byte-identical to
//! the userspace vxlan backend's: the MAC comes from the previous lease, else
//! [`super::derive_mac`]. Nodes can therefore mix the two and a node
//! can move between them without changing its lease.
//!
//! Unlike flannel, `reconcile` re-adds missing neighbours, fdb entries and
//! routes, and recreates a deleted device with all its peers. On exit the
//! device stays (flannel: a restart must not interrupt traffic);
//! [`Running::remove_all`] deletes it (used when switching to userspace).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::IpNet;

use super::{
    Mtus, Target, TxCsumOffload, direct_route, fmt_mac, lease_attrs, log_config, peer_change,
};
use crate::backend::{
    ApplyError, Backend, BackendError, Batch, Dataplane, Observe, Prepared, Running, Setup,
};
use crate::config::backend::VxlanOptions;
use crate::iface::ExternalInterface;
use crate::lease::Lease;
use crate::lease::watcher::Change;
use crate::netlink::{Client, Fdb, LinkKind, LinkSpec, Neigh, Route, VxlanLink};

/// One family's device.
#[derive(Debug, Clone)]
struct Dev {
    spec: VxlanLink,
    /// `<subnet IP>/32` or `/128`, set by `setup`.
    addr: Option<IpNet>,
    /// Interface index once created.
    index: u32,
}

/// What one peer subnet got.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Entry {
    /// Neighbour, fdb entry and onlink route on the vxlan device.
    Encap {
        neigh: Neigh,
        fdb: Fdb,
        route: Route,
    },
    /// DirectRouting: a plain route via the peer's public IP.
    Direct(Route),
}

/// See the module docs: the backend as the factory builds it.
#[derive(Debug)]
pub struct KernelVxlan {
    opts: VxlanOptions,
    nl: Arc<dyn Client>,
    want_v4: bool,
    want_v6: bool,
    /// See [`Live::tx_csum`].
    tx_csum: Option<bool>,
}

/// A kernel vxlan backend with its lease attributes (its devices planned,
/// [`Setup`]) and, once set up, running.
#[derive(Debug)]
struct Live {
    opts: VxlanOptions,
    nl: Arc<dyn Client>,
    /// Each family's device (planned when the lease attributes asked for it).
    v4: Option<Dev>,
    v6: Option<Dev>,
    /// `FLANNEL_MTU`.
    mtu: u32,
    peers: BTreeMap<IpNet, Entry>,
    /// The devices' transmit checksum offload, when weft sets it
    /// ([`TxCsumOffload::wanted`] on this kernel).
    tx_csum: Option<bool>,
}

impl KernelVxlan {
    /// A kernel vxlan backend for the enabled families.
    pub fn new(opts: VxlanOptions, v4: bool, v6: bool, nl: Arc<dyn Client>) -> KernelVxlan {
        KernelVxlan {
            opts,
            nl,
            want_v4: v4,
            want_v6: v6,
            tx_csum: None,
        }
    }

    /// `--vxlan-tx-checksum-offload` on a kernel of `release` ([`TxCsumOffload`];
    /// without it the offload stays as the kernel makes it).
    pub fn with_tx_csum(mut self, policy: TxCsumOffload, release: &str) -> KernelVxlan {
        self.tx_csum = policy.wanted(release);
        self
    }
}

impl Live {
    /// Sets the device's transmit checksum offload where weft manages it
    /// (the kernel vxlan checksum bug's workaround); a failure is logged, the
    /// device works either way.
    async fn offload(&self, name: &str) {
        let Some(on) = self.tx_csum else { return };
        match self.nl.set_tx_checksum(name, on).await {
            Ok(true) => tracing::info!(
                "{name}: transmit checksum offload turned {} (--vxlan-tx-checksum-offload; \
                 flannel's `ethtool -K {name} tx-checksum-ip-generic off` workaround for the \
                 kernel vxlan checksum bug)",
                if on { "on" } else { "off" }
            ),
            Ok(false) => {}
            Err(e) => tracing::warn!("{name}: cannot set transmit checksum offload: {e}"),
        }
    }

    /// flannel's `ensureLink`: create, or reuse a compatible device, or recreate.
    async fn ensure_link(&self, spec: &VxlanLink) -> Result<u32, BackendError> {
        if let Some(d) = self.nl.link_detail(&spec.name).await? {
            match incompatible(spec, &d.kind, d.link.mac.as_deref()) {
                None => return Ok(d.link.index),
                Some(why) => {
                    tracing::warn!(
                        "{:?} already exists with incompatible configuration: {why}; recreating device",
                        spec.name
                    );
                    self.nl.delete_link(d.link.index).await?;
                }
            }
        }
        self.nl.add_link(&LinkSpec::Vxlan(spec.clone())).await?;
        let d = self
            .nl
            .link_detail(&spec.name)
            .await?
            .ok_or_else(|| crate::netlink::NetlinkError::NoSuchLink(spec.name.clone()))?;
        if let Err(e) = self
            .nl
            .sysctl(&format!("net/ipv6/conf/{}/accept_ra", spec.name), "0")
            .await
        {
            tracing::warn!("{e}");
        }
        Ok(d.link.index)
    }

    /// Creates (or re-creates) one device with its address, up, and checks its MAC.
    async fn bring_up(&self, dev: &mut Dev) -> Result<(), BackendError> {
        dev.index = self.ensure_link(&dev.spec).await?;
        if let Some(addr) = dev.addr {
            // EnsureV4AddressOnLink / EnsureV6AddressOnLink: ours only.
            for a in self.nl.addrs_on(dev.index).await? {
                if a.net != addr && !a.link_local && a.net.addr().is_ipv4() == addr.addr().is_ipv4()
                {
                    self.nl.remove_addr(dev.index, a.net).await?;
                }
            }
            if !self
                .nl
                .addrs_on(dev.index)
                .await?
                .iter()
                .any(|a| a.net == addr)
            {
                self.nl.add_addr(dev.index, addr).await?;
            }
        }
        self.nl.link_up(dev.index, None).await?;
        self.offload(&dev.spec.name).await;
        let got = self
            .nl
            .link_detail(&dev.spec.name)
            .await?
            .and_then(|d| d.link.mac);
        if got.as_deref() != Some(&dev.spec.mac[..]) {
            return Err(BackendError::Config(format!(
                "{}'s mac address wanted: {}, but got: {}",
                dev.spec.name,
                fmt_mac(dev.spec.mac),
                got.map(|m| m
                    .iter()
                    .map(|b| format!("{b:02x}"))
                    .collect::<Vec<_>>()
                    .join(":"))
                    .unwrap_or_default()
            )));
        }
        Ok(())
    }

    fn dev_for(&self, subnet: &IpNet) -> Option<&Dev> {
        match subnet {
            IpNet::V4(_) => self.v4.as_ref(),
            IpNet::V6(_) => self.v6.as_ref(),
        }
    }

    /// flannel's DirectRouting check: `ip route get` gives one gateway-less route.
    async fn on_link(&self, ip: IpAddr) -> bool {
        match self.nl.route_get(ip).await {
            Ok(r) => r.len() == 1 && r[0].gateway.is_none(),
            Err(e) => {
                tracing::warn!("ip route get {ip}: {e}");
                false
            }
        }
    }

    /// Programs one peer subnet (neighbour, fdb, route; rollback on failure).
    async fn program(&self, e: &Entry) -> Result<(), BackendError> {
        match e {
            Entry::Direct(r) => Ok(self.nl.route_replace(r).await?),
            Entry::Encap { neigh, fdb, route } => {
                self.nl.neigh_replace(neigh).await?;
                if let Err(err) = self.nl.fdb_replace(fdb).await {
                    let _ = self.nl.neigh_del(neigh).await;
                    return Err(err.into());
                }
                if let Err(err) = self.nl.route_replace(route).await {
                    let _ = self.nl.neigh_del(neigh).await;
                    let _ = self.nl.fdb_del(fdb).await;
                    return Err(err.into());
                }
                Ok(())
            }
        }
    }

    /// Removes one peer subnet's entries; errors are logged (flannel does not bail out).
    async fn unprogram(&self, e: &Entry) {
        let results = match e {
            Entry::Direct(r) => vec![self.nl.route_del(r).await],
            Entry::Encap { neigh, fdb, route } => {
                vec![
                    self.nl.neigh_del(neigh).await,
                    self.nl.fdb_del(fdb).await,
                    self.nl.route_del(route).await,
                ]
            }
        };
        for r in results {
            if let Err(err) = r {
                tracing::error!("failed to remove a vxlan peer entry: {err}");
            }
        }
    }

    async fn entry_for(&self, t: &Target<'_>, public: IpAddr) -> Option<Entry> {
        let subnet = t.subnet;
        if self.opts.direct_routing && self.on_link(public).await {
            return Some(Entry::Direct(direct_route(subnet, Some(public))));
        }
        let dev = self.dev_for(&subnet)?;
        let mac = t.vtep_mac()?;
        let gw = subnet.network();
        Some(Entry::Encap {
            neigh: Neigh {
                index: dev.index,
                ip: gw,
                mac,
            },
            fdb: Fdb {
                index: dev.index,
                mac,
                dst: public,
            },
            route: Route {
                dst: subnet,
                gateway: Some(gw),
                oif: Some(dev.index),
                onlink: true,
                scope_link: false,
            },
        })
    }

    /// Re-points remembered encap entries at the current device index.
    fn reindex(&mut self, v6: bool, index: u32) {
        for e in self.peers.values_mut() {
            if let Entry::Encap { neigh, fdb, route } = e
                && neigh.ip.is_ipv6() == v6
            {
                neigh.index = index;
                fdb.index = index;
                route.oif = Some(index);
            }
        }
    }
}

/// flannel's `vxlanLinksIncompat` (plus the MAC, which weft treats as part of
/// the lease): why an existing link cannot be reused, or `None`.
fn incompatible(want: &VxlanLink, have: &LinkKind, mac: Option<&[u8]>) -> Option<String> {
    let LinkKind::Vxlan(h) = have else {
        return Some(format!("link type: {have:?} vs vxlan"));
    };
    if h.vni != want.vni {
        return Some(format!("vni: {} vs {}", h.vni, want.vni));
    }
    if h.vtep_index > 0 && want.vtep_index > 0 && h.vtep_index != want.vtep_index {
        return Some(format!(
            "vtep (external) interface: {} vs {}",
            h.vtep_index, want.vtep_index
        ));
    }
    if h.local.is_some_and(|l| l != want.local) {
        return Some(format!(
            "vtep (external) IP: {:?} vs {}",
            h.local, want.local
        ));
    }
    if h.group.is_some() {
        return Some(format!("group address: {:?} vs none", h.group));
    }
    if h.l2miss {
        return Some("l2miss: true vs false".into());
    }
    if h.port > 0 && want.port > 0 && h.port != want.port {
        return Some(format!("port: {} vs {}", h.port, want.port));
    }
    if h.gbp != want.gbp {
        return Some(format!("gbp: {} vs {}", h.gbp, want.gbp));
    }
    if mac.is_some_and(|m| m != want.mac) {
        return Some("mac address differs from the lease's VtepMAC".into());
    }
    None
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "vxlan"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Kernel)
    }

    fn view(&self) -> crate::view::BackendView {
        let mut v = crate::view::BackendView::new(self.name(), self.dataplane());
        let devs = [&self.v4, &self.v6]
            .into_iter()
            .flatten()
            .filter(|d| d.index != 0);
        v.devices
            .extend(devs.map(|d| crate::view::devices::KernelDevice::probe(&d.spec.name)));
        v
    }
}

#[async_trait]
impl Backend for KernelVxlan {
    fn name(&self) -> &'static str {
        "vxlan"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        log_config(&self.opts);
        let vni = self.opts.vni;
        let (attrs, vteps) = lease_attrs(vni, ext, prev, self.want_v4, self.want_v6)?;
        let mtus = Mtus::new(ext.backend_mtu(self.opts.mtu), self.want_v6);
        let spec = |name: String, local: IpAddr, mac: [u8; 6], mtu: u32| VxlanLink {
            name,
            vni,
            vtep_index: ext.iface.index,
            local,
            port: self.opts.port,
            learning: self.opts.learning,
            gbp: self.opts.gbp,
            mtu,
            mac,
        };
        let dev = |spec| Dev {
            spec,
            addr: None,
            index: 0,
        };
        let v4 = vteps
            .v4
            .zip(ext.ext_addr)
            .map(|(mac, ip)| dev(spec(format!("flannel.{vni}"), ip.into(), mac, mtus.v4)));
        let v6 = vteps
            .v6
            .zip(ext.ext_v6_addr)
            .map(|(mac, ip)| dev(spec(format!("flannel-v6.{vni}"), ip.into(), mac, mtus.v6)));
        let live = Live {
            opts: self.opts,
            nl: self.nl,
            v4,
            v6,
            mtu: mtus.env,
            peers: BTreeMap::new(),
            tx_csum: self.tx_csum,
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
        if let (Some(mut d), Some(sn)) = (self.v4.take(), lease.subnet) {
            d.addr = Some(
                IpNet::new(sn.network().into(), 32)
                    .map_err(|e| BackendError::Config(e.to_string()))?,
            );
            let r = self.bring_up(&mut d).await;
            self.v4 = Some(d);
            r?;
        }
        if let (Some(mut d), Some(sn)) = (self.v6.take(), lease.ipv6_subnet) {
            d.addr = Some(
                IpNet::new(sn.network().into(), 128)
                    .map_err(|e| BackendError::Config(e.to_string()))?,
            );
            let r = self.bring_up(&mut d).await;
            self.v6 = Some(d);
            r?;
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
        if batch.snapshot {
            out.prune = self.prune().await.err();
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        // A deleted device comes back with all its peers.
        for v6 in [false, true] {
            let slot = if v6 { &self.v6 } else { &self.v4 };
            let Some(dev) = slot.clone() else { continue };
            if dev.addr.is_none() {
                continue;
            }
            let present = self.nl.link_detail(&dev.spec.name).await?;
            if present
                .as_ref()
                .is_some_and(|d| d.link.index == dev.index && d.link.up)
            {
                // An ethtool run by hand, or a udev rule, may have changed it.
                self.offload(&dev.spec.name).await;
                continue;
            }
            tracing::warn!("{} is gone or down; recreating it", dev.spec.name);
            let mut dev = dev;
            self.bring_up(&mut dev).await?;
            let index = dev.index;
            if v6 {
                self.v6 = Some(dev);
            } else {
                self.v4 = Some(dev);
            }
            self.reindex(v6, index);
        }
        let mut neighs = BTreeMap::new();
        let mut fdbs = BTreeMap::new();
        for dev in [self.v4.as_ref(), self.v6.as_ref()]
            .into_iter()
            .flatten()
            .filter(|d| d.index > 0)
        {
            neighs.insert(dev.index, self.nl.neighs(dev.index).await?);
            fdbs.insert(dev.index, self.nl.fdbs(dev.index).await?);
        }
        let dsts: Vec<IpNet> = self
            .peers
            .values()
            .map(|e| match e {
                Entry::Direct(r) => r.dst,
                Entry::Encap { route, .. } => route.dst,
            })
            .collect();
        let present = crate::backend::route_set::main_routes(&*self.nl, &dsts).await?;
        for e in self.peers.values() {
            match e {
                Entry::Direct(r) => {
                    if !present
                        .get(&r.dst)
                        .is_some_and(|v| v.iter().any(|p| p.same_as(r)))
                    {
                        self.nl.route_replace(r).await?;
                        tracing::info!("Route recovered {} : {}", r.dst, r);
                    }
                }
                Entry::Encap { neigh, fdb, route } => {
                    if !neighs.get(&neigh.index).is_some_and(|v| v.contains(neigh)) {
                        self.nl.neigh_replace(neigh).await?;
                        tracing::info!(
                            "Neighbour recovered {} lladdr {}",
                            neigh.ip,
                            fmt_mac(neigh.mac)
                        );
                    }
                    if !fdbs.get(&fdb.index).is_some_and(|v| v.contains(fdb)) {
                        self.nl.fdb_replace(fdb).await?;
                        tracing::info!("FDB entry recovered {} dst {}", fmt_mac(fdb.mac), fdb.dst);
                    }
                    if !present
                        .get(&route.dst)
                        .is_some_and(|v| v.iter().any(|p| p.same_as(route)))
                    {
                        self.nl.route_replace(route).await?;
                        tracing::info!("Route recovered {} : {}", route.dst, route);
                    }
                }
            }
        }
        Ok(())
    }

    async fn teardown(&mut self) {}

    async fn remove_all(&mut self) {
        for e in std::mem::take(&mut self.peers).into_values() {
            if let Entry::Direct(r) = &e {
                let _ = self.nl.route_del(r).await;
            }
        }
        for dev in [self.v4.take(), self.v6.take()].into_iter().flatten() {
            if let Ok(Some(d)) = self.nl.link_detail(&dev.spec.name).await
                && matches!(d.kind, LinkKind::Vxlan(_))
                && let Err(e) = self.nl.delete_link(d.link.index).await
            {
                tracing::warn!("failed to delete {}: {e}", dev.spec.name);
            }
        }
    }
}

impl Live {
    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        let Some((add, targets)) = peer_change(change) else {
            return Ok(());
        };
        let mut first_err = None;
        for t in targets {
            let subnet = t.subnet;
            if self.dev_for(&subnet).is_none() {
                continue;
            }
            let old = self.peers.remove(&subnet);
            if !add {
                if let Some(old) = old {
                    self.unprogram(&old).await;
                }
                continue;
            }
            let Some(public) = t.public else { continue };
            let Some(entry) = self.entry_for(&t, public).await else {
                continue;
            };
            if let Some(old) = old.filter(|o| *o != entry) {
                self.unprogram(&old).await;
            }
            // Remembered even on failure: reconcile retries it.
            self.peers.insert(subnet, entry.clone());
            if let Err(e) = self.program(&entry).await {
                first_err.get_or_insert(e);
            }
        }
        first_err.map_or(Ok(()), Err)
    }

    /// Routes, fdb entries and neighbours on weft's vxlan devices that no
    /// known peer accounts for (left by an earlier weftd: the devices outlive
    /// it, flannel never cleans them) are deleted.
    async fn prune(&mut self) -> Result<(), BackendError> {
        let (mut dsts, mut fdb_dsts, mut neigh_ips) = (Vec::new(), Vec::new(), Vec::new());
        for e in self.peers.values() {
            if let Entry::Encap { neigh, fdb, route } = e {
                dsts.push(route.dst);
                fdb_dsts.push((fdb.index, fdb.dst));
                neigh_ips.push((neigh.index, neigh.ip));
            }
        }
        for (dev, v6) in [(self.v4.as_ref(), false), (self.v6.as_ref(), true)] {
            let Some(dev) = dev.filter(|d| d.index > 0) else {
                continue;
            };
            for r in self.nl.routes_main(v6).await? {
                if r.oif == Some(dev.index) && !dsts.contains(&r.dst) {
                    tracing::info!("Removing stale route {r} (no such lease)");
                    self.nl.route_del(&r).await?;
                }
            }
            for f in self.nl.fdbs(dev.index).await? {
                if !fdb_dsts.contains(&(f.index, f.dst)) {
                    tracing::info!("Removing stale FDB entry {} dst {}", fmt_mac(f.mac), f.dst);
                    self.nl.fdb_del(&f).await?;
                }
            }
            for n in self.nl.neighs(dev.index).await? {
                if !neigh_ips.contains(&(n.index, n.ip)) {
                    tracing::info!(
                        "Removing stale neighbour {} lladdr {}",
                        n.ip,
                        fmt_mac(n.mac)
                    );
                    self.nl.neigh_del(&n).await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
