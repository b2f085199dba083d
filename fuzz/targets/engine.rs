//! Engine targets: the receive path (decapsulation, then what the worker does
//! with the inner packet), userspace GRO, and the TUN transmit path
//! (virtio-net header, GSO, checksum completion, encapsulation). The
//! userspace WireGuard receive path is in `wg.rs` and reuses the GRO checks.
//!
//! Each body follows `weft_engine`'s worker step by step (`on_tun_packet`,
//! the receive loop, `write_plain`, `flush_rx`) over the public sans-IO
//! functions, and checks what the engine promises: ranges stay inside the
//! buffer, every segment GSO writes is a valid IP/TCP packet with correct
//! checksums carrying exactly the original payload, our own encapsulation
//! decapsulates, GRO loses or invents no bytes and merges only segments whose
//! TCP checksum was valid (or partial).

use std::cell::RefCell;
use std::ops::Range;

use weft_engine::encap::{Codec, DropReason, FlannelUdp, VXLAN_HEADROOM, Vxlan};
use weft_engine::ipip;
use weft_engine::offload::gro::{Gro, Pushed};
use weft_engine::offload::gso::{self, Segments};
use weft_engine::offload::partial_checksum;
use weft_engine::wire::{checksum, ipv4, ipv6, vnet};

/// flannel's default VNI.
const VNI: u32 = 1;
/// Our VTEP MAC (locally administered unicast).
const LOCAL_MAC: [u8; 6] = [0x0e, 0x9a, 0x3c, 0x11, 0x22, 0x33];
/// The TUN MTU of a VXLAN node on a 1500-byte underlay.
const MTU: usize = 1450;
/// The worker's transmit arena; bigger GSO outputs are dropped as `Mtu`.
const TX_ARENA: usize = 1 << 20;
/// TCP's checksum field offset in the TCP header.
pub(crate) const TCP_CSUM: usize = 16;

pub(crate) fn be16_at(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

fn codec(mode: u8) -> Codec {
    if mode & 1 == 0 {
        Codec::Vxlan(Vxlan {
            vni: VNI,
            local_mac: LOCAL_MAC,
        })
    } else {
        Codec::FlannelUdp
    }
}

/// `(ip header length, protocol)` of an IPv4 or IPv6 packet long enough for its header.
pub(crate) fn ip_layout(pkt: &[u8]) -> Option<(usize, u8)> {
    match pkt.first()? >> 4 {
        4 if pkt.len() >= ipv4::HEADER_LEN => Some((usize::from(pkt[0] & 0x0f) * 4, pkt[9])),
        6 if pkt.len() >= ipv6::HEADER_LEN => Some((ipv6::HEADER_LEN, pkt[6])),
        _ => None,
    }
}

/// The folded pseudo-header sum of `pkt`'s transport part (`pkt[ip_hl..]`).
pub(crate) fn pseudo_sum(pkt: &[u8], ip_hl: usize, proto: u8) -> u32 {
    let (src, dst) = if pkt[0] >> 4 == 6 {
        (8..24, 24..40)
    } else {
        (12..16, 16..20)
    };
    let len = u32::try_from(pkt.len() - ip_hl).expect("packets are below 4 GiB");
    checksum::pseudo_v4(&pkt[src], &pkt[dst], proto, len)
}

/// Whether the transport checksum of `pkt` (over `pkt[ip_hl..]`) verifies.
fn l4_checksum_ok(pkt: &[u8], ip_hl: usize, proto: u8) -> bool {
    checksum::combine(pseudo_sum(pkt, ip_hl, proto), checksum::sum(&pkt[ip_hl..])) == 0xffff
}

/// GRO's merge condition: the TCP checksum is valid, or partial (the field
/// holds the pseudo-header sum).
fn tcp_checksum_valid_or_partial(pkt: &[u8], ip_hl: usize) -> bool {
    let ps = pseudo_sum(pkt, ip_hl, ipv4::PROTO_TCP);
    u32::from(be16_at(pkt, ip_hl + TCP_CSUM)) == ps || l4_checksum_ok(pkt, ip_hl, ipv4::PROTO_TCP)
}

/// The end of the IP packet GSO cuts (`tcp_segment`'s own rule).
fn ip_end(pkt: &[u8]) -> usize {
    if pkt[0] >> 4 == 6 {
        ipv6::HEADER_LEN + usize::from(be16_at(pkt, 4))
    } else {
        match usize::from(be16_at(pkt, 2)) {
            0 => pkt.len(),
            tl => tl,
        }
    }
}

/// Checks the output of `gso::tcp_segment(pkt, gs, headroom, out)`.
fn check_segments(
    pkt: &[u8],
    gs: usize,
    headroom: usize,
    out: &[u8],
    segs: Segments,
) -> Vec<Range<usize>> {
    let hdrs = gso::tcp_headers_len(pkt).expect("tcp_segment accepted a non-TCP packet");
    let (ip_hl, _) = ip_layout(pkt).expect("tcp_segment accepted a non-IP packet");
    let payload = &pkt[hdrs..ip_end(pkt)];
    assert!(segs.count >= 1);
    assert_eq!(segs.count, payload.len().div_ceil(gs).max(1));
    assert_eq!(segs.stride, headroom + hdrs + gs);
    let mut joined = Vec::with_capacity(payload.len());
    let mut ranges = Vec::with_capacity(segs.count);
    for i in 0..segs.count {
        let len = if i + 1 == segs.count {
            segs.last_len
        } else {
            segs.stride
        };
        assert!(len <= segs.stride && len >= headroom + hdrs);
        let at = i * segs.stride;
        let seg = &out[at + headroom..at + len];
        if pkt[0] >> 4 == 6 {
            let p = ipv6::Packet::new_checked(seg).expect("GSO wrote a bad IPv6 header");
            assert_eq!(usize::from(p.payload_len()), seg.len() - ipv6::HEADER_LEN);
        } else {
            let p = ipv4::Packet::new_checked(seg).expect("GSO wrote a bad IPv4 header");
            assert_eq!(usize::from(p.total_len()), seg.len());
            assert!(p.verify_checksum(), "GSO wrote a bad IPv4 header checksum");
        }
        assert!(
            l4_checksum_ok(seg, ip_hl, ipv4::PROTO_TCP),
            "GSO wrote a bad TCP checksum in segment {i}"
        );
        joined.extend_from_slice(&seg[hdrs..]);
        ranges.push(at..at + len);
    }
    assert!(
        joined == payload,
        "GSO lost, reordered or invented payload bytes"
    );
    ranges
}

/// What the worker does with a decapsulated packet when the TUN has no
/// virtio-net header (`write_plain`): cut oversize TCP packets to the MTU,
/// else complete a partial transport checksum.
fn rx_plain(pkt: &mut [u8]) {
    if pkt.len() > MTU
        && let Some(hdrs) = gso::tcp_headers_len(pkt)
        && MTU > hdrs
    {
        let gs = MTU - hdrs;
        let need = gso::required_len(pkt, gs, 0).expect("tcp_headers_len accepted it");
        let mut out = vec![0; need];
        let segs = gso::tcp_segment(pkt, gs, 0, &mut out).expect("required_len bytes suffice");
        for r in check_segments(pkt, gs, 0, &out, segs) {
            assert!(r.len() <= MTU, "GSO wrote a segment above the MTU");
        }
        return;
    }
    if let Some((cs, co)) = partial_checksum(pkt) {
        let (_, proto) = ip_layout(pkt).expect("partial_checksum accepted a non-IP packet");
        gso::complete_checksum(pkt, cs, co)
            .expect("partial_checksum gave a field outside the packet");
        assert!(
            l4_checksum_ok(pkt, cs, proto),
            "completed checksum does not verify"
        );
    }
}

/// VXLAN receive: decap, re-encapsulation round trip, then `write_plain`.
pub fn vxlan_decap(data: &[u8]) {
    let v = Vxlan {
        vni: VNI,
        local_mac: LOCAL_MAC,
    };
    let mut buf = data.to_vec();
    let res = v.decap(&buf);
    assert_eq!(res, Codec::Vxlan(v).decap(&mut buf));
    assert!(buf == data, "VXLAN decap changed the datagram");
    let Ok(r) = res else { return };
    assert_eq!(r.start, VXLAN_HEADROOM);
    assert!(r.end <= buf.len() && r.end - r.start >= ipv4::HEADER_LEN);
    let inner = buf[r.clone()].to_vec();
    let mut again = vec![0; VXLAN_HEADROOM + inner.len()];
    v.write_header(&mut again[..VXLAN_HEADROOM], LOCAL_MAC, inner[0] >> 4);
    again[VXLAN_HEADROOM..].copy_from_slice(&inner);
    assert_eq!(v.decap(&again), Ok(VXLAN_HEADROOM..again.len()));
    rx_plain(&mut buf[r]);
}

/// flannel-UDP receive: decap (TTL decrement), then `write_plain`.
pub fn flannel_udp_decap(data: &[u8]) {
    let mut buf = data.to_vec();
    let csum_was_ok = ipv4::Packet::new_checked(data).is_ok_and(|p| p.verify_checksum());
    let Ok(r) = FlannelUdp::decap(&mut buf) else {
        assert!(buf == data, "a dropped datagram was modified");
        return;
    };
    assert_eq!(r.start, 0);
    assert!(r.end <= buf.len() && r.end >= ipv4::HEADER_LEN);
    assert_eq!(buf[8], data[8] - 1, "TTL not decremented by one");
    if csum_was_ok {
        let p = ipv4::Packet::new_unchecked(&buf[..]);
        assert!(
            p.verify_checksum(),
            "TTL update broke a valid header checksum"
        );
    }
    rx_plain(&mut buf[r]);
}

thread_local! {
    /// One table reused across runs, as a worker reuses it across batches.
    static GRO: RefCell<Gro> = RefCell::new(Gro::new(MTU));
}

/// A datagram of the `gro` input and where it sits in the arena.
pub(crate) struct Record {
    pub(crate) start: usize,
    pub(crate) len: usize,
    /// The inner packet as pushed (before GRO rewrote any header).
    pub(crate) pushed: Vec<u8>,
}

/// The receive path with a virtio-net TUN: decap a batch, push every inner
/// packet into GRO, flush. Input: a mode byte (bit 0: flannel-UDP instead of
/// VXLAN), then records `len (u16 LE) | flags | datagram`; flag bit 0 makes
/// the harness write a valid TCP checksum, bit 1 a partial one.
pub fn gro(data: &[u8]) {
    let Some((&mode, mut rest)) = data.split_first() else {
        return;
    };
    let codec = codec(mode);
    let mut arena = Vec::with_capacity(rest.len());
    let mut dgrams = Vec::new();
    while rest.len() >= 3 {
        let len = usize::from(u16::from_le_bytes([rest[0], rest[1]])).min(rest.len() - 3);
        dgrams.push((arena.len(), len, rest[2]));
        arena.extend_from_slice(&rest[3..3 + len]);
        rest = &rest[3 + len..];
    }
    let mut records = Vec::new();
    for (start, len, flags) in dgrams {
        let Ok(r) = codec.decap(&mut arena[start..start + len]) else {
            continue;
        };
        assert!(r.start <= r.end && r.end <= len);
        let pkt = &mut arena[start + r.start..start + r.end];
        if let Some((ip_hl, ipv4::PROTO_TCP)) = ip_layout(pkt)
            && ip_hl >= ipv4::HEADER_LEN
            && pkt.len() >= ip_hl + 20
        {
            if flags & 1 != 0 {
                pkt[ip_hl + TCP_CSUM..ip_hl + TCP_CSUM + 2].fill(0);
                let c = checksum::finish(checksum::combine(
                    pseudo_sum(pkt, ip_hl, ipv4::PROTO_TCP),
                    checksum::sum(&pkt[ip_hl..]),
                ));
                pkt[ip_hl + TCP_CSUM..ip_hl + TCP_CSUM + 2].copy_from_slice(&c.to_be_bytes());
            } else if flags & 2 != 0 {
                let ps = u16::try_from(pseudo_sum(pkt, ip_hl, ipv4::PROTO_TCP)).unwrap_or(0);
                pkt[ip_hl + TCP_CSUM..ip_hl + TCP_CSUM + 2].copy_from_slice(&ps.to_be_bytes());
            }
        }
        records.push(Record {
            start: start + r.start,
            len: r.end - r.start,
            pushed: pkt.to_vec(),
        });
    }
    GRO.with(|g| {
        let mut g = g.borrow_mut();
        assert!(g.is_empty());
        let mut bytes_out = 0;
        for rec in &records {
            if g.push(&arena, rec.start, rec.len) == Pushed::Full {
                bytes_out += flush_checked(&mut g, &mut arena, &records, MTU);
                assert_eq!(g.push(&arena, rec.start, rec.len), Pushed::Queued);
            }
        }
        bytes_out += flush_checked(&mut g, &mut arena, &records, MTU);
        let bytes_in: usize = records.iter().map(|r| r.len).sum();
        assert_eq!(bytes_out, bytes_in, "GRO lost or duplicated bytes");
        let _ = g.take_coalesced();
    });
}

/// Flushes `g` (built with `mtu`) and checks every emitted packet; returns
/// the bytes the pushed packets it covers had (payload plus each segment's
/// own headers).
pub(crate) fn flush_checked(
    g: &mut Gro,
    arena: &mut [u8],
    records: &[Record],
    mtu: usize,
) -> usize {
    let base = arena.as_ptr() as usize;
    let mut covered = 0;
    g.flush(arena, |iov| {
        assert!(iov.len() >= 2, "GRO wrote a packet without a body");
        let hdr = vnet::VnetHdr::parse(&iov[0]).expect("vnet header is 10 bytes");
        let body: Vec<u8> = iov[1..].iter().flat_map(|s| s.iter().copied()).collect();
        covered += body.len() + (iov.len() - 2) * usize::from(hdr.hdr_len);
        // Which pushed packets each slice came from: all must have had a
        // valid or partial TCP checksum when more than one was merged.
        let merged = iov.len() > 2;
        for s in iov[1..].iter().filter(|s| !s.is_empty()) {
            let off = (s.as_ptr() as usize).wrapping_sub(base);
            let rec = records
                .iter()
                .find(|r| r.start <= off && off < r.start + r.len)
                .expect("GRO emitted bytes from outside every pushed packet");
            if merged {
                let (ip_hl, _) = ip_layout(&rec.pushed).expect("merged a non-IP packet");
                assert!(
                    tcp_checksum_valid_or_partial(&rec.pushed, ip_hl),
                    "GRO merged a segment with a bad TCP checksum"
                );
            }
        }
        let gso_type = hdr.gso_type & !vnet::GSO_ECN;
        if matches!(gso_type, vnet::GSO_TCPV4 | vnet::GSO_TCPV6) {
            assert!(
                merged || body.len() > mtu,
                "GSO header on a single small packet"
            );
            assert!(
                body.len() <= 65535 || !merged,
                "coalesced packet above 64 KiB"
            );
            assert_eq!(
                Some(usize::from(hdr.hdr_len)),
                gso::tcp_headers_len(&body),
                "hdr_len is not the TCP/IP header length"
            );
            let gs = usize::from(hdr.gso_size);
            assert!(gs > 0);
            let need = gso::required_len(&body, gs, 0).expect("coalesced packet is TCP/IP");
            let mut out = vec![0; need];
            let segs =
                gso::tcp_segment(&body, gs, 0, &mut out).expect("kernel-style resegmentation");
            if merged {
                assert_eq!(
                    segs.count,
                    iov.len() - 1,
                    "resegmentation gives other segments"
                );
            }
            check_segments(&body, gs, 0, &out, segs);
        } else {
            assert_eq!(gso_type, vnet::GSO_NONE);
            assert!(!merged);
        }
        if hdr.flags & vnet::F_NEEDS_CSUM != 0 {
            let (cs, co) = (usize::from(hdr.csum_start), usize::from(hdr.csum_offset));
            let mut body = body;
            gso::complete_checksum(&mut body, cs, co).expect("NEEDS_CSUM field inside the packet");
            let (_, proto) = ip_layout(&body).expect("NEEDS_CSUM on a non-IP packet");
            assert!(
                l4_checksum_ok(&body, cs, proto),
                "NEEDS_CSUM completion does not verify"
            );
        }
    });
    assert!(g.is_empty());
    covered
}

/// The TUN read path (`on_tun_packet` after the route lookup). Input: a mode
/// byte (bit 0: flannel-UDP instead of VXLAN), the 10-byte virtio-net header,
/// the packet.
pub fn tun_tx(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let codec = codec(mode);
    let Some(hdr) = vnet::VnetHdr::parse(rest) else {
        return;
    };
    let mut pkt = rest[vnet::HEADER_LEN..].to_vec();
    let Some(version) = ip_layout(&pkt).map(|_| pkt[0] >> 4) else {
        return;
    };
    if codec.prepare_inner(&mut pkt).is_err() {
        return;
    }
    let headroom = codec.headroom();
    let gso_type = hdr.gso_type & !vnet::GSO_ECN;
    if matches!(gso_type, vnet::GSO_TCPV4 | vnet::GSO_TCPV6) && hdr.gso_size > 0 {
        let gs = usize::from(hdr.gso_size);
        let Some(need) = gso::required_len(&pkt, gs, headroom) else {
            return;
        };
        if need > TX_ARENA {
            return;
        }
        let mut out = vec![0; need];
        let Ok(segs) = gso::tcp_segment(&pkt, gs, headroom, &mut out) else {
            return;
        };
        assert!(segs.total_len() <= need);
        for r in check_segments(&pkt, gs, headroom, &out, segs) {
            let seg = &mut out[r];
            codec.write_header(&mut seg[..headroom], LOCAL_MAC, version);
            match codec.decap(seg) {
                Ok(inner) => assert_eq!(inner, headroom..seg.len()),
                Err(DropReason::TtlExpired) if matches!(codec, Codec::FlannelUdp) => {}
                Err(e) => panic!("our own segment is rejected by decap: {e:?}"),
            }
        }
    } else {
        if gso_type != vnet::GSO_NONE {
            return;
        }
        if hdr.flags & vnet::F_NEEDS_CSUM != 0
            && gso::complete_checksum(
                &mut pkt,
                usize::from(hdr.csum_start),
                usize::from(hdr.csum_offset),
            )
            .is_err()
        {
            return;
        }
        let mut dgram = vec![0; headroom + pkt.len()];
        codec.write_header(&mut dgram[..headroom], LOCAL_MAC, version);
        dgram[headroom..].copy_from_slice(&pkt);
        if let Ok(r) = codec.decap(&mut dgram) {
            assert_eq!(r.start, headroom);
            assert!(r.end <= dgram.len());
        }
    }
}

/// IPIP receive (raw IP socket: outer IPv4 header first): decap with ECN
/// decapsulation, the steering hash, then `write_plain`.
pub fn ipip_decap(data: &[u8]) {
    let _ = ipip::steering_hash(
        data,
        1 + usize::from(data.first().copied().unwrap_or(0) & 7),
    );
    let _ = ipip::outer_source(data);
    let mut buf = data.to_vec();
    let Ok(r) = ipip::decap(&mut buf) else {
        return;
    };
    let hl = usize::from(data[0] & 0x0f) * 4;
    assert_eq!(r.start, hl);
    assert!(r.end <= buf.len() && r.end - r.start >= ipv4::HEADER_LEN);
    let inner_was_ok =
        ipv4::Packet::new_checked(&data[r.clone()]).is_ok_and(|p| p.verify_checksum());
    let inner =
        ipv4::Packet::new_checked(&buf[r.clone()]).expect("decap returned a bad inner packet");
    if inner_was_ok {
        assert!(
            inner.verify_checksum(),
            "ECN update broke a valid inner checksum"
        );
    }
    let params = ipip::outer_params(&buf[r.clone()]).expect("inner packet is IPv4");
    assert!(params.ttl >= 1);
    rx_plain(&mut buf[r]);
}
