//! The transmit step: one TUN read -> datagrams in the transmit arena.
//!
//! In two calls, so that the caller can make room between them without the
//! step doing I/O: a `*_plan` function parses, routes and prepares the read
//! in place (TTL, checksum completion) and says how many arena bytes and
//! messages it will take ([`Plan::need`], [`Plan::datagrams`]); the caller
//! flushes if they do not fit, then [`write()`] (or [`udp_write`]) cuts the
//! packet into the arena and [`Datagrams`] says where each datagram lies.

use std::net::{IpAddr, Ipv4Addr};

use crate::encap::ipip::{self, OuterParams};
use crate::encap::wg::{OVERHEAD as WG_OVERHEAD, owner};
use crate::encap::{Codec, DropReason, MAX_UDP_PAYLOAD};
use crate::offload::gso::{self, Segments};
use crate::offload::uso;
use crate::peers::{Entry, PeerTable};
use crate::wire::{ip, ip_version, vnet};

/// Largest inner packet an outer IPv4 packet can carry (IPIP).
pub const MAX_IPIP_INNER: usize = 65535 - crate::wire::ipv4::HEADER_LEN;

/// A TUN read: its virtio-net header and where the IP packet lies.
#[derive(Debug, Clone, Copy)]
pub struct TunPacket {
    /// The virtio-net header (all zero without `IFF_VNET_HDR`).
    pub hdr: vnet::VnetHdr,
    /// The IP packet is `read[start..]`.
    pub start: usize,
    /// 4 or 6.
    pub version: u8,
    /// The inner destination.
    pub dst: IpAddr,
}

/// Splits a TUN read (`read` is exactly what was read) into its header and
/// IP packet; `Malformed` unless the packet holds a fixed IP header.
pub fn parse(read: &[u8], vnet_hdr: bool) -> Result<TunPacket, DropReason> {
    let (hdr, start) = vnet::VnetHdr::split(read, vnet_hdr).ok_or(DropReason::Malformed)?;
    let p = ip::Packet::new_checked(&read[start..]).map_err(|_| DropReason::Malformed)?;
    Ok(TunPacket {
        hdr,
        start,
        version: p.version(),
        dst: p.dst(),
    })
}

/// Which super-packets an encapsulation cuts (all of them take `GSO_TCPV4`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cuts {
    /// `GSO_TCPV6`.
    pub tcp6: bool,
    /// `GSO_UDP_L4` (userspace USO).
    pub udp: bool,
}

/// flannel-UDP and VXLAN: TCP over both versions and UDP.
pub const UDP_CUTS: Cuts = Cuts {
    tcp6: true,
    udp: true,
};
/// WireGuard: TCP over both versions (segmented in place, `path::wg::seg`).
pub const WG_CUTS: Cuts = Cuts {
    tcp6: true,
    udp: false,
};
/// IPIP: TCP over IPv4 (it carries nothing else).
pub const IPIP_CUTS: Cuts = Cuts {
    tcp6: false,
    udp: false,
};

/// What the virtio-net header asks of a TUN read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// One packet; a partial transport checksum at `(csum_start, csum_offset)` to complete.
    Single(Option<(usize, usize)>),
    /// A TCP super-packet to cut into segments of this many payload bytes.
    Tcp(usize),
    /// A UDP super-packet to cut into datagrams of this many payload bytes.
    Udp(usize),
}

impl Shape {
    /// The shape `hdr` describes; `Malformed` for a GSO type this
    /// encapsulation does not cut, or a GSO size of 0.
    pub fn of(hdr: &vnet::VnetHdr, cuts: Cuts) -> Result<Shape, DropReason> {
        let size = usize::from(hdr.gso_size);
        match hdr.gso_type & !vnet::GSO_ECN {
            vnet::GSO_NONE => Ok(Shape::Single(
                (hdr.flags & vnet::F_NEEDS_CSUM != 0)
                    .then(|| (usize::from(hdr.csum_start), usize::from(hdr.csum_offset))),
            )),
            _ if size == 0 => Err(DropReason::Malformed),
            vnet::GSO_TCPV4 => Ok(Shape::Tcp(size)),
            vnet::GSO_TCPV6 if cuts.tcp6 => Ok(Shape::Tcp(size)),
            vnet::GSO_UDP_L4 if cuts.udp => Ok(Shape::Udp(size)),
            _ => Err(DropReason::Malformed),
        }
    }
}

/// A single (not super-) packet made ready to send: its partial checksum
/// completed, its length checked against `max_len` (`Mtu`).
pub fn single(
    ip: &mut [u8],
    csum: Option<(usize, usize)>,
    max_len: usize,
) -> Result<(), DropReason> {
    if let Some((cs, co)) = csum {
        gso::complete_checksum(ip, cs, co)?;
    }
    if ip.len() > max_len {
        return Err(DropReason::Mtu);
    }
    Ok(())
}

/// What the outer side of a planned read needs besides the peer entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outer {
    /// flannel-UDP / VXLAN: the entry's endpoint and VTEP MAC.
    Udp,
    /// IPIP: the outer destination and header fields.
    Ipip {
        /// The peer's (IPv4) address.
        dst: Ipv4Addr,
        /// TTL, TOS and DF of the outer header.
        params: OuterParams,
    },
    /// WireGuard: the peer (sessions are [`crate::path::wg`]'s).
    Wg {
        /// The peer's id.
        id: u32,
    },
}

/// A TUN read routed and prepared: what [`write()`] (or the WireGuard
/// core) needs and the room it takes. One shape for every encapsulation.
#[derive(Debug, Clone, Copy)]
pub struct Plan<'t> {
    /// The peer it goes to.
    pub entry: &'t Entry,
    /// The read.
    pub pkt: TunPacket,
    /// Its shape.
    pub shape: Shape,
    /// Bytes in front of each datagram for the encapsulation's header.
    pub headroom: usize,
    /// Arena bytes [`write()`] fills.
    pub need: usize,
    /// At most this many datagrams (messages) come out (for a super-packet, with a margin).
    pub datagrams: usize,
    /// The outer side.
    pub outer: Outer,
}

/// Why a TUN read is not sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Dropped for this reason.
    Drop(DropReason),
    /// No peer (count `NoRoute`); flannel-UDP answers an IPv4 packet with an
    /// ICMP net-unreachable quoting `read[start..]`.
    Unreachable {
        /// Where the IP packet starts in the read.
        start: usize,
    },
}

impl Refusal {
    /// The drop reason to count.
    pub fn reason(self) -> DropReason {
        match self {
            Refusal::Drop(r) => r,
            Refusal::Unreachable { .. } => DropReason::NoRoute,
        }
    }
}

impl From<DropReason> for Refusal {
    fn from(r: DropReason) -> Refusal {
        Refusal::Drop(r)
    }
}

/// Bytes a super-packet's segments need (`gso::required_len`, `uso::udp_required_len`).
type Required = fn(&[u8], usize, usize) -> Option<usize>;

/// Room for the packet: `need` arena bytes and how many datagrams, or `Mtu`
/// when it can never fit (`arena` bytes for a super-packet, `max_len` for one).
fn room(
    ip: &mut [u8],
    shape: Shape,
    headroom: usize,
    arena: usize,
    max_len: usize,
) -> Result<(usize, usize), DropReason> {
    let (required, size): (Required, usize) = match shape {
        Shape::Single(csum) => {
            single(ip, csum, max_len)?;
            return Ok((headroom + ip.len(), 1));
        }
        Shape::Tcp(size) => (gso::required_len, size),
        Shape::Udp(size) => (uso::udp_required_len, size),
    };
    let need = required(ip, size, headroom).ok_or(DropReason::Malformed)?;
    if need > arena {
        return Err(DropReason::Mtu);
    }
    Ok((need, need / (headroom + size) + 2))
}

/// flannel-UDP / VXLAN: routes `read` (a whole TUN read, edited in place:
/// flannel-UDP's TTL, checksum completion) for a transmit arena of `arena` bytes.
pub fn udp_plan<'t>(
    codec: &Codec,
    peers: &'t PeerTable,
    read: &mut [u8],
    vnet_hdr: bool,
    arena: usize,
) -> Result<Plan<'t>, Refusal> {
    let pkt = parse(read, vnet_hdr)?;
    let Some(entry) = peers.lookup(pkt.dst) else {
        return Err(if pkt.version == 4 && matches!(codec, Codec::FlannelUdp) {
            Refusal::Unreachable { start: pkt.start }
        } else {
            Refusal::Drop(DropReason::NoRoute)
        });
    };
    let ip = &mut read[pkt.start..];
    codec.prepare_inner(ip)?;
    let shape = Shape::of(&pkt.hdr, UDP_CUTS)?;
    let headroom = codec.headroom();
    let (need, datagrams) = room(ip, shape, headroom, arena, MAX_UDP_PAYLOAD - headroom)?;
    Ok(Plan {
        entry,
        pkt,
        shape,
        headroom,
        need,
        datagrams,
        outer: Outer::Udp,
    })
}

/// IPIP: routes `read` (IPv4 only; a peer with an IPv6 endpoint is no route)
/// and derives the outer header fields ([`Outer::Ipip`]).
pub fn ipip_plan<'t>(
    peers: &'t PeerTable,
    read: &mut [u8],
    vnet_hdr: bool,
    arena: usize,
) -> Result<Plan<'t>, DropReason> {
    let pkt = parse(read, vnet_hdr).map_err(|e| {
        // The TUN has no IPv6 routes: link-local chatter ends here.
        let off = if vnet_hdr { vnet::HEADER_LEN } else { 0 };
        match read.get(off..).and_then(ip_version) {
            Some(6) => DropReason::NoRoute,
            _ => e,
        }
    })?;
    if pkt.version != 4 {
        return Err(DropReason::NoRoute);
    }
    let entry = peers.lookup(pkt.dst).ok_or(DropReason::NoRoute)?;
    let IpAddr::V4(dst) = entry.dst.ip() else {
        return Err(DropReason::NoRoute);
    };
    let ip = &mut read[pkt.start..];
    let params = ipip::outer_params(ip).ok_or(DropReason::Malformed)?;
    let shape = Shape::of(&pkt.hdr, IPIP_CUTS)?;
    let (need, datagrams) = room(ip, shape, 0, arena, MAX_IPIP_INNER)?;
    Ok(Plan {
        entry,
        pkt,
        shape,
        headroom: 0,
        need,
        datagrams,
        outer: Outer::Ipip { dst, params },
    })
}

/// Where [`write()`] put the datagrams in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagrams {
    /// Their layout (headroom included).
    pub segs: Segments,
    /// Header bytes in front of each.
    pub headroom: usize,
    /// Whether a super-packet was cut (count `GsoSuperPackets`).
    pub cut: bool,
}

impl Datagrams {
    /// Number of datagrams.
    pub fn count(&self) -> usize {
        self.segs.count
    }

    /// Where datagram `i` lies in the arena passed to [`write()`].
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        self.segs.range(i)
    }

    /// Inner (IP) bytes of all datagrams.
    pub fn inner_bytes(&self) -> usize {
        self.segs.total_len() - self.segs.count * self.headroom
    }
}

/// Cuts (or copies) the planned packet of `read` into `arena` (at least
/// [`Plan::need`] bytes), [`Plan::headroom`] bytes left free in front of each
/// datagram.
///
/// # Panics
/// If `arena` is shorter than `plan.need` or `read` is not the planned read.
pub fn write(plan: &Plan<'_>, read: &[u8], arena: &mut [u8]) -> Result<Datagrams, DropReason> {
    let ip = &read[plan.pkt.start..];
    let h = plan.headroom;
    let segs = match plan.shape {
        Shape::Tcp(size) => gso::tcp_segment(ip, size, h, arena)?,
        Shape::Udp(size) => uso::udp_segment(ip, size, h, arena)?,
        Shape::Single(_) => {
            arena[h..plan.need].copy_from_slice(ip);
            Segments {
                count: 1,
                stride: plan.need,
                last_len: plan.need,
            }
        }
    };
    Ok(Datagrams {
        segs,
        headroom: h,
        cut: !matches!(plan.shape, Shape::Single(_)),
    })
}

/// [`write()`], then `codec`'s header in front of every datagram.
pub fn udp_write(
    codec: &Codec,
    plan: &Plan<'_>,
    read: &[u8],
    arena: &mut [u8],
) -> Result<Datagrams, DropReason> {
    let d = write(plan, read, arena)?;
    for i in 0..d.count() {
        let s = d.range(i).start;
        codec.write_header(
            &mut arena[s..s + d.headroom],
            plan.entry.mac,
            plan.pkt.version,
        );
    }
    Ok(d)
}

/// Where a WireGuard TUN read goes.
#[derive(Debug, Clone, Copy)]
pub enum WgRoute<'t> {
    /// The worker with this index owns the peer: hand the whole read over
    /// (untouched: its checksum is completed where it is encrypted).
    HandOff(usize),
    /// This worker owns the peer ([`Outer::Wg`]): segment (or finish) and
    /// encrypt here; [`Plan::headroom`] is the 32 bytes WireGuard adds.
    Here(Plan<'t>),
}

/// WireGuard: the peer of `read` and the worker (of `workers`) that owns
/// it; this one is `me`. Planned for an arena of `arena` bytes.
pub fn wg_plan<'t>(
    peers: &'t PeerTable,
    read: &mut [u8],
    vnet_hdr: bool,
    (me, workers): (usize, usize),
    arena: usize,
) -> Result<WgRoute<'t>, DropReason> {
    let pkt = parse(read, vnet_hdr)?;
    let entry = peers.lookup(pkt.dst).ok_or(DropReason::NoRoute)?;
    let w = entry
        .wg
        .and_then(|i| peers.wg_peers().get(i))
        .ok_or(DropReason::NoRoute)?;
    let home = owner(w.id, workers);
    if home != me {
        return Ok(WgRoute::HandOff(home));
    }
    let ip = &mut read[pkt.start..];
    let shape = Shape::of(&pkt.hdr, WG_CUTS)?;
    let h = WG_OVERHEAD;
    let (need, datagrams) = room(ip, shape, h, arena, MAX_UDP_PAYLOAD - h)?;
    Ok(WgRoute::Here(Plan {
        entry,
        pkt,
        shape,
        headroom: h,
        need,
        datagrams,
        outer: Outer::Wg { id: w.id },
    }))
}

/// FNV-style hash of the inner flow (addresses + TCP/UDP ports), like the
/// kernel's `udp_flow_src_port` input: stable per flow, spread across flows
/// (it picks the send socket, so the outer source port).
pub fn flow_hash(ip: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    let Ok(p) = ip::Packet::new_checked(ip) else {
        return h ^ (h >> 16);
    };
    let l4 = matches!(p.protocol(), 6 | 17).then(|| p.header_len());
    let ports = l4.and_then(|o| ip.get(o..o + 4)).unwrap_or(&[]);
    for b in p.addr_bytes().iter().chain(ports) {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    h ^ (h >> 16)
}
