//! Userspace GSO: split a TCP super-packet handed over by the TUN
//! (`virtio_net_hdr` with `GSO_TCPV4/6` and a partial checksum) into
//! MSS-sized IP packets, and complete partial checksums of single packets.
//!
//! Output layout, the one UDP GSO wants: segment `i` occupies
//! `out[i * stride ..][..len_i]`, where the first `headroom` bytes are left for
//! the encapsulation header and `stride = headroom + headers + gso_size`; all
//! segments are `stride` long except possibly the last. Per segment we fix the
//! IPv4 total length, ID (+i) and header checksum (IPv6: payload length), the
//! TCP sequence number, flags (FIN/PSH only on the last, CWR only on the first)
//! and the full TCP checksum, as the kernel's `tcp_gso_segment` does.

use crate::encap::DropReason;
use crate::wire::{checksum, ipv4, ipv6, put16, tcp};

/// Where the segments of one super-packet ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segments {
    /// Number of segments (>= 1).
    pub count: usize,
    /// Distance between segment starts (= length of every segment but the last, headroom included).
    pub stride: usize,
    /// Length of the last segment, headroom included.
    pub last_len: usize,
}

impl Segments {
    /// Total bytes written.
    pub fn total_len(&self) -> usize {
        (self.count - 1) * self.stride + self.last_len
    }
}

/// Parsed facts about a TCP/IP packet needed to cut it.
struct Layout {
    v6: bool,
    ip_hl: usize,
    hdrs: usize,
    len: usize,
}

fn layout(pkt: &[u8]) -> Result<Layout, DropReason> {
    match pkt.first().map(|b| b >> 4) {
        Some(4) => {
            if pkt.len() < ipv4::HEADER_LEN {
                return Err(DropReason::Malformed);
            }
            let p = ipv4::Packet::new_unchecked(pkt);
            let hl = p.header_len();
            // Total length 0 happens with BIG TCP; the buffer length is authoritative then.
            let tl = match usize::from(p.total_len()) {
                0 => pkt.len(),
                tl => tl,
            };
            if hl < ipv4::HEADER_LEN || tl > pkt.len() || tl < hl || p.protocol() != ipv4::PROTO_TCP
            {
                return Err(DropReason::Malformed);
            }
            let t = tcp::Packet::new_checked(&pkt[hl..tl]).map_err(|_| DropReason::Malformed)?;
            Ok(Layout {
                v6: false,
                ip_hl: hl,
                hdrs: hl + t.header_len(),
                len: tl,
            })
        }
        Some(6) => {
            let p = ipv6::Packet::new_checked(pkt).map_err(|_| DropReason::Malformed)?;
            if p.next_header() != ipv4::PROTO_TCP {
                return Err(DropReason::Malformed);
            }
            let tl = ipv6::HEADER_LEN + usize::from(p.payload_len());
            let t = tcp::Packet::new_checked(&pkt[ipv6::HEADER_LEN..tl])
                .map_err(|_| DropReason::Malformed)?;
            Ok(Layout {
                v6: true,
                ip_hl: ipv6::HEADER_LEN,
                hdrs: ipv6::HEADER_LEN + t.header_len(),
                len: tl,
            })
        }
        _ => Err(DropReason::Malformed),
    }
}

/// Length of the IP + TCP headers of a TCP/IP packet (`None` if it is not one).
pub fn tcp_headers_len(pkt: &[u8]) -> Option<usize> {
    layout(pkt).ok().map(|l| l.hdrs)
}

/// Bytes [`tcp_segment`] needs in `out` for `pkt` (`None` if `pkt` is not TCP/IP).
pub fn required_len(pkt: &[u8], gso_size: usize, headroom: usize) -> Option<usize> {
    let l = layout(pkt).ok()?;
    let payload = l.len - l.hdrs;
    let n = payload.div_ceil(gso_size.max(1)).max(1);
    Some(n * (headroom + l.hdrs + gso_size))
}

/// Cuts the TCP super-packet `pkt` into segments of `gso_size` payload bytes
/// written to `out` (see the module doc for the layout). The checksum field of
/// `pkt` may hold anything (the kernel leaves a partial sum there).
pub fn tcp_segment(
    pkt: &[u8],
    gso_size: usize,
    headroom: usize,
    out: &mut [u8],
) -> Result<Segments, DropReason> {
    let l = layout(pkt)?;
    let tcp = TcpHeaders::new(pkt, l.v6, l.ip_hl, gso_size);
    cut(
        pkt,
        l.hdrs,
        l.len,
        gso_size,
        headroom,
        out,
        |seg, i, count| tcp.fix(seg, i, count),
    )
}

/// Copies each segment of the super-packet `pkt[..len]` (headers
/// `pkt[..hdrs]`, then the payload in `gso_size` chunks) into `out` as
/// [`plan`] lays them out, and hands it to `fix(segment, i, count)` to fix its
/// headers. `Malformed` for a zero `gso_size`.
pub(crate) fn cut(
    pkt: &[u8],
    hdrs: usize,
    len: usize,
    gso_size: usize,
    headroom: usize,
    out: &mut [u8],
    mut fix: impl FnMut(&mut [u8], usize, usize) -> Result<(), DropReason>,
) -> Result<Segments, DropReason> {
    if gso_size == 0 {
        return Err(DropReason::Malformed);
    }
    let payload = &pkt[hdrs..len];
    let segs = plan(payload.len(), hdrs, gso_size, headroom, out.len())?;
    for i in 0..segs.count {
        let chunk = &payload[i * gso_size..((i + 1) * gso_size).min(payload.len())];
        let seg = &mut out[i * segs.stride + headroom..][..hdrs + chunk.len()];
        seg[..hdrs].copy_from_slice(&pkt[..hdrs]);
        seg[hdrs..].copy_from_slice(chunk);
        fix(seg, i, segs.count)?;
    }
    Ok(segs)
}

/// What every segment's headers derive from: the super-packet's IPv4 ID
/// and TCP sequence number and flags.
pub(crate) struct TcpHeaders {
    v6: bool,
    ip_hl: usize,
    ident0: u16,
    seq0: u32,
    flags0: u8,
    gso_size: usize,
}

impl TcpHeaders {
    /// From the super-packet's IP + TCP headers at the start of `hdr`.
    pub(crate) fn new(hdr: &[u8], v6: bool, ip_hl: usize, gso_size: usize) -> TcpHeaders {
        let th = tcp::Packet::new_unchecked(&hdr[ip_hl..]);
        TcpHeaders {
            v6,
            ip_hl,
            ident0: ident0(hdr, v6),
            seq0: th.seq(),
            flags0: th.flags(),
            gso_size,
        }
    }

    /// Fixes segment `i` of `count` (the whole segment is `seg`), as the
    /// kernel's `tcp_gso_segment` does: the IP header ([`fix_ip_header`]),
    /// the sequence number, FIN/PSH only on the last and CWR only on the
    /// first segment, and the full TCP checksum.
    pub(crate) fn fix(&self, seg: &mut [u8], i: usize, count: usize) -> Result<(), DropReason> {
        fix_ip_header(seg, self.v6, self.ident0, i)?;
        let mut flags = self.flags0;
        if i + 1 != count {
            flags &= !(tcp::FIN | tcp::PSH);
        }
        if i != 0 {
            flags &= !tcp::CWR;
        }
        let seq = self
            .seq0
            .wrapping_add(u32::try_from(i * self.gso_size).unwrap_or(0));
        let mut th = tcp::Packet::new_unchecked(&mut seg[self.ip_hl..]);
        th.set_seq(seq);
        th.set_flags(flags);
        th.set_checksum(0);
        let c = l4_checksum(seg, self.ip_hl, self.v6, ipv4::PROTO_TCP);
        put16(&mut seg[self.ip_hl..], tcp::CHECKSUM_OFFSET, c);
        Ok(())
    }
}

/// The IPv4 ID of the packet whose IP header starts `hdr` (0 for IPv6).
pub(crate) fn ident0(hdr: &[u8], v6: bool) -> u16 {
    if v6 {
        0
    } else {
        ipv4::Packet::new_unchecked(hdr).ident()
    }
}

/// The transport checksum of the IP packet `seg` (transport header at
/// `ip_hl`, its checksum field zeroed): pseudo-header plus transport bytes.
pub(crate) fn l4_checksum(seg: &[u8], ip_hl: usize, v6: bool, proto: u8) -> u16 {
    let (src, dst) = if v6 {
        (8..24, 24..40)
    } else {
        (12..16, 16..20)
    };
    let l4 = &seg[ip_hl..];
    let len = u32::try_from(l4.len()).unwrap_or(0);
    let ps = checksum::pseudo_v4(&seg[src], &seg[dst], proto, len);
    checksum::finish(checksum::combine(ps, checksum::sum(l4)))
}

/// Where the segments of a super-packet with `payload` bytes after `hdrs`
/// bytes of headers go (see the module doc); `Mtu` when `out_len` is short.
pub(crate) fn plan(
    payload: usize,
    hdrs: usize,
    gso_size: usize,
    headroom: usize,
    out_len: usize,
) -> Result<Segments, DropReason> {
    let count = payload.div_ceil(gso_size).max(1);
    let segs = Segments {
        count,
        stride: headroom + hdrs + gso_size,
        last_len: headroom + hdrs + payload - (count - 1) * gso_size,
    };
    if out_len < segs.total_len() {
        return Err(DropReason::Mtu);
    }
    Ok(segs)
}

/// Fixes the IP header of segment `i` (the whole segment is `seg`) cut from a
/// super-packet whose IPv4 ID was `ident0`: IPv6 payload length, or IPv4
/// total length, ID (+i) and header checksum.
pub(crate) fn fix_ip_header(
    seg: &mut [u8],
    v6: bool,
    ident0: u16,
    i: usize,
) -> Result<(), DropReason> {
    let seg_len = seg.len();
    if v6 {
        let pl = u16::try_from(seg_len - ipv6::HEADER_LEN).map_err(|_| DropReason::Mtu)?;
        ipv6::Packet::new_unchecked(seg).set_payload_len(pl);
    } else {
        let mut ip = ipv4::Packet::new_unchecked(seg);
        ip.set_total_len(u16::try_from(seg_len).map_err(|_| DropReason::Mtu)?);
        ip.set_ident(ident0.wrapping_add(u16::try_from(i & 0xffff).unwrap_or(0)));
        ip.fill_checksum();
    }
    Ok(())
}

/// Completes a partial checksum (`VIRTIO_NET_HDR_F_NEEDS_CSUM` on a non-GSO
/// packet): the field at `csum_start + csum_offset` holds the folded
/// pseudo-header sum; the result covers everything from `csum_start`.
pub fn complete_checksum(
    pkt: &mut [u8],
    csum_start: usize,
    csum_offset: usize,
) -> Result<(), DropReason> {
    let field = csum_start
        .checked_add(csum_offset)
        .ok_or(DropReason::Malformed)?;
    if field.checked_add(2).is_none_or(|end| end > pkt.len()) {
        return Err(DropReason::Malformed);
    }
    let mut c = checksum::finish(checksum::sum(&pkt[csum_start..]));
    // A computed UDP checksum of 0 is sent as all ones (RFC 768); for TCP the two are equal.
    if c == 0 {
        c = 0xffff;
    }
    put16(pkt, field, c);
    Ok(())
}

#[cfg(test)]
#[path = "gso_tests.rs"]
mod tests;
