//! A thin typed layer over rtnetlink: the only place in weftd that talks
//! netlink. Each method names the `ip` command it mirrors.
//!
//! Errors carry the kernel's errno so that callers can tell "already exists"
//! from real failures without string matching.

use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::packet_route::address::{AddressAttribute, AddressHeaderFlags, AddressMessage};
use rtnetlink::packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use rtnetlink::packet_route::route::{RouteAddress, RouteAttribute, RouteMessage, RouteScope};
use rtnetlink::{Handle, LinkUnspec, RouteMessageBuilder};

/// A netlink failure.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The netlink socket could not be opened.
    #[error("cannot open netlink socket: {0}")]
    Connect(#[source] std::io::Error),
    /// The kernel refused a request.
    #[error("{op}: {source}")]
    Request {
        /// What was asked, in `ip` terms.
        op: String,
        /// The kernel's answer.
        #[source]
        source: rtnetlink::Error,
    },
    /// A link that must exist does not.
    #[error("link {0:?} not found")]
    NoSuchLink(String),
}

impl NetlinkError {
    /// The kernel errno (positive), if the kernel answered with one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Request { source: rtnetlink::Error::NetlinkError(e), .. } => {
                e.code.map(|c| -c.get())
            }
            _ => None,
        }
    }
}

fn req(op: impl Into<String>) -> impl FnOnce(rtnetlink::Error) -> NetlinkError {
    let op = op.into();
    move |source| NetlinkError::Request { op, source }
}

/// A link as `ip link` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Interface name.
    pub name: String,
    /// MTU.
    pub mtu: u32,
    /// Whether the link is administratively up.
    pub up: bool,
    /// Hardware address, if any.
    pub mac: Option<Vec<u8>>,
}

/// An address as `ip addr` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Addr {
    /// Interface index.
    pub index: u32,
    /// The address with its prefix length.
    pub net: IpNet,
    /// Permanent (not from autoconfiguration / DHCP).
    pub permanent: bool,
    /// Deprecated (preferred lifetime over).
    pub deprecated: bool,
    /// Link-local scope.
    pub link_local: bool,
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
        let msgs: Vec<LinkMessage> =
            self.handle.link().get().execute().try_collect().await.map_err(req("ip link show"))?;
        Ok(msgs.into_iter().map(link_from).collect())
    }

    /// `ip link show dev NAME`; `None` if it does not exist.
    pub async fn link_by_name(&self, name: &str) -> Result<Option<Link>, NetlinkError> {
        Ok(self.links().await?.into_iter().find(|l| l.name == name))
    }

    /// `ip addr show`.
    pub async fn addrs(&self) -> Result<Vec<Addr>, NetlinkError> {
        let msgs: Vec<AddressMessage> =
            self.handle.address().get().execute().try_collect().await.map_err(req("ip addr show"))?;
        Ok(msgs.into_iter().filter_map(addr_from).collect())
    }

    /// The output interface of the main table's default route (`ip route show default`).
    pub async fn default_route_oif(&self, v6: bool) -> Result<Option<u32>, NetlinkError> {
        let msg = if v6 {
            RouteMessageBuilder::<std::net::Ipv6Addr>::new().build()
        } else {
            RouteMessageBuilder::<std::net::Ipv4Addr>::new().build()
        };
        let routes: Vec<RouteMessage> =
            self.handle.route().get(msg).execute().try_collect().await.map_err(req("ip route show"))?;
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
        self.handle.link().set(b.build()).execute().await.map_err(req(format!("ip link set {index} up")))
    }

    /// `ip link del dev INDEX`.
    pub async fn del_link(&self, index: u32) -> Result<(), NetlinkError> {
        self.handle.link().del(index).execute().await.map_err(req(format!("ip link del {index}")))
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
        for m in msgs.into_iter().filter(|m| m.header.prefix_len == net.prefix_len()) {
            self.handle.address().del(m).execute().await.map_err(req(format!("ip addr del {net}")))?;
        }
        Ok(())
    }

    /// `ip route replace DST [via GW] [dev OIF] [onlink] [scope link]`.
    pub async fn replace_route(&self, r: &Route) -> Result<(), NetlinkError> {
        self.handle
            .route()
            .add(r.message())
            .replace()
            .execute()
            .await
            .map_err(req(format!("ip route replace {r}")))
    }

    /// `ip route del DST [via GW] [dev OIF]`; a missing route is not an error.
    pub async fn del_route(&self, r: &Route) -> Result<(), NetlinkError> {
        match self.handle.route().del(r.message()).execute().await {
            Ok(()) => Ok(()),
            Err(rtnetlink::Error::NetlinkError(e)) if e.code.map(|c| -c.get()) == Some(libc::ESRCH) => Ok(()),
            Err(e) => Err(NetlinkError::Request { op: format!("ip route del {r}"), source: e }),
        }
    }

    /// Routes in the main table whose destination is exactly `dst`.
    pub async fn routes_to(&self, dst: IpNet) -> Result<Vec<RouteMessage>, NetlinkError> {
        let msg = match dst {
            IpNet::V4(_) => RouteMessageBuilder::<std::net::Ipv4Addr>::new().build(),
            IpNet::V6(_) => RouteMessageBuilder::<std::net::Ipv6Addr>::new().build(),
        };
        let routes: Vec<RouteMessage> =
            self.handle.route().get(msg).execute().try_collect().await.map_err(req("ip route show"))?;
        Ok(routes
            .into_iter()
            .filter(|r| {
                r.header.table == 254
                    && r.header.destination_prefix_length == dst.prefix_len()
                    && route_dst(r) == Some(dst.network())
            })
            .collect())
    }
}

/// A route to program.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination prefix.
    pub dst: IpNet,
    /// Gateway, if any.
    pub gateway: Option<IpAddr>,
    /// Output interface index, if fixed.
    pub oif: Option<u32>,
    /// `onlink` (gateway reachable without a covering route).
    pub onlink: bool,
    /// `scope link` instead of universe.
    pub scope_link: bool,
}

impl std::fmt::Display for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.dst)?;
        if let Some(g) = self.gateway {
            write!(f, " via {g}")?;
        }
        if let Some(o) = self.oif {
            write!(f, " dev #{o}")?;
        }
        if self.onlink {
            f.write_str(" onlink")?;
        }
        if self.scope_link {
            f.write_str(" scope link")?;
        }
        Ok(())
    }
}

impl Route {
    fn message(&self) -> RouteMessage {
        let mut m = match (self.dst, self.gateway) {
            (IpNet::V4(d), g) => {
                let mut b = RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                    .destination_prefix(d.network(), d.prefix_len());
                if let Some(IpAddr::V4(g)) = g {
                    b = b.gateway(g);
                }
                b.build()
            }
            (IpNet::V6(d), g) => {
                let mut b = RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                    .destination_prefix(d.network(), d.prefix_len());
                if let Some(IpAddr::V6(g)) = g {
                    b = b.gateway(g);
                }
                b.build()
            }
        };
        if let Some(o) = self.oif {
            m.attributes.push(RouteAttribute::Oif(o));
        }
        if self.onlink {
            m.header.flags |= rtnetlink::packet_route::route::RouteFlags::Onlink;
        }
        m.header.scope = if self.scope_link { RouteScope::Link } else { RouteScope::Universe };
        m
    }
}

fn route_dst(r: &RouteMessage) -> Option<IpAddr> {
    r.attributes.iter().find_map(|a| match a {
        RouteAttribute::Destination(RouteAddress::Inet(a)) => Some(IpAddr::V4(*a)),
        RouteAttribute::Destination(RouteAddress::Inet6(a)) => Some(IpAddr::V6(*a)),
        _ => None,
    })
}

fn link_from(m: LinkMessage) -> Link {
    let mut l = Link {
        index: m.header.index,
        name: String::new(),
        mtu: 0,
        up: m.header.flags.contains(LinkFlags::Up),
        mac: None,
    };
    for a in m.attributes {
        match a {
            LinkAttribute::IfName(n) => l.name = n,
            LinkAttribute::Mtu(v) => l.mtu = v,
            LinkAttribute::Address(mac) => l.mac = Some(mac),
            _ => {}
        }
    }
    l
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
