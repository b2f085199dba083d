use super::*;
use crate::test_util::*;
use crate::wire::checksum;

fn corrupt_csum(pkt: &mut [u8], ip_hl: usize) {
    // The kernel leaves a partial (pseudo-header) sum in the field: anything must do.
    pkt[ip_hl + 16] = 0xde;
    pkt[ip_hl + 17] = 0xad;
}

fn segment_and_check(pkt: &[u8], gso: usize, headroom: usize, ip_hl: usize) -> Vec<Vec<u8>> {
    let need = required_len(pkt, gso, headroom).expect("tcp");
    let mut out = vec![0xaa; need];
    let segs = tcp_segment(pkt, gso, headroom, &mut out).expect("segment");
    assert!(segs.total_len() <= need);
    let mut res = Vec::new();
    for i in 0..segs.count {
        let r = segs.range(i);
        let seg = out[r.start + headroom..r.end].to_vec();
        assert!(seg.len() - ip_hl <= 32 + gso + 20);
        res.push(seg);
    }
    res
}

#[test]
fn ipv4_super_packet_is_cut_like_the_kernel() {
    let data = payload(5000, 1);
    let mut sp = tcp4([10, 244, 1, 2], [10, 244, 2, 3], 1000, &data, true);
    // FIN on the super-packet: only the last segment keeps FIN and PSH.
    sp[20 + 13] |= crate::wire::tcp::FIN;
    corrupt_csum(&mut sp, 20);
    let segs = segment_and_check(&sp, 1400, 22, 20);
    assert_eq!(segs.len(), 4);
    let ident0 = u16::from_be_bytes([sp[4], sp[5]]);
    let mut joined = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        let (seq, flags, pl) = check_tcp(s);
        assert_eq!(seq, 1000 + 1400 * i as u32);
        assert_eq!(
            u16::from_be_bytes([s[4], s[5]]),
            ident0.wrapping_add(i as u16)
        );
        assert_eq!(usize::from(u16::from_be_bytes([s[2], s[3]])), s.len());
        let last = i == 3;
        assert_eq!(
            flags & (tcp::PSH | tcp::FIN) != 0,
            last,
            "segment {i} flags {flags:#x}"
        );
        assert_eq!(pl.len(), if last { 800 } else { 1400 });
        joined.extend_from_slice(&pl);
    }
    assert_eq!(joined, data);
}

#[test]
fn ipv6_super_packet_is_cut() {
    let data = payload(4000, 2);
    let mut sp = tcp6(7, &data, false);
    corrupt_csum(&mut sp, 40);
    let segs = segment_and_check(&sp, 1300, 0, 40);
    assert_eq!(segs.len(), 4);
    let mut joined = Vec::new();
    for (i, s) in segs.iter().enumerate() {
        let (seq, _, pl) = check_tcp(s);
        assert_eq!(seq, 7 + 1300 * i as u32);
        joined.extend_from_slice(&pl);
    }
    assert_eq!(joined, data);
}

#[test]
fn exact_multiple_and_single_segment() {
    let sp = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 0, &payload(2800, 3), false);
    assert_eq!(segment_and_check(&sp, 1400, 0, 20).len(), 2);
    let sp = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 0, &payload(100, 3), false);
    assert_eq!(segment_and_check(&sp, 1400, 0, 20).len(), 1);
}

#[test]
fn cwr_only_on_first_segment() {
    let mut sp = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 0, &payload(3000, 4), false);
    sp[20 + 13] |= tcp::CWR;
    let segs = segment_and_check(&sp, 1000, 0, 20);
    let flags: Vec<u8> = segs.iter().map(|s| check_tcp(s).1 & tcp::CWR).collect();
    assert_eq!(flags, vec![tcp::CWR, 0, 0]);
}

#[test]
fn bad_input_is_an_error_not_a_panic() {
    let sp = tcp4([1, 1, 1, 1], [2, 2, 2, 2], 0, &payload(3000, 5), false);
    let mut out = vec![0; 70000];
    assert_eq!(tcp_segment(&sp, 0, 0, &mut out), Err(DropReason::Malformed));
    assert_eq!(
        tcp_segment(&sp, 1000, 0, &mut out[..100]),
        Err(DropReason::Mtu)
    );
    let udp = udp4([1, 1, 1, 1], [2, 2, 2, 2], 5, &[0; 100]);
    assert_eq!(
        tcp_segment(&udp, 1000, 0, &mut out),
        Err(DropReason::Malformed)
    );
    for len in 0..sp.len().min(80) {
        let _ = tcp_segment(&sp[..len], 1000, 22, &mut out);
        let _ = required_len(&sp[..len], 1000, 22);
    }
    let mut x = 12345u32;
    for _ in 0..2000 {
        let len = (x % 200) as usize;
        let junk: Vec<u8> = payload(len, x);
        let _ = tcp_segment(&junk, 1 + (x % 1500) as usize, 22, &mut out);
        let mut j2 = junk.clone();
        let _ = complete_checksum(&mut j2, (x % 64) as usize, (x % 20) as usize);
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
    }
}

#[test]
fn partial_udp_checksum_is_completed() {
    let pkt = udp4([10, 0, 0, 1], [10, 0, 0, 2], 64, &payload(333, 6));
    let want = u16::from_be_bytes([pkt[26], pkt[27]]);
    let mut p = pkt.clone();
    // What the kernel hands over with NEEDS_CSUM: the folded pseudo-header sum.
    let ps = checksum::pseudo_v4(&p[12..16], &p[16..20], 17, (p.len() - 20) as u32);
    p[26..28].copy_from_slice(&(ps as u16).to_be_bytes());
    complete_checksum(&mut p, 20, 6).expect("complete");
    assert_eq!(u16::from_be_bytes([p[26], p[27]]), want);
    assert_eq!(
        complete_checksum(&mut p, 20, 400),
        Err(DropReason::Malformed)
    );
    // A start inside the IP header would overwrite it (the version byte at 0).
    let before = p.clone();
    for start in [0, 10, 19] {
        assert_eq!(
            complete_checksum(&mut p, start, 0),
            Err(DropReason::Malformed)
        );
    }
    assert_eq!(p, before, "a refused completion wrote into the packet");
}
