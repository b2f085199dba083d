//! TCP header view (RFC 9293), enough for segmentation and coalescing.

use super::{Field, WireError, be16, be32, put16, put32};

mod field {
    use super::Field;
    pub const SRC_PORT: Field = 0..2;
    pub const DST_PORT: Field = 2..4;
    pub const SEQ: Field = 4..8;
    pub const ACK: Field = 8..12;
    pub const DOFF: usize = 12;
    pub const FLAGS: usize = 13;
    pub const CHECKSUM: Field = 16..18;
}

/// Offset of the checksum field inside the TCP header.
pub const CHECKSUM_OFFSET: usize = 16;
/// Minimum header length.
pub const HEADER_LEN: usize = 20;
/// FIN flag.
pub const FIN: u8 = 0x01;
/// SYN flag.
pub const SYN: u8 = 0x02;
/// RST flag.
pub const RST: u8 = 0x04;
/// PSH flag.
pub const PSH: u8 = 0x08;
/// ACK flag.
pub const ACK: u8 = 0x10;
/// URG flag.
pub const URG: u8 = 0x20;
/// ECE flag.
pub const ECE: u8 = 0x40;
/// CWR flag.
pub const CWR: u8 = 0x80;

/// A view of a TCP segment.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wraps untrusted input: the data offset is sane and fits the buffer.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        let hl = usize::from(b[field::DOFF] >> 4) * 4;
        if hl < HEADER_LEN {
            return Err(WireError::Malformed);
        }
        if hl > b.len() {
            return Err(WireError::Truncated);
        }
        Ok(Packet { buffer })
    }
    /// Source port.
    pub fn src_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::SRC_PORT.start)
    }
    /// Destination port.
    pub fn dst_port(&self) -> u16 {
        be16(self.buffer.as_ref(), field::DST_PORT.start)
    }
    /// Sequence number.
    pub fn seq(&self) -> u32 {
        be32(self.buffer.as_ref(), field::SEQ.start)
    }
    /// Acknowledgement number.
    pub fn ack(&self) -> u32 {
        be32(self.buffer.as_ref(), field::ACK.start)
    }
    /// Header length in bytes.
    pub fn header_len(&self) -> usize {
        usize::from(self.buffer.as_ref()[field::DOFF] >> 4) * 4
    }
    /// Flag byte (CWR..FIN).
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// Checksum field.
    pub fn checksum(&self) -> u16 {
        be16(self.buffer.as_ref(), field::CHECKSUM.start)
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Sets the sequence number.
    pub fn set_seq(&mut self, v: u32) {
        put32(self.buffer.as_mut(), field::SEQ.start, v);
    }
    /// Sets the flag byte.
    pub fn set_flags(&mut self, v: u8) {
        self.buffer.as_mut()[field::FLAGS] = v;
    }
    /// Sets the checksum field.
    pub fn set_checksum(&mut self, v: u16) {
        put16(self.buffer.as_mut(), field::CHECKSUM.start, v);
    }
}
