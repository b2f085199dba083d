//! Packet builders and fixtures shared by the criterion benches (`benches/`)
//! and the allocation check (`tests/no_alloc.rs`); the WireGuard pair is the
//! engine's own (`weft_engine::path::wg::sim::Pair`): pod addresses
//! 10.244.1.2 -> 10.244.2.3, underlay 192.0.2.1 -> 192.0.2.2. Set-up code
//! only: it allocates and panics on impossible input, never inside a
//! measured loop.

use std::net::IpAddr;

use weft_engine::peers::{Peer, PeerTable};
use weft_engine::wire::vnet::{self, VnetHdr};

/// Packet sizes every per-packet bench and check covers.
pub const SIZES: [usize; 3] = [64, 1400, 8950];
/// Our VTEP MAC.
pub const LOCAL: [u8; 6] = [2, 0, 0, 0, 1, 1];
/// The peer's VTEP MAC.
pub const PEER: [u8; 6] = [2, 0, 0, 0, 2, 1];

/// An IPv4 UDP packet of exactly `size` bytes (at least 28).
pub fn udp_packet(size: usize) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([10, 244, 1, 2], [10, 244, 2, 3], 64)
        .udp(1000, 2000)
        .write(&mut v, &vec![0xab; size.saturating_sub(28)])
        .expect("build");
    v
}

/// An IPv4 TCP packet with `payload` bytes (timestamps option, like Linux).
pub fn tcp_packet(seq: u32, payload: usize) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([10, 244, 1, 2], [10, 244, 2, 3], 64)
        .tcp(40000, 5201, seq, 500)
        .ack(1)
        .options_raw(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2])
        .expect("options")
        .write(&mut v, &vec![0x5a; payload])
        .expect("build");
    v
}

/// `inner` behind an outer IPv4 header (protocol 4, 192.0.2.1 -> 192.0.2.2),
/// as the raw IPIP socket receives it.
pub fn ipip_packet(inner: &[u8]) -> Vec<u8> {
    let mut v = Vec::new();
    etherparse::PacketBuilder::ipv4([192, 0, 2, 1], [192, 0, 2, 2], 63)
        .write(&mut v, etherparse::IpNumber::IPV4, inner)
        .expect("build outer");
    v
}

/// Node 1's peer table (the packets' sender): node 2, 10.244.2.0/24 at
/// 192.0.2.2 with VTEP MAC [`PEER`]; and node 2's: node 1, 10.244.1.0/24 at
/// 192.0.2.1 with [`LOCAL`]. Both are weft nodes that take UDP-tunnel GSO
/// datagrams whole (`tunnel_gso`: the tunnel TAP may send flannel-UDP to them).
pub fn peer_tables() -> (PeerTable, PeerTable) {
    let table = |subnet: &str, endpoint: [u8; 4], mac| {
        let p = Peer {
            subnet: subnet.parse().expect("subnet"),
            endpoint: IpAddr::from(endpoint),
            vtep_mac: Some(mac),
            nat: None,
            wireguard: None,
            tunnel_gso: true,
        };
        PeerTable::new(&[p], 8472)
    };
    (
        table("10.244.2.0/24", [192, 0, 2, 2], PEER),
        table("10.244.1.0/24", [192, 0, 2, 1], LOCAL),
    )
}

/// A TUN read: a virtio-net header (a super-packet of `gso_type` cut at
/// `gso_size`, or `GSO_NONE`), then `pkt`.
pub fn tun_read(gso_type: u8, gso_size: u16, pkt: &[u8]) -> Vec<u8> {
    let hdr = VnetHdr {
        gso_type,
        gso_size,
        ..VnetHdr::default()
    };
    let mut v = hdr.to_bytes().to_vec();
    v.extend_from_slice(pkt);
    v
}

/// A TCP super-packet read of 64 KiB cut at `mss`.
pub fn tcp_super_read(mss: usize) -> Vec<u8> {
    let mss = u16::try_from(mss).expect("mss");
    tun_read(vnet::GSO_TCPV4, mss, &tcp_packet(1, 65535 - 52 - 20))
}

/// A UDP super-packet read of ~64 KiB cut at `size` (USO).
pub fn udp_super_read(size: usize) -> Vec<u8> {
    let size = u16::try_from(size).expect("size");
    tun_read(vnet::GSO_UDP_L4, size, &udp_packet(65000))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_make_what_they_say() {
        for size in SIZES {
            assert_eq!(udp_packet(size).len(), size);
        }
        let t = tcp_packet(7, 100);
        assert_eq!(t.len(), 20 + 32 + 100);
        let outer = ipip_packet(&t);
        assert_eq!((outer.len(), outer[9]), (20 + t.len(), 4));
    }
}
