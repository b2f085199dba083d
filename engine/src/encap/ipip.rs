//! Userspace IPIP (IPv4-in-IPv4, IP protocol 4, RFC 2003) on a raw
//! `IPPROTO_IPIP` socket, on the wire exactly like the Linux `ipip` device
//! flannel's ipip backend creates (`flannel.ipip`, local = the node's
//! interface address, remote any, `ttl inherit`, `tos 0`, no pmtudisc):
//! outer source = our bound address, outer destination = the peer's
//! PublicIP, nothing between the outer and the inner IPv4 header.
//!
//! # Outer header (what the kernel's `ip_tunnel_xmit` would write)
//!
//! [`outer_params`] derives, once per TUN packet: **TTL** = the inner TTL
//! (`ttl inherit`), **TOS** = DSCP 0 with the inner ECN bits copied (CE sent
//! as ECT(0), RFC 6040 normal mode, `INET_ECN_encapsulate`), **DF** = the
//! inner DF bit. The raw socket writes TTL and TOS per message (`IP_TTL`,
//! `IP_TOS` control messages) and DF per socket mode (see `sys::raw`); the
//! kernel never fragments an outer packet locally: an inner packet that would
//! make the outer one larger than the egress MTU is refused (`EMSGSIZE`,
//! counted as `mtu`). The TUN MTU is the underlay MTU − 20, so this only
//! happens when the underlay MTU shrinks under a running engine.
//!
//! # Receive
//!
//! A raw IPIP socket gets every IPIP packet addressed to its bound address,
//! whoever sent it, starting at the outer header. [`decap`] validates the
//! outer header (IPv4, protocol 4, lengths, not a fragment: the kernel has
//! reassembled) and the inner IPv4 header, applies RFC 6040 ECN decapsulation
//! (outer CE marks an ECN-capable inner packet CE; CE over a not-ECT inner
//! packet is dropped, as the kernel does), and returns the inner packet's
//! range. The worker then checks the sources as [`crate::antispoof`] says:
//! in strict mode the outer source must be a peer (`unknown_peer`) and the
//! inner source must lie in that peer's subnet (`spoofed_source`).
//!
//! # Workers
//!
//! Raw sockets are not load-balanced: each of `N` workers' sockets would get
//! a copy of every packet. Each socket therefore carries a classic BPF
//! filter, [`steering_filter`], that keeps a packet only when a hash of its
//! inner addresses (and TCP/UDP ports) modulo `N` is the worker's index
//! ([`steering_hash`] is the same function in Rust), so every packet is
//! handled once and a flow always by the same worker (per-flow order).

use std::net::Ipv4Addr;
use std::ops::Range;

use crate::encap::DropReason;
use crate::wire::ipv4;

/// The IP protocol number of IPv4-in-IPv4.
pub const PROTO_IPIP: u8 = 4;
/// Bytes the outer header adds (no options): the TUN MTU is the underlay MTU minus this.
pub const OVERHEAD: usize = ipv4::HEADER_LEN;

const ECN_MASK: u8 = 0x03;
const ECN_ECT0: u8 = 0x02;
const ECN_CE: u8 = 0x03;

/// The outer header fields the sender chooses for one inner packet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OuterParams {
    /// Outer TTL (the inner one, at least 1).
    pub ttl: u8,
    /// Outer TOS: DSCP 0, ECN from the inner packet (CE becomes ECT(0)).
    pub tos: u8,
    /// Outer DF: copied from the inner packet.
    pub df: bool,
}

/// The outer header fields for the inner IPv4 packet `inner` (`None` if it is
/// not at least an IPv4 header).
pub fn outer_params(inner: &[u8]) -> Option<OuterParams> {
    if inner.len() < ipv4::HEADER_LEN || inner[0] >> 4 != 4 {
        return None;
    }
    let p = ipv4::Packet::new_unchecked(inner);
    let ecn = p.tos() & ECN_MASK;
    Some(OuterParams {
        ttl: p.ttl().max(1),
        tos: if ecn == ECN_CE { ECN_ECT0 } else { ecn },
        df: p.dont_frag(),
    })
}

/// The outer source address of a received packet (`None` if shorter than an IPv4 header).
pub fn outer_source(pkt: &[u8]) -> Option<Ipv4Addr> {
    (pkt.len() >= ipv4::HEADER_LEN).then(|| ipv4::Packet::new_unchecked(pkt).src())
}

/// Validates a received packet (outer IPv4 header first) in place, applies
/// ECN decapsulation to the inner header, and returns the inner IPv4
/// packet's range (trimmed to its total length).
pub fn decap(pkt: &mut [u8]) -> Result<Range<usize>, DropReason> {
    if pkt.len() < ipv4::HEADER_LEN || pkt[0] >> 4 != 4 {
        return Err(DropReason::Malformed);
    }
    let outer = ipv4::Packet::new_unchecked(&*pkt);
    let hl = outer.header_len();
    let tl = usize::from(outer.total_len());
    if hl < ipv4::HEADER_LEN
        || tl > pkt.len()
        || tl < hl + ipv4::HEADER_LEN
        || outer.protocol() != PROTO_IPIP
        || outer.more_frags()
        || outer.frag_offset() != 0
    {
        return Err(DropReason::Malformed);
    }
    let outer_ecn = outer.tos() & ECN_MASK;
    let inner = ipv4::Packet::new_checked(&pkt[hl..tl]).map_err(|_| DropReason::Malformed)?;
    let len = usize::from(inner.total_len());
    let inner_ecn = inner.tos() & ECN_MASK;
    if outer_ecn == ECN_CE && inner_ecn != ECN_CE {
        if inner_ecn == 0 {
            return Err(DropReason::Malformed);
        }
        ipv4::Packet::new_unchecked(&mut pkt[hl..tl]).set_ecn_ce();
    }
    Ok(hl..hl + len)
}

/// The worker (out of `workers`) that handles a received packet (outer
/// header first): what [`steering_filter`] computes in the kernel.
pub fn steering_hash(pkt: &[u8], workers: usize) -> usize {
    let n = u32::try_from(workers.max(1)).unwrap_or(1);
    // The filter reads fixed offsets: an outer header without options.
    let Some(inner) = pkt
        .get(ipv4::HEADER_LEN..)
        .filter(|i| i.len() >= ipv4::HEADER_LEN)
    else {
        return 0;
    };
    let p = ipv4::Packet::new_unchecked(inner);
    let mut h = u32::from_be_bytes(p.src_bytes()) ^ u32::from_be_bytes(p.dst_bytes());
    let ihl = p.header_len();
    let l4 = matches!(p.protocol(), ipv4::PROTO_TCP | ipv4::PROTO_UDP) && p.frag_offset() == 0;
    if let Some(ports) = inner.get(ihl..ihl + 4).filter(|_| l4) {
        h ^= u32::from_be_bytes([ports[0], ports[1], ports[2], ports[3]]);
    }
    crate::steer::mix(h, n) as usize
}

/// Length of [`steering_filter`] programs.
pub const FILTER_LEN: usize = 35;

/// A classic BPF socket filter keeping exactly the packets
/// [`steering_hash`] assigns to worker `me` of `workers`.
pub fn steering_filter(me: usize, workers: usize) -> [libc::sock_filter; FILTER_LEN] {
    let n = u32::try_from(workers.max(1)).unwrap_or(1);
    let me = u32::try_from(me).unwrap_or(u32::MAX);
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    let (ld, ldx, alu, jmp, ret) = (
        libc::BPF_LD,
        libc::BPF_LDX,
        libc::BPF_ALU,
        libc::BPF_JMP,
        libc::BPF_RET,
    );
    let (w, h, b) = (libc::BPF_W, libc::BPF_H, libc::BPF_B);
    let tax = op(libc::BPF_MISC | libc::BPF_TAX, 0, 0, 0);
    let txa = op(libc::BPF_MISC | libc::BPF_TXA, 0, 0, 0);
    let xor_x = op(alu | libc::BPF_XOR | libc::BPF_X, 0, 0, 0);
    let accept = u32::MAX;
    // Packets too short for the inner addresses go to worker 0 (which counts them as malformed).
    let short = if me == 0 { accept } else { 0 };
    [
        /* 0 */ op(ld | w | libc::BPF_LEN, 0, 0, 0),
        /* 1 */ op(jmp | libc::BPF_JGE | libc::BPF_K, 1, 0, 40),
        /* 2 */ op(ret | libc::BPF_K, 0, 0, short),
        /* 3 */ op(ld | w | libc::BPF_ABS, 0, 0, 32),
        /* 4 */ tax,
        /* 5 */ op(ld | w | libc::BPF_ABS, 0, 0, 36),
        /* 6 */ xor_x,
        /* 7 */ op(libc::BPF_ST, 0, 0, 0),
        /* 8 */ op(ld | b | libc::BPF_ABS, 0, 0, 29),
        /* 9 */ op(jmp | libc::BPF_JEQ | libc::BPF_K, 1, 0, 6),
        /* 10 */ op(jmp | libc::BPF_JEQ | libc::BPF_K, 0, 14, 17),
        /* 11 */ op(ld | h | libc::BPF_ABS, 0, 0, 26),
        /* 12 */ op(jmp | libc::BPF_JSET | libc::BPF_K, 12, 0, 0x1fff),
        /* 13 */ op(ldx | b | libc::BPF_MSH, 0, 0, 20),
        /* 14 */ txa,
        /* 15 */ op(alu | libc::BPF_ADD | libc::BPF_K, 0, 0, 24),
        /* 16 */ tax,
        /* 17 */ op(ld | w | libc::BPF_LEN, 0, 0, 0),
        /* 18 */ op(jmp | libc::BPF_JGE | libc::BPF_X, 0, 6, 0),
        /* 19 */ op(ldx | b | libc::BPF_MSH, 0, 0, 20),
        /* 20 */ op(ld | w | libc::BPF_IND, 0, 0, 20),
        /* 21 */ tax,
        /* 22 */ op(ld | libc::BPF_MEM, 0, 0, 0),
        /* 23 */ xor_x,
        /* 24 */ op(libc::BPF_ST, 0, 0, 0),
        /* 25 */ op(ld | libc::BPF_MEM, 0, 0, 0),
        /* 26 */ tax,
        /* 27 */ op(alu | libc::BPF_RSH | libc::BPF_K, 0, 0, 16),
        /* 28 */ xor_x,
        /* 29 */
        op(
            alu | libc::BPF_MUL | libc::BPF_K,
            0,
            0,
            crate::steer::GOLDEN,
        ),
        /* 30 */ op(alu | libc::BPF_RSH | libc::BPF_K, 0, 0, 16),
        /* 31 */ op(alu | libc::BPF_MOD | libc::BPF_K, 0, 0, n),
        /* 32 */ op(jmp | libc::BPF_JEQ | libc::BPF_K, 0, 1, me),
        /* 33 */ op(ret | libc::BPF_K, 0, 0, accept),
        /* 34 */ op(ret | libc::BPF_K, 0, 0, 0),
    ]
}

#[cfg(test)]
#[path = "ipip_tests.rs"]
mod tests;
