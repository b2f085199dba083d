//! IPv4 header view (RFC 791).

use std::net::Ipv4Addr;

use super::{Field, WireError, be16, checksum, put16};

mod field {
    use super::Field;
    pub const VER_IHL: usize = 0;
    pub const TOS: usize = 1;
    pub const LENGTH: Field = 2..4;
    pub const IDENT: Field = 4..6;
    pub const FLG_OFF: Field = 6..8;
    pub const TTL: usize = 8;
    pub const PROTOCOL: usize = 9;
    pub const CHECKSUM: Field = 10..12;
    pub const SRC: Field = 12..16;
    pub const DST: Field = 16..20;
}

/// Minimum (and, without options, exact) IPv4 header length.
pub const HEADER_LEN: usize = 20;
/// IP protocol numbers used by the engine.
pub const PROTO_ICMP: u8 = 1;
/// TCP.
pub const PROTO_TCP: u8 = 6;
/// UDP.
pub const PROTO_UDP: u8 = 17;

/// A view of an IPv4 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checks (accessors may panic if it is too short).
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }

    /// Wraps untrusted input: checks version, IHL and that the total length fits the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let p = Packet { buffer };
        let b = p.buffer.as_ref();
        let hl = p.header_len();
        let tl = usize::from(p.total_len());
        if b[field::VER_IHL] >> 4 != 4 || hl < HEADER_LEN || tl < hl {
            return Err(WireError::Malformed);
        }
        if tl > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(p)
    }

    /// The underlying buffer.
    pub fn into_inner(self) -> T {
        self.buffer
    }

    /// Header length in bytes (IHL * 4).
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::VER_IHL] & 0x0f) * 4
    }
    /// Type of service / DSCP+ECN byte.
    pub fn tos(&self) -> u8 {
        self.buffer.as_ref()[field::TOS]
    }
    /// Total length field.
    pub fn total_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::LENGTH.start)
    }
    /// Identification field.
    pub fn ident(&self) -> u16 {
        be16(self.buffer.as_ref(), field::IDENT.start)
    }
    /// Don't-fragment flag.
    pub fn dont_frag(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & 0x4000 != 0
    }
    /// More-fragments flag.
    pub fn more_frags(&self) -> bool {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & 0x2000 != 0
    }
    /// Fragment offset in 8-byte units.
    pub fn frag_offset(&self) -> u16 {
        be16(self.buffer.as_ref(), field::FLG_OFF.start) & 0x1fff
    }
    /// Time to live.
    pub fn ttl(&self) -> u8 {
        self.buffer.as_ref()[field::TTL]
    }
    /// Payload protocol.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[field::PROTOCOL]
    }
    /// Header checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }
    /// Source address bytes.
    pub fn src_bytes(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        a
    }
    /// Destination address bytes.
    pub fn dst_bytes(&self) -> [u8; 4] {
        let mut a = [0; 4];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        a
    }
    /// Source address.
    pub fn src(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.src_bytes())
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.dst_bytes())
    }
    /// Whether the header checksum is correct.
    pub fn verify_checksum(&self) -> bool {
        checksum::sum(&self.buffer.as_ref()[..self.header_len()]) == 0xffff
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the total length.
    pub fn set_total_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::LENGTH.start, v);
    }
    /// Sets the identification.
    pub fn set_ident(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::IDENT.start, v);
    }
    /// Sets the header checksum field (computed by the caller).
    pub fn set_checksum(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::CHECKSUM.start, v);
    }
    /// Recomputes the header checksum.
    pub fn fill_checksum(&mut self) {
        let hl = self.header_len();
        let b = self.buffer.as_mut();
        b[field::CHECKSUM].fill(0);
        let c = checksum::checksum(&b[..hl]);
        put16(b, field::CHECKSUM.start, c);
    }
    /// Marks the packet Congestion Experienced (ECN field 11, RFC 3168) and
    /// patches the checksum incrementally (RFC 1624).
    pub fn set_ecn_ce(&mut self) {
        let b = self.buffer.as_mut();
        let old = be16(b, field::VER_IHL);
        b[field::TOS] |= 0x03;
        let new = be16(b, field::VER_IHL);
        let c = checksum::update16(be16(b, field::CHECKSUM.start), old, new);
        put16(b, field::CHECKSUM.start, c);
    }
    /// Decrements the TTL and patches the checksum incrementally (RFC 1624).
    /// Returns `false` (and leaves the packet unchanged) when the TTL would reach 0.
    pub fn decrement_ttl(&mut self) -> bool {
        let b = self.buffer.as_mut();
        if b[field::TTL] <= 1 {
            return false;
        }
        let old = be16(b, field::TTL);
        b[field::TTL] -= 1;
        let new = be16(b, field::TTL);
        let c = checksum::update16(be16(b, field::CHECKSUM.start), old, new);
        put16(b, field::CHECKSUM.start, c);
        true
    }
}

/// Builds an ICMPv4 destination-unreachable (type 3, code 0 = net unreachable)
/// for `offending` into `out` as flannel's udp proxy does: source `src`, TTL 8,
/// payload = offending IP header + 8 bytes. Returns the length written, or
/// `None` when no ICMP must be sent (ICMP offender, non-first fragment,
/// malformed offender) or `out` is too small.
pub fn build_net_unreachable(src: Ipv4Addr, offending: &[u8], out: &mut [u8]) -> Option<usize> {
    let off = Packet::new_checked(offending).ok()?;
    if off.protocol() == PROTO_ICMP || off.frag_offset() != 0 {
        return None;
    }
    let quote = (off.header_len() + 8).min(usize::from(off.total_len()));
    let len = HEADER_LEN + 8 + quote;
    if out.len() < len {
        return None;
    }
    let out = &mut out[..len];
    out.fill(0);
    out[0] = 0x45;
    put16(out, 2, u16::try_from(len).ok()?);
    out[8] = 8;
    out[9] = PROTO_ICMP;
    out[12..16].copy_from_slice(&src.octets());
    out[16..20].copy_from_slice(&off.src_bytes());
    out[HEADER_LEN] = 3; // destination unreachable
    out[HEADER_LEN + 1] = 0; // net unreachable
    out[HEADER_LEN + 8..].copy_from_slice(&offending[..quote]);
    let c = checksum::checksum(&out[HEADER_LEN..]);
    put16(out, HEADER_LEN + 2, c);
    Packet::new_unchecked(&mut *out).fill_checksum();
    Some(len)
}
