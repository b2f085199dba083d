//! Packet builders shared by the unit tests (etherparse does the reference encoding).

use etherparse::PacketBuilder;

/// TCP timestamp option (NOP, NOP, TS) as Linux sends it.
pub const TS_OPTS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];

/// An IPv4 TCP packet with ACK (+PSH when `psh`) and timestamp options.
pub fn tcp4(src: [u8; 4], dst: [u8; 4], seq: u32, payload: &[u8], psh: bool) -> Vec<u8> {
    let b = PacketBuilder::ipv4(src, dst, 64)
        .tcp(40000, 5201, seq, 502)
        .ack(77)
        .options_raw(&TS_OPTS);
    let b = match b {
        Ok(b) => b,
        Err(e) => panic!("options: {e:?}"),
    };
    let b = if psh { b.psh() } else { b };
    let mut out = Vec::new();
    b.write(&mut out, payload).expect("build");
    out
}

/// An IPv6 TCP packet with ACK and timestamp options.
pub fn tcp6(seq: u32, payload: &[u8], psh: bool) -> Vec<u8> {
    let src = [0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let dst = [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let b = PacketBuilder::ipv6(src, dst, 64)
        .tcp(40000, 5201, seq, 502)
        .ack(77)
        .options_raw(&TS_OPTS);
    let b = match b {
        Ok(b) => b,
        Err(e) => panic!("options: {e:?}"),
    };
    let b = if psh { b.psh() } else { b };
    let mut out = Vec::new();
    b.write(&mut out, payload).expect("build");
    out
}

/// An IPv4 UDP packet.
pub fn udp4(src: [u8; 4], dst: [u8; 4], ttl: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv4(src, dst, ttl)
        .udp(1234, 5678)
        .write(&mut out, payload)
        .expect("build");
    out
}

/// Deterministic pseudo-random payload.
pub fn payload(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x & 0xff) as u8
        })
        .collect()
}

/// Asserts `pkt` is a valid TCP/IP packet (both checksums) and returns (seq, flags, payload).
pub fn check_tcp(pkt: &[u8]) -> (u32, u8, Vec<u8>) {
    let s = etherparse::SlicedPacket::from_ip(pkt).expect("parse");
    let Some(etherparse::TransportSlice::Tcp(t)) = s.transport else {
        panic!("not tcp")
    };
    match s.net {
        Some(etherparse::NetSlice::Ipv4(ip)) => {
            let h = ip.header().to_header();
            assert_eq!(
                h.calc_header_checksum(),
                h.header_checksum,
                "ipv4 header checksum"
            );
            let c = t.calc_checksum_ipv4(h.source, h.destination).expect("csum");
            assert_eq!(c, t.checksum(), "tcp checksum");
        }
        Some(etherparse::NetSlice::Ipv6(ip)) => {
            let h = ip.header().to_header();
            let c = t.calc_checksum_ipv6(h.source, h.destination).expect("csum");
            assert_eq!(c, t.checksum(), "tcp checksum");
        }
        _ => panic!("not ip"),
    }
    (
        t.sequence_number(),
        pkt_flags(t.slice()),
        t.payload().to_vec(),
    )
}

fn pkt_flags(tcp: &[u8]) -> u8 {
    tcp[13]
}
