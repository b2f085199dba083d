//! Engine targets: the receive path (decapsulation and the source checks,
//! then what the worker does with the inner packet), userspace GRO, and the
//! TUN transmit path (virtio-net header, route, GSO/USO, checksum
//! completion, encapsulation). The userspace WireGuard path (its core,
//! both directions) is `wg.rs`.
//!
//! The bodies call the functions the workers call: `weft_engine::path`'s
//! transmit and receive steps (`tx::udp_plan`/`udp_write`,
//! `tx::ipip_plan`/`write`, `rx::udp`, `rx::ipip`) over a fixed peer table,
//! and GRO / `write_plain`'s steps after them. They check what the engine
//! promises: ranges stay inside the buffer, every segment GSO or USO writes
//! is a valid IP/TCP or IP/UDP packet with correct checksums carrying exactly
//! the original payload, our own encapsulation decapsulates, the source
//! checks of every anti-spoofing mode decide as the modes say, GRO loses or
//! invents no bytes and merges only segments whose TCP checksum was valid
//! (or partial).

use std::cell::RefCell;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Range;

use weft_engine::AntiSpoofing;
use weft_engine::encap::{Codec, DropReason, FlannelUdp, VXLAN_HEADROOM, Vxlan};
use weft_engine::ipip;
use weft_engine::offload::gro::{Gro, Pushed};
use weft_engine::offload::gso::{self, Segments};
use weft_engine::offload::partial_checksum;
use weft_engine::path::gather;
use weft_engine::path::rx::{self, Delivery};
use weft_engine::path::tx::{self, Refusal, Shape};
use weft_engine::peers::{Peer, PeerTable};
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

/// Node 1's underlay address (the seeds' outer source) and node 2's.
const NODE1: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 11);
const NODE2: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 12);
/// Source of the ICMP errors flannel-UDP answers unroutable packets with.
const ICMP_SRC: Ipv4Addr = Ipv4Addr::new(10, 244, 2, 0);

fn table() -> PeerTable {
    let peer = |subnet: &str, endpoint: Ipv4Addr| Peer {
        subnet: subnet.parse().expect("subnet"),
        endpoint: IpAddr::V4(endpoint),
        // Our own MAC, so that our decap takes what our encap wrote.
        vtep_mac: Some(LOCAL_MAC),
        nat: None,
        wireguard: None,
        tunnel_gso: false,
    };
    PeerTable::new(
        &[
            peer("10.244.1.0/24", NODE1),
            peer("fc00:0:0:1::/64", NODE1),
            peer("10.0.0.0/8", NODE2),
            peer("::/0", NODE2),
        ],
        8472,
    )
}

thread_local! {
    /// The peer table every body routes and checks sources with: node 1
    /// (the seeds' sources) and node 2 (10.0.0.0/8 and all of IPv6; other
    /// IPv4 destinations have no route).
    static TABLE: PeerTable = table();
}

/// Whether peer `node`'s subnets (by its underlay address) hold `src`.
fn owns(node: Ipv4Addr, src: IpAddr) -> bool {
    let node1 = match src {
        IpAddr::V4(a) => a.octets()[..3] == [10, 244, 1],
        IpAddr::V6(a) => a.segments()[..4] == [0xfc00, 0, 0, 1],
    };
    match node {
        NODE1 => node1,
        NODE2 => match src {
            IpAddr::V4(a) => a.octets()[0] == 10,
            IpAddr::V6(_) => true,
        },
        _ => false,
    }
}

/// The inner source of a decapsulated packet, read independently of the engine.
fn inner_src(pkt: &[u8]) -> IpAddr {
    if pkt[0] >> 4 == 6 {
        let a: [u8; 16] = pkt[8..24].try_into().expect("16 bytes");
        IpAddr::from(a)
    } else {
        IpAddr::from([pkt[12], pkt[13], pkt[14], pkt[15]])
    }
}

/// Checks one receive step's verdict for a packet whose outer source is
/// `outer` (`None`: no peer's) against `want`, what decap alone gave.
fn check_verdict(
    mode: AntiSpoofing,
    outer: Option<Ipv4Addr>,
    got: Result<Delivery<'_>, DropReason>,
    want: &Result<Range<usize>, DropReason>,
    buf: &[u8],
) {
    let Ok(range) = want else {
        match (mode, outer, got) {
            (AntiSpoofing::Strict, None, Err(r)) => assert_eq!(r, DropReason::UnknownPeer),
            (_, _, Err(r)) => assert_eq!(Err(r), want.clone(), "another drop reason than decap's"),
            (_, _, Ok(_)) => panic!("delivered what decap refused"),
        }
        return;
    };
    let src = inner_src(&buf[range.clone()]);
    let expect = match (mode, outer) {
        (AntiSpoofing::Off, _) => Ok(false),
        (_, Some(n)) if owns(n, src) => Ok(false),
        (_, Some(_)) => Err(DropReason::SpoofedSource),
        (AntiSpoofing::Subnet, None) if owns(NODE1, src) || owns(NODE2, src) => Ok(true),
        (_, None) => Err(DropReason::UnknownPeer),
    };
    match got {
        Ok(d) => {
            assert_eq!(
                Ok(d.unexpected),
                expect,
                "{mode} delivered {src} from {outer:?}"
            );
            assert_eq!(&d.inner, range, "delivery range differs from decap's");
            if mode != AntiSpoofing::Off {
                let e = d.from.expect("a checked delivery counts on a peer");
                assert!(e.subnet.contains(&src), "counted on a peer without {src}");
            }
        }
        Err(r) => assert_eq!(Err(r), expect, "{mode} dropped {src} from {outer:?}"),
    }
}

/// The UDP receive step (`rx::udp`) in every anti-spoofing mode, from node 1
/// and from an unknown source, against `want` (what decap alone gave).
fn rx_udp_modes(codec: &Codec, data: &[u8], want: &Result<Range<usize>, DropReason>) {
    TABLE.with(|t| {
        let node1 = t.endpoint_entries(IpAddr::V4(NODE1));
        for mode in [
            AntiSpoofing::Off,
            AntiSpoofing::Subnet,
            AntiSpoofing::Strict,
        ] {
            for (outer, entries) in [(Some(NODE1), node1), (None, &[][..])] {
                let mut buf = data.to_vec();
                let got = rx::udp(codec, mode, t, entries, &mut buf);
                check_verdict(mode, outer, got, want, &buf);
            }
        }
    });
}

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
    check_cut(pkt, ipv4::PROTO_TCP, gs, headroom, out, segs)
}

/// Checks the output of cutting the TCP or UDP (`proto`) super-packet `pkt`
/// into segments of `gs` payload bytes (`gso::tcp_segment`,
/// `uso::udp_segment`); returns each segment's range in `out`.
fn check_cut(
    pkt: &[u8],
    proto: u8,
    gs: usize,
    headroom: usize,
    out: &[u8],
    segs: Segments,
) -> Vec<Range<usize>> {
    let (ip_hl, _) = ip_layout(pkt).expect("cut a non-IP packet");
    let hdrs = if proto == ipv4::PROTO_TCP {
        gso::tcp_headers_len(pkt).expect("tcp_segment accepted a non-TCP packet")
    } else {
        ip_hl + 8
    };
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
            l4_checksum_ok(seg, ip_hl, proto),
            "GSO wrote a bad transport checksum in segment {i}"
        );
        if proto == ipv4::PROTO_UDP {
            assert_eq!(
                usize::from(be16_at(seg, ip_hl + 4)),
                seg.len() - ip_hl,
                "USO wrote a wrong UDP length"
            );
        }
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

/// VXLAN receive: decap, the receive step in every anti-spoofing mode,
/// re-encapsulation round trip, then `write_plain`.
pub fn vxlan_decap(data: &[u8]) {
    let v = Vxlan {
        vni: VNI,
        local_mac: LOCAL_MAC,
    };
    let mut buf = data.to_vec();
    let res = v.decap(&buf);
    assert_eq!(res, Codec::Vxlan(v).decap(&mut buf));
    assert!(buf == data, "VXLAN decap changed the datagram");
    rx_udp_modes(&Codec::Vxlan(v), data, &res);
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

/// flannel-UDP receive: decap (TTL decrement), the receive step in every
/// anti-spoofing mode, then `write_plain`.
pub fn flannel_udp_decap(data: &[u8]) {
    let mut buf = data.to_vec();
    let csum_was_ok = ipv4::Packet::new_checked(data).is_ok_and(|p| p.verify_checksum());
    let res = FlannelUdp::decap(&mut buf);
    rx_udp_modes(&Codec::FlannelUdp, data, &res);
    let Ok(r) = res else {
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

/// The receive path with a virtio-net TUN: the receive step (no source
/// checks) over a batch, push every inner
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
        let d = &mut arena[start..start + len];
        let Ok(r) = TABLE.with(|t| rx::udp(&codec, AntiSpoofing::Off, t, &[], d).map(|d| d.inner))
        else {
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

/// The TUN read path: the transmit step the workers run. Input: a mode byte
/// (bit 1: IPIP; else bit 0: flannel-UDP instead of VXLAN), the 10-byte
/// virtio-net header, the packet. `GSO_TCPV4/6` super-packets go through
/// userspace GSO, `GSO_UDP_L4` ones through USO (flannel-UDP and VXLAN).
pub fn tun_tx(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    let mut read = rest.to_vec();
    TABLE.with(|t| {
        if mode & 2 != 0 {
            tx_ipip(t, &mut read);
        } else {
            tx_udp(&codec(mode), t, &mut read);
        }
    });
}

/// `tx::udp_plan` + `tx::udp_write`, then every datagram through our own receive step.
fn tx_udp(codec: &Codec, t: &PeerTable, read: &mut [u8]) {
    let plan = match tx::udp_plan(codec, t, read, true, TX_ARENA) {
        Ok(p) => p,
        Err(Refusal::Unreachable { start }) => {
            assert!(matches!(codec, Codec::FlannelUdp), "unreachable from VXLAN");
            let dst = ipv4::Packet::new_checked(&read[start..]).map(|p| p.dst());
            assert!(
                dst.is_err() || dst.is_ok_and(|d| d.octets()[0] != 10),
                "routable"
            );
            let mut icmp = [0u8; 128];
            if let Some(n) = ipv4::build_net_unreachable(ICMP_SRC, &read[start..], &mut icmp) {
                let p = ipv4::Packet::new_checked(&icmp[..n]).expect("our ICMP is IPv4");
                assert!(p.verify_checksum(), "ICMP error with a bad IPv4 checksum");
                assert_eq!(
                    checksum::sum(&icmp[ipv4::HEADER_LEN..n]),
                    0xffff,
                    "bad ICMP checksum"
                );
            }
            return;
        }
        Err(Refusal::Drop(_)) => return,
    };
    assert!(plan.need <= TX_ARENA);
    let headroom = codec.headroom();
    assert_eq!(plan.headroom, headroom);
    let mut arena = vec![0; plan.need];
    let Ok(out) = tx::udp_write(codec, &plan, read, &mut arena) else {
        return;
    };
    assert!(out.segs.total_len() <= plan.need && out.count() <= plan.datagrams);
    check_gather(codec, &plan, read, &arena, &out);
    let ip = &read[plan.pkt.start..];
    let ranges = match plan.shape {
        Shape::Tcp(gs) => check_cut(ip, ipv4::PROTO_TCP, gs, headroom, &arena, out.segs),
        Shape::Udp(gs) => check_cut(ip, ipv4::PROTO_UDP, gs, headroom, &arena, out.segs),
        Shape::Single(_) => {
            assert!(
                arena[headroom..] == *ip,
                "a single packet was not copied as it is"
            );
            std::iter::once(0..plan.need).collect()
        }
    };
    let cut = !matches!(plan.shape, Shape::Single(_));
    for r in ranges {
        let seg = &mut arena[r];
        match rx::udp(codec, AntiSpoofing::Off, t, &[], seg) {
            Ok(d) if cut => assert_eq!(d.inner, headroom..seg.len()),
            Ok(d) => assert!(d.inner.start == headroom && d.inner.end <= seg.len()),
            Err(DropReason::TtlExpired) if matches!(codec, Codec::FlannelUdp) => {}
            // A single packet the TUN handed over need not be a valid one.
            Err(_) if !cut => {}
            Err(e) => panic!("our own segment is rejected by decap: {e:?}"),
        }
    }
}

/// `gather::udp_gather` of a TCP super-packet: header block + payload
/// slice of every segment are exactly the datagram `udp_write` copied.
fn check_gather(
    codec: &Codec,
    plan: &tx::Plan<'_>,
    read: &[u8],
    arena: &[u8],
    out: &tx::Datagrams,
) {
    let mut hdrs = vec![0; TX_ARENA];
    let g = match gather::udp_gather(codec, plan, read, &mut hdrs) {
        Ok(Some(g)) => g,
        Ok(None) => {
            let few = out.count() <= gather::MAX_GATHER_SEGS;
            assert!(!matches!(plan.shape, Shape::Tcp(_)) || !few, "not gathered");
            return;
        }
        Err(e) => panic!("gather refused what udp_write cut: {e:?}"),
    };
    assert!(
        matches!(plan.shape, Shape::Tcp(_)),
        "gathered a {:?}",
        plan.shape
    );
    assert_eq!(g.count, out.count());
    let ip = &read[plan.pkt.start..];
    for i in 0..g.count {
        let mut seg = hdrs[g.header(i)].to_vec();
        seg.extend_from_slice(&ip[g.payload(i)]);
        assert!(seg == arena[out.range(i)], "gathered segment {i} differs");
    }
}

/// `tx::ipip_plan` + `tx::write`.
fn tx_ipip(t: &PeerTable, read: &mut [u8]) {
    let Ok(plan) = tx::ipip_plan(t, read, true, TX_ARENA) else {
        return;
    };
    let tx::Outer::Ipip { dst, params: outer } = plan.outer else {
        panic!("an ipip plan without ipip outer fields: {:?}", plan.outer)
    };
    assert_eq!(IpAddr::V4(dst), plan.entry.dst.ip());
    assert!(outer.ttl >= 1 && outer.tos & 0xfc == 0);
    let mut arena = vec![0; plan.need];
    let Ok(out) = tx::write(&plan, read, &mut arena) else {
        return;
    };
    let ip = &read[plan.pkt.start..];
    assert_eq!(ip[0] >> 4, 4, "IPIP sent IPv6");
    match plan.shape {
        Shape::Tcp(gs) => {
            check_cut(ip, ipv4::PROTO_TCP, gs, 0, &arena, out.segs);
        }
        Shape::Udp(_) => panic!("IPIP cut a UDP super-packet"),
        Shape::Single(_) => assert!(arena == *ip, "a single packet was not copied as it is"),
    }
}

/// IPIP receive (raw IP socket: outer IPv4 header first): decap with ECN
/// decapsulation, the receive step in every anti-spoofing mode, the steering
/// hash, then `write_plain`.
pub fn ipip_decap(data: &[u8]) {
    let _ = ipip::steering_hash(
        data,
        1 + usize::from(data.first().copied().unwrap_or(0) & 7),
    );
    let outer = ipip::outer_source(data);
    let mut buf = data.to_vec();
    let res = ipip::decap(&mut buf);
    TABLE.with(|t| {
        for mode in [
            AntiSpoofing::Off,
            AntiSpoofing::Subnet,
            AntiSpoofing::Strict,
        ] {
            let mut b = data.to_vec();
            let known = outer.filter(|a| matches!(*a, NODE1 | NODE2));
            match rx::ipip(mode, t, &mut b) {
                Ok((src, d)) => {
                    assert_eq!(Some(src), outer);
                    check_verdict(mode, known, Ok(d), &res, &buf);
                }
                Err(DropReason::Malformed) if outer.is_none() => {}
                Err(r) => check_verdict(mode, known, Err(r), &res, &buf),
            }
        }
    });
    let Ok(r) = res else {
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
