use super::*;
use crate::test_util::{payload, run_cbpf, tcp4, udp4};
use crate::wire::put16;

/// Wraps `inner` in an outer IPv4 header as the kernel's ipip device (and
/// our raw socket) would send it: protocol 4, `src -> dst`, TTL/TOS from
/// `outer_params`, DF copied, `opts` extra header bytes (IHL > 5).
fn wrap(inner: &[u8], src: [u8; 4], dst: [u8; 4], opts: usize) -> Vec<u8> {
    let o = outer_params(inner).expect("ipv4 inner");
    let hl = 20 + opts;
    let mut v = vec![0u8; hl + inner.len()];
    v[0] = 0x40 | u8::try_from(hl / 4).expect("ihl");
    v[1] = o.tos;
    put16(&mut v, 2, u16::try_from(hl + inner.len()).expect("len"));
    put16(&mut v, 4, 0x1234);
    put16(&mut v, 6, if o.df { 0x4000 } else { 0 });
    v[8] = o.ttl;
    v[9] = PROTO_IPIP;
    v[12..16].copy_from_slice(&src);
    v[16..20].copy_from_slice(&dst);
    ipv4::Packet::new_unchecked(&mut v[..]).fill_checksum();
    v[hl..].copy_from_slice(inner);
    v
}

fn set_tos(pkt: &mut [u8], tos: u8) {
    pkt[1] = tos;
    ipv4::Packet::new_unchecked(&mut pkt[..]).fill_checksum();
}

const A: [u8; 4] = [192, 0, 2, 1];
const B: [u8; 4] = [192, 0, 2, 2];

#[test]
fn outer_params_follow_the_kernel_ipip_device() {
    let mut p = udp4([10, 244, 1, 2], [10, 244, 2, 2], 63, b"x");
    // etherparse sets DF on IPv4 by default.
    let df = ipv4::Packet::new_unchecked(&p[..]).dont_frag();
    let o = outer_params(&p).expect("params");
    assert_eq!((o.ttl, o.tos, o.df), (63, 0, df));
    // DSCP is not copied (tos 0), ECN is; CE leaves as ECT(0).
    for (inner, outer) in [(0xb8, 0), (0xb9, 1), (0xba, 2), (0xbb, 2)] {
        set_tos(&mut p, inner);
        assert_eq!(
            outer_params(&p).map(|o| o.tos),
            Some(outer),
            "inner tos {inner:#x}"
        );
    }
    put16(&mut p, 6, 0);
    assert!(!outer_params(&p).expect("params").df);
    put16(&mut p, 6, 0x4000);
    assert!(outer_params(&p).expect("params").df);
    p[8] = 0;
    assert_eq!(
        outer_params(&p).map(|o| o.ttl),
        Some(1),
        "ttl 0 is not a valid IP_TTL"
    );
    assert_eq!(outer_params(&p[..19]), None);
    let mut v6 = p.clone();
    v6[0] = 0x60;
    assert_eq!(outer_params(&v6), None);
}

#[test]
fn decap_strips_the_outer_header_with_and_without_options() {
    let inner = tcp4(
        [10, 244, 1, 2],
        [10, 244, 2, 2],
        7,
        &payload(1400, 3),
        false,
    );
    for opts in [0, 4, 40] {
        let mut pkt = wrap(&inner, A, B, opts);
        // Trailing bytes beyond the outer total length (link padding) are ignored.
        pkt.extend_from_slice(&[0xee; 6]);
        assert_eq!(outer_source(&pkt), Some(Ipv4Addr::from(A)));
        let r = decap(&mut pkt).expect("decap");
        assert_eq!(r, 20 + opts..20 + opts + inner.len());
        assert_eq!(&pkt[r], &inner[..]);
    }
}

#[test]
fn decap_trims_to_the_inner_total_length() {
    let inner = udp4([10, 244, 1, 2], [10, 244, 2, 2], 64, b"hello");
    let mut padded = inner.clone();
    padded.extend_from_slice(&[0; 10]);
    let mut pkt = wrap(&padded, A, B, 0);
    let r = decap(&mut pkt).expect("decap");
    assert_eq!(&pkt[r], &inner[..]);
}

#[test]
fn malformed_packets_are_rejected() {
    let inner = udp4([10, 244, 1, 2], [10, 244, 2, 2], 64, b"hello world");
    let good = wrap(&inner, A, B, 0);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("empty", vec![]),
        ("shorter than an ipv4 header", good[..19].to_vec()),
        ("outer header only", {
            let mut p = good[..20].to_vec();
            put16(&mut p, 2, 20);
            p
        }),
        ("outer version 6", {
            let mut p = good.clone();
            p[0] = 0x65;
            p
        }),
        ("outer ihl 4", {
            let mut p = good.clone();
            p[0] = 0x44;
            p
        }),
        ("outer ihl beyond the packet", {
            let mut p = good[..40].to_vec();
            p[0] = 0x4f;
            put16(&mut p, 2, 40);
            p
        }),
        ("not protocol 4", {
            let mut p = good.clone();
            p[9] = 41;
            p
        }),
        (
            "outer total length beyond the packet",
            good[..good.len() - 1].to_vec(),
        ),
        ("outer fragment (more fragments)", {
            let mut p = good.clone();
            put16(&mut p, 6, 0x2000);
            p
        }),
        ("outer fragment (offset)", {
            let mut p = good.clone();
            put16(&mut p, 6, 0x0001);
            p
        }),
        ("inner ipv6", {
            let mut p = good.clone();
            p[20] = 0x60;
            p
        }),
        ("inner truncated", {
            let mut p = wrap(&inner[..inner.len() - 3], A, B, 0);
            let l = u16::try_from(inner.len()).expect("len");
            put16(&mut p, 22, l);
            p
        }),
        ("inner ihl 3", {
            let mut p = good.clone();
            p[20] = 0x43;
            p
        }),
    ];
    for (what, mut pkt) in cases {
        assert_eq!(decap(&mut pkt), Err(DropReason::Malformed), "{what}");
    }
    let mut ok = good.clone();
    assert!(decap(&mut ok).is_ok());
}

#[test]
fn ecn_decapsulation_follows_rfc_6040() {
    let base = udp4([10, 244, 1, 2], [10, 244, 2, 2], 64, b"ecn");
    // (inner ECN, outer ECN) -> Some(inner ECN after decap) or None (drop).
    let cases = [
        (0, 0, Some(0)),
        (0, 1, Some(0)),
        (0, 2, Some(0)),
        (0, 3, None),
        (2, 3, Some(3)),
        (1, 3, Some(3)),
        (3, 3, Some(3)),
        (2, 0, Some(2)),
        (2, 1, Some(2)),
    ];
    for (inner_ecn, outer_ecn, want) in cases {
        let mut inner = base.clone();
        set_tos(&mut inner, 0x20 | inner_ecn);
        let mut pkt = wrap(&inner, A, B, 0);
        pkt[1] = (pkt[1] & !3) | outer_ecn;
        match (decap(&mut pkt), want) {
            (Ok(r), Some(w)) => {
                let p = ipv4::Packet::new_checked(&pkt[r]).expect("inner");
                assert_eq!(p.tos(), 0x20 | w, "inner {inner_ecn} outer {outer_ecn}");
                assert!(p.verify_checksum(), "checksum after ECN update");
            }
            (Err(e), None) => assert_eq!(e, DropReason::Malformed),
            (got, want) => panic!("inner {inner_ecn} outer {outer_ecn}: {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn steering_filter_matches_the_hash_and_picks_exactly_one_worker() {
    let mut pkts: Vec<Vec<u8>> = Vec::new();
    for i in 0..64u8 {
        let src = [10, 244, 1, 2 + (i % 7)];
        let dst = [10, 244, 2, 2 + (i % 5)];
        let mut t = tcp4(
            src,
            dst,
            u32::from(i),
            &payload(usize::from(i) * 3, 1),
            false,
        );
        // Different ports per packet.
        put16(&mut t, 20, 40000 + u16::from(i));
        pkts.push(wrap(&t, A, B, 0));
        let mut u = udp4(src, dst, 64, &payload(usize::from(i), 2));
        put16(&mut u, 22, 1000 + u16::from(i));
        pkts.push(wrap(&u, A, B, 0));
    }
    // ICMP-like (no ports), a non-first fragment, a short packet, inner options,
    // an inner IHL that points past the end, garbage.
    let mut icmp = udp4([10, 244, 1, 9], [10, 244, 2, 9], 64, b"ping");
    icmp[9] = 1;
    pkts.push(wrap(&icmp, A, B, 0));
    let mut frag = udp4([10, 244, 1, 9], [10, 244, 2, 9], 64, b"frag");
    put16(&mut frag, 6, 0x0010);
    pkts.push(wrap(&frag, A, B, 0));
    pkts.push(vec![0x45; 39]);
    pkts.push(vec![]);
    let mut long_ihl = wrap(
        &udp4([10, 244, 1, 3], [10, 244, 2, 3], 64, b"opts"),
        A,
        B,
        0,
    );
    long_ihl[20] = 0x4f;
    pkts.push(long_ihl);
    pkts.push(payload(300, 9));
    for workers in 1..=5 {
        let progs: Vec<_> = (0..workers)
            .map(|me| steering_filter(me, workers))
            .collect();
        let mut seen = vec![0usize; workers];
        for p in &pkts {
            let takers: Vec<usize> = (0..workers)
                .filter(|&me| run_cbpf(&progs[me], p) != 0)
                .collect();
            assert_eq!(
                takers,
                vec![steering_hash(p, workers)],
                "workers {workers}, packet {p:02x?}"
            );
            seen[takers[0]] += 1;
        }
        assert!(
            seen.iter().all(|&s| s > 0),
            "every worker gets flows: {seen:?}"
        );
    }
    // Same flow, different payloads: same worker.
    let f = |seq: u32, len: usize| {
        wrap(
            &tcp4(
                [10, 244, 1, 2],
                [10, 244, 2, 2],
                seq,
                &payload(len, seq),
                false,
            ),
            A,
            B,
            0,
        )
    };
    for w in 2..=4 {
        assert_eq!(
            steering_hash(&f(1, 100), w),
            steering_hash(&f(9000, 1400), w)
        );
    }
    // Connections between two pods differ in an even source port only
    // (Linux's connect()): they still spread over two workers.
    let mut seen = [0usize; 2];
    for port in (40000..40200u16).step_by(2) {
        let mut t = tcp4([10, 244, 1, 2], [10, 244, 2, 2], 1, b"x", false);
        put16(&mut t, 20, port);
        seen[steering_hash(&wrap(&t, A, B, 0), 2)] += 1;
    }
    assert!(seen.iter().all(|&c| c > 25), "{seen:?}");
}
