//! The transmit step that lets the kernel segment (issue 32, Linux 6.17+):
//! a VXLAN or flannel-UDP TCP super-packet becomes ONE frame for a TAP on
//! the underlay side, headed by the 24-byte virtio-net header of UDP-tunnel
//! GSO (`GSO_TCPV4 | GSO_UDP_TUNNEL_IPV4`). The node's stack forwards it to
//! the uplink whole; the uplink (a veth, a NIC with
//! `tx-udp_tnl-segmentation`) or the stack's software GSO cuts it into
//! datagrams and fills both checksums. Userspace writes one header block
//! per super-packet and neither cuts nor sums the payload.
//!
//! [`tunnel_header`] writes the block (virtio-net header, outer Ethernet
//! to the TAP's own MAC, IPv4, UDP, then VXLAN and inner Ethernet, or for
//! flannel-UDP nothing: the inner IP header follows the UDP header, which
//! the kernel's tunnel GSO takes alike, since the virtio-net header names
//! the inner network header's offset) into a caller's buffer; the worker
//! writes block + the TUN read's IP packet with one `writev`. The inner TCP
//! checksum field keeps what the pod's stack left there for a partial
//! checksum (the pseudo-header sum), which is what the kernel's GSO
//! completes.
//!
//! flannel-UDP only toward peers marked [`Entry::tunnel_gso`](crate::peers::Entry::tunnel_gso):
//! across an uplink that hands the skb over whole (a veth to a node on the
//! same host), a plain UDP socket, flanneld's, gets the whole super-packet
//! as one datagram with its inner checksum still partial; weft's receive
//! takes it (`UDP_GRO` socket, oversize delivery through GRO). VXLAN
//! receivers, kernel or weft, all take it.
//!
//! Not taken (`None`, the caller sends through its UDP sockets): anything
//! but a TCP super-packet with a partial checksum to an IPv4 endpoint from
//! an IPv4 node, a flannel-UDP peer not so marked, or an inner packet too
//! big for one outer IPv4 length field.

use std::net::{IpAddr, Ipv4Addr};

use crate::encap::{Codec, VXLAN_HEADROOM};
use crate::path::tx::{Plan, Shape};
use crate::wire::{ethernet, ipv4, vnet};

/// Outer Ethernet + IPv4 + UDP.
const OUTER: usize = ethernet::HEADER_LEN + ipv4::HEADER_LEN + 8;
/// Bytes of the longest block [`tunnel_header`] writes (VXLAN's; flannel-UDP's
/// is [`VXLAN_HEADROOM`] shorter).
pub const BLOCK_LEN: usize = vnet::TUNNEL_HEADER_LEN + OUTER + VXLAN_HEADROOM;
/// Largest inner IP packet one outer IPv4 packet carries under VXLAN
/// ([`max_inner`]).
pub const MAX_INNER: usize = max_inner(VXLAN_HEADROOM);

/// Largest inner IP packet one outer IPv4 packet carries behind `headroom`
/// bytes of tunnel header.
pub const fn max_inner(headroom: usize) -> usize {
    65535 - (ipv4::HEADER_LEN + 8 + headroom)
}
/// `DF`, as the engine's UDP sockets send (`IP_PMTUDISC_PROBE`).
const DF: u16 = 0x4000;
/// The outer TTL (kernel vxlan's default, the UDP sockets' too).
const TTL: u8 = 64;

/// The fixed parts of the frames one worker writes.
#[derive(Debug, Clone, Copy)]
pub struct TapSide {
    /// The TAP's own MAC (the stack takes the frame as addressed to it).
    pub tap_mac: [u8; 6],
    /// This node's underlay address (the outer source).
    pub local: Ipv4Addr,
}

/// Writes the header block for the planned read `ip` (the TUN read from the
/// plan's start) into `out[..BLOCK_LEN]`, with outer UDP source port
/// `sport` and IP ID `id`; `None` when this path does not take the packet
/// (see the module docs).
pub fn tunnel_header(
    codec: &Codec,
    plan: &Plan<'_>,
    ip: &[u8],
    side: TapSide,
    (sport, id): (u16, u16),
    out: &mut [u8],
) -> Option<usize> {
    if matches!(codec, Codec::FlannelUdp) && !plan.entry.tunnel_gso {
        return None;
    }
    let Shape::Tcp(mss) = plan.shape else {
        return None;
    };
    let IpAddr::V4(dst) = plan.entry.dst.ip() else {
        return None;
    };
    let h = plan.pkt.hdr;
    let headroom = codec.headroom();
    let len = vnet::TUNNEL_HEADER_LEN + OUTER + headroom;
    if plan.pkt.version != 4
        || h.flags & vnet::F_NEEDS_CSUM == 0
        || ip.len() > max_inner(headroom)
        || out.len() < len
    {
        return None;
    }
    let mss = u16::try_from(mss).ok()?;
    let th = usize::from(h.csum_start);
    let headers = th + usize::from(*ip.get(th + 12)? >> 4) * 4;
    let out = &mut out[..len];
    let frame = vnet::TUNNEL_HEADER_LEN;
    let outer_ip = frame + ethernet::HEADER_LEN;
    let outer_udp = outer_ip + ipv4::HEADER_LEN;
    let inner_nh = OUTER + headroom; // from the frame's start
    let inner_th = inner_nh + usize::from(h.csum_start);
    let gso = vnet::VnetHdr {
        flags: vnet::F_NEEDS_CSUM,
        gso_type: vnet::GSO_TCPV4 | vnet::GSO_UDP_TUNNEL_IPV4 | (h.gso_type & vnet::GSO_ECN),
        hdr_len: u16::try_from(inner_nh + headers).ok()?,
        gso_size: mss,
        csum_start: u16::try_from(inner_th).ok()?,
        csum_offset: h.csum_offset,
    };
    gso.emit_tunnel(
        (OUTER - 8) as u16,
        inner_nh as u16,
        &mut out[..vnet::TUNNEL_HEADER_LEN],
    );
    let mut src = side.tap_mac;
    src[5] ^= 1; // any unicast source but the TAP's own
    ethernet::Frame::new_unchecked(&mut out[frame..outer_ip]).emit(
        side.tap_mac,
        src,
        ethernet::ETHERTYPE_IPV4,
    );
    let udp_len = u16::try_from(8 + headroom + ip.len()).ok()?;
    let o = &mut out[outer_ip..outer_udp];
    o[0] = 0x45;
    o[1] = 0;
    o[2..4].copy_from_slice(&(udp_len + ipv4::HEADER_LEN as u16).to_be_bytes());
    o[4..6].copy_from_slice(&id.to_be_bytes());
    o[6..8].copy_from_slice(&DF.to_be_bytes());
    o[8] = TTL;
    o[9] = ipv4::PROTO_UDP;
    o[12..16].copy_from_slice(&side.local.octets());
    o[16..20].copy_from_slice(&dst.octets());
    ipv4::Packet::new_unchecked(&mut *o).fill_checksum();
    let u = &mut out[outer_udp..outer_udp + 8];
    u[0..2].copy_from_slice(&sport.to_be_bytes());
    u[2..4].copy_from_slice(&plan.entry.dst.port().to_be_bytes());
    u[4..6].copy_from_slice(&udp_len.to_be_bytes());
    // No outer checksum, as kernel vxlan sends by default; the inner TCP
    // checksum covers the payload.
    u[6..8].fill(0);
    codec.write_header(&mut out[outer_udp + 8..], plan.entry.mac, 4);
    Some(len)
}

/// How many datagrams, and how many inner bytes in them, the kernel cuts
/// the TCP super-packet `ip` (transport header at `th`) into at `mss`.
pub fn segments(ip: &[u8], th: usize, mss: usize) -> (usize, usize) {
    let headers = th + ip.get(th + 12).map_or(20, |d| usize::from(d >> 4) * 4);
    let n = ip.len().saturating_sub(headers).div_ceil(mss.max(1)).max(1);
    (n, ip.len() + (n - 1) * headers)
}
