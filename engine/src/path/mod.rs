//! The packet path's decisions, sans-IO: what every worker does with one
//! packet between its reads and its writes.
//!
//! - [`tx`]: a TUN read -> its peer (longest prefix), its shape (one packet,
//!   a TCP super-packet for userspace GSO, a UDP one for USO), checksum
//!   completion, MTU limits, the room it needs, then its datagrams written
//!   into the caller's transmit arena with the encapsulation's headers; or
//!   the [`DropReason`] (flannel-UDP: an ICMP net-unreachable to answer).
//! - [`gather`]: the transmit step for TCP super-packets over flannel-UDP
//!   and VXLAN without a payload copy (header blocks written, payload left
//!   in the TUN read for a gathered send).
//! - [`tap`]: the transmit step that leaves segmenting to the kernel: one
//!   frame per VXLAN TCP super-packet for a TAP with UDP-tunnel GSO.
//! - [`rx`]: a received datagram (or raw IPIP packet) -> decapsulated,
//!   sources checked ([`crate::antispoof`]), the inner range to deliver and
//!   the peer entry to count it on; or the [`DropReason`].
//! - [`wg`]: WireGuard's core, which owns the sessions: the transmit and
//!   receive steps above for WireGuard (encryption, the handshake gate,
//!   decryption, AllowedIPs, roaming) and the protocol's timers, with the
//!   time as an argument.
//!
//! Contract: functions over the peer table and caller-owned buffers only.
//! No I/O, no clock read, no allocation, no lock, no logging (boringtun's
//! sessions keep their own timer clock and queue a packet per `Vec` while
//! a handshake runs: see [`wg`]); nothing here imports a worker, the
//! builder or a start-up module (`tests/layers.rs`); counting is the
//! caller's (they return what to count). The workers (`udp/worker.rs`,
//! `wg/worker.rs`, `ipip/worker.rs`) are I/O shells around them, and the
//! fuzz targets, `tests/pipeline.rs` and the criterion benches call the
//! same functions.

pub mod gather;
pub mod rx;
pub mod tap;
pub mod tx;
pub mod wg;

pub use crate::stats::DropReason;

#[cfg(test)]
mod tap_tests;
#[cfg(test)]
mod tests;
