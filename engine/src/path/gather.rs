//! The transmit step without a payload copy, for TCP super-packets over
//! flannel-UDP and VXLAN: [`udp_gather`] writes each segment's header block
//! (the encapsulation's header, then the segment's IP + TCP headers) into
//! the caller's buffer and leaves the payload in the TUN read; the worker
//! sends header block + payload slice as the iovecs of one datagram
//! (`sendmmsg`, `UDP_SEGMENT` trains). Same bytes on the wire as
//! [`super::tx::udp_write`] (the tests compare them).
//!
//! Why: the copying path wrote every payload byte into the transmit arena
//! and read it again for the TCP checksum; here it is read once (the
//! checksum) and the kernel's copy into its socket buffer is the only other
//! pass. Super-packets cut into more than [`MAX_GATHER_SEGS`] segments (an
//! MSS under ~512 bytes) take the copying path: their header blocks would
//! outgrow the per-send iovec list.

use crate::encap::{Codec, DropReason};
use crate::offload::gso::{self, Gathered};
use crate::path::tx::{Plan, Shape};

/// Most segments a gathered super-packet may have (two iovecs each).
pub const MAX_GATHER_SEGS: usize = 128;

/// The header blocks of the planned TCP super-packet of `read`, written
/// to `out` with `codec`'s header in front of each; `Ok(None)` when the
/// plan is not a TCP super-packet, has more than [`MAX_GATHER_SEGS`]
/// segments or its header blocks do not fit `out` (send it by
/// [`super::tx::udp_write`] then). Segment `i` is
/// `out[g.header(i)]` + `read[plan.pkt.start..][g.payload(i)]`.
pub fn udp_gather(
    codec: &Codec,
    plan: &Plan<'_>,
    read: &[u8],
    out: &mut [u8],
) -> Result<Option<Gathered>, DropReason> {
    let Shape::Tcp(size) = plan.shape else {
        return Ok(None);
    };
    let ip = &read[plan.pkt.start..];
    let Some((count, bytes)) = gso::headers_required(ip, size, plan.headroom) else {
        return Err(DropReason::Malformed);
    };
    if count > MAX_GATHER_SEGS || bytes > out.len() {
        return Ok(None);
    }
    let g = gso::tcp_headers(ip, size, plan.headroom, out)?;
    for i in 0..g.count {
        let s = g.header(i).start;
        codec.write_header(
            &mut out[s..s + plan.headroom],
            plan.entry.mac,
            plan.pkt.version,
        );
    }
    Ok(Some(g))
}
