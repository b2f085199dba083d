//! Counters: one cache-line-aligned block per worker, written only by that
//! worker (plain relaxed stores once per loop iteration, no read-modify-write
//! on shared memory), summed on read by [`crate::Engine::stats`].
//!
//! Shape of [`Stats`] (what the daemon exports):
//! `tx_packets/tx_bytes` = inner packets/bytes encapsulated and handed to UDP,
//! `rx_packets/rx_bytes` = inner packets/bytes decapsulated and written to TUN,
//! plus syscall and offload counters and one drop counter per [`DropReason`].
//!
//! Per-peer counters ([`PeerStats`], read with [`crate::Engine::peer_stats`])
//! live in each peer-table entry: one cache-line slot per worker, written
//! only by that worker (a relaxed load and store, no read-modify-write, no
//! allocation) and summed on read. The slots move to the next table for an
//! unchanged subnet, so counters survive peer-table swaps. They also count
//! the packets anti-spoofing let in from an unexpected outer source
//! ([`crate::antispoof`]) and keep the last such source.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::encap::DropReason;

/// Counter slots.
#[derive(Debug, Clone, Copy)]
#[repr(usize)]
pub(crate) enum Ctr {
    TxPackets,
    TxBytes,
    UdpSends,
    RxPackets,
    RxBytes,
    UdpRecvs,
    TunReads,
    TunWrites,
    GsoSuperPackets,
    GroCoalesced,
    IcmpSent,
    UnexpectedSource,
    Malformed,
    BadVni,
    WrongDstMac,
    UnknownPeer,
    SpoofedSource,
    NoRoute,
    TtlExpired,
    Mtu,
    BadMac,
    UnknownKey,
    Replay,
    Handshake,
    Backlog,
    Handoffs,
    UdpSendErrors,
    TunWriteErrors,
    IoErrors,
    /// Set to 1 by workers that keep per-peer counters.
    PeerCounting,
}

const N: usize = Ctr::PeerCounting as usize + 1;

impl From<DropReason> for Ctr {
    fn from(r: DropReason) -> Self {
        match r {
            DropReason::Malformed => Ctr::Malformed,
            DropReason::BadVni => Ctr::BadVni,
            DropReason::WrongDstMac => Ctr::WrongDstMac,
            DropReason::UnknownPeer => Ctr::UnknownPeer,
            DropReason::SpoofedSource => Ctr::SpoofedSource,
            DropReason::NoRoute => Ctr::NoRoute,
            DropReason::TtlExpired => Ctr::TtlExpired,
            DropReason::Mtu => Ctr::Mtu,
            DropReason::BadMac => Ctr::BadMac,
            DropReason::UnknownKey => Ctr::UnknownKey,
            DropReason::Replay => Ctr::Replay,
            DropReason::Handshake => Ctr::Handshake,
            DropReason::Backlog => Ctr::Backlog,
        }
    }
}

/// The published block of one worker.
#[repr(align(128))]
#[derive(Debug, Default)]
pub(crate) struct Shared([AtomicU64; N]);

/// A worker's private running counters.
#[derive(Debug, Default)]
pub(crate) struct Local([u64; N]);

impl Local {
    #[inline]
    pub(crate) fn add(&mut self, c: Ctr, n: u64) {
        self.0[c as usize] += n;
    }
    #[inline]
    pub(crate) fn drop(&mut self, r: DropReason, n: u64) {
        self.add(Ctr::from(r), n);
    }
    /// Publishes the totals (single writer: plain stores are enough).
    pub(crate) fn publish(&self, to: &Shared) {
        for (d, s) in to.0.iter().zip(self.0.iter()) {
            d.store(*s, Ordering::Relaxed);
        }
    }
}

/// Drop counters by reason (packets).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drops {
    /// Not a valid IP/Ethernet/VXLAN packet, or a truncated one.
    pub malformed: u64,
    /// VXLAN VNI other than ours.
    pub bad_vni: u64,
    /// Inner Ethernet destination is not our VTEP MAC.
    pub wrong_dst_mac: u64,
    /// Anti-spoofing: outer source is not a peer.
    pub unknown_peer: u64,
    /// Anti-spoofing: inner source outside the sending peer's subnet.
    pub spoofed_source: u64,
    /// No peer for the destination.
    pub no_route: u64,
    /// TTL reached zero (flannel-UDP).
    pub ttl_expired: u64,
    /// Too large to carry.
    pub mtu: u64,
    /// WireGuard: MAC / AEAD tag did not verify.
    pub bad_mac: u64,
    /// WireGuard: unknown static key or receiver index.
    pub unknown_key: u64,
    /// WireGuard: replayed or too old counter.
    pub replay: u64,
    /// WireGuard: handshake state mismatch or refused handshake.
    pub handshake: u64,
    /// Cross-worker handoff had no free buffer.
    pub backlog: u64,
    /// `sendmmsg` failures (messages).
    pub udp_send_errors: u64,
    /// TUN write failures.
    pub tun_write_errors: u64,
    /// Other I/O errors (reads, receives).
    pub io_errors: u64,
}

/// Whether any worker of `blocks` keeps per-peer counters.
pub(crate) fn counts_peers<'a>(blocks: impl IntoIterator<Item = &'a Shared>) -> bool {
    blocks
        .into_iter()
        .any(|b| b.0[Ctr::PeerCounting as usize].load(Ordering::Relaxed) > 0)
}

/// Counters of one peer (one subnet of the peer table), summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeerStats {
    /// Inner packets from this peer's subnet that arrived from an outer
    /// source other than its published address (delivered by
    /// [`crate::AntiSpoofing::Subnet`]; see [`crate::antispoof`]).
    pub unexpected_source: u64,
    /// The last such outer source one of the workers saw.
    pub unexpected_from: Option<std::net::IpAddr>,
    /// WireGuard: when the last handshake with the peer completed.
    pub last_handshake: Option<std::time::SystemTime>,
    /// Inner packets sent to the peer.
    pub tx_packets: u64,
    /// Inner bytes sent to the peer.
    pub tx_bytes: u64,
    /// Inner packets received from the peer (after anti-spoofing).
    pub rx_packets: u64,
    /// Inner bytes received from the peer.
    pub rx_bytes: u64,
}

/// One worker's slot: tx packets, tx bytes, rx packets, rx bytes,
/// unexpected-source packets, then the last unexpected outer source behind a
/// sequence number (a single-writer seqlock: [`SEQ`], [`ADDR_HI`], [`ADDR_LO`]).
/// Eight counters: one cache line.
#[repr(align(64))]
#[derive(Debug, Default)]
struct PeerSlot([AtomicU64; 8]);

const UNEXPECTED: usize = 4;
/// Odd while the worker rewrites the address.
const SEQ: usize = 5;
/// The address as an IPv6 address (IPv4 mapped), high and low halves; all zero = none.
const ADDR_HI: usize = 6;
const ADDR_LO: usize = 7;

fn addr_bits(a: std::net::IpAddr) -> u128 {
    match a {
        std::net::IpAddr::V4(v) => u128::from(v.to_ipv6_mapped()),
        std::net::IpAddr::V6(v) => u128::from(v),
    }
}

fn bits_addr(b: u128) -> Option<std::net::IpAddr> {
    (b != 0).then(|| std::net::Ipv6Addr::from(b).to_canonical())
}

/// Per-peer counters, one slot per worker (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct PeerSlots(Box<[PeerSlot]>);

impl PeerSlots {
    /// Zeroed slots for `workers` workers.
    pub(crate) fn new(workers: usize) -> Arc<PeerSlots> {
        Arc::new(PeerSlots(
            (0..workers).map(|_| PeerSlot::default()).collect(),
        ))
    }

    /// Counts for worker `w` (the only writer of its slot).
    #[inline]
    pub(crate) fn add(&self, w: usize, tx: bool, packets: u64, bytes: u64) {
        if let Some(s) = self.0.get(w) {
            let i = if tx { 0 } else { 2 };
            let (p, b) = (&s.0[i], &s.0[i + 1]);
            p.store(p.load(Ordering::Relaxed) + packets, Ordering::Relaxed);
            b.store(b.load(Ordering::Relaxed) + bytes, Ordering::Relaxed);
        }
    }

    /// Counts, for worker `w`, one packet that arrived from outer source
    /// `src` instead of the peer's published address. The address is
    /// rewritten only when it changes.
    #[inline]
    pub(crate) fn unexpected(&self, w: usize, src: std::net::IpAddr) {
        let Some(s) = self.0.get(w) else { return };
        let c = &s.0[UNEXPECTED];
        c.store(c.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        let bits = addr_bits(src);
        let (hi, lo) = ((bits >> 64) as u64, bits as u64);
        if s.0[ADDR_HI].load(Ordering::Relaxed) == hi && s.0[ADDR_LO].load(Ordering::Relaxed) == lo
        {
            return;
        }
        let seq = s.0[SEQ].load(Ordering::Relaxed);
        s.0[SEQ].store(seq.wrapping_add(1), Ordering::Relaxed);
        std::sync::atomic::fence(Ordering::Release);
        s.0[ADDR_HI].store(hi, Ordering::Relaxed);
        s.0[ADDR_LO].store(lo, Ordering::Relaxed);
        s.0[SEQ].store(seq.wrapping_add(2), Ordering::Release);
    }

    /// Whether there are no slots (counters not attached).
    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The sum over workers.
    pub(crate) fn sum(&self) -> PeerStats {
        let mut t = [0u64; 5];
        let mut from = None;
        for s in self.0.iter() {
            for (d, v) in t.iter_mut().zip(s.0.iter()) {
                *d += v.load(Ordering::Relaxed);
            }
            if from.is_none() {
                from = read_addr(s);
            }
        }
        PeerStats {
            unexpected_source: t[UNEXPECTED],
            unexpected_from: from,
            last_handshake: None,
            tx_packets: t[0],
            tx_bytes: t[1],
            rx_packets: t[2],
            rx_bytes: t[3],
        }
    }
}

/// The slot's last unexpected source, if one was stored and not being rewritten.
fn read_addr(s: &PeerSlot) -> Option<std::net::IpAddr> {
    let seq = s.0[SEQ].load(Ordering::Acquire);
    if seq % 2 == 1 {
        return None;
    }
    let hi = s.0[ADDR_HI].load(Ordering::Relaxed);
    let lo = s.0[ADDR_LO].load(Ordering::Relaxed);
    std::sync::atomic::fence(Ordering::Acquire);
    if s.0[SEQ].load(Ordering::Relaxed) != seq {
        return None;
    }
    bits_addr((u128::from(hi) << 64) | u128::from(lo))
}

/// Engine counters, summed over workers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stats {
    /// Inner packets sent to peers (after segmentation).
    pub tx_packets: u64,
    /// Inner bytes sent to peers.
    pub tx_bytes: u64,
    /// `sendmmsg` calls.
    pub udp_sends: u64,
    /// Inner packets written to the TUN (before coalescing).
    pub rx_packets: u64,
    /// Inner bytes written to the TUN.
    pub rx_bytes: u64,
    /// `recvmmsg` calls that returned data.
    pub udp_recvs: u64,
    /// TUN reads that returned a packet.
    pub tun_reads: u64,
    /// TUN writes.
    pub tun_writes: u64,
    /// TUN super-packets segmented in userspace.
    pub gso_super_packets: u64,
    /// Received segments merged into a previous one (userspace GRO).
    pub gro_coalesced: u64,
    /// ICMP net-unreachable messages written to the TUN (flannel-UDP).
    pub icmp_sent: u64,
    /// Packets delivered although their outer source is no peer's published
    /// address (anti-spoofing `subnet`: the inner source lies in a peer's subnet).
    pub unexpected_source: u64,
    /// Packets passed to another worker (WireGuard: the peer's owner).
    pub handoffs: u64,
    /// Drops by reason.
    pub drops: Drops,
}

impl Stats {
    pub(crate) fn sum<'a>(blocks: impl IntoIterator<Item = &'a Shared>) -> Stats {
        let mut t = [0u64; N];
        for b in blocks {
            for (d, s) in t.iter_mut().zip(b.0.iter()) {
                *d += s.load(Ordering::Relaxed);
            }
        }
        let g = |c: Ctr| t[c as usize];
        Stats {
            tx_packets: g(Ctr::TxPackets),
            tx_bytes: g(Ctr::TxBytes),
            udp_sends: g(Ctr::UdpSends),
            rx_packets: g(Ctr::RxPackets),
            rx_bytes: g(Ctr::RxBytes),
            udp_recvs: g(Ctr::UdpRecvs),
            tun_reads: g(Ctr::TunReads),
            tun_writes: g(Ctr::TunWrites),
            gso_super_packets: g(Ctr::GsoSuperPackets),
            gro_coalesced: g(Ctr::GroCoalesced),
            icmp_sent: g(Ctr::IcmpSent),
            unexpected_source: g(Ctr::UnexpectedSource),
            handoffs: g(Ctr::Handoffs),
            drops: Drops {
                malformed: g(Ctr::Malformed),
                bad_vni: g(Ctr::BadVni),
                wrong_dst_mac: g(Ctr::WrongDstMac),
                unknown_peer: g(Ctr::UnknownPeer),
                spoofed_source: g(Ctr::SpoofedSource),
                no_route: g(Ctr::NoRoute),
                ttl_expired: g(Ctr::TtlExpired),
                mtu: g(Ctr::Mtu),
                bad_mac: g(Ctr::BadMac),
                unknown_key: g(Ctr::UnknownKey),
                replay: g(Ctr::Replay),
                handshake: g(Ctr::Handshake),
                backlog: g(Ctr::Backlog),
                udp_send_errors: g(Ctr::UdpSendErrors),
                tun_write_errors: g(Ctr::TunWriteErrors),
                io_errors: g(Ctr::IoErrors),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unexpected_sources_are_counted_per_worker_with_the_last_address() {
        let p = PeerSlots::new(2);
        assert_eq!(p.sum().unexpected_source, 0);
        assert_eq!(p.sum().unexpected_from, None);
        let a: std::net::IpAddr = "192.0.2.2".parse().expect("ip");
        let b: std::net::IpAddr = "2001:db8::2".parse().expect("ip");
        p.unexpected(1, a);
        p.unexpected(1, a);
        p.unexpected(0, b);
        p.unexpected(9, a); // no such worker: ignored
        let s = p.sum();
        assert_eq!(s.unexpected_source, 3);
        // Worker 0's address is read first; an IPv4 source stays IPv4.
        assert_eq!(s.unexpected_from, Some(b));
        let q = PeerSlots::new(1);
        q.unexpected(0, a);
        assert_eq!(q.sum().unexpected_from, Some(a));
        q.unexpected(0, b);
        assert_eq!(q.sum().unexpected_from, Some(b));
        // The rx/tx counters are untouched.
        assert_eq!((s.rx_packets, s.tx_packets), (0, 0));
    }
}
