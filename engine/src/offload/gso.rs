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
use crate::wire::{checksum, ip, ipv4, ipv6, put16, tcp};

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

    /// Where segment `i` (< `count`) lies in the output, headroom included.
    pub fn range(&self, i: usize) -> std::ops::Range<usize> {
        let len = if i + 1 == self.count {
            self.last_len
        } else {
            self.stride
        };
        i * self.stride..i * self.stride + len
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

/// What every segment's headers derive from: the super-packet's IP header
/// ([`IpFix`]), TCP sequence number and flags, and the one's complement sum of
/// the TCP header and pseudo-header without the fields that change per
/// segment. Each segment's checksums are then computed from values held in
/// registers plus the payload: reading back header bytes just written
/// (narrow stores, wide loads) stalls on store forwarding, and the 20-byte
/// IPv4 header sums alone took about 5 % of a worker's time at 13 Gbit/s.
pub(crate) struct TcpHeaders {
    ip: IpFix,
    ip_hl: usize,
    tcp_hl: usize,
    seq0: u32,
    flags0: u8,
    /// Byte 12 of the TCP header (data offset), which shares a word with the flags.
    doff: u8,
    /// Pseudo-header (addresses, protocol) plus the TCP header with sequence
    /// number, offset/flags word and checksum taken as zero.
    base: u32,
    gso_size: usize,
}

impl TcpHeaders {
    /// From the super-packet's IP + TCP headers at the start of `hdr` (whole:
    /// callers have checked them with `layout`).
    pub(crate) fn new(hdr: &[u8], v6: bool, ip_hl: usize, gso_size: usize) -> TcpHeaders {
        let th = tcp::Packet::new_unchecked(&hdr[ip_hl..]);
        let tcp_hl = th.header_len().min(60);
        let mut t = [0u8; 60];
        t[..tcp_hl].copy_from_slice(&hdr[ip_hl..ip_hl + tcp_hl]);
        // Sequence number, offset/flags word, checksum.
        for r in [4..8, 12..14, tcp::CHECKSUM_OFFSET..tcp::CHECKSUM_OFFSET + 2] {
            t[r].fill(0);
        }
        // Length 0: each segment adds its own (for IPv6 too: the sum of the
        // 32-bit length is the 16-bit one below 64 KiB).
        let pseudo = super::pseudo_sum(hdr, v6, ipv4::PROTO_TCP, 0);
        TcpHeaders {
            ip: IpFix::new(hdr, v6, ip_hl),
            ip_hl,
            tcp_hl,
            seq0: th.seq(),
            flags0: th.flags(),
            doff: hdr[ip_hl + 12],
            base: checksum::combine(pseudo, checksum::sum(&t[..tcp_hl])),
            gso_size,
        }
    }

    /// Fixes segment `i` of `count` (the whole segment is `seg`), as the
    /// kernel's `tcp_gso_segment` does: the IP header ([`IpFix::apply`]),
    /// the sequence number, FIN/PSH only on the last and CWR only on the
    /// first segment, and the full TCP checksum.
    pub(crate) fn fix(&self, seg: &mut [u8], i: usize, count: usize) -> Result<(), DropReason> {
        let hdrs = self.ip_hl + self.tcp_hl;
        if seg.len() < hdrs {
            return Err(DropReason::Malformed);
        }
        let (h, p) = seg.split_at_mut(hdrs);
        self.fix_parts(h, p, i, count)
    }

    /// [`TcpHeaders::fix`] for a segment whose IP + TCP headers (`hdr`,
    /// exactly their length) and payload lie apart: the checksum sums
    /// `payload` where it lies (the one pass over it), nothing is copied.
    pub(crate) fn fix_parts(
        &self,
        hdr: &mut [u8],
        payload: &[u8],
        i: usize,
        count: usize,
    ) -> Result<(), DropReason> {
        if hdr.len() != self.ip_hl + self.tcp_hl {
            return Err(DropReason::Malformed);
        }
        let total = hdr.len() + payload.len();
        self.ip.apply(hdr, i, total)?;
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
        let l4_len = u32::try_from(total - self.ip_hl).map_err(|_| DropReason::Mtu)?;
        let mut th = tcp::Packet::new_unchecked(&mut hdr[self.ip_hl..]);
        th.set_seq(seq);
        th.set_flags(flags);
        let mut s = self.base;
        for v in [
            l4_len >> 16,
            l4_len & 0xffff,
            seq >> 16,
            seq & 0xffff,
            (u32::from(self.doff) << 8) | u32::from(flags),
            checksum::sum(payload),
        ] {
            s = checksum::combine(s, v);
        }
        put16(
            &mut hdr[self.ip_hl..],
            tcp::CHECKSUM_OFFSET,
            checksum::finish(s),
        );
        Ok(())
    }
}

/// What every segment's IP header derives from: the version, the
/// super-packet's IPv4 ID and the sum of its IPv4 header without total
/// length, ID and checksum.
#[derive(Debug, Clone, Copy)]
pub(crate) struct IpFix {
    v6: bool,
    ident0: u16,
    base: u32,
}

impl IpFix {
    /// From the super-packet's IP header at the start of `hdr` (`ip_hl` bytes).
    pub(crate) fn new(hdr: &[u8], v6: bool, ip_hl: usize) -> IpFix {
        if v6 {
            return IpFix {
                v6,
                ident0: 0,
                base: 0,
            };
        }
        let hl = ip_hl.min(60);
        let mut h = [0u8; 60];
        h[..hl].copy_from_slice(&hdr[..hl]);
        let ident0 = ipv4::Packet::new_unchecked(&h[..]).ident();
        // Total length, ID, checksum.
        for r in [2..6, 10..12] {
            h[r].fill(0);
        }
        IpFix {
            v6,
            ident0,
            base: checksum::sum(&h[..hl]),
        }
    }

    /// Fixes the IP header of segment `i` (its header starts `seg`; the
    /// whole segment is `seg_len` bytes): IPv6 payload length, or IPv4 total
    /// length, ID (+i) and header checksum.
    pub(crate) fn apply(&self, seg: &mut [u8], i: usize, seg_len: usize) -> Result<(), DropReason> {
        if self.v6 {
            let pl = u16::try_from(seg_len - ipv6::HEADER_LEN).map_err(|_| DropReason::Mtu)?;
            ipv6::Packet::new_unchecked(seg).set_payload_len(pl);
            return Ok(());
        }
        let tl = u16::try_from(seg_len).map_err(|_| DropReason::Mtu)?;
        let ident = self
            .ident0
            .wrapping_add(u16::try_from(i & 0xffff).unwrap_or(0));
        let s = checksum::combine(
            checksum::combine(self.base, u32::from(tl)),
            u32::from(ident),
        );
        let mut ip = ipv4::Packet::new_unchecked(seg);
        ip.set_total_len(tl);
        ip.set_ident(ident);
        ip.set_checksum(checksum::finish(s));
        Ok(())
    }
}

/// The transport checksum of the IP packet `seg` (transport header at
/// `ip_hl`, its checksum field zeroed): pseudo-header plus transport bytes.
pub(crate) fn l4_checksum(seg: &[u8], ip_hl: usize, v6: bool, proto: u8) -> u16 {
    let l4 = &seg[ip_hl..];
    let len = u32::try_from(l4.len()).unwrap_or(0);
    let ps = super::pseudo_sum(seg, v6, proto, len);
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

/// Completes a partial checksum (`VIRTIO_NET_HDR_F_NEEDS_CSUM` on a non-GSO
/// packet): the field at `csum_start + csum_offset` holds the folded
/// pseudo-header sum; the result covers everything from `csum_start`.
///
/// `pkt` is an IP packet and `csum_start` must lie past its IP header: the
/// kernel only sets it at the transport header, and a start inside the IP
/// header (a forged vnet header, found by the `tun_tx` fuzz target) would
/// rewrite the version byte or the addresses after routing read them.
pub fn complete_checksum(
    pkt: &mut [u8],
    csum_start: usize,
    csum_offset: usize,
) -> Result<(), DropReason> {
    let ip = ip::Packet::new_checked(&*pkt).map_err(|_| DropReason::Malformed)?;
    if csum_start < ip.header_len().max(ipv4::HEADER_LEN) {
        return Err(DropReason::Malformed);
    }
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

#[path = "gso_gather.rs"]
mod gather;
pub use gather::{Gathered, headers_required, tcp_headers};

#[cfg(test)]
#[path = "gso_tests.rs"]
mod tests;
