//! The codec layer, sans-IO, for all four encapsulations: flannel-UDP and
//! VXLAN (here), IPIP ([`ipip`]) and WireGuard's framing ([`wg`]: the
//! receiver index, the owner worker, drop reasons, AllowedIPs; its
//! sessions are [`crate::path::wg`]'s).
//!
//! Contract: no I/O, no clock, no allocation, no logging; headers are read
//! and written through [`crate::wire`] views. Nothing here imports a
//! worker, the builder or a start-up module (`tests/layers.rs` checks).
//! flannel-UDP and VXLAN encapsulation is
//! split in two steps so that userspace GSO can run in between:
//! [`Codec::prepare_inner`] edits the inner packet once (flannel-UDP
//! decrements the TTL), then [`Codec::write_header`] fills the
//! [`Codec::headroom`] bytes in front of each (segmented) inner packet. The
//! outer IP/UDP headers are the kernel's (we send through UDP sockets).
//! [`Codec::decap`] validates an untrusted datagram in place and returns the
//! range of the inner IP packet, or the [`DropReason`] to count.

pub mod ipip;
pub mod key;
pub mod wg;

use std::ops::Range;

pub use crate::stats::DropReason;
use crate::wire::{ethernet, ipv4, ipv6, vxlan};

/// flannel-UDP (flannel's `udp` backend): the UDP payload is exactly one bare
/// IPv4 packet. TTL is decremented on send and on receive; packets shorter than
/// 20 bytes are dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct FlannelUdp;

impl FlannelUdp {
    /// Validates an inner packet read from the TUN and decrements its TTL.
    pub fn prepare_inner(pkt: &mut [u8]) -> Result<(), DropReason> {
        let mut p = ipv4::Packet::new_checked(pkt).map_err(|_| DropReason::Malformed)?;
        if p.decrement_ttl() {
            Ok(())
        } else {
            Err(DropReason::TtlExpired)
        }
    }

    /// Validates a received datagram (a bare IPv4 packet) and decrements its TTL.
    /// Returns the inner packet range (trimmed to the IPv4 total length).
    pub fn decap(dgram: &mut [u8]) -> Result<Range<usize>, DropReason> {
        let mut p = ipv4::Packet::new_checked(&mut *dgram).map_err(|_| DropReason::Malformed)?;
        let len = usize::from(p.total_len());
        if !p.decrement_ttl() {
            return Err(DropReason::TtlExpired);
        }
        Ok(0..len)
    }
}

/// Userspace VXLAN (RFC 7348) the way a Linux `vxlan` device configured by
/// flannel speaks it: 8-byte VXLAN header with the I flag and our VNI, inner
/// Ethernet `dst = peer VtepMAC`, `src = our VtepMAC`, EtherType IPv4/IPv6.
#[derive(Debug, Clone, Copy)]
pub struct Vxlan {
    /// Our VNI (24 bits).
    pub vni: u32,
    /// Our VTEP MAC.
    pub local_mac: [u8; 6],
}

/// Largest UDP payload (IPv4: 65535 - 20 - 8); a GSO train's total, too.
pub const MAX_UDP_PAYLOAD: usize = 65507;

/// VXLAN + inner Ethernet bytes in front of the inner IP packet.
pub const VXLAN_HEADROOM: usize = vxlan::HEADER_LEN + ethernet::HEADER_LEN;

impl Vxlan {
    /// Writes the VXLAN and Ethernet headers into `hdr` (exactly [`VXLAN_HEADROOM`] bytes).
    ///
    /// # Panics
    /// If `hdr` is shorter than [`VXLAN_HEADROOM`].
    pub fn write_header(&self, hdr: &mut [u8], dst_mac: [u8; 6], ip_version: u8) {
        vxlan::Packet::new_unchecked(&mut hdr[..vxlan::HEADER_LEN]).emit(self.vni);
        let ethertype = if ip_version == 6 {
            ethernet::ETHERTYPE_IPV6
        } else {
            ethernet::ETHERTYPE_IPV4
        };
        ethernet::Frame::new_unchecked(&mut hdr[vxlan::HEADER_LEN..VXLAN_HEADROOM]).emit(
            dst_mac,
            self.local_mac,
            ethertype,
        );
    }

    /// Validates a received datagram: I flag, our VNI, inner dst MAC == ours,
    /// IPv4/IPv6 EtherType and a well-formed inner IP header. Returns the inner
    /// IP packet's range (Ethernet padding trimmed).
    pub fn decap(&self, dgram: &[u8]) -> Result<Range<usize>, DropReason> {
        let v = vxlan::Packet::new_checked(dgram).map_err(|_| DropReason::Malformed)?;
        if v.vni() != self.vni {
            return Err(DropReason::BadVni);
        }
        let eth = ethernet::Frame::new_checked(v.payload()).map_err(|_| DropReason::Malformed)?;
        if eth.dst() != self.local_mac {
            return Err(DropReason::WrongDstMac);
        }
        let start = VXLAN_HEADROOM;
        let inner = &dgram[start..];
        let len = match eth.ethertype() {
            ethernet::ETHERTYPE_IPV4 => {
                let p = ipv4::Packet::new_checked(inner).map_err(|_| DropReason::Malformed)?;
                usize::from(p.total_len())
            }
            ethernet::ETHERTYPE_IPV6 => {
                let p = ipv6::Packet::new_checked(inner).map_err(|_| DropReason::Malformed)?;
                ipv6::HEADER_LEN + usize::from(p.payload_len())
            }
            _ => return Err(DropReason::Malformed),
        };
        Ok(start..start + len)
    }
}

/// The encapsulation a worker runs; a closed set, so a plain enum.
#[derive(Debug, Clone, Copy)]
pub enum Codec {
    /// flannel's udp backend.
    FlannelUdp,
    /// VXLAN.
    Vxlan(Vxlan),
}

impl Codec {
    /// Bytes the caller must reserve in front of each inner packet.
    pub const fn headroom(&self) -> usize {
        match self {
            Codec::FlannelUdp => 0,
            Codec::Vxlan(_) => VXLAN_HEADROOM,
        }
    }

    /// Edits the inner packet (once per packet read from the TUN, before segmentation).
    pub fn prepare_inner(&self, pkt: &mut [u8]) -> Result<(), DropReason> {
        match self {
            Codec::FlannelUdp => FlannelUdp::prepare_inner(pkt),
            Codec::Vxlan(_) => match pkt.first().map(|b| b >> 4) {
                Some(4) if pkt.len() >= ipv4::HEADER_LEN => Ok(()),
                Some(6) if pkt.len() >= ipv6::HEADER_LEN => Ok(()),
                _ => Err(DropReason::Malformed),
            },
        }
    }

    /// Fills `hdr` (exactly [`Codec::headroom`] bytes) in front of one inner packet.
    pub fn write_header(&self, hdr: &mut [u8], dst_mac: [u8; 6], ip_version: u8) {
        match self {
            Codec::FlannelUdp => {}
            Codec::Vxlan(v) => v.write_header(hdr, dst_mac, ip_version),
        }
    }

    /// Validates a datagram in place and returns the inner IP packet's range.
    pub fn decap(&self, dgram: &mut [u8]) -> Result<Range<usize>, DropReason> {
        match self {
            Codec::FlannelUdp => FlannelUdp::decap(dgram),
            Codec::Vxlan(v) => v.decap(dgram),
        }
    }
}

#[cfg(test)]
mod tests;
