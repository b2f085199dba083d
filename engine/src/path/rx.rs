//! The receive step: one datagram (a segment of a `UDP_GRO` train) or raw
//! IPIP packet -> the inner packet to deliver, or why not.

use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, TunnResult};
use boringtun::x25519;

use crate::antispoof::{self, AntiSpoofing, Verdict};
use crate::encap::{Codec, DropReason};
use crate::ipip;
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

/// WireGuard: a packet of `len` bytes that peer `id` sent from inner source
/// `inner_src` (boringtun has decrypted it): it must hold its IP header and,
/// unless anti-spoofing is off, come from the peer's AllowedIPs. Returns the
/// entry counting it.
pub fn wg(
    mode: AntiSpoofing,
    peers: &PeerTable,
    id: u32,
    inner_src: IpAddr,
    len: usize,
) -> Result<Option<&Entry>, DropReason> {
    if !crate::wg::input::holds_ip_header(inner_src, len) {
        return Err(DropReason::Malformed);
    }
    let (allowed, from) = crate::wg::input::source_allowed(peers, id, inner_src);
    if !allowed && mode != AntiSpoofing::Off {
        return Err(DropReason::SpoofedSource);
    }
    Ok(from)
}

/// What a WireGuard datagram without a receiver index (a handshake
/// initiation, or junk) asks for; see [`wg_initiation`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Initiation {
    /// An initiation from the peer with this id: its owner handles it.
    Peer(u32),
    /// Under load: answer the source with the cookie reply in the first
    /// this many bytes of the cookie buffer, and count a `Handshake` drop.
    Cookie(usize),
}

/// WireGuard: a datagram without a receiver index, from `src`. Checks MAC1
/// (under load, MAC2 too: without a valid cookie the answer is a cookie
/// reply written into `cookie`), then decrypts the initiator's static key
/// with our `secret` (`public` is its public key) and finds that key's peer
/// in `peers`. `UnknownKey` for a key of no peer.
pub fn wg_initiation(
    limiter: &RateLimiter,
    secret: &x25519::StaticSecret,
    public: &x25519::PublicKey,
    peers: &PeerTable,
    d: &[u8],
    src: IpAddr,
    cookie: &mut [u8; 64],
) -> Result<Initiation, DropReason> {
    let pkt = match limiter.verify_packet(Some(src), d, cookie) {
        Ok(Packet::HandshakeInit(h)) => h,
        Ok(_) => return Err(DropReason::Malformed),
        Err(TunnResult::WriteToNetwork(c)) => return Ok(Initiation::Cookie(c.len())),
        Err(TunnResult::Err(e)) => return Err(crate::wg::classify(&e)),
        Err(_) => return Err(DropReason::Malformed),
    };
    let half = parse_handshake_anon(secret, public, &pkt).map_err(|e| crate::wg::classify(&e))?;
    match peers.wg_by_key(&half.peer_static_public) {
        Some(w) => Ok(Initiation::Peer(w.id)),
        None => Err(DropReason::UnknownKey),
    }
}
