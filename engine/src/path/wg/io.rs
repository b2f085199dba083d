//! What the WireGuard core and its caller exchange: the time ([`Now`]),
//! what a round shares ([`Round`]), how a train arrived ([`Train`]), the
//! caller's side ([`Out`], [`Io`]) and what became of a TUN read
//! ([`TunTx`]) or a datagram ([`Rx`]).

use std::net::SocketAddr;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use crate::antispoof::AntiSpoofing;
use crate::encap::DropReason;
use crate::peers::{Entry, PeerTable};

/// The time, read once per round by the caller.
#[derive(Debug, Clone, Copy)]
pub struct Now {
    /// Monotonic: timers, rate limits, cookies.
    pub mono: Instant,
    /// Wall clock: the handshake times published to `weft status`.
    pub wall: SystemTime,
}

impl Now {
    /// The clocks now (callers outside the core only).
    pub fn read() -> Now {
        Now {
            mono: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    pub(super) fn unix_ms(&self) -> u64 {
        self.wall
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
}

/// What every call of a worker's round shares.
#[derive(Debug, Clone, Copy)]
pub struct Round<'t> {
    /// The peer table of the round.
    pub table: &'t PeerTable,
    /// The anti-spoofing mode (AllowedIPs are checked unless `Off`).
    pub mode: AntiSpoofing,
    /// The TUN carries virtio-net headers: reads start with one, and a
    /// decrypted TCP packet's checksum is marked trusted
    /// ([`super::seg::trust_tcp_checksum`]).
    pub vnet_hdr: bool,
    /// The time.
    pub now: Now,
}

/// How a received train of datagrams arrived: from `src`, `stride` bytes
/// each (the last may be shorter), and for an initiation handed over by
/// its gate worker, the peer id that gate found (`vouched`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Train {
    /// The source of every datagram.
    pub src: SocketAddr,
    /// The datagrams' size.
    pub stride: usize,
    /// The initiator's peer id a gate found.
    pub vouched: Option<u32>,
}

/// Where the core writes datagrams: the worker's transmit queue (tests and
/// benches: a plain buffer). Datagrams are pushed in the order they lie in
/// the room.
pub trait Out {
    /// At least `len` free bytes, contiguous, for at most `datagrams`
    /// datagrams (the caller sends what it holds first if it must).
    fn room(&mut self, len: usize, datagrams: usize) -> &mut [u8];
    /// The next `len` bytes of the room leave for `to`.
    fn push(&mut self, to: SocketAddr, len: usize);
}

/// The caller's side of [`super::Core::datagram`] and [`super::Core::train`]: besides
/// [`Out`], room for decrypted packets, and what became of each datagram.
pub trait Io: Out {
    /// At least `len` free bytes for one decrypted packet.
    fn plain(&mut self, len: usize) -> &mut [u8];
    /// The first `len` bytes of the last `plain` room are a packet from
    /// the outer source `src` for the TUN, counted on `from`.
    fn deliver(&mut self, len: usize, from: Option<&Entry>, src: SocketAddr);
    /// The datagrams `d` go to worker `to` ([`Rx::HandOff`]).
    fn hand_off(&mut self, to: usize, d: &[u8], how: Train);
    /// A datagram was consumed, and `sent` packets that waited for its
    /// handshake went out ([`Rx::Done`]).
    fn answered(&mut self, sent: u64);
    /// A datagram was dropped for `reason`.
    fn dropped(&mut self, reason: DropReason);
}

/// What became of a TUN read.
#[derive(Debug, Clone, Copy)]
pub enum TunTx<'t> {
    /// Another worker owns the peer: hand the whole read to it.
    HandOff(usize),
    /// Encrypted and pushed (or queued while the session's handshake runs):
    /// `packets` inner packets of `bytes` bytes to count on `entry`.
    Sent {
        /// The entry counting them.
        entry: &'t Entry,
        /// Inner packets encrypted (0 while queued).
        packets: u64,
        /// Their bytes.
        bytes: u64,
        /// A super-packet was cut (count `GsoSuperPackets`).
        cut: bool,
    },
}

/// What became of a received datagram.
#[derive(Debug, Clone, Copy)]
pub enum Rx<'t> {
    /// The last [`Io::plain`] room's first `len` bytes are a decrypted IP
    /// packet from the peer's AllowedIPs: deliver it (and count it on `from`).
    Deliver {
        /// Its length.
        len: usize,
        /// The entry counting it.
        from: Option<&'t Entry>,
    },
    /// Another worker handles it: pass it on with `vouched` (an initiation
    /// whose peer a gate has already found).
    HandOff {
        /// The worker.
        to: usize,
        /// The peer id of a checked initiation.
        vouched: Option<u32>,
    },
    /// Consumed (a handshake, a keepalive, a cookie); answers went to the
    /// [`Out`], `sent` of them data packets that had waited for the session.
    Done {
        /// Queued data packets sent (count them as transmitted).
        sent: u64,
    },
    /// Dropped for this reason (a cookie reply may have gone to the source).
    Drop(DropReason),
}
