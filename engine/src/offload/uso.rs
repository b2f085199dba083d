//! Userspace USO: split a UDP super-packet handed over by the TUN
//! (`virtio_net_hdr` with `GSO_UDP_L4`, negotiated with `TUN_F_USO4/6`) into
//! datagrams of `gso_size` payload bytes, as the kernel's
//! `__udp_gso_segment` does: every segment gets a copy of the IP and UDP
//! headers, its own IPv4 total length, ID (+i) and header checksum (IPv6:
//! payload length), UDP length and a full UDP checksum (0 sent as 0xffff).
//! The output layout is [`super::gso`]'s: segment `i` at `out[i * stride..]`,
//! `headroom` bytes first for the encapsulation header.

use super::gso::{self, Segments};
use crate::encap::DropReason;
use crate::wire::{ipv4, ipv6, put16};

/// UDP header length.
const UDP_HLEN: usize = 8;
/// Offset of the UDP length field.
const UDP_LEN_OFFSET: usize = 4;
/// Offset of the UDP checksum field.
const UDP_CSUM_OFFSET: usize = 6;

/// Parsed facts about a UDP/IP packet needed to cut it.
struct Layout {
    v6: bool,
    ip_hl: usize,
    len: usize,
}

fn layout(pkt: &[u8]) -> Result<Layout, DropReason> {
    let l = match pkt.first().map(|b| b >> 4) {
        Some(4) => {
            if pkt.len() < ipv4::HEADER_LEN {
                return Err(DropReason::Malformed);
            }
            let p = ipv4::Packet::new_unchecked(pkt);
            let hl = p.header_len();
            let tl = usize::from(p.total_len());
            if hl < ipv4::HEADER_LEN || tl > pkt.len() || p.protocol() != ipv4::PROTO_UDP {
                return Err(DropReason::Malformed);
            }
            Layout {
                v6: false,
                ip_hl: hl,
                len: tl,
            }
        }
        Some(6) => {
            let p = ipv6::Packet::new_checked(pkt).map_err(|_| DropReason::Malformed)?;
            if p.next_header() != ipv4::PROTO_UDP {
                return Err(DropReason::Malformed);
            }
            Layout {
                v6: true,
                ip_hl: ipv6::HEADER_LEN,
                len: ipv6::HEADER_LEN + usize::from(p.payload_len()),
            }
        }
        _ => return Err(DropReason::Malformed),
    };
    if l.len < l.ip_hl + UDP_HLEN {
        return Err(DropReason::Malformed);
    }
    Ok(l)
}

/// Bytes [`udp_segment`] needs in `out` for `pkt` (`None` if `pkt` is not UDP/IP).
pub fn udp_required_len(pkt: &[u8], gso_size: usize, headroom: usize) -> Option<usize> {
    let l = layout(pkt).ok()?;
    let hdrs = l.ip_hl + UDP_HLEN;
    let n = (l.len - hdrs).div_ceil(gso_size.max(1)).max(1);
    Some(n * (headroom + hdrs + gso_size))
}

/// Cuts the UDP super-packet `pkt` into datagrams of `gso_size` payload
/// bytes written to `out` (see the module doc). The checksum field of `pkt`
/// may hold anything (the kernel leaves a partial sum there).
pub fn udp_segment(
    pkt: &[u8],
    gso_size: usize,
    headroom: usize,
    out: &mut [u8],
) -> Result<Segments, DropReason> {
    let l = layout(pkt)?;
    let ip = gso::IpFix::new(pkt, l.v6, l.ip_hl);
    gso::cut(
        pkt,
        l.ip_hl + UDP_HLEN,
        l.len,
        gso_size,
        headroom,
        out,
        |seg, i, _| {
            let n = seg.len();
            ip.apply(seg, i, n)?;
            let u = &mut seg[l.ip_hl..];
            let udp_len = u16::try_from(u.len()).map_err(|_| DropReason::Mtu)?;
            put16(u, UDP_LEN_OFFSET, udp_len);
            put16(u, UDP_CSUM_OFFSET, 0);
            let c = match gso::l4_checksum(seg, l.ip_hl, l.v6, ipv4::PROTO_UDP) {
                0 => 0xffff,
                c => c,
            };
            put16(&mut seg[l.ip_hl..], UDP_CSUM_OFFSET, c);
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn udp_super(v6: bool, payload: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        let b = if v6 {
            etherparse::PacketBuilder::ipv6([0xfd; 16], [0xfe; 16], 64)
        } else {
            etherparse::PacketBuilder::ipv4([10, 244, 1, 2], [10, 244, 2, 3], 64)
        };
        b.udp(4433, 443).write(&mut v, payload).expect("build");
        // The kernel leaves a partial sum in the field: anything must do.
        let off = if v6 { 40 + 6 } else { 20 + 6 };
        v[off] = 0xde;
        v[off + 1] = 0xad;
        v
    }

    fn cut(sp: &[u8], gso: usize, headroom: usize) -> Vec<Vec<u8>> {
        let need = udp_required_len(sp, gso, headroom).expect("udp");
        let mut out = vec![0xaa; need];
        let segs = udp_segment(sp, gso, headroom, &mut out).expect("segment");
        assert!(segs.total_len() <= need);
        (0..segs.count)
            .map(|i| {
                let r = segs.range(i);
                out[r.start + headroom..r.end].to_vec()
            })
            .collect()
    }

    #[test]
    fn super_packets_are_cut_into_valid_datagrams_v4_and_v6() {
        let data: Vec<u8> = (0..4000u32).map(|i| (i * 7 % 251) as u8).collect();
        for v6 in [false, true] {
            let sp = udp_super(v6, &data);
            let segs = cut(&sp, 1200, 50);
            assert_eq!(segs.len(), 4);
            let mut joined = Vec::new();
            for (i, s) in segs.iter().enumerate() {
                let p = etherparse::SlicedPacket::from_ip(s).expect("valid IP");
                let Some(etherparse::TransportSlice::Udp(u)) = p.transport else {
                    panic!("segment {i} is not UDP");
                };
                assert_eq!(usize::from(u.length()), 8 + u.payload().len());
                assert_eq!(u.payload().len(), if i == 3 { 400 } else { 1200 });
                let ok = match &p.net {
                    Some(etherparse::NetSlice::Ipv4(ip)) => {
                        let h = ip.header().to_header();
                        assert_eq!(h.header_checksum, h.calc_header_checksum(), "ip checksum");
                        u.to_header()
                            .calc_checksum_ipv4(&h, u.payload())
                            .expect("sum")
                            == u.checksum()
                    }
                    Some(etherparse::NetSlice::Ipv6(ip)) => {
                        let h = ip.header().to_header();
                        u.to_header()
                            .calc_checksum_ipv6(&h, u.payload())
                            .expect("sum")
                            == u.checksum()
                    }
                    _ => false,
                };
                assert!(ok, "udp checksum of segment {i} (v6 {v6})");
                joined.extend_from_slice(u.payload());
            }
            assert_eq!(joined, data, "no byte lost or duplicated");
        }
    }

    #[test]
    fn ipv4_ids_increase_and_short_packets_pass_whole() {
        let sp = udp_super(false, &[1u8; 2500]);
        let id0 = u16::from_be_bytes([sp[4], sp[5]]);
        let segs = cut(&sp, 1000, 0);
        let ids: Vec<u16> = segs
            .iter()
            .map(|s| u16::from_be_bytes([s[4], s[5]]))
            .collect();
        assert_eq!(ids, [id0, id0.wrapping_add(1), id0.wrapping_add(2)]);
        assert_eq!(cut(&udp_super(false, &[2u8; 10]), 1000, 0).len(), 1);
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        let sp = udp_super(false, &[0u8; 100]);
        let mut out = vec![0u8; 4096];
        assert_eq!(udp_segment(&sp, 0, 0, &mut out), Err(DropReason::Malformed));
        assert_eq!(
            udp_segment(&sp[..10], 50, 0, &mut out),
            Err(DropReason::Malformed)
        );
        assert_eq!(
            udp_segment(&sp, 50, 0, &mut out[..20]),
            Err(DropReason::Mtu)
        );
        let mut tcp = sp.clone();
        tcp[9] = ipv4::PROTO_TCP;
        assert_eq!(
            udp_segment(&tcp, 50, 0, &mut out),
            Err(DropReason::Malformed)
        );
        let mut lie = sp.clone();
        lie[2..4].copy_from_slice(&5000u16.to_be_bytes());
        assert_eq!(
            udp_segment(&lie, 50, 0, &mut out),
            Err(DropReason::Malformed)
        );
        assert!(udp_required_len(&tcp, 50, 0).is_none());
    }
}
