//! VXLAN header view (RFC 7348 §5): `flags(8) reserved(24) VNI(24) reserved(8)`.

use super::{Field, WireError};

mod field {
    use super::Field;
    pub const FLAGS: usize = 0;
    pub const RESERVED1: Field = 1..4;
    pub const VNI: Field = 4..7;
    pub const RESERVED2: usize = 7;
}

/// Header length.
pub const HEADER_LEN: usize = 8;
/// The "I" flag: the VNI is valid.
pub const FLAG_I: u8 = 0x08;
/// Largest VNI (24 bits).
pub const MAX_VNI: u32 = 0x00ff_ffff;

/// A view of a VXLAN header and its payload.
#[derive(Debug, Clone)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Packet { buffer }
    }
    /// Wraps untrusted input: a full header with the I flag set.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < HEADER_LEN {
            return Err(WireError::Truncated);
        }
        if b[field::FLAGS] & FLAG_I == 0 {
            return Err(WireError::Malformed);
        }
        Ok(Packet { buffer })
    }
    /// Flag byte.
    pub fn flags(&self) -> u8 {
        self.buffer.as_ref()[field::FLAGS]
    }
    /// VXLAN network identifier.
    pub fn vni(&self) -> u32 {
        let b = &self.buffer.as_ref()[field::VNI];
        u32::from_be_bytes([0, b[0], b[1], b[2]])
    }
    /// The inner frame.
    pub fn payload(&self) -> &[u8] {
        &self.buffer.as_ref()[HEADER_LEN..]
    }
}

impl<T: AsRef<[u8]> + AsMut<[u8]>> Packet<T> {
    /// Writes a header with the I flag and `vni` (masked to 24 bits).
    pub fn emit(&mut self, vni: u32) {
        let b = self.buffer.as_mut();
        b[field::FLAGS] = FLAG_I;
        b[field::RESERVED1].fill(0);
        b[field::VNI].copy_from_slice(&vni.to_be_bytes()[1..]);
        b[field::RESERVED2] = 0;
    }
}
