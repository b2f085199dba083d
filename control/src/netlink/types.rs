//! The typed requests and results of the netlink layer, and the pure
//! functions that turn requests into netlink messages.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use rtnetlink::packet_route::AddressFamily;
use rtnetlink::packet_route::link::{InfoVxlan, LinkMessage};
use rtnetlink::packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourFlags, NeighbourMessage, NeighbourState,
};
use rtnetlink::packet_route::route::{
    RouteFlags, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use rtnetlink::{LinkIpIp, LinkVxlan, LinkWireguard, RouteMessageBuilder};

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

/// A link's type (`ip -d link`'s first detail word).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkKind {
    /// `vxlan`, with its attributes.
    Vxlan(VxlanAttrs),
    /// `ipip`: (local, remote); `None` is "any".
    Ipip {
        /// `local`.
        local: Option<Ipv4Addr>,
        /// `remote`.
        remote: Option<Ipv4Addr>,
    },
    /// `wireguard`.
    Wireguard,
    /// `tun` (weft's userspace engine, flannel's udp).
    Tun,
    /// Any other kind (by name), or none (`""`: physical, loopback).
    Other(String),
}

/// A vxlan link's attributes as the kernel reports them (what flannel's
/// `vxlanLinksIncompat` compares).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VxlanAttrs {
    /// VNI.
    pub vni: u32,
    /// The VTEP device index (`dev`), 0 if none.
    pub vtep_index: u32,
    /// `local`.
    pub local: Option<IpAddr>,
    /// `group` / `remote`.
    pub group: Option<IpAddr>,
    /// `dstport` (0 if not reported).
    pub port: u16,
    /// `l2miss`.
    pub l2miss: bool,
    /// `gbp`.
    pub gbp: bool,
    /// `learning`.
    pub learning: bool,
}

/// A link with its type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkDetail {
    /// The link.
    pub link: Link,
    /// Its type.
    pub kind: LinkKind,
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

/// A link to create.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LinkSpec {
    /// `ip link add ... type vxlan ...`.
    Vxlan(VxlanLink),
    /// `ip link add ... type ipip ...`.
    Ipip(IpipLink),
    /// `ip link add ... type wireguard`.
    Wireguard(WireguardLink),
}

impl LinkSpec {
    /// The new link's name.
    pub fn name(&self) -> &str {
        match self {
            LinkSpec::Vxlan(v) => &v.name,
            LinkSpec::Ipip(i) => &i.name,
            LinkSpec::Wireguard(w) => &w.name,
        }
    }

    /// The RTM_NEWLINK message.
    pub fn message(&self) -> LinkMessage {
        match self {
            LinkSpec::Vxlan(v) => v.message(),
            LinkSpec::Ipip(i) => i.message(),
            LinkSpec::Wireguard(w) => w.message(),
        }
    }
}

/// A vxlan device as flannel creates it (vishvananda/netlink v1.3.1
/// `addVxlanAttrs` with flannel's `Vxlan` value): `ip link add NAME address
/// MAC mtu MTU type vxlan id VNI dev VTEP local LOCAL [dstport PORT]
/// nolearning ttl 0 tos 0 noproxy norsc nol2miss nol3miss
/// noudp6zerocsumtx noudp6zerocsumrx [gbp]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanLink {
    /// `flannel.<VNI>` or `flannel-v6.<VNI>`.
    pub name: String,
    /// VNI.
    pub vni: u32,
    /// The VTEP (external) device index.
    pub vtep_index: u32,
    /// The local (public) address.
    pub local: IpAddr,
    /// `dstport`; 0 sends no attribute (kernel default 8472).
    pub port: u16,
    /// `learning`.
    pub learning: bool,
    /// `gbp`.
    pub gbp: bool,
    /// Device MTU.
    pub mtu: u32,
    /// Device MAC.
    pub mac: [u8; 6],
}

impl VxlanLink {
    /// The RTM_NEWLINK message (attribute order as flannel's library sends it).
    pub fn message(&self) -> LinkMessage {
        let mut b = LinkVxlan::new(&self.name, self.vni).dev(self.vtep_index);
        b = match self.local {
            IpAddr::V4(a) => b.local(a),
            IpAddr::V6(a) => b.local6(a),
        };
        b = b
            .append_info_data(InfoVxlan::Ttl(0))
            .append_info_data(InfoVxlan::Tos(0))
            .learning(self.learning)
            .append_info_data(InfoVxlan::Proxy(false))
            .append_info_data(InfoVxlan::Rsc(false))
            .append_info_data(InfoVxlan::L2Miss(false))
            .append_info_data(InfoVxlan::L3Miss(false))
            .append_info_data(InfoVxlan::UDPZeroCsumTX(false))
            .append_info_data(InfoVxlan::UDPZeroCsumRX(false));
        if self.gbp {
            b = b.append_info_data(InfoVxlan::Gbp);
        }
        if self.port > 0 {
            b = b.port(self.port);
        }
        b.mtu(self.mtu).address(self.mac.to_vec()).build()
    }
}

/// flannel's `flannel.ipip` (netlink `Iptun{Local: IfaceAddr}`): `ip link add
/// NAME type ipip local LOCAL remote any ttl 0 tos 0 nopmtudisc`. (flannel's
/// library also sends zero encap attributes and protocol 0; both are the
/// kernel's defaults for a new ipip device, so they are left out.)
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpipLink {
    /// `flannel.ipip`.
    pub name: String,
    /// The local (interface) address.
    pub local: Ipv4Addr,
}

impl IpipLink {
    /// The RTM_NEWLINK message.
    pub fn message(&self) -> LinkMessage {
        LinkIpIp::new(&self.name)
            .local(self.local)
            .pmtudisc(false)
            .ttl(0)
            .tos(0)
            .build()
    }
}

/// `ip link add NAME mtu MTU type wireguard`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireguardLink {
    /// `flannel-wg` / `flannel-wg-v6`.
    pub name: String,
    /// Device MTU.
    pub mtu: u32,
}

impl WireguardLink {
    /// The RTM_NEWLINK message.
    pub fn message(&self) -> LinkMessage {
        LinkWireguard::new(&self.name).mtu(self.mtu).build()
    }
}

/// A permanent unicast neighbour: `ip neigh replace IP lladdr MAC dev INDEX
/// nud permanent` (flannel's ARP entry for a vxlan peer).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Neigh {
    /// The device.
    pub index: u32,
    /// The neighbour's address.
    pub ip: IpAddr,
    /// Its link-layer address.
    pub mac: [u8; 6],
}

impl Neigh {
    /// The RTM_NEWNEIGH / RTM_DELNEIGH message.
    pub fn message(&self) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = family_of(self.ip);
        m.header.ifindex = self.index;
        m.header.state = NeighbourState::Permanent;
        m.header.kind = RouteType::Unicast;
        m.attributes
            .push(NeighbourAttribute::Destination(neigh_addr(self.ip)));
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(self.mac.to_vec()));
        m
    }
}

/// A permanent fdb entry on a vxlan device: `bridge fdb replace MAC dev
/// INDEX dst DST self permanent`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Fdb {
    /// The vxlan device.
    pub index: u32,
    /// The remote VTEP MAC.
    pub mac: [u8; 6],
    /// The remote VTEP address.
    pub dst: IpAddr,
}

impl Fdb {
    /// The RTM_NEWNEIGH / RTM_DELNEIGH message (family AF_BRIDGE, NTF_SELF).
    pub fn message(&self) -> NeighbourMessage {
        let mut m = NeighbourMessage::default();
        m.header.family = AddressFamily::Bridge;
        m.header.ifindex = self.index;
        m.header.state = NeighbourState::Permanent;
        m.header.flags = NeighbourFlags::Own;
        m.header.kind = RouteType::Unspec;
        m.attributes
            .push(NeighbourAttribute::LinkLayerAddress(self.mac.to_vec()));
        m.attributes
            .push(NeighbourAttribute::Destination(neigh_addr(self.dst)));
        m
    }
}

fn family_of(ip: IpAddr) -> AddressFamily {
    match ip {
        IpAddr::V4(_) => AddressFamily::Inet,
        IpAddr::V6(_) => AddressFamily::Inet6,
    }
}

fn neigh_addr(ip: IpAddr) -> NeighbourAddress {
    match ip {
        IpAddr::V4(a) => NeighbourAddress::Inet(a),
        IpAddr::V6(a) => NeighbourAddress::Inet6(a),
    }
}

/// A route to program (main table, `proto boot` as flannel's).
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
    /// The RTM_NEWROUTE / RTM_DELROUTE message.
    pub fn message(&self) -> RouteMessage {
        let mut m = match self.dst {
            IpNet::V4(d) => {
                let mut b = RouteMessageBuilder::<Ipv4Addr>::new()
                    .destination_prefix(d.network(), d.prefix_len());
                if let Some(IpAddr::V4(g)) = self.gateway {
                    b = b.gateway(g);
                }
                b.build()
            }
            IpNet::V6(d) => {
                let mut b = RouteMessageBuilder::<Ipv6Addr>::new()
                    .destination_prefix(d.network(), d.prefix_len());
                if let Some(IpAddr::V6(g)) = self.gateway {
                    b = b.gateway(g);
                }
                b.build()
            }
        };
        if let Some(o) = self.oif {
            m.attributes
                .push(rtnetlink::packet_route::route::RouteAttribute::Oif(o));
        }
        if self.onlink {
            m.header.flags |= RouteFlags::Onlink;
        }
        m.header.scope = if self.scope_link {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        // flannel's netlink library leaves RTPROT_BOOT (`ip route` shows no `proto`).
        m.header.protocol = RouteProtocol::Boot;
        m
    }

    /// Whether `other` is the same route as flannel's `routeEqual` sees it
    /// (destination, gateway and device; `None` device matches any).
    pub fn same_as(&self, other: &Route) -> bool {
        self.dst == other.dst
            && self.gateway == other.gateway
            && (self.oif.is_none() || other.oif.is_none() || self.oif == other.oif)
    }
}
