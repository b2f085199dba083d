//! A small synchronous rtnetlink socket: the CNI binary is synchronous, so
//! it speaks netlink-packet-route directly over a blocking netlink-sys
//! socket instead of using rtnetlink's tokio machinery.
//!
//! Contract: one request at a time, each with its own sequence number;
//! `NLM_F_ACK` on every change, so each call returns only after the kernel
//! applied it (or with the kernel's errno). A socket belongs to the network
//! namespace it was opened in, for its whole life: [`Socket::open_in`] opens
//! one inside another namespace from a short-lived thread (namespaces are
//! per thread), so the calling thread never leaves its own. Each builder
//! names the `ip` command it mirrors.

use std::fs::File;
use std::io;
use std::net::IpAddr;

use netlink_packet_core::{
    NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage,
    NetlinkPayload,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::neighbour::{
    NeighbourAddress, NeighbourAttribute, NeighbourMessage, NeighbourState,
};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteFlags, RouteHeader, RouteMessage, RouteProtocol, RouteScope,
    RouteType,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};
use netlink_sys::SocketAddr;
use netlink_sys::protocols::NETLINK_ROUTE;

/// Receive buffer: the kernel sends at most 32 KiB per dump datagram.
const RECV_BUF: usize = 64 * 1024;

/// A netlink failure.
#[derive(Debug, thiserror::Error)]
pub enum NlError {
    /// The socket could not be opened, or sending/receiving failed.
    #[error("netlink socket: {0}")]
    Socket(#[source] io::Error),
    /// The kernel refused a request.
    #[error("{op}: {source}")]
    Kernel {
        /// The request, in `ip` terms.
        op: String,
        /// The kernel's errno.
        #[source]
        source: io::Error,
    },
    /// The kernel's reply could not be decoded.
    #[error("{op}: undecodable reply: {reason}")]
    Decode {
        /// The request, in `ip` terms.
        op: String,
        /// What failed.
        reason: String,
    },
}

impl NlError {
    /// The kernel's errno, if the kernel refused the request.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NlError::Kernel { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }
}

/// A link as `ip link` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// Interface index.
    pub index: u32,
    /// Whether it is administratively up.
    pub up: bool,
    /// Its hardware address.
    pub mac: Vec<u8>,
    /// Its MTU.
    pub mtu: u32,
}

/// A synchronous NETLINK_ROUTE socket; see the module docs.
pub struct Socket {
    sock: netlink_sys::Socket,
    seq: u32,
    buf: Vec<u8>,
}

// === impl Socket ===

impl Socket {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> Result<Socket, NlError> {
        let mut sock = netlink_sys::Socket::new(NETLINK_ROUTE).map_err(NlError::Socket)?;
        sock.bind_auto().map_err(NlError::Socket)?;
        sock.connect(&SocketAddr::new(0, 0))
            .map_err(NlError::Socket)?;
        Ok(Socket {
            sock,
            seq: 0,
            buf: Vec::with_capacity(RECV_BUF),
        })
    }

    /// Opens a socket inside the namespace `netns` (already opened): a
    /// thread enters it, opens the socket and ends.
    pub fn open_in(netns: &File) -> Result<Socket, NlError> {
        let ns = netns.try_clone().map_err(NlError::Socket)?;
        std::thread::spawn(move || {
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET)
                .map_err(|e| NlError::Socket(io::Error::from(e)))?;
            Socket::open()
        })
        .join()
        .map_err(|_| NlError::Socket(io::Error::other("netns thread panicked")))?
    }

    /// `ip link add <name> mtu <mtu> type veth peer name <peer> mtu <mtu> netns <peer_ns>`.
    pub fn add_veth(
        &mut self,
        name: &str,
        peer: &str,
        mtu: u32,
        peer_ns: &File,
    ) -> Result<(), NlError> {
        use std::os::fd::AsRawFd;
        let mut peer_msg = LinkMessage::default();
        peer_msg
            .attributes
            .push(LinkAttribute::IfName(peer.to_string()));
        peer_msg.attributes.push(LinkAttribute::Mtu(mtu));
        peer_msg
            .attributes
            .push(LinkAttribute::NetNsFd(peer_ns.as_raw_fd()));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer_msg))),
        ]));
        let op = format!("ip link add {name} type veth peer name {peer}");
        self.change(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &op,
        )
    }

    /// `ip link show <name>`; `None` if there is no such link.
    pub fn link(&mut self, name: &str) -> Result<Option<Link>, NlError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        let op = format!("ip link show {name}");
        match self.request(RouteNetlinkMessage::GetLink(msg), 0, &op) {
            Ok(replies) => Ok(replies.into_iter().find_map(|m| match m {
                RouteNetlinkMessage::NewLink(l) => Some(to_link(&l)),
                _ => None,
            })),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `ip link set dev <index> up`.
    pub fn set_up(&mut self, index: u32) -> Result<(), NlError> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.change(
            RouteNetlinkMessage::SetLink(msg),
            0,
            &format!("ip link set {index} up"),
        )
    }

    /// `ip link del <name>`; `false` if there was no such link.
    pub fn del_link(&mut self, name: &str) -> Result<bool, NlError> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        match self.change(
            RouteNetlinkMessage::DelLink(msg),
            0,
            &format!("ip link del {name}"),
        ) {
            Ok(()) => Ok(true),
            Err(e) if e.errno() == Some(libc::ENODEV) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// `ip addr add <ip>/<max> dev <index> [nodad]` (IPv6 skips duplicate
    /// address detection: the address is the daemon's, and DAD would delay it).
    pub fn add_host_addr(&mut self, index: u32, ip: IpAddr) -> Result<(), NlError> {
        let mut msg = AddressMessage::default();
        msg.header.family = family(ip);
        msg.header.prefix_len = max_prefix(ip);
        msg.header.index = index;
        msg.attributes.push(AddressAttribute::Local(ip));
        msg.attributes.push(AddressAttribute::Address(ip));
        if ip.is_ipv6() {
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        let op = format!("ip addr add {ip}/{} dev {index}", max_prefix(ip));
        self.change(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &op,
        )
    }

    /// `ip addr show dev <index>`: the addresses with prefix lengths.
    pub fn addrs(&mut self, index: u32) -> Result<Vec<(IpAddr, u8)>, NlError> {
        let replies = self.request(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
            "ip addr show",
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewAddress(a) if a.header.index == index => {
                    let ip = a.attributes.iter().find_map(|at| match at {
                        AddressAttribute::Address(ip) => Some(*ip),
                        _ => None,
                    })?;
                    Some((ip, a.header.prefix_len))
                }
                _ => None,
            })
            .collect())
    }

    /// `ip neigh replace <ip> lladdr <mac> dev <index> nud permanent`.
    pub fn add_permanent_neigh(
        &mut self,
        index: u32,
        ip: IpAddr,
        mac: &[u8],
    ) -> Result<(), NlError> {
        let mut msg = NeighbourMessage::default();
        msg.header.family = family(ip);
        msg.header.ifindex = index;
        msg.header.state = NeighbourState::Permanent;
        msg.attributes
            .push(NeighbourAttribute::Destination(match ip {
                IpAddr::V4(v4) => NeighbourAddress::Inet(v4),
                IpAddr::V6(v6) => NeighbourAddress::Inet6(v6),
            }));
        msg.attributes
            .push(NeighbourAttribute::LinkLayerAddress(mac.to_vec()));
        let op = format!(
            "ip neigh replace {ip} lladdr {} dev {index} nud permanent",
            fmt_mac(mac)
        );
        self.change(
            RouteNetlinkMessage::NewNeighbour(msg),
            NLM_F_CREATE | netlink_packet_core::NLM_F_REPLACE,
            &op,
        )
    }

    /// `ip neigh show dev <index>`: permanent entries as (address, MAC).
    pub fn permanent_neighs(&mut self, index: u32) -> Result<Vec<(IpAddr, Vec<u8>)>, NlError> {
        let replies = self.request(
            RouteNetlinkMessage::GetNeighbour(NeighbourMessage::default()),
            NLM_F_DUMP,
            "ip neigh show",
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewNeighbour(n)
                    if n.header.ifindex == index && n.header.state == NeighbourState::Permanent =>
                {
                    let mut ip = None;
                    let mut mac = None;
                    for at in &n.attributes {
                        match at {
                            NeighbourAttribute::Destination(NeighbourAddress::Inet(v)) => {
                                ip = Some(IpAddr::V4(*v))
                            }
                            NeighbourAttribute::Destination(NeighbourAddress::Inet6(v)) => {
                                ip = Some(IpAddr::V6(*v))
                            }
                            NeighbourAttribute::LinkLayerAddress(m) => mac = Some(m.clone()),
                            _ => {}
                        }
                    }
                    Some((ip?, mac?))
                }
                _ => None,
            })
            .collect())
    }

    /// `ip route add <dst>/<len> [via <gw> onlink] dev <index> [scope link]`
    /// in the main table (`gw = None` gives a link-scope route).
    pub fn add_route(
        &mut self,
        dst: IpAddr,
        len: u8,
        gw: Option<IpAddr>,
        index: u32,
    ) -> Result<(), NlError> {
        let msg = route_msg(dst, len, gw, index);
        let via = gw.map(|g| format!(" via {g} onlink")).unwrap_or_default();
        let op = format!("ip route add {dst}/{len}{via} dev {index}");
        self.change(
            RouteNetlinkMessage::NewRoute(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &op,
        )
    }

    /// `ip route show table main` for one family: (dst, len, gateway, oif).
    pub fn routes(&mut self, v6: bool) -> Result<Vec<Route>, NlError> {
        let mut msg = RouteMessage::default();
        msg.header.address_family = if v6 {
            AddressFamily::Inet6
        } else {
            AddressFamily::Inet
        };
        let replies = self.request(
            RouteNetlinkMessage::GetRoute(msg),
            NLM_F_DUMP,
            "ip route show",
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewRoute(r)
                    if r.header.table == RouteHeader::RT_TABLE_MAIN =>
                {
                    let mut route = Route {
                        dst: None,
                        len: r.header.destination_prefix_length,
                        gw: None,
                        oif: 0,
                    };
                    for at in &r.attributes {
                        match at {
                            RouteAttribute::Destination(a) => route.dst = route_ip(a),
                            RouteAttribute::Gateway(a) => route.gw = route_ip(a),
                            RouteAttribute::Oif(i) => route.oif = *i,
                            _ => {}
                        }
                    }
                    Some(route)
                }
                _ => None,
            })
            .collect())
    }

    /// Sends a change and waits for the kernel's ack.
    fn change(&mut self, msg: RouteNetlinkMessage, flags: u16, op: &str) -> Result<(), NlError> {
        self.request(msg, flags | NLM_F_ACK, op).map(|_| ())
    }

    /// Sends one request and collects the replies until the ack, the error
    /// or the end of the dump.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        op: &str,
    ) -> Result<Vec<RouteNetlinkMessage>, NlError> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut out = vec![0u8; packet.buffer_len()];
        packet.serialize(&mut out);
        self.sock.send(&out, 0).map_err(NlError::Socket)?;
        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let acked = flags & NLM_F_ACK != 0;
        let mut replies = Vec::new();
        loop {
            self.buf.clear();
            self.sock.recv(&mut self.buf, 0).map_err(NlError::Socket)?;
            let mut off = 0;
            while off < self.buf.len() {
                let bytes = &self.buf[off..];
                let reply =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(bytes).map_err(|e| {
                        NlError::Decode {
                            op: op.to_string(),
                            reason: e.to_string(),
                        }
                    })?;
                let len = usize::try_from(reply.header.length).unwrap_or(0);
                if len == 0 {
                    return Err(NlError::Decode {
                        op: op.to_string(),
                        reason: "zero-length message".into(),
                    });
                }
                off += (len + 3) & !3;
                if reply.header.sequence_number != seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Error(e) => match e.code {
                        None => return Ok(replies),
                        Some(_) => {
                            return Err(NlError::Kernel {
                                op: op.to_string(),
                                source: e.to_io(),
                            });
                        }
                    },
                    NetlinkPayload::Done(_) => return Ok(replies),
                    NetlinkPayload::InnerMessage(m) => {
                        replies.push(m);
                        if !dump && !acked {
                            return Ok(replies);
                        }
                    }
                    _ => {}
                }
            }
        }
    }
}

/// A route as [`Socket::routes`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// Destination (`None` for the default route).
    pub dst: Option<IpAddr>,
    /// Destination prefix length.
    pub len: u8,
    /// Gateway, if any.
    pub gw: Option<IpAddr>,
    /// Output interface index.
    pub oif: u32,
}

fn route_msg(dst: IpAddr, len: u8, gw: Option<IpAddr>, index: u32) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header.address_family = family(dst);
    msg.header.destination_prefix_length = len;
    msg.header.table = RouteHeader::RT_TABLE_MAIN;
    msg.header.protocol = RouteProtocol::Boot;
    msg.header.kind = RouteType::Unicast;
    msg.header.scope = if gw.is_some() || dst.is_ipv6() {
        RouteScope::Universe
    } else {
        RouteScope::Link
    };
    if len > 0 {
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst)));
    }
    if let Some(gw) = gw {
        msg.header.flags = RouteFlags::Onlink;
        msg.attributes
            .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
    }
    msg.attributes.push(RouteAttribute::Oif(index));
    msg
}

fn route_ip(a: &RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v) => Some(IpAddr::V4(*v)),
        RouteAddress::Inet6(v) => Some(IpAddr::V6(*v)),
        _ => None,
    }
}

fn to_link(l: &LinkMessage) -> Link {
    let mut link = Link {
        index: l.header.index,
        up: l.header.flags.contains(LinkFlags::Up),
        mac: Vec::new(),
        mtu: 0,
    };
    for at in &l.attributes {
        match at {
            LinkAttribute::Address(m) => link.mac = m.clone(),
            LinkAttribute::Mtu(m) => link.mtu = *m,
            _ => {}
        }
    }
    link
}

fn family(ip: IpAddr) -> AddressFamily {
    if ip.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

/// 32 for IPv4, 128 for IPv6.
pub fn max_prefix(ip: IpAddr) -> u8 {
    if ip.is_ipv4() { 32 } else { 128 }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn fmt_mac(mac: &[u8]) -> String {
    mac.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
