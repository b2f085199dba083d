use super::*;
use crate::test_util::*;
use crate::wire::checksum;

const OURS: [u8; 6] = [0x02, 0, 0, 0, 1, 1];
const THEIRS: [u8; 6] = [0x02, 0, 0, 0, 2, 1];

fn vx() -> Vxlan {
    Vxlan {
        vni: 1,
        local_mac: OURS,
    }
}

#[test]
fn vxlan_header_parses_as_kernel_would() {
    let inner = udp4([10, 244, 1, 2], [10, 244, 2, 3], 64, &[7; 50]);
    let mut buf = vec![0; VXLAN_HEADROOM + inner.len()];
    buf[VXLAN_HEADROOM..].copy_from_slice(&inner);
    vx().write_header(&mut buf[..VXLAN_HEADROOM], THEIRS, 4);
    assert_eq!(&buf[..8], &[0x08, 0, 0, 0, 0, 0, 1, 0]);
    let eth = etherparse::Ethernet2HeaderSlice::from_slice(&buf[8..]).expect("eth");
    assert_eq!(eth.destination(), THEIRS);
    assert_eq!(eth.source(), OURS);
    assert_eq!(eth.ether_type(), etherparse::EtherType::IPV4);
    // The receiving side (their MAC) accepts it and gets the inner packet back.
    let rx = Vxlan {
        vni: 1,
        local_mac: THEIRS,
    };
    let r = rx.decap(&buf).expect("decap");
    assert_eq!(&buf[r], &inner[..]);
}

#[test]
fn vxlan_ipv6_inner_and_padding() {
    let inner = tcp6(1, &[1, 2, 3], false);
    let mut buf = vec![0; VXLAN_HEADROOM + inner.len() + 10];
    buf[VXLAN_HEADROOM..VXLAN_HEADROOM + inner.len()].copy_from_slice(&inner);
    Vxlan {
        vni: 1,
        local_mac: THEIRS,
    }
    .write_header(&mut buf[..VXLAN_HEADROOM], OURS, 6);
    assert_eq!(&buf[20..22], &[0x86, 0xdd]);
    let r = vx().decap(&buf).expect("decap");
    assert_eq!(r.len(), inner.len(), "trailing padding trimmed");
}

#[test]
fn vxlan_decap_rejects_by_reason() {
    let inner = udp4([10, 244, 1, 2], [10, 244, 2, 3], 64, &[7; 50]);
    let mut buf = vec![0; VXLAN_HEADROOM + inner.len()];
    buf[VXLAN_HEADROOM..].copy_from_slice(&inner);
    Vxlan {
        vni: 2,
        local_mac: THEIRS,
    }
    .write_header(&mut buf[..VXLAN_HEADROOM], OURS, 4);
    assert_eq!(vx().decap(&buf), Err(DropReason::BadVni));
    Vxlan {
        vni: 1,
        local_mac: THEIRS,
    }
    .write_header(&mut buf[..VXLAN_HEADROOM], THEIRS, 4);
    assert_eq!(vx().decap(&buf), Err(DropReason::WrongDstMac));
    Vxlan {
        vni: 1,
        local_mac: THEIRS,
    }
    .write_header(&mut buf[..VXLAN_HEADROOM], OURS, 4);
    assert!(vx().decap(&buf).is_ok());
    let mut noi = buf.clone();
    noi[0] = 0;
    assert_eq!(vx().decap(&noi), Err(DropReason::Malformed));
    let mut arp = buf.clone();
    arp[20..22].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(vx().decap(&arp), Err(DropReason::Malformed));
    for len in 0..buf.len() - 1 {
        assert!(vx().decap(&buf[..len]).is_err(), "truncated to {len}");
    }
}

#[test]
fn flannel_udp_decrements_ttl_both_ways() {
    let mut p = udp4([10, 244, 1, 2], [10, 244, 2, 3], 64, &[1; 10]);
    FlannelUdp::prepare_inner(&mut p).expect("send");
    assert_eq!(p[8], 63);
    let r = FlannelUdp::decap(&mut p).expect("recv");
    assert_eq!(p[8], 62);
    assert_eq!(r, 0..p.len());
    assert_eq!(
        checksum::sum(&p[..20]),
        0xffff,
        "header checksum still valid"
    );
    let mut one = udp4([10, 244, 1, 2], [10, 244, 2, 3], 1, &[1; 10]);
    assert_eq!(FlannelUdp::decap(&mut one), Err(DropReason::TtlExpired));
    assert_eq!(
        FlannelUdp::prepare_inner(&mut one),
        Err(DropReason::TtlExpired)
    );
    assert_eq!(
        FlannelUdp::decap(&mut [0x45; 19]),
        Err(DropReason::Malformed)
    );
    let mut v6 = tcp6(1, &[1], false);
    assert_eq!(FlannelUdp::decap(&mut v6), Err(DropReason::Malformed));
}

#[test]
fn decap_never_panics_on_junk() {
    let c = [Codec::FlannelUdp, Codec::Vxlan(vx())];
    let mut x = 7u32;
    for _ in 0..5000 {
        let len = (x % 120) as usize;
        let mut junk = payload(len, x);
        if len > 0 && x.is_multiple_of(3) {
            junk[0] = 0x45;
        }
        if len > 8 && x.is_multiple_of(5) {
            junk[0] = 0x08;
        }
        for codec in &c {
            let mut j = junk.clone();
            if let Ok(r) = codec.decap(&mut j) {
                assert!(r.end <= j.len());
            }
            let _ = codec.prepare_inner(&mut j);
        }
        x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
    }
}

#[test]
fn icmp_net_unreachable_like_flannel() {
    let off = udp4([10, 244, 1, 2], [10, 99, 0, 1], 64, &[9; 40]);
    let mut out = [0u8; 128];
    let n = ipv4::build_net_unreachable("10.244.1.0".parse().expect("ip"), &off, &mut out)
        .expect("icmp");
    let s = etherparse::SlicedPacket::from_ip(&out[..n]).expect("parse");
    let Some(etherparse::NetSlice::Ipv4(ip)) = s.net else {
        panic!("not v4")
    };
    let h = ip.header().to_header();
    assert_eq!(h.source, [10, 244, 1, 0]);
    assert_eq!(h.destination, [10, 244, 1, 2]);
    assert_eq!(h.time_to_live, 8);
    assert_eq!(h.calc_header_checksum(), h.header_checksum);
    assert_eq!(&out[20..22], &[3, 0]);
    assert_eq!(checksum::sum(&out[20..n]), 0xffff, "icmp checksum");
    assert_eq!(&out[28..n], &off[..28], "quotes header + 8 bytes");
    // Not for ICMP offenders, nor for non-first fragments.
    let mut icmp = off.clone();
    icmp[9] = 1;
    assert!(
        ipv4::build_net_unreachable("10.244.1.0".parse().expect("ip"), &icmp, &mut [0u8; 128])
            .is_none()
    );
    let mut frag = off.clone();
    frag[7] = 10;
    assert!(
        ipv4::build_net_unreachable("10.244.1.0".parse().expect("ip"), &frag, &mut [0u8; 128])
            .is_none()
    );
}
