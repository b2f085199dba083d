//! The receive step: one datagram (a segment of a `UDP_GRO` train) or raw
//! IPIP packet -> the inner packet to deliver, or why not.

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;

use crate::antispoof::{self, AntiSpoofing, Verdict};
use crate::encap::ipip;
use crate::encap::{Codec, DropReason};
use crate::peers::{Entry, PeerTable};
use crate::wire::ip;

/// A decapsulated packet that passed the source checks.
#[derive(Debug, Clone)]
pub struct Delivery<'t> {
    /// The inner IP packet, within the buffer passed in.
    pub inner: Range<usize>,
    /// The entry whose per-peer counters count it, if any.
    pub from: Option<&'t Entry>,
    /// Subnet mode: delivered although the outer source is not `from`'s
    /// published address (count `UnexpectedSource` and note it on the peer).
    pub unexpected: bool,
}

/// The segments of a receive buffer of `len` bytes that the kernel
/// coalesced with stride `stride` (the last one may be shorter).
pub fn train(len: usize, stride: usize) -> impl Iterator<Item = Range<usize>> {
    let stride = stride.max(1);
    (0..len.div_ceil(stride)).map(move |i| i * stride..((i + 1) * stride).min(len))
}

/// The source checks ([`antispoof::check`]) of the decapsulated packet
/// `buf[inner]` (a valid IP header) whose outer source has the entries `outer`.
pub fn admit<'t>(
    mode: AntiSpoofing,
    peers: &'t PeerTable,
    outer: &[usize],
    buf: &[u8],
    inner: Range<usize>,
) -> Result<Delivery<'t>, DropReason> {
    let src = ip::Packet::new_unchecked(&buf[inner.clone()]).src();
    let (from, unexpected) = match antispoof::check(mode, peers, outer, src) {
        Verdict::Drop(r) => return Err(r),
        Verdict::Accept(from) => (from, false),
        Verdict::Unexpected(e) => (Some(e), true),
    };
    Ok(Delivery {
        inner,
        from,
        unexpected,
    })
}

/// flannel-UDP / VXLAN: one datagram from an outer source with the entries
/// `outer` ([`PeerTable::endpoint_entries`]), validated in place.
pub fn udp<'t>(
    codec: &Codec,
    mode: AntiSpoofing,
    peers: &'t PeerTable,
    outer: &[usize],
    dgram: &mut [u8],
) -> Result<Delivery<'t>, DropReason> {
    if mode.drops_unknown_outer() && outer.is_empty() {
        return Err(DropReason::UnknownPeer);
    }
    let r = codec.decap(dgram)?;
    admit(mode, peers, outer, dgram, r)
}

/// Whether the kernel has checked an integrity sum that covers the whole
/// inner packet of a flannel-UDP / VXLAN datagram from `src`: over IPv6 a
/// UDP checksum is mandatory and the engine's sockets leave
/// `UDP_NO_CHECK6_RX` off, so a datagram with a zero checksum never reaches
/// them and every other one was verified (or came over a veth from a local
/// `CHECKSUM_PARTIAL` skb, which the kernel trusts alike). Over IPv4 the
/// checksum may be zero, and kernel vxlan sends it zero by default (flannel
/// does not ask for `udpcsum`); a UDP socket does not say which, so IPv4
/// datagrams get no trust here and GRO verifies their inner TCP checksums.
pub fn outer_checksum_covers(src: IpAddr) -> bool {
    matches!(src, IpAddr::V6(a) if a.to_ipv4_mapped().is_none())
}

/// flannel-UDP / VXLAN: [`udp`], then, when [`outer_checksum_covers`] the
/// datagram from `src`, its inner TCP checksum marked trusted (as WireGuard
/// does after Poly1305, [`crate::path::wg::seg::trust_tcp_checksum`]): GRO
/// merges it without summing the payload again, and the TUN write says
/// `NEEDS_CSUM`, so the kernel does not either.
pub fn udp_from<'t>(
    codec: &Codec,
    mode: AntiSpoofing,
    peers: &'t PeerTable,
    (src, outer): (IpAddr, &[usize]),
    dgram: &mut [u8],
) -> Result<Delivery<'t>, DropReason> {
    let d = udp(codec, mode, peers, outer, dgram)?;
    if outer_checksum_covers(src) {
        crate::path::wg::seg::trust_tcp_checksum(&mut dgram[d.inner.clone()]);
    }
    Ok(d)
}

/// IPIP: one packet from the raw socket (outer header first), validated in
/// place; with its outer source.
pub fn ipip<'t>(
    mode: AntiSpoofing,
    peers: &'t PeerTable,
    pkt: &mut [u8],
) -> Result<(Ipv4Addr, Delivery<'t>), DropReason> {
    let src = ipip::outer_source(pkt).ok_or(DropReason::Malformed)?;
    let outer = peers.endpoint_entries(IpAddr::V4(src));
    if mode.drops_unknown_outer() && outer.is_empty() {
        return Err(DropReason::UnknownPeer);
    }
    let r = ipip::decap(pkt)?;
    let d = admit(mode, peers, outer, pkt, r)?;
    Ok((src, d))
}
