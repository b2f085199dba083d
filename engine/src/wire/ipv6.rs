//! IPv6 fixed header view (RFC 8200). Extension headers are not parsed: the
//! engine only coalesces/segments when `next_header` is TCP directly.

use std::net::Ipv6Addr;

use super::{Field, WireError, be16, put16};

mod field {
    use super::Field;
    pub const VER_TC_FL: Field = 0..4;
    pub const PAYLOAD_LEN: Field = 4..6;
    pub const NEXT_HEADER: usize = 6;
    pub const HOP_LIMIT: usize = 7;
    pub const SRC: Field = 8..24;
    pub const DST: Field = 24..40;
}

/// Fixed header length.
pub const HEADER_LEN: usize = 40;

/// A view of an IPv6 packet.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wraps untrusted input: version 6 and the payload length fits the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[0] >> 4 != 6 {
            return Err(WireError::Malformed);
        }
        if HEADER_LEN + usize::from(be16(b, field::PAYLOAD_LEN.start)) > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(Packet { buffer })
    }
    /// Traffic class + flow label word (version nibble included).
    pub fn ver_tc_flow(&self) -> u32 {
        super::be32(self.buffer.as_ref(), field::VER_TC_FL.start)
    }
    /// Payload length.
    pub fn payload_len(&self) -> u16 {
        be16(self.buffer.as_ref(), field::PAYLOAD_LEN.start)
    }
    /// Next header.
    pub fn next_header(&self) -> u8 {
        self.buffer.as_ref()[field::NEXT_HEADER]
    }
    /// Hop limit.
    pub fn hop_limit(&self) -> u8 {
        self.buffer.as_ref()[field::HOP_LIMIT]
    }
    /// Source address bytes.
    pub fn src_bytes(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::SRC]);
        a
    }
    /// Destination address bytes.
    pub fn dst_bytes(&self) -> [u8; 16] {
        let mut a = [0; 16];
        a.copy_from_slice(&self.buffer.as_ref()[field::DST]);
        a
    }
    /// Source address.
    pub fn src(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.src_bytes())
    }
    /// Destination address.
    pub fn dst(&self) -> Ipv6Addr {
        Ipv6Addr::from(self.dst_bytes())
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the payload length.
    pub fn set_payload_len(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::PAYLOAD_LEN.start, v);
    }
}
