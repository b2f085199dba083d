//! Zero-copy packet views and wire helpers.
//!
//! Contract (as in smoltcp's `wire`): every header type is a `Packet<T: AsRef<[u8]>>`
//! over a caller buffer with named field ranges in a private `field` module.
//! `new_checked` validates untrusted input (length, version, header length) and
//! after it succeeds no accessor panics; `new_unchecked` is for buffers the
//! caller has just written or already checked, and its accessors may panic on a
//! too-short buffer. Nothing here allocates.

pub mod checksum;
pub mod direct;
pub mod disco;
pub mod ethernet;
pub mod ip;
pub mod ipv4;
pub mod ipv6;
pub mod tcp;
pub mod vnet;
pub mod vxlan;
pub mod wg;

/// A field is a byte range inside a header.
pub type Field = std::ops::Range<usize>;

/// Why a buffer is not a valid header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The buffer is shorter than the header or than the length it declares.
    #[error("truncated packet")]
    Truncated,
    /// A version, flag or length field holds an impossible value.
    #[error("malformed header")]
    Malformed,
}

#[inline]
pub(crate) fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

#[inline]
pub(crate) fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

#[inline]
pub(crate) fn put16(b: &mut [u8], at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}

#[inline]
pub(crate) fn put32(b: &mut [u8], at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}

/// IP version nibble of a packet, if any.
#[inline]
pub fn ip_version(pkt: &[u8]) -> Option<u8> {
    pkt.first().map(|b| b >> 4)
}
