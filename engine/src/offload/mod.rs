//! Userspace offloads between the TUN's TCP super-packets and MTU-sized wire packets.

pub mod gro;
pub mod gso;
pub mod uso;

use crate::wire::{be16, checksum, ip, ipv4};

/// Pseudo-header sum (addresses, `proto`, `l4_len`) of the IPv4 or IPv6
/// packet whose header starts `pkt` (at least 20 or 40 bytes).
pub(crate) fn pseudo_sum(pkt: &[u8], v6: bool, proto: u8, l4_len: u32) -> u32 {
    let (src, dst) = if v6 {
        (8..24, 24..40)
    } else {
        (12..16, 16..20)
    };
    checksum::pseudo_v4(&pkt[src], &pkt[dst], proto, l4_len)
}

/// Detects a transport checksum left *partial* by a sender that relied on
/// checksum offload (`CHECKSUM_PARTIAL`): the field holds the folded
/// pseudo-header sum instead of the checksum. A Linux sender whose skb never
/// meets hardware (veth underlays, e.g. kind or netns) puts such packets on the
/// wire, and its receivers trust them. Returns `(csum_start, csum_offset)` for
/// a `NEEDS_CSUM` TUN write, so the kernel treats it exactly as its own vxlan
/// receive path would. Costs one pseudo-header sum, no pass over the payload.
pub fn partial_checksum(pkt: &[u8]) -> Option<(usize, usize)> {
    let ip = ip::Packet::new_checked(pkt).ok()?;
    let v6 = ip.version() == 6;
    if !v6 {
        let v4 = ipv4::Packet::new_unchecked(pkt);
        if v4.more_frags() || v4.frag_offset() != 0 {
            return None;
        }
    }
    let (ip_hl, proto) = (ip.header_len(), ip.protocol());
    let off = match proto {
        ipv4::PROTO_TCP => 16,
        ipv4::PROTO_UDP => 6,
        _ => return None,
    };
    if pkt.len() < ip_hl + off + 2 {
        return None;
    }
    let l4_len = u32::try_from(pkt.len() - ip_hl).ok()?;
    let ps = pseudo_sum(pkt, v6, proto, l4_len);
    let field = u32::from(be16(pkt, ip_hl + off));
    (field == ps && field != 0).then_some((ip_hl, off))
}
