//! [`FakeNetlink`]: an in-memory kernel for unit tests. It implements
//! [`Client`] and [`XfrmClient`], records every request as an [`Op`], and
//! keeps just enough state (links, addresses, routes, neighbours, fdb
//! entries, policies) for backends to read back what they wrote and for
//! tests to delete entries "by hand" and watch reconciliation restore them.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::sync::{Mutex, MutexGuard};

use async_trait::async_trait;
use ipnet::IpNet;

use super::{
    Addr, Client, Fdb, Link, LinkDetail, LinkKind, LinkSpec, Neigh, NetlinkError, Route,
    VxlanAttrs, WgClient, WgDevice, WgPeer, WgSet, XfrmClient, XfrmPolicy, XfrmSa,
};

/// One request a backend made, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `ip link add`.
    AddLink(LinkSpec),
    /// `ip link del`.
    DelLink(u32),
    /// `ip link set INDEX [mtu MTU] up`.
    LinkUp(u32, Option<u32>),
    /// `ip addr replace NET dev INDEX`.
    AddAddr(u32, IpNet),
    /// `ip addr del NET dev INDEX`.
    DelAddr(u32, IpNet),
    /// `ip route replace`.
    RouteReplace(Route),
    /// `ip route del`.
    RouteDel(Route),
    /// `ip route add blackhole DST metric METRIC`.
    BlackholeAdd(IpNet, u32),
    /// `ip route del blackhole DST metric METRIC`.
    BlackholeDel(IpNet, u32),
    /// `ip neigh replace`.
    NeighReplace(Neigh),
    /// `ip neigh del`.
    NeighDel(Neigh),
    /// `bridge fdb replace`.
    FdbReplace(Fdb),
    /// `bridge fdb del`.
    FdbDel(Fdb),
    /// A sysctl write (key under /proc/sys, value).
    Sysctl(String, String),
    /// `ethtool -K DEV tx on|off` that changed the device.
    TxChecksum(String, bool),
    /// `ip xfrm policy update`.
    PolicyUpdate(XfrmPolicy),
    /// `ip xfrm policy delete`.
    PolicyDel(XfrmPolicy),
    /// `wg set` (generic netlink `WG_CMD_SET_DEVICE`).
    WgSet(WgSet),
}

#[derive(Debug, Default)]
struct State {
    ops: Vec<Op>,
    links: BTreeMap<u32, LinkDetail>,
    next_index: u32,
    addrs: Vec<Addr>,
    routes: Vec<Route>,
    blackholes: Vec<(IpNet, u32)>,
    neighs: BTreeSet<Neigh>,
    fdbs: BTreeSet<Fdb>,
    policies: BTreeSet<XfrmPolicy>,
    /// ESP SAs (charon's in a real kernel; tests add them by hand).
    sas: BTreeSet<XfrmSa>,
    /// WireGuard devices' state by name, as `wg_set` leaves it.
    wg: BTreeMap<String, WgDevice>,
    /// Link kinds `add_link` accepts ("vxlan", "ipip", "wireguard").
    kinds: BTreeSet<&'static str>,
    esp: bool,
    /// On-link prefixes (with their device) for `route_get`.
    connected: Vec<(IpNet, u32)>,
    /// The default gateway and device for `route_get`.
    default_via: Option<(IpAddr, u32)>,
    /// Devices whose transmit checksum offload was turned off.
    tx_csum_off: BTreeSet<String>,
    /// Sysctl values by key, as written or set by the test (unset: `0`).
    sysctls: BTreeMap<String, String>,
    /// ethtool features by (device, name), as set by the test.
    features: BTreeMap<(String, String), bool>,
}

/// See the module docs.
#[derive(Debug, Default)]
pub struct FakeNetlink {
    state: Mutex<State>,
}

fn errno(op: &str, e: i32) -> NetlinkError {
    NetlinkError::Errno {
        op: op.to_string(),
        errno: e,
    }
}

impl FakeNetlink {
    /// A kernel with `lo` (1) and `eth0` (2, MTU 1500) that supports the
    /// given link kinds (e.g. `&["vxlan"]`) and ESP when `esp`.
    pub fn new(kinds: &[&'static str], esp: bool) -> FakeNetlink {
        let f = FakeNetlink::default();
        {
            let mut s = f.lock();
            s.kinds = kinds.iter().copied().collect();
            s.esp = esp;
            s.next_index = 10;
            for (index, name) in [(1, "lo"), (2, "eth0")] {
                let link = Link {
                    index,
                    name: name.into(),
                    mtu: if index == 1 { 65536 } else { 1500 },
                    up: true,
                    mac: None,
                };
                s.links.insert(
                    index,
                    LinkDetail {
                        link,
                        kind: LinkKind::Other(String::new()),
                    },
                );
            }
        }
        f
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Declares `net` on-link via device `index` (`ip route get` answers
    /// with a gateway-less route for addresses inside it).
    pub fn set_connected(&self, net: IpNet, index: u32) {
        self.lock().connected.push((net, index));
    }

    /// Sets the default route used by `ip route get` for other addresses.
    pub fn set_default_via(&self, gw: IpAddr, index: u32) {
        self.lock().default_via = Some((gw, index));
    }

    /// Sets sysctl `key` (as under /proc/sys) without recording a write.
    pub fn set_sysctl(&self, key: &str, value: &str) {
        self.lock().sysctls.insert(key.into(), value.into());
    }

    /// Gives `dev` ethtool feature `name`, on or off.
    pub fn set_feature(&self, dev: &str, name: &str, on: bool) {
        self.lock().features.insert((dev.into(), name.into()), on);
    }

    /// Every request so far, in order.
    pub fn ops(&self) -> Vec<Op> {
        self.lock().ops.clone()
    }

    /// Every request so far; forgets them.
    pub fn take_ops(&self) -> Vec<Op> {
        std::mem::take(&mut self.lock().ops)
    }

    /// The links (index → detail).
    pub fn links(&self) -> BTreeMap<u32, LinkDetail> {
        self.lock().links.clone()
    }

    /// The routes (main table).
    pub fn routes(&self) -> Vec<Route> {
        self.lock().routes.clone()
    }

    /// All neighbours.
    pub fn all_neighs(&self) -> Vec<Neigh> {
        self.lock().neighs.iter().cloned().collect()
    }

    /// All fdb entries.
    pub fn all_fdbs(&self) -> Vec<Fdb> {
        self.lock().fdbs.iter().cloned().collect()
    }

    /// All addresses.
    pub fn all_addrs(&self) -> Vec<Addr> {
        self.lock().addrs.clone()
    }

    /// All XFRM policies.
    pub fn policies(&self) -> Vec<XfrmPolicy> {
        self.lock().policies.iter().cloned().collect()
    }

    /// The blackhole routes (main table): destination and metric.
    pub fn blackhole_routes(&self) -> Vec<(IpNet, u32)> {
        self.lock().blackholes.clone()
    }

    /// Adds a blackhole route by hand (e.g. one another daemon left).
    pub fn insert_blackhole(&self, dst: IpNet, metric: u32) {
        self.lock().blackholes.push((dst, metric));
    }

    /// Deletes the blackhole routes to `dst` behind the daemon's back.
    pub fn forget_blackhole(&self, dst: IpNet) {
        self.lock().blackholes.retain(|b| b.0 != dst);
    }

    /// Deletes routes to `dst` behind the backend's back (`ip route del`).
    pub fn forget_route(&self, dst: IpNet) {
        self.lock().routes.retain(|r| r.dst != dst);
    }

    /// Deletes a neighbour behind the backend's back.
    pub fn forget_neigh(&self, ip: IpAddr) {
        self.lock().neighs.retain(|n| n.ip != ip);
    }

    /// Deletes an fdb entry behind the backend's back.
    pub fn forget_fdb(&self, dst: IpAddr) {
        self.lock().fdbs.retain(|f| f.dst != dst);
    }

    /// Deletes a policy behind the backend's back.
    pub fn forget_policy(&self, p: &XfrmPolicy) {
        self.lock().policies.remove(p);
    }

    /// Adds an ESP SA by hand (what charon would install).
    pub fn insert_sa(&self, sa: XfrmSa) {
        self.lock().sas.insert(sa);
    }

    /// Deletes the SAs matching `pred` behind the backend's back
    /// (`ip xfrm state delete` / `deleteall`).
    pub fn forget_sas(&self, pred: impl Fn(&XfrmSa) -> bool) {
        self.lock().sas.retain(|sa| !pred(sa));
    }

    /// The WireGuard device `ifname` as `wg show` would read it.
    pub fn wg_device(&self, ifname: &str) -> Option<WgDevice> {
        self.lock().wg.get(ifname).cloned()
    }

    /// Changes a WireGuard device's peers behind the backend's back (`wg
    /// set DEV peer K remove`, a roamed endpoint, ...).
    pub fn edit_wg_peers(&self, ifname: &str, edit: impl FnOnce(&mut Vec<WgPeer>)) {
        if let Some(d) = self.lock().wg.get_mut(ifname) {
            edit(&mut d.peers);
        }
    }

    /// Adds a link by hand (e.g. a leftover device of another kind).
    pub fn insert_link(&self, name: &str, kind: LinkKind, mtu: u32, mac: Option<[u8; 6]>) -> u32 {
        let mut s = self.lock();
        s.next_index += 1;
        let index = s.next_index;
        let link = Link {
            index,
            name: name.into(),
            mtu,
            up: false,
            mac: mac.map(|m| m.to_vec()),
        };
        s.links.insert(index, LinkDetail { link, kind });
        index
    }
}

#[async_trait]
impl Client for FakeNetlink {
    async fn link_detail(&self, name: &str) -> Result<Option<LinkDetail>, NetlinkError> {
        Ok(self
            .lock()
            .links
            .values()
            .find(|d| d.link.name == name)
            .cloned())
    }

    async fn add_link(&self, spec: &LinkSpec) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::AddLink(spec.clone()));
        let (kind_name, kind, mtu, mac) = match spec {
            LinkSpec::Vxlan(v) => {
                let attrs = VxlanAttrs {
                    vni: v.vni,
                    vtep_index: v.vtep_index,
                    local: Some(v.local),
                    group: None,
                    port: if v.port == 0 { 8472 } else { v.port },
                    l2miss: false,
                    gbp: v.gbp,
                    learning: v.learning,
                };
                ("vxlan", LinkKind::Vxlan(attrs), v.mtu, Some(v.mac.to_vec()))
            }
            LinkSpec::Ipip(i) => (
                "ipip",
                LinkKind::Ipip {
                    local: Some(i.local),
                    remote: None,
                },
                1480,
                None,
            ),
            LinkSpec::Wireguard(w) => ("wireguard", LinkKind::Wireguard, w.mtu, None),
        };
        let op = format!("ip link add {}", spec.name());
        if !s.kinds.contains(kind_name) {
            return Err(errno(&op, libc::EOPNOTSUPP));
        }
        if s.links.values().any(|d| d.link.name == spec.name()) {
            return Err(errno(&op, libc::EEXIST));
        }
        s.next_index += 1;
        let index = s.next_index;
        let link = Link {
            index,
            name: spec.name().into(),
            mtu,
            up: false,
            mac,
        };
        s.links.insert(index, LinkDetail { link, kind });
        Ok(())
    }

    async fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::DelLink(index));
        let Some(gone) = s.links.remove(&index) else {
            return Err(errno(&format!("ip link del {index}"), libc::ENODEV));
        };
        s.wg.remove(&gone.link.name);
        s.addrs.retain(|a| a.index != index);
        s.routes.retain(|r| r.oif != Some(index));
        s.neighs.retain(|n| n.index != index);
        s.fdbs.retain(|f| f.index != index);
        Ok(())
    }

    async fn link_up(&self, index: u32, mtu: Option<u32>) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::LinkUp(index, mtu));
        let d = s
            .links
            .get_mut(&index)
            .ok_or_else(|| errno("ip link set up", libc::ENODEV))?;
        d.link.up = true;
        if let Some(m) = mtu {
            d.link.mtu = m;
        }
        Ok(())
    }

    async fn addrs_on(&self, index: u32) -> Result<Vec<Addr>, NetlinkError> {
        Ok(self
            .lock()
            .addrs
            .iter()
            .filter(|a| a.index == index)
            .cloned()
            .collect())
    }

    async fn add_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::AddAddr(index, net));
        s.addrs.retain(|a| !(a.index == index && a.net == net));
        s.addrs.push(Addr {
            index,
            net,
            permanent: true,
            deprecated: false,
            link_local: false,
        });
        Ok(())
    }

    async fn remove_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::DelAddr(index, net));
        s.addrs.retain(|a| !(a.index == index && a.net == net));
        Ok(())
    }

    async fn route_replace(&self, r: &Route) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::RouteReplace(r.clone()));
        if let Some(o) = r.oif
            && !s.links.get(&o).is_some_and(|d| d.link.up)
        {
            return Err(errno(&format!("ip route replace {r}"), libc::ENETDOWN));
        }
        s.routes.retain(|x| x.dst != r.dst);
        s.routes.push(r.clone());
        Ok(())
    }

    async fn route_del(&self, r: &Route) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::RouteDel(r.clone()));
        s.routes
            .retain(|x| !(x.dst == r.dst && (r.gateway.is_none() || x.gateway == r.gateway)));
        Ok(())
    }

    async fn routes_main(&self, v6: bool) -> Result<Vec<Route>, NetlinkError> {
        Ok(self
            .lock()
            .routes
            .iter()
            .filter(|r| matches!(r.dst, IpNet::V6(_)) == v6)
            .cloned()
            .collect())
    }

    async fn routes_exact(&self, dst: IpNet) -> Result<Vec<Route>, NetlinkError> {
        Ok(self
            .lock()
            .routes
            .iter()
            .filter(|r| r.dst == dst)
            .cloned()
            .collect())
    }

    async fn route_get(&self, ip: IpAddr) -> Result<Vec<Route>, NetlinkError> {
        let s = self.lock();
        let host = IpNet::from(ip);
        if let Some((_, index)) = s.connected.iter().find(|(n, _)| n.contains(&ip)) {
            return Ok(vec![Route {
                dst: host,
                gateway: None,
                oif: Some(*index),
                onlink: false,
                scope_link: false,
            }]);
        }
        Ok(s.default_via
            .map(|(gw, index)| Route {
                dst: host,
                gateway: Some(gw),
                oif: Some(index),
                onlink: false,
                scope_link: false,
            })
            .into_iter()
            .collect())
    }

    async fn blackholes(&self, v6: bool) -> Result<Vec<(IpNet, u32)>, NetlinkError> {
        Ok(self
            .lock()
            .blackholes
            .iter()
            .filter(|b| matches!(b.0, IpNet::V6(_)) == v6)
            .copied()
            .collect())
    }

    async fn blackhole_add(&self, dst: IpNet, metric: u32) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::BlackholeAdd(dst, metric));
        if s.blackholes.contains(&(dst, metric)) {
            return Err(errno(
                &format!("ip route add blackhole {dst} metric {metric}"),
                libc::EEXIST,
            ));
        }
        s.blackholes.push((dst, metric));
        Ok(())
    }

    async fn blackhole_del(&self, dst: IpNet, metric: u32) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::BlackholeDel(dst, metric));
        s.blackholes.retain(|b| *b != (dst, metric));
        Ok(())
    }

    async fn neigh_replace(&self, n: &Neigh) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::NeighReplace(n.clone()));
        s.neighs.retain(|x| !(x.index == n.index && x.ip == n.ip));
        s.neighs.insert(n.clone());
        Ok(())
    }

    async fn neigh_del(&self, n: &Neigh) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::NeighDel(n.clone()));
        s.neighs.retain(|x| !(x.index == n.index && x.ip == n.ip));
        Ok(())
    }

    async fn neighs(&self, index: u32) -> Result<Vec<Neigh>, NetlinkError> {
        Ok(self
            .lock()
            .neighs
            .iter()
            .filter(|n| n.index == index)
            .cloned()
            .collect())
    }

    async fn fdb_replace(&self, f: &Fdb) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::FdbReplace(f.clone()));
        s.fdbs.retain(|x| !(x.index == f.index && x.mac == f.mac));
        s.fdbs.insert(f.clone());
        Ok(())
    }

    async fn fdb_del(&self, f: &Fdb) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::FdbDel(f.clone()));
        s.fdbs.remove(f);
        Ok(())
    }

    async fn fdbs(&self, index: u32) -> Result<Vec<Fdb>, NetlinkError> {
        Ok(self
            .lock()
            .fdbs
            .iter()
            .filter(|f| f.index == index)
            .cloned()
            .collect())
    }

    async fn sysctl(&self, key: &str, value: &str) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::Sysctl(key.into(), value.into()));
        s.sysctls.insert(key.into(), value.into());
        Ok(())
    }

    async fn sysctl_read(&self, key: &str) -> Result<String, NetlinkError> {
        Ok(self
            .lock()
            .sysctls
            .get(key)
            .cloned()
            .unwrap_or_else(|| "0".into()))
    }

    async fn ethtool_feature(&self, dev: &str, name: &str) -> Result<Option<bool>, NetlinkError> {
        Ok(self
            .lock()
            .features
            .get(&(dev.to_string(), name.to_string()))
            .copied())
    }

    /// Devices start with the offload on (as the kernel creates a vxlan device).
    async fn set_tx_checksum(&self, dev: &str, on: bool) -> Result<bool, NetlinkError> {
        let mut st = self.lock();
        let was = !st.tx_csum_off.contains(dev);
        if was == on {
            return Ok(false);
        }
        if on {
            st.tx_csum_off.remove(dev);
        } else {
            st.tx_csum_off.insert(dev.to_string());
        }
        st.ops.push(Op::TxChecksum(dev.into(), on));
        Ok(true)
    }
}

/// The genl recorder: a request needs an existing wireguard link of that
/// name (ENODEV otherwise, as the kernel answers). A set is applied to the
/// device's peers as the kernel applies it, so `wg_get` reads it back.
#[async_trait]
impl WgClient for FakeNetlink {
    async fn wg_set(&self, set: &WgSet) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::WgSet(set.clone()));
        if !s.has_wg(&set.ifname) {
            return Err(errno(&set.describe(), libc::ENODEV));
        }
        let d = s.wg.entry(set.ifname.clone()).or_default();
        if let Some(p) = set.listen_port {
            d.listen_port = p;
        }
        if set.replace_peers {
            d.peers.clear();
        }
        for p in &set.peers {
            let at = d.peers.iter().position(|x| x.public_key == p.public_key);
            if p.remove {
                if let Some(i) = at {
                    d.peers.remove(i);
                }
                continue;
            }
            let i = at.unwrap_or_else(|| {
                d.peers.push(WgPeer {
                    public_key: p.public_key,
                    endpoint: None,
                    keepalive: 0,
                    allowed_ips: Vec::new(),
                });
                d.peers.len() - 1
            });
            let x = &mut d.peers[i];
            if p.endpoint.is_some() {
                x.endpoint = p.endpoint;
            }
            if let Some(k) = p.keepalive {
                x.keepalive = k;
            }
            // Every request carries REPLACE_ALLOWEDIPS.
            x.allowed_ips = p.allowed_ips.clone();
        }
        Ok(())
    }

    async fn wg_get(&self, ifname: &str) -> Result<WgDevice, NetlinkError> {
        let s = self.lock();
        if !s.has_wg(ifname) {
            return Err(errno(&format!("wg show {ifname}"), libc::ENODEV));
        }
        Ok(s.wg.get(ifname).cloned().unwrap_or_default())
    }
}

impl State {
    fn has_wg(&self, ifname: &str) -> bool {
        self.links
            .values()
            .any(|d| d.link.name == ifname && d.kind == LinkKind::Wireguard)
    }
}

#[async_trait]
impl XfrmClient for FakeNetlink {
    async fn policy_update(&self, p: &XfrmPolicy) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::PolicyUpdate(p.clone()));
        s.policies
            .retain(|x| !(x.src == p.src && x.dst == p.dst && x.dir == p.dir));
        s.policies.insert(p.clone());
        Ok(())
    }

    async fn policy_del(&self, p: &XfrmPolicy) -> Result<(), NetlinkError> {
        let mut s = self.lock();
        s.ops.push(Op::PolicyDel(p.clone()));
        s.policies
            .retain(|x| !(x.src == p.src && x.dst == p.dst && x.dir == p.dir));
        Ok(())
    }

    async fn policy_exists(&self, p: &XfrmPolicy) -> Result<bool, NetlinkError> {
        Ok(self.lock().policies.contains(p))
    }

    async fn esp_supported(&self) -> Result<bool, NetlinkError> {
        Ok(self.lock().esp)
    }

    async fn states(&self) -> Result<Vec<XfrmSa>, NetlinkError> {
        Ok(self.lock().sas.iter().copied().collect())
    }
}
