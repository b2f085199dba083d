//! [`Netlink`]: the real [`Client`], one rtnetlink socket in the current
//! network namespace.

use std::net::IpAddr;

use async_trait::async_trait;
use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_EXCL, NLM_F_REPLACE, NLM_F_REQUEST, NetlinkMessage,
    NetlinkPayload,
};
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use rtnetlink::packet_route::link::{
    InfoData, InfoIpTunnel, InfoKind, InfoVxlan, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::packet_route::{AddressFamily, RouteNetlinkMessage};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

use super::{
    Addr, Client, Fdb, Link, LinkDetail, LinkKind, LinkSpec, Neigh, NetlinkError, Route, VxlanAttrs,
};

#[path = "route_mtu.rs"]
pub(super) mod route_mtu;
#[path = "rules.rs"]
pub(super) mod rules;

fn req(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let op = op.into();
    move |source| NetlinkError::Request { op, source }
}

fn errno_of(e: &rtnetlink::Error) -> Option<i32> {
    match e {
        rtnetlink::Error::NetlinkError(m) => m.code.map(|c| -c.get()),
        _ => None,
    }
}

/// A connection to the kernel's routing netlink in the current namespace.
#[derive(Debug, Clone)]
pub struct Netlink {
    handle: Handle,
}

impl Netlink {
    /// Opens the socket; must be called inside a tokio runtime.
    pub fn connect() -> Result<Netlink, NetlinkError> {
        let (conn, handle, _) = rtnetlink::new_connection().map_err(NetlinkError::Connect)?;
        tokio::spawn(conn);
        Ok(Netlink { handle })
    }

    /// `ip link show`.
    pub async fn links(&self) -> Result<Vec<Link>, NetlinkError> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(req("ip link show"))?;
        Ok(msgs.into_iter().map(|m| detail_from(m).link).collect())
    }

    /// `ip -d link show`: every link with its kind.
    pub async fn link_details(&self) -> Result<Vec<LinkDetail>, NetlinkError> {
        let msgs: Vec<LinkMessage> = self
            .handle
            .link()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(req("ip -d link show"))?;
        Ok(msgs.into_iter().map(detail_from).collect())
    }

    /// `ip link show dev NAME`; `None` if it does not exist.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        Ok(self.links().await?.into_iter().find(|l| l.name == name))
    }

    /// `ip addr show`.
    pub async fn addrs(&self) -> Result<Vec<Addr>, NetlinkError> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .execute()
            .try_collect()
            .await
            .map_err(req("ip addr show"))?;
        Ok(msgs.into_iter().filter_map(addr_from).collect())
    }

    /// The output interface of the main table's default route (`ip route show default`).
    pub async fn default_route_oif(&self, v6: bool) -> Result<Option<u32>, NetlinkError> {
        let routes = self.route_dump(v6).await?;
        Ok(routes
            .iter()
            .filter(|r| r.header.destination_prefix_length == 0 && r.header.table == 254)
            .find_map(|r| {
                r.attributes.iter().find_map(|a| match a {
                    RouteAttribute::Oif(i) => Some(*i),
                    _ => None,
                })
            }))
    }

    /// `ip link set dev INDEX [mtu MTU] up`.
    pub async fn set_link_up(&self, index: u32, mtu: Option<u32>) -> Result<(), NetlinkError> {
        let mut b = LinkUnspec::new_with_index(index).up();
        if let Some(m) = mtu {
            b = b.mtu(m);
        }
        self.handle
            .link()
            .set(b.build())
            .execute()
            .await
            .map_err(req(format!("ip link set {index} up")))
    }

    /// `ip link del dev INDEX`.
    pub async fn del_link(&self, index: u32) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .del(index)
            .execute()
            .await
            .map_err(req(format!("ip link del {index}")))
    }

    /// `ip addr replace NET dev INDEX`.
    pub async fn replace_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        self.handle
            .address()
            .add(index, net.addr(), net.prefix_len())
            .replace()
            .execute()
            .await
            .map_err(req(format!("ip addr replace {net} dev {index}")))
    }

    /// `ip addr del NET dev INDEX`.
    pub async fn del_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .set_address_filter(net.addr())
            .execute()
            .try_collect()
            .await
            .map_err(req("ip addr show"))?;
        for m in msgs
            .into_iter()
            .filter(|m| m.header.prefix_len == net.prefix_len())
        {
            self.handle
                .address()
                .del(m)
                .execute()
                .await
                .map_err(req(format!("ip addr del {net}")))?;
        }
        Ok(())
    }

    /// `ip route replace DST [via GW] [dev OIF] [onlink] [scope link]`.
    /// A destination whose path MTU the prober lowered keeps it: the
    /// message carries its `mtu` metric ([`route_mtu::lowered_mtu`]).
    pub async fn replace_route(&self, r: &Route) -> Result<(), NetlinkError> {
        let mut m = r.message();
        if let Some(mtu) = route_mtu::lowered_mtu(r.dst) {
            route_mtu::set_mtu_metric(&mut m, Some(mtu));
        }
        self.replace_message(m, format!("ip route replace {r}"))
            .await
    }

    /// Sends a built route message as `ip route replace` (`what` names it in errors).
    pub(super) async fn replace_message(
        &self,
        m: RouteMessage,
        what: String,
    ) -> Result<(), NetlinkError> {
        self.handle
            .route()
            .add(m)
            .replace()
            .execute()
            .await
            .map_err(req(what))
    }

    /// `ip route del DST [via GW] [dev OIF]`; a missing route is not an error.
    pub async fn del_route(&self, r: &Route) -> Result<(), NetlinkError> {
        match self.handle.route().del(r.message()).execute().await {
            Ok(()) => Ok(()),
            Err(e) if errno_of(&e) == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(NetlinkError::Request {
                op: format!("ip route del {r}"),
                source: e,
            }),
        }
    }

    /// Every route of one address family (`ip [-6] route show table all`).
    async fn route_dump(&self, v6: bool) -> Result<Vec<RouteMessage>, NetlinkError> {
        let msg = if v6 {
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
        };
        let routes: Vec<RouteMessage> = self
            .handle
            .route()
            .get(msg)
            .execute()
            .try_collect()
            .await
            .map_err(req("ip route show"))?;
        Ok(routes)
    }

    /// Routes in the main table whose destination is exactly `dst`.
    pub async fn routes_to(&self, dst: IpNet) -> Result<Vec<RouteMessage>, NetlinkError> {
        let routes = self.route_dump(matches!(dst, IpNet::V6(_))).await?;
        Ok(routes
            .into_iter()
            .filter(|r| {
                r.header.table == 254
                    && r.header.destination_prefix_length == dst.prefix_len()
                    && route_dst(r) == Some(dst.network())
            })
            .collect())
    }

    /// Sends one RTM_NEWROUTE (with `flags`) or RTM_DELROUTE.
    async fn route_request(
        &self,
        m: RouteMessage,
        add: Option<u16>,
        op: String,
    ) -> Result<(), NetlinkError> {
        let mut handle = self.handle.clone();
        let mut req = NetlinkMessage::from(match add {
            Some(_) => RouteNetlinkMessage::NewRoute(m),
            None => RouteNetlinkMessage::DelRoute(m),
        });
        req.header.flags = NLM_F_REQUEST | NLM_F_ACK | add.unwrap_or(0);
        let mut resp = handle
            .request(req)
            .map_err(|source| NetlinkError::Request {
                op: op.clone(),
                source,
            })?;
        while let Some(msg) = futures::StreamExt::next(&mut resp).await {
            if let NetlinkPayload::Error(e) = msg.payload {
                let source = rtnetlink::Error::NetlinkError(e);
                if add.is_none() && errno_of(&source) == Some(libc::ESRCH) {
                    return Ok(());
                }
                return Err(NetlinkError::Request { op, source });
            }
        }
        Ok(())
    }

    /// Sends one RTM_NEWNEIGH / RTM_DELNEIGH.
    async fn neigh_request(
        &self,
        m: NeighbourMessage,
        add: bool,
        op: String,
    ) -> Result<(), NetlinkError> {
        let mut handle = self.handle.clone();
        let mut req = NetlinkMessage::from(if add {
            RouteNetlinkMessage::NewNeighbour(m)
        } else {
            RouteNetlinkMessage::DelNeighbour(m)
        });
        req.header.flags = if add {
            NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_REPLACE
        } else {
            NLM_F_REQUEST | NLM_F_ACK
        };
        let mut resp = handle
            .request(req)
            .map_err(|source| NetlinkError::Request {
                op: op.clone(),
                source,
            })?;
        while let Some(msg) = futures::StreamExt::next(&mut resp).await {
            if let NetlinkPayload::Error(e) = msg.payload {
                let source = rtnetlink::Error::NetlinkError(e);
                if !add && errno_of(&source) == Some(libc::ENOENT) {
                    return Ok(());
                }
                return Err(NetlinkError::Request { op, source });
            }
        }
        Ok(())
    }

    async fn neigh_dump(
        &self,
        family: AddressFamily,
    ) -> Result<Vec<NeighbourMessage>, NetlinkError> {
        let get = self.handle.neighbours().get().set_address_family(family);
        get.execute()
            .try_collect()
            .await
            .map_err(req("ip neigh show"))
    }
}

#[async_trait]
impl Client for Netlink {
    async fn link_detail(&self, name: &str) -> Result<Option<LinkDetail>, NetlinkError> {
        let res: Result<Vec<LinkMessage>, _> = self
            .handle
            .link()
            .get()
            .match_name(name.to_string())
            .execute()
            .try_collect()
            .await;
        match res {
            Ok(msgs) => Ok(msgs
                .into_iter()
                .map(detail_from)
                .find(|d| d.link.name == name)),
            Err(e) if errno_of(&e) == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(NetlinkError::Request {
                op: format!("ip link show {name}"),
                source: e,
            }),
        }
    }

    async fn add_link(&self, spec: &LinkSpec) -> Result<(), NetlinkError> {
        self.handle
            .link()
            .add(spec.message())
            .execute()
            .await
            .map_err(req(format!("ip link add {}", spec.name())))
    }

    async fn delete_link(&self, index: u32) -> Result<(), NetlinkError> {
        self.del_link(index).await
    }

    async fn link_up(&self, index: u32, mtu: Option<u32>) -> Result<(), NetlinkError> {
        self.set_link_up(index, mtu).await
    }

    async fn addrs_on(&self, index: u32) -> Result<Vec<Addr>, NetlinkError> {
        let msgs: Vec<AddressMessage> = self
            .handle
            .address()
            .get()
            .set_link_index_filter(index)
            .execute()
            .try_collect()
            .await
            .map_err(req(format!("ip addr show dev {index}")))?;
        Ok(msgs
            .into_iter()
            .filter_map(addr_from)
            .filter(|a| a.index == index)
            .collect())
    }

    async fn add_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        self.replace_addr(index, net).await
    }

    async fn remove_addr(&self, index: u32, net: IpNet) -> Result<(), NetlinkError> {
        self.del_addr(index, net).await
    }

    async fn route_replace(&self, r: &Route) -> Result<(), NetlinkError> {
        self.replace_route(r).await
    }

    async fn route_del(&self, r: &Route) -> Result<(), NetlinkError> {
        self.del_route(r).await
    }

    async fn routes_main(&self, v6: bool) -> Result<Vec<Route>, NetlinkError> {
        let routes = self.route_dump(v6).await?;
        Ok(routes
            .iter()
            .filter(|r| r.header.table == 254)
            .filter_map(route_from)
            .collect())
    }

    async fn routes_exact(&self, dst: IpNet) -> Result<Vec<Route>, NetlinkError> {
        Ok(self
            .routes_to(dst)
            .await?
            .iter()
            .filter_map(route_from)
            .collect())
    }

    async fn route_get(&self, ip: IpAddr) -> Result<Vec<Route>, NetlinkError> {
        let msg = match ip {
            IpAddr::V4(a) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(a, 32)
                .build(),
            IpAddr::V6(a) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(a, 128)
                .build(),
        };
        let routes: Vec<RouteMessage> = self
            .handle
            .route()
            .get(msg)
            .execute()
            .try_collect()
            .await
            .map_err(req(format!("ip route get {ip}")))?;
        Ok(routes.iter().filter_map(route_from).collect())
    }

    async fn blackholes(&self, v6: bool) -> Result<Vec<(IpNet, u32)>, NetlinkError> {
        let routes = self.route_dump(v6).await?;
        Ok(routes
            .iter()
            .filter(|r| r.header.table == 254 && r.header.kind == RouteType::BlackHole)
            .filter_map(|r| {
                let dst = route_dst(r).unwrap_or(if v6 {
                    IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)
                } else {
                    IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)
                });
                let metric = r
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        RouteAttribute::Priority(p) => Some(*p),
                        _ => None,
                    })
                    .unwrap_or(0);
                Some((
                    IpNet::new(dst, r.header.destination_prefix_length).ok()?,
                    metric,
                ))
            })
            .collect())
    }

    async fn blackhole_add(&self, dst: IpNet, metric: u32) -> Result<(), NetlinkError> {
        self.route_request(
            blackhole_message(dst, metric),
            Some(NLM_F_CREATE | NLM_F_EXCL),
            format!("ip route add blackhole {dst} metric {metric}"),
        )
        .await
    }

    async fn blackhole_del(&self, dst: IpNet, metric: u32) -> Result<(), NetlinkError> {
        self.route_request(
            blackhole_message(dst, metric),
            None,
            format!("ip route del blackhole {dst} metric {metric}"),
        )
        .await
    }

    async fn neigh_replace(&self, n: &Neigh) -> Result<(), NetlinkError> {
        let op = format!(
            "ip neigh replace {} lladdr {} dev #{} nud permanent",
            n.ip,
            mac_str(&n.mac),
            n.index
        );
        self.neigh_request(n.message(), true, op).await
    }

    async fn neigh_del(&self, n: &Neigh) -> Result<(), NetlinkError> {
        self.neigh_request(
            n.message(),
            false,
            format!("ip neigh del {} dev #{}", n.ip, n.index),
        )
        .await
    }

    async fn neighs(&self, index: u32) -> Result<Vec<Neigh>, NetlinkError> {
        let mut out = Vec::new();
        for fam in [AddressFamily::Inet, AddressFamily::Inet6] {
            for m in self.neigh_dump(fam).await? {
                if m.header.ifindex != index || m.header.state != NeighbourState::Permanent {
                    continue;
                }
                if let (Some(ip), Some(mac)) = (neigh_dst(&m), neigh_lladdr(&m)) {
                    out.push(Neigh { index, ip, mac });
                }
            }
        }
        Ok(out)
    }

    async fn fdb_replace(&self, f: &Fdb) -> Result<(), NetlinkError> {
        let op = format!(
            "bridge fdb replace {} dev #{} dst {} self permanent",
            mac_str(&f.mac),
            f.index,
            f.dst
        );
        self.neigh_request(f.message(), true, op).await
    }

    async fn fdb_del(&self, f: &Fdb) -> Result<(), NetlinkError> {
        let op = format!(
            "bridge fdb del {} dev #{} dst {} self",
            mac_str(&f.mac),
            f.index,
            f.dst
        );
        self.neigh_request(f.message(), false, op).await
    }

    async fn fdbs(&self, index: u32) -> Result<Vec<Fdb>, NetlinkError> {
        Ok(self
            .neigh_dump(AddressFamily::Bridge)
            .await?
            .iter()
            .filter(|m| m.header.ifindex == index)
            .filter_map(|m| {
                Some(Fdb {
                    index,
                    mac: neigh_lladdr(m)?,
                    dst: neigh_dst(m)?,
                })
            })
            .collect())
    }

    async fn sysctl(&self, key: &str, value: &str) -> Result<(), NetlinkError> {
        let path = format!("/proc/sys/{key}");
        std::fs::write(&path, value).map_err(|source| NetlinkError::Sysctl { path, source })
    }

    async fn sysctl_read(&self, key: &str) -> Result<String, NetlinkError> {
        let path = format!("/proc/sys/{key}");
        match std::fs::read_to_string(&path) {
            Ok(v) => Ok(v.trim().to_string()),
            Err(source) => Err(NetlinkError::Sysctl { path, source }),
        }
    }

    async fn ethtool_feature(&self, dev: &str, name: &str) -> Result<Option<bool>, NetlinkError> {
        weft_engine::ethtool_feature(dev, name).map_err(|source| NetlinkError::Ethtool {
            dev: dev.into(),
            source,
        })
    }

    async fn set_tx_checksum(&self, dev: &str, on: bool) -> Result<bool, NetlinkError> {
        weft_engine::set_tx_checksum(dev, on).map_err(|source| NetlinkError::Ethtool {
            dev: dev.into(),
            source,
        })
    }
}

/// A main-table blackhole route to `dst` at `metric` (`proto boot`, as
/// flannel's netlink library sends it).
fn blackhole_message(dst: IpNet, metric: u32) -> RouteMessage {
    let mut m = match dst {
        IpNet::V4(d) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
            .destination_prefix(d.network(), d.prefix_len())
            .priority(metric)
            .build(),
        IpNet::V6(d) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
            .destination_prefix(d.network(), d.prefix_len())
            .priority(metric)
            .build(),
    };
    m.header.kind = RouteType::BlackHole;
    m.header.scope = RouteScope::Universe;
    m.header.protocol = RouteProtocol::Boot;
    m
}

pub(super) fn mac_str(m: &[u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// `NDA_DST`. In an AF_BRIDGE (fdb) message the parser cannot tell the
/// address family from the header and hands the bytes over raw (`Other`):
/// 4 bytes are IPv4, 16 IPv6.
pub(super) fn neigh_dst(m: &NeighbourMessage) -> Option<IpAddr> {
    m.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::Destination(NeighbourAddress::Inet(a)) => Some(IpAddr::V4(*a)),
        NeighbourAttribute::Destination(NeighbourAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
        NeighbourAttribute::Destination(NeighbourAddress::Other(v)) => match v.len() {
            4 => <[u8; 4]>::try_from(v.as_slice()).ok().map(IpAddr::from),
            16 => <[u8; 16]>::try_from(v.as_slice()).ok().map(IpAddr::from),
            _ => None,
        },
        _ => None,
    })
}

fn neigh_lladdr(m: &NeighbourMessage) -> Option<[u8; 6]> {
    m.attributes.iter().find_map(|a| match a {
        NeighbourAttribute::LinkLayerAddress(l) => <[u8; 6]>::try_from(l.as_slice()).ok(),
        _ => None,
    })
}

fn route_addr(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(a) => Some(IpAddr::V4(*a)),
        RouteAddress::Inet6(a) => Some(IpAddr::V6(*a)),
        _ => None,
    }
}

fn route_dst(r: &RouteMessage) -> Option<IpAddr> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(d) => route_addr(d),
        _ => None,
    })
}

/// A typed route from a kernel route message (main-table unicast routes only).
fn route_from(m: &RouteMessage) -> Option<Route> {
    let dst = route_dst(m).or(match m.header.address_family {
        AddressFamily::Inet => Some(IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED)),
        AddressFamily::Inet6 => Some(IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED)),
        _ => None,
    })?;
    let dst = IpNet::new(dst, m.header.destination_prefix_length).ok()?;
    let mut r = Route {
        dst,
        gateway: None,
        oif: None,
        onlink: m.header.flags.contains(RouteFlags::Onlink),
        scope_link: m.header.scope == RouteScope::Link,
    };
    for a in &m.attributes {
        match a {
            RouteAttribute::Gateway(g) => r.gateway = route_addr(g),
            RouteAttribute::Oif(o) => r.oif = Some(*o),
            _ => {}
        }
    }
    Some(r)
}

fn detail_from(m: LinkMessage) -> LinkDetail {
    let mut l = Link {
        index: m.header.index,
        name: String::new(),
        mtu: 0,
        up: m.header.flags.contains(LinkFlags::Up),
        mac: None,
    };
    let mut kind = LinkKind::Other(String::new());
    for a in m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n,
            LinkAttribute::Mtu(v) => l.mtu = v,
            LinkAttribute::Address(mac) => l.mac = Some(mac),
            LinkAttribute::LinkInfo(infos) => kind = kind_from(&infos),
            _ => {}
        }
    }
    LinkDetail { link: l, kind }
}

fn kind_from(infos: &[LinkInfo]) -> LinkKind {
    let k = infos.iter().find_map(|i| match i {
        LinkInfo::Kind(k) => Some(k.clone()),
        _ => None,
    });
    let data = infos.iter().find_map(|i| match i {
        LinkInfo::Data(d) => Some(d),
        _ => None,
    });
    match (k, data) {
        (Some(InfoKind::Vxlan), d) => {
            let mut v = VxlanAttrs::default();
            if let Some(InfoData::Vxlan(attrs)) = d {
                for a in attrs {
                    match a {
                        InfoVxlan::Id(x) => v.vni = *x,
                        InfoVxlan::Link(x) => v.vtep_index = *x,
                        InfoVxlan::Local(x) => v.local = Some(IpAddr::V4(*x)),
                        InfoVxlan::Local6(x) => v.local = Some(IpAddr::V6(*x)),
                        InfoVxlan::Group(x) => v.group = Some(IpAddr::V4(*x)),
                        InfoVxlan::Group6(x) => v.group = Some(IpAddr::V6(*x)),
                        InfoVxlan::Port(x) => v.port = *x,
                        InfoVxlan::L2Miss(x) => v.l2miss = *x,
                        InfoVxlan::Learning(x) => v.learning = *x,
                        InfoVxlan::Gbp => v.gbp = true,
                        _ => {}
                    }
                }
            }
            LinkKind::Vxlan(v)
        }
        (Some(InfoKind::IpIp), d) => {
            let (mut local, mut remote) = (None, None);
            if let Some(InfoData::IpTunnel(attrs)) = d {
                for a in attrs {
                    match a {
                        InfoIpTunnel::Local(IpAddr::V4(x)) if !x.is_unspecified() => {
                            local = Some(*x)
                        }
                        InfoIpTunnel::Remote(IpAddr::V4(x)) if !x.is_unspecified() => {
                            remote = Some(*x)
                        }
                        _ => {}
                    }
                }
            }
            LinkKind::Ipip { local, remote }
        }
        (Some(InfoKind::Wireguard), _) => LinkKind::Wireguard,
        (Some(InfoKind::Tun), _) => LinkKind::Tun,
        (Some(other), _) => LinkKind::Other(other.to_string()),
        (None, _) => LinkKind::Other(String::new()),
    }
}

fn addr_from(m: AddressMessage) -> Option<Addr> {
    let ip = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Local(ip) => Some(*ip),
        _ => None,
    });
    let ip = ip.or_else(|| {
        m.attributes.iter().find_map(|a| match a {
            AddressAttribute::Address(ip) => Some(*ip),
            _ => None,
        })
    })?;
    let flags = m.attributes.iter().find_map(|a| match a {
        AddressAttribute::Flags(f) => Some(f.bits()),
        _ => None,
    });
    let flags = flags.unwrap_or(u32::from(m.header.flags.bits()));
    let net = IpNet::new(ip, m.header.prefix_len).ok()?;
    Some(Addr {
        index: m.header.index,
        net,
        permanent: flags & u32::from(AddressHeaderFlags::Permanent.bits()) != 0,
        deprecated: flags & u32::from(AddressHeaderFlags::Deprecated.bits()) != 0,
        link_local: matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
            || matches!(ip, IpAddr::V4(v4) if v4.is_link_local()),
    })
}
