//! Per-byte work the WireGuard path can skip: in-place TCP segmentation on
//! TX ([`segment_in_place`]) and no re-verification of inner TCP checksums on
//! RX ([`trust_tcp_checksum`]).
//!
//! boringtun's `encapsulate` copies the plaintext next to the ciphertext
//! header anyway, so a separate segment buffer would be one more pass over
//! every byte. Instead the super-packet is cut where it lies: segment `i`'s
//! payload already follows segment `i - 1`'s, so its (fixed-up) IP + TCP
//! headers are written over the last header-length bytes of segment `i - 1`,
//! which the callback has consumed by then. Segments come out in order and
//! are identical to [`crate::offload::gso::tcp_segment`]'s (IPv4 length, ID
//! and header checksum, IPv6 payload length, TCP sequence number, flags and
//! full checksum per segment). The super-packet is destroyed.

use crate::encap::DropReason;
use crate::offload::gso;
use crate::wire::{ipv4, ipv6, put16, tcp};

/// IPv4 with options (60) + TCP with options (60).
const MAX_HDRS: usize = 120;

/// Cuts the TCP super-packet `pkt` into segments of `gso_size` payload bytes
/// and hands each one to `f`, in order. Returns the number of segments.
pub fn segment_in_place(
    pkt: &mut [u8],
    gso_size: usize,
    mut f: impl FnMut(&[u8]),
) -> Result<usize, DropReason> {
    let hdrs = gso::tcp_headers_len(pkt).ok_or(DropReason::Malformed)?;
    if gso_size == 0 || hdrs > MAX_HDRS {
        return Err(DropReason::Malformed);
    }
    let v6 = pkt[0] >> 4 == 6;
    let (ip_hl, len) = if v6 {
        let p = ipv6::Packet::new_unchecked(&*pkt);
        (
            ipv6::HEADER_LEN,
            ipv6::HEADER_LEN + usize::from(p.payload_len()),
        )
    } else {
        let p = ipv4::Packet::new_unchecked(&*pkt);
        // Total length 0 happens with BIG TCP; the buffer length is authoritative then.
        let len = match usize::from(p.total_len()) {
            0 => pkt.len(),
            tl => tl,
        };
        (p.header_len(), len)
    };
    // `tcp_headers_len` has checked `hdrs <= len <= pkt.len()`.
    let mut hdr = [0u8; MAX_HDRS];
    hdr[..hdrs].copy_from_slice(&pkt[..hdrs]);
    let tcp = gso::TcpHeaders::new(&hdr[..hdrs], v6, ip_hl, gso_size);
    let count = (len - hdrs).div_ceil(gso_size).max(1);
    for i in 0..count {
        let p = hdrs + i * gso_size;
        let end = (p + gso_size).min(len);
        let seg = &mut pkt[p - hdrs..end];
        if i > 0 {
            seg[..hdrs].copy_from_slice(&hdr[..hdrs]);
        }
        tcp.fix(seg, i, count)?;
        f(seg);
    }
    Ok(count)
}

/// Marks the TCP checksum of a decrypted IP packet as *partial* (the field
/// holds the pseudo-header sum), so that GRO merges it without summing the
/// payload and the TUN write says `NEEDS_CSUM` (the kernel trusts it).
///
/// Sound for WireGuard payloads only: Poly1305 has authenticated every byte
/// as the peer sent it, which is why the kernel's own WireGuard marks
/// decrypted packets `CHECKSUM_UNNECESSARY` instead of verifying them. Leaves
/// anything that is not a complete, unfragmented TCP/IP packet alone.
pub fn trust_tcp_checksum(pkt: &mut [u8]) {
    let (ip_hl, v6) = match pkt.first().map(|b| b >> 4) {
        Some(4) if pkt.len() >= ipv4::HEADER_LEN => {
            let ip = ipv4::Packet::new_unchecked(&*pkt);
            if ip.protocol() != ipv4::PROTO_TCP
                || ip.header_len() < ipv4::HEADER_LEN
                || ip.more_frags()
                || ip.frag_offset() != 0
            {
                return;
            }
            (ip.header_len(), false)
        }
        Some(6) if pkt.len() >= ipv6::HEADER_LEN && pkt[6] == ipv4::PROTO_TCP => {
            (ipv6::HEADER_LEN, true)
        }
        _ => return,
    };
    if pkt.len() < ip_hl + tcp::HEADER_LEN {
        return;
    }
    let Ok(tcp_len) = u32::try_from(pkt.len() - ip_hl) else {
        return;
    };
    let ps = crate::offload::pseudo_sum(pkt, v6, ipv4::PROTO_TCP, tcp_len);
    // A partial sum of 0 could not be told from "no checksum"; leave those.
    if let Ok(v) = u16::try_from(ps)
        && v != 0
    {
        put16(pkt, ip_hl + tcp::CHECKSUM_OFFSET, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{check_tcp, payload, tcp4, tcp6};

    /// Same segments as the copying segmenter, for v4, v6 and odd sizes.
    #[test]
    fn matches_the_copying_segmenter() {
        let cases = [
            tcp4(
                [10, 244, 1, 2],
                [10, 244, 2, 3],
                1000,
                &payload(65000, 1),
                true,
            ),
            tcp4(
                [10, 244, 1, 2],
                [10, 244, 2, 3],
                u32::MAX - 5,
                &payload(2761, 2),
                false,
            ),
            tcp4([10, 244, 1, 2], [10, 244, 2, 3], 7, &payload(100, 3), true),
            tcp4([10, 244, 1, 2], [10, 244, 2, 3], 7, &[], false),
            tcp6(42, &payload(9000, 4), true),
        ];
        for (n, pkt) in cases.iter().enumerate() {
            for gs in [1, 13, 536, 1368, 70000] {
                let mut out = vec![0u8; gso::required_len(pkt, gs, 0).expect("tcp")];
                let want = gso::tcp_segment(pkt, gs, 0, &mut out).expect("segment");
                let mut got = Vec::new();
                let mut buf = pkt.clone();
                let count =
                    segment_in_place(&mut buf, gs, |s| got.push(s.to_vec())).expect("in place");
                assert_eq!(
                    (count, got.len()),
                    (want.count, want.count),
                    "case {n} gs {gs}"
                );
                let mut seq = None;
                for (i, s) in got.iter().enumerate() {
                    assert_eq!(&s[..], &out[want.range(i)], "case {n} gs {gs} seg {i}");
                    let (sq, _, _) = check_tcp(s);
                    assert!(seq.is_none_or(|p: u32| sq == p.wrapping_add(gs as u32)));
                    seq = Some(sq);
                }
            }
        }
    }

    #[test]
    fn trusted_checksums_are_partial_and_complete_to_the_original() {
        let v4 = tcp4(
            [10, 244, 1, 2],
            [10, 244, 2, 3],
            9,
            &payload(1000, 5),
            false,
        );
        let v6 = tcp6(9, &payload(1000, 6), false);
        for pkt in [v4, v6] {
            let mut p = pkt.clone();
            trust_tcp_checksum(&mut p);
            assert_ne!(p, pkt);
            let (cs, co) = crate::offload::partial_checksum(&p).expect("partial");
            gso::complete_checksum(&mut p, cs, co).expect("complete");
            assert_eq!(
                p, pkt,
                "completing the partial sum gives the sender's checksum"
            );
        }
        let udp = crate::test_util::udp4([1, 1, 1, 1], [2, 2, 2, 2], 64, &[7; 50]);
        let mut p = udp.clone();
        trust_tcp_checksum(&mut p);
        assert_eq!(p, udp, "not TCP: untouched");
        let tcp = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1, &[1; 10], false);
        for cut in [0, 1, 20, 39] {
            let mut short = tcp[..cut].to_vec();
            trust_tcp_checksum(&mut short);
            assert_eq!(short, tcp[..cut]);
        }
        let mut no_ihl = tcp.clone();
        no_ihl[0] = 0x40;
        let before = no_ihl.clone();
        trust_tcp_checksum(&mut no_ihl);
        assert_eq!(no_ihl, before, "IHL < 5: untouched");
    }

    #[test]
    fn rejects_what_is_not_tcp() {
        let udp = crate::test_util::udp4([1, 1, 1, 1], [2, 2, 2, 2], 64, &[0; 100]);
        let mut buf = udp.clone();
        assert_eq!(
            segment_in_place(&mut buf, 100, |_| panic!("no segment")),
            Err(DropReason::Malformed)
        );
        let mut tcp = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 1, &[0; 100], false);
        assert_eq!(
            segment_in_place(&mut tcp, 0, |_| {}),
            Err(DropReason::Malformed)
        );
        for cut in [0, 1, 19, 30] {
            let mut short = tcp[..cut].to_vec();
            assert!(segment_in_place(&mut short, 10, |_| {}).is_err());
        }
    }
}
