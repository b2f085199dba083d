//! `struct virtio_net_hdr` (legacy, 10 bytes, native endian on x86) that
//! prefixes every read and write on a TUN queue opened with `IFF_VNET_HDR`.

/// Header length.
pub const HEADER_LEN: usize = 10;
/// `VIRTIO_NET_HDR_F_NEEDS_CSUM`: checksum from `csum_start` is partial.
pub const F_NEEDS_CSUM: u8 = 1;
/// `VIRTIO_NET_HDR_F_DATA_VALID`.
pub const F_DATA_VALID: u8 = 2;
/// `VIRTIO_NET_HDR_GSO_NONE`.
pub const GSO_NONE: u8 = 0;
/// `VIRTIO_NET_HDR_GSO_TCPV4`.
pub const GSO_TCPV4: u8 = 1;
/// `VIRTIO_NET_HDR_GSO_UDP` (UFO, never negotiated).
pub const GSO_UDP: u8 = 3;
/// `VIRTIO_NET_HDR_GSO_TCPV6`.
pub const GSO_TCPV6: u8 = 4;
/// `VIRTIO_NET_HDR_GSO_UDP_L4` (USO).
pub const GSO_UDP_L4: u8 = 5;
/// `VIRTIO_NET_HDR_GSO_ECN` bit.
pub const GSO_ECN: u8 = 0x80;
/// `VIRTIO_NET_HDR_GSO_UDP_TUNNEL_IPV4` (Linux 6.17+): the packet is a UDP
/// tunnel over IPv4; or'd with the inner GSO type.
pub const GSO_UDP_TUNNEL_IPV4: u8 = 0x20;
/// Length of `struct virtio_net_hdr_v1_hash_tunnel` (Linux 6.17+): the
/// legacy 10 bytes, `num_buffers` (2), the hash report (8), then the outer
/// transport header's and the inner network header's offsets (2 + 2).
pub const TUNNEL_HEADER_LEN: usize = 24;

/// Decoded virtio-net header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `F_*` flags.
    pub flags: u8,
    /// `GSO_*` type (possibly with [`GSO_ECN`]).
    pub gso_type: u8,
    /// Length of the headers to replicate per segment.
    pub hdr_len: u16,
    /// Payload bytes per segment.
    pub gso_size: u16,
    /// Where checksumming starts.
    pub csum_start: u16,
    /// Offset of the checksum field from `csum_start`.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Decodes the first 10 bytes of `b` (`None` when shorter).
    pub fn parse(b: &[u8]) -> Option<Self> {
        let b = b.get(..HEADER_LEN)?;
        let le = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Some(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: le(2),
            gso_size: le(4),
            csum_start: le(6),
            csum_offset: le(8),
        })
    }
    /// Splits what a TUN read returned: with `IFF_VNET_HDR` the header and
    /// the packet's offset after it (`None` when shorter), without it an
    /// all-zero header and offset 0.
    pub fn split(read: &[u8], vnet_hdr: bool) -> Option<(Self, usize)> {
        match vnet_hdr {
            true => Some((Self::parse(read)?, HEADER_LEN)),
            false => Some((Self::default(), 0)),
        }
    }

    /// Encodes into the first 10 bytes of `b`.
    ///
    /// # Panics
    /// If `b` is shorter than [`HEADER_LEN`].
    pub fn emit(&self, b: &mut [u8]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }
    /// Encodes the 24-byte tunnel header ([`TUNNEL_HEADER_LEN`]) into the
    /// first bytes of `b`: this header, zero `num_buffers` and hash, then
    /// the outer transport header's and the inner network header's offsets
    /// from the frame's start.
    ///
    /// # Panics
    /// If `b` is shorter than [`TUNNEL_HEADER_LEN`].
    pub fn emit_tunnel(&self, outer_th: u16, inner_nh: u16, b: &mut [u8]) {
        self.emit(b);
        b[HEADER_LEN..20].fill(0);
        b[20..22].copy_from_slice(&outer_th.to_le_bytes());
        b[22..24].copy_from_slice(&inner_nh.to_le_bytes());
    }

    /// The encoded bytes.
    pub fn to_bytes(self) -> [u8; HEADER_LEN] {
        let mut b = [0; HEADER_LEN];
        self.emit(&mut b);
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip() {
        let h = VnetHdr {
            flags: 1,
            gso_type: 4,
            hdr_len: 60,
            gso_size: 1388,
            csum_start: 40,
            csum_offset: 16,
        };
        assert_eq!(VnetHdr::parse(&h.to_bytes()), Some(h));
        // The layout observed from the kernel in /work/shared/crates.md.
        let k = VnetHdr::parse(&[1, 0, 0, 0, 0, 0, 20, 0, 6, 0]);
        assert_eq!(
            k.map(|h| (h.flags, h.csum_start, h.csum_offset)),
            Some((1, 20, 6))
        );
        assert_eq!(VnetHdr::parse(&[0; 9]), None);
        assert_eq!(VnetHdr::split(&[0; 9], true), None);
        assert_eq!(
            VnetHdr::split(&[7; 9], false),
            Some((VnetHdr::default(), 0))
        );
        assert_eq!(VnetHdr::split(&h.to_bytes(), true), Some((h, HEADER_LEN)));
    }
}
