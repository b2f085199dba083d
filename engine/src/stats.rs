//! Counters: one cache-line-aligned block per worker, written only by that
//! worker (plain relaxed stores once per loop iteration, no read-modify-write
//! on shared memory), summed on read by [`crate::Engine::stats`] and
//! [`crate::Engine::report`].
//!
//! Every counter is defined once, in the table at [`counters!`]'s call
//! below: its slot ([`Ctr`], what workers write), its field in [`Stats`],
//! [`Batching`] or [`Drops`] (what readers get), and for the last two its
//! name and help text ([`Counter`], iterated with [`CounterSet`]; the names
//! are the keys of `weft status --json` and the `reason` label of
//! `weft_drops_total`, the help texts those of `/metrics`). Readers iterate
//! the sets instead of naming their fields.
//!
//! Shape of [`Stats`] (what the daemon exports):
//! `tx_packets/tx_bytes` = inner packets/bytes encapsulated and handed to UDP,
//! `rx_packets/rx_bytes` = inner packets/bytes decapsulated and written to TUN,
//! plus syscall and offload counters ([`Batching`]) and one drop counter per
//! [`DropReason`] ([`Drops`]).
//!
//! Per-peer counters ([`PeerStats`], read with [`crate::Engine::report`])
//! live in each peer-table entry: one cache-line slot per worker, written
//! only by that worker (a relaxed load and store, no read-modify-write, no
//! allocation) and summed on read. The slots move to the next table for an
//! unchanged subnet, so counters survive peer-table swaps. They also count
//! the packets anti-spoofing let in from an unexpected outer source
//! ([`crate::antispoof`]) and keep the last such source.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use ipnet::IpNet;

use crate::OffloadState;

/// What one counter of a [`CounterSet`] counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counter {
    /// Its name: the key in `weft status --json`; for a drop reason also the
    /// `reason` label of `weft_drops_total`.
    pub name: &'static str,
    /// Its Prometheus family (without the `weft_` prefix and `_total`
    /// suffix); for drop reasons `drops`.
    pub metric: &'static str,
    /// What it counts, one line without a final period (also its HELP text
    /// in `/metrics`).
    pub help: &'static str,
}

/// A group of counters that readers iterate instead of naming each field.
pub trait CounterSet: Copy + Default {
    /// Every counter of the set, in table order.
    const COUNTERS: &'static [Counter];
    /// The values, in the order of [`Self::COUNTERS`].
    fn values(&self) -> impl Iterator<Item = u64>;
    /// Sets the counter named `name`; `false` when the set has none.
    fn set(&mut self, name: &str, value: u64) -> bool;
    /// `(counter, value)` pairs in table order.
    fn iter(&self) -> impl Iterator<Item = (&'static Counter, u64)> {
        Self::COUNTERS.iter().zip(self.values())
    }
}

/// `impl CounterSet for $set`: its fields, each with its Prometheus family
/// and help text.
macro_rules! counter_set {
    ($set:ident { $( $name:ident / $metric:literal => $help:literal ),* }) => {
        impl CounterSet for $set {
            const COUNTERS: &'static [Counter] = &[$(
                Counter { name: stringify!($name), metric: $metric, help: $help },
            )*];
            fn values(&self) -> impl Iterator<Item = u64> {
                [$( self.$name ),*].into_iter()
            }
            fn set(&mut self, name: &str, value: u64) -> bool {
                match name {
                    $( stringify!($name) => self.$name = value, )*
                    _ => return false,
                }
                true
            }
        }
    };
}

/// Generates, from one table, the slot enum [`Ctr`], the structs [`Stats`],
/// [`Batching`] and [`Drops`], the enum [`DropReason`] and the sets'
/// [`Counter`]s; the help text is also each item's doc comment.
macro_rules! counters {
    (
        stats { $( $s_var:ident $s_name:ident = $s_help:literal; )* }
        batching { $( $b_var:ident $b_name:ident / $b_metric:literal = $b_help:literal; )* }
        drops { $( $d_var:ident $d_name:ident = $d_help:literal; )* }
    ) => {
        /// Counter slots of a worker's block.
        #[derive(Debug, Clone, Copy)]
        #[repr(usize)]
        pub(crate) enum Ctr {
            $( #[doc = $s_help] $s_var, )*
            $( #[doc = $b_help] $b_var, )*
            $( #[doc = $d_help] $d_var, )*
            /// Set to 1 by workers that keep per-peer counters.
            PeerCounting,
        }

        /// Engine counters, summed over workers.
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Stats {
            $( #[doc = $s_help] pub $s_name: u64, )*
            /// Syscall and offload counters.
            pub batching: Batching,
            /// Drops by reason.
            pub drops: Drops,
        }

        /// Syscall and offload counters of an engine (packets per call =
        /// batch size).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Batching {
            $( #[doc = $b_help] pub $b_name: u64, )*
        }

        /// Why a packet was dropped. Each reason has its own counter in [`Drops`].
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DropReason {
            $( #[doc = $d_help] $d_var, )*
        }

        /// Drop counters by reason (packets).
        #[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
        pub struct Drops {
            $( #[doc = $d_help] pub $d_name: u64, )*
        }

        counter_set!(Batching { $( $b_name / $b_metric => $b_help ),* });
        counter_set!(Drops { $( $d_name / "drops" => $d_help ),* });

        impl DropReason {
            /// Every reason, in table order.
            pub const ALL: &'static [DropReason] = &[$( DropReason::$d_var ),*];

            /// The reason's name and help text.
            pub fn counter(self) -> &'static Counter {
                &<Drops as CounterSet>::COUNTERS[self as usize]
            }

            /// The reason's count in `drops`.
            pub fn count(self, drops: &Drops) -> u64 {
                match self {
                    $( DropReason::$d_var => drops.$d_name, )*
                }
            }
        }

        impl From<DropReason> for Ctr {
            #[inline]
            fn from(r: DropReason) -> Self {
                match r {
                    $( DropReason::$d_var => Ctr::$d_var, )*
                }
            }
        }

        impl Stats {
            pub(crate) fn sum<'a>(blocks: impl IntoIterator<Item = &'a Shared>) -> Stats {
                let mut t = [0u64; N];
                for b in blocks {
                    for (d, s) in t.iter_mut().zip(b.0.iter()) {
                        *d += s.load(Ordering::Relaxed);
                    }
                }
                Stats {
                    $( $s_name: t[Ctr::$s_var as usize], )*
                    batching: Batching { $( $b_name: t[Ctr::$b_var as usize], )* },
                    drops: Drops { $( $d_name: t[Ctr::$d_var as usize], )* },
                }
            }
        }
    };
}

counters! {
    stats {
        TxPackets tx_packets = "Inner packets sent to peers (after segmentation)";
        TxBytes tx_bytes = "Inner bytes sent to peers";
        RxPackets rx_packets = "Inner packets written to the TUN (before coalescing)";
        RxBytes rx_bytes = "Inner bytes written to the TUN";
        UnexpectedSource unexpected_source = "Packets delivered although their outer source is no \
            peer's published address (anti-spoofing subnet: the inner source lies in a peer's \
            subnet)";
    }
    batching {
        UdpSends udp_sends / "udp_send_calls" = "sendmmsg calls (tx packets per call = batch size)";
        UdpRecvs udp_recvs / "udp_recv_calls" = "recvmmsg calls that returned data";
        TunReads tun_reads / "tun_reads" = "TUN reads that returned a packet or super-packet";
        TunWrites tun_writes / "tun_writes" = "TUN writes (after GRO)";
        GsoSuperPackets gso_super_packets / "gso_super_packets" = "TUN super-packets segmented in \
            userspace (GSO)";
        GroCoalesced gro_coalesced / "gro_coalesced" = "Received segments merged into a previous \
            one (userspace GRO)";
        Handoffs handoffs / "handoffs" = "Packets passed to another worker (WireGuard: the peer's \
            owner)";
        IcmpSent icmp_sent / "icmp_sent" = "ICMP net-unreachable messages written to the TUN \
            (flannel-UDP)";
        Sleeps sleeps / "worker_sleeps" = "Times a worker slept in poll for its next packet (each \
            ends in a wake-up, or the idle timeout)";
        PollRounds poll_rounds / "poll_rounds" = "Empty rounds a worker polled on instead of \
            sleeping (the poll-on window)";
        PollBackoffs poll_backoffs / "poll_backoffs" = "Times a worker lost its CPU while polling \
            and stopped polling for the backoff (100 ms)";
    }
    drops {
        Malformed malformed = "Not a well-formed IP / Ethernet / VXLAN packet (too short, bad \
            lengths, wrong version)";
        BadVni bad_vni = "A VXLAN header carrying a VNI other than ours";
        WrongDstMac wrong_dst_mac = "VXLAN: the inner Ethernet destination is not our VTEP MAC";
        UnknownPeer unknown_peer = "Anti-spoofing: the outer source address is not a known peer";
        SpoofedSource spoofed_source = "Anti-spoofing: the inner source address is outside the \
            sending peer's subnet";
        NoRoute no_route = "No peer subnet contains the destination";
        TtlExpired ttl_expired = "flannel-UDP: the TTL reached zero";
        Mtu mtu = "The packet cannot be carried at this size";
        DecryptFailure decrypt_failure = "WireGuard: a handshake MAC or a data packet's AEAD tag \
            did not verify (forged, corrupted, or encrypted for another key)";
        UnknownKey unknown_key = "WireGuard: a handshake from a static key that is not a peer, or \
            a packet for a receiver index no peer owns";
        Replay replay = "WireGuard: a data packet whose counter was already seen or is too old";
        Handshake handshake = "WireGuard: no session yet / handshake state does not fit (a stray \
            or expired message), or a handshake refused (rate limit, old timestamp)";
        RateLimited rate_limited = "WireGuard: a handshake with a valid cookie over its source's \
            rate while under load (a token bucket per source address: 20/s, burst 5)";
        Expired expired = "WireGuard: a data packet of a session past its message limit \
            (REJECT_AFTER_MESSAGES) or its age limit (REJECT_AFTER_TIME)";
        Backlog backlog = "The cross-worker handoff had no free buffer";
        UdpSendError udp_send_error = "Datagrams (or GSO trains) that sendmmsg failed to send";
        TunWriteError tun_write_error = "TUN writes that failed";
        IoError io_error = "Other I/O errors (TUN reads, UDP receives, socket options)";
    }
}

const N: usize = Ctr::PeerCounting as usize + 1;

/// The published block of one worker.
#[repr(align(128))]
#[derive(Debug)]
pub(crate) struct Shared([AtomicU64; N]);

impl Default for Shared {
    fn default() -> Self {
        Shared(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

/// A worker's private running counters.
#[derive(Debug)]
pub(crate) struct Local([u64; N]);

impl Default for Local {
    fn default() -> Self {
        Local([0; N])
    }
}

impl Local {
    #[inline]
    pub(crate) fn add(&mut self, c: Ctr, n: u64) {
        self.0[c as usize] += n;
    }
    #[inline]
    pub(crate) fn drop(&mut self, r: DropReason, n: u64) {
        self.add(Ctr::from(r), n);
    }
    #[cfg(test)]
    pub(crate) fn get(&self, c: Ctr) -> u64 {
        self.0[c as usize]
    }
    /// Publishes the totals (single writer: plain stores are enough).
    pub(crate) fn publish(&self, to: &Shared) {
        for (d, s) in to.0.iter().zip(self.0.iter()) {
            d.store(*s, Ordering::Relaxed);
        }
    }
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
    /// WireGuard: when we last sent the peer a handshake initiation (see
    /// [`crate::wg::BORINGTUN_TAI64_AHEAD`]).
    pub last_initiation: Option<std::time::SystemTime>,
    /// WireGuard: when an authenticated packet (data, keepalive or
    /// handshake) last came from the peer (published on the owner's 250 ms
    /// tick).
    pub last_heard: Option<std::time::SystemTime>,
    /// WireGuard: when a data packet (not a keepalive) last went to it.
    pub last_sent: Option<std::time::SystemTime>,
    /// WireGuard: where its owner worker sends now: the configured
    /// endpoint or where WireGuard roamed it (`None`: not yet ticked, IPv6).
    pub current: Option<std::net::SocketAddr>,
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
            last_initiation: None,
            last_heard: None,
            last_sent: None,
            current: None,
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

/// Everything an engine counts, read at once by [`crate::Engine::report`]:
/// the totals, the offloads, and every entry of the current peer table
/// with its own counters (one pass over one table snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// Counters summed over workers.
    pub stats: Stats,
    /// Active offloads.
    pub offloads: OffloadState,
    /// The peer table's entries, in table order.
    pub peers: Vec<PeerReport>,
}

/// One peer-table entry and its counters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerReport {
    /// The subnet behind the peer.
    pub subnet: IpNet,
    /// Where its packets go.
    pub endpoint: SocketAddr,
    /// Its counters; `None` while no worker keeps per-peer counters.
    pub stats: Option<PeerStats>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_drop_reason_counts_into_its_own_field() {
        for (i, &r) in DropReason::ALL.iter().enumerate() {
            let n = i as u64 + 1;
            let mut l = Local::default();
            l.drop(r, n);
            let shared = Shared::default();
            l.publish(&shared);
            let s = Stats::sum([&shared]);
            assert_eq!(r.count(&s.drops), n, "{r:?}");
            assert_eq!(
                s.drops.values().sum::<u64>(),
                n,
                "{r:?} counted elsewhere too"
            );
            assert_eq!(r.counter(), &Drops::COUNTERS[i]);
            assert_eq!(s.batching, Batching::default());
        }
        assert_eq!(DropReason::ALL.len(), Drops::COUNTERS.len());
    }

    #[test]
    fn counter_names_are_unique_and_settable_by_name() {
        let mut seen = std::collections::HashSet::new();
        for c in Batching::COUNTERS.iter().chain(Drops::COUNTERS) {
            assert!(seen.insert(c.name), "{} twice", c.name);
            assert!(
                c.name.bytes().all(|b| b.is_ascii_lowercase() || b == b'_'),
                "{}",
                c.name
            );
            assert!(!c.help.is_empty() && !c.metric.is_empty(), "{}", c.name);
        }
        let mut d = Drops::default();
        assert!(d.set("wrong_dst_mac", 3) && d.set("decrypt_failure", 4));
        assert!(!d.set("bad_mac", 1), "the old, ambiguous name is gone");
        assert_eq!((d.wrong_dst_mac, d.decrypt_failure), (3, 4));
        let names: Vec<_> = d
            .iter()
            .filter(|(_, n)| *n > 0)
            .map(|(c, _)| c.name)
            .collect();
        assert_eq!(names, ["wrong_dst_mac", "decrypt_failure"]);
        let mut b = Batching::default();
        assert!(b.set("udp_sends", 2));
        assert_eq!(
            b.iter().next().map(|(c, n)| (c.metric, n)),
            Some(("udp_send_calls", 2))
        );
    }

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
