//! WireGuard's framing, sans-IO: who handles a datagram before a session
//! sees it (the [`owner`] worker of the peer id in its receiver index, and
//! its kernel-side twin [`steering_program`]), the drop reason of a boringtun
//! error ([`classify`]), the AllowedIPs check of a decrypted packet
//! ([`source_allowed`], [`holds_ip_header`]); the key encoding `wg`
//! prints is [`super::key`]. Sessions and handshakes are [`crate::path::wg`]'s.

use std::net::IpAddr;

use boringtun::noise::errors::WireGuardError;

use crate::encap::DropReason;
use crate::peers::{Entry, PeerTable};
use crate::wire::wg as msg;
use crate::wire::{ipv4, ipv6};

/// Bytes WireGuard adds to an inner packet (16 header + 16 tag).
pub const OVERHEAD: usize = msg::DATA_OVERHEAD;
/// Smallest output buffer boringtun accepts (a handshake initiation).
pub const MIN_DST: usize = msg::INITIATION_LEN;

pub use super::key::{key_from_base64, key_to_base64};

/// The worker owning peer `id` among `workers` (matches [`steering_program`]).
#[inline]
pub fn owner(id: u32, workers: usize) -> usize {
    (id & 0xff) as usize % workers.max(1)
}

/// The drop reason counted for a boringtun error.
pub fn classify(e: &WireGuardError) -> DropReason {
    match e {
        WireGuardError::InvalidMac | WireGuardError::InvalidAeadTag | WireGuardError::WrongKey => {
            DropReason::DecryptFailure
        }
        WireGuardError::DuplicateCounter | WireGuardError::InvalidCounter => DropReason::Replay,
        WireGuardError::WrongIndex => DropReason::UnknownKey,
        WireGuardError::ConnectionExpired => DropReason::Expired,
        WireGuardError::InvalidPacket
        | WireGuardError::IncorrectPacketLength
        | WireGuardError::WrongPacketType
        | WireGuardError::DestinationBufferTooSmall => DropReason::Malformed,
        _ => DropReason::Handshake,
    }
}

/// The AllowedIPs check of a packet that WireGuard peer `id` sent from inner
/// source `inner_src` (cryptokey routing, as the kernel does it): the
/// longest-prefix match of the source must be one of the peer's own
/// subnets. A source inside the peer's subnet but inside a more specific
/// subnet of another peer is refused: it belongs to the other peer (the
/// overlap GotaTun 0.7.2 fixed; weft checked only the peer's own list).
/// Returns the entry whose per-peer counters count the packet.
pub fn source_allowed(table: &PeerTable, id: u32, inner_src: IpAddr) -> Option<&Entry> {
    table.wg_src_entry(id, inner_src)
}

/// Whether a decrypted packet of `len` bytes from inner source `inner_src`
/// holds at least its IP header (boringtun cuts the plaintext to the inner
/// total length, which a peer may set below the header length).
pub fn holds_ip_header(inner_src: IpAddr, len: usize) -> bool {
    match inner_src {
        IpAddr::V4(_) => len >= ipv4::HEADER_LEN,
        IpAddr::V6(_) => len >= ipv6::HEADER_LEN,
    }
}

/// The `SO_ATTACH_REUSEPORT_CBPF` program: socket index = owner byte of the
/// receiver index, modulo `workers`. The program sees the UDP payload:
/// handshake responses carry the receiver index at bytes 8..12, cookie
/// replies and data packets at 4..8 (little endian; byte 1 of it is `id & 0xff`).
/// Initiations read a byte of the (random) sender index: some worker, which
/// hands them on.
pub fn steering_program(workers: usize) -> [libc::sock_filter; 8] {
    let n = u32::try_from(workers.max(1)).unwrap_or(1);
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    [
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 0),
        // Type 2: receiver index at 8..12, owner byte at 9; else go to 5.
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 3, 2),
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 9),
        op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, 0, 0, n),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
        // Types 3/4 (and 1): receiver (sender) index at 4..8, owner byte at 5.
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 5),
        op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, 0, 0, n),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
    ]
}

#[cfg(test)]
#[path = "wg_tests.rs"]
mod tests;
