//! Userspace GSO without a payload copy: each segment's headers are
//! written to the caller's buffer and its payload stays where the TUN read
//! put it, to be sent as `sendmmsg` iovecs (header block, payload slice).
//! The payload is read once, for the TCP checksum ([`TcpHeaders::fix_parts`]);
//! the copying segmenter read it twice and wrote it once.

use super::{DropReason, TcpHeaders, layout};

/// Where [`tcp_headers`] put each segment's headers and where its payload
/// lies in the super-packet: segment `i` is `out[header(i)]` followed by
/// `pkt[payload(i)]`, for a gathered send (`sendmmsg` iovecs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gathered {
    /// Number of segments (>= 1).
    pub count: usize,
    /// Bytes of each header block: headroom + IP + TCP headers.
    pub head: usize,
    /// Where the payload starts in the super-packet.
    pub payload_start: usize,
    /// Where the super-packet ends (its IP length).
    pub end: usize,
    /// Payload bytes per segment (the last may be shorter).
    pub gso_size: usize,
}

impl Gathered {
    /// Segment `i`'s header block (headroom included) in the output.
    pub fn header(&self, i: usize) -> std::ops::Range<usize> {
        i * self.head..(i + 1) * self.head
    }

    /// Segment `i`'s payload in the super-packet.
    pub fn payload(&self, i: usize) -> std::ops::Range<usize> {
        let s = (self.payload_start + i * self.gso_size).min(self.end);
        s..(s + self.gso_size).min(self.end)
    }

    /// Output bytes the header blocks take.
    pub fn header_bytes(&self) -> usize {
        self.count * self.head
    }

    /// Payload bytes of all segments.
    pub fn payload_bytes(&self) -> usize {
        self.end - self.payload_start
    }
}

/// Segments (and header bytes) [`tcp_headers`] makes of `pkt`: `None` if
/// `pkt` is not TCP/IP or `gso_size` is 0.
pub fn headers_required(pkt: &[u8], gso_size: usize, headroom: usize) -> Option<(usize, usize)> {
    let l = layout(pkt).ok()?;
    let n = (l.len - l.hdrs).checked_div(gso_size)?;
    let n = (n + usize::from((l.len - l.hdrs) % gso_size != 0)).max(1);
    Some((n, n * (headroom + l.hdrs)))
}

/// [`super::tcp_segment`] without copying payload: only each segment's (fixed)
/// headers are written to `out`, `headroom` bytes after the start of each
/// header block; the payload stays in `pkt` ([`Gathered::payload`]) and is
/// read once, for the TCP checksum.
pub fn tcp_headers(
    pkt: &[u8],
    gso_size: usize,
    headroom: usize,
    out: &mut [u8],
) -> Result<Gathered, DropReason> {
    if gso_size == 0 {
        return Err(DropReason::Malformed);
    }
    let l = layout(pkt)?;
    let tcp = TcpHeaders::new(pkt, l.v6, l.ip_hl, gso_size);
    let g = Gathered {
        count: (l.len - l.hdrs).div_ceil(gso_size).max(1),
        head: headroom + l.hdrs,
        payload_start: l.hdrs,
        end: l.len,
        gso_size,
    };
    if out.len() < g.header_bytes() {
        return Err(DropReason::Mtu);
    }
    for i in 0..g.count {
        let h = &mut out[g.header(i)][headroom..];
        h.copy_from_slice(&pkt[..l.hdrs]);
        tcp.fix_parts(h, &pkt[g.payload(i)], i, g.count)?;
    }
    Ok(g)
}
