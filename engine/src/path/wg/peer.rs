//! A peer the core owns ([`Owned`]: its `Tunn`, endpoint and published
//! times) and what one `Tunn` call produced, with the borrow of the
//! caller's buffer ended ([`Sealed`], [`Decap`], a read's [`Run`]).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use boringtun::noise::{Tunn, TunnResult};

use super::{Now, Out};
use crate::encap::DropReason;
use crate::encap::wg::{OVERHEAD, classify};
use crate::wire::wg as msg;

/// Peers by id. Ids are small integers the peer table assigns (a packet
/// can only look one up, never add one), so a multiplicative hash is enough;
/// SipHash took 0.5 % of the CPU in a one-stream profile.
pub(super) type ById<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

#[derive(Default)]
pub(super) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.0 = u64::from(x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A peer this core owns.
pub(super) struct Owned {
    pub(super) key: [u8; 32],
    pub(super) psk: Option<[u8; 32]>,
    pub(super) keepalive: u16,
    pub(super) tunn: Box<Tunn>,
    /// The endpoint from the lease (a change resets `endpoint`).
    pub(super) configured: SocketAddr,
    /// Where we send: `configured`, or the source of the last authenticated packet.
    pub(super) endpoint: SocketAddr,
    /// A fresh `Tunn` that has not yet sent its first handshake initiation.
    pub(super) greet: bool,
    /// The table's last-handshake slot for this peer (unix seconds).
    pub(super) handshake: Arc<AtomicU64>,
    /// The table's last-initiation slot for this peer (unix milliseconds).
    pub(super) initiated: Arc<AtomicU64>,
    /// The table's slot for what this worker saw of the peer.
    pub(super) seen: Arc<crate::peers::WgSeen>,
}

impl Owned {
    /// Records when `pkt`, about to be sent to the peer, is a handshake
    /// initiation: the peer remembers its timestamp.
    pub(super) fn note_sent(&self, pkt: &[u8], now: Now) {
        if pkt.len() == msg::INITIATION_LEN && pkt[0] == msg::INITIATION {
            self.initiated
                .store(now.unix_ms().max(1), Ordering::Relaxed);
        }
    }

    /// Sends to the endpoint what `write` makes of up to `room` bytes (an
    /// initiation, a keepalive, a queued packet), if anything; whether it did.
    pub(super) fn send(
        &mut self,
        room: usize,
        now: Now,
        out: &mut impl Out,
        write: for<'b> fn(&mut Tunn, &'b mut [u8]) -> TunnResult<'b>,
    ) -> bool {
        let len = match write(&mut self.tunn, out.room(room, 1)) {
            TunnResult::WriteToNetwork(p) => {
                self.note_sent(p, now);
                p.len()
            }
            _ => return false,
        };
        out.push(self.endpoint, len);
        true
    }
}

/// What one `encapsulate` call produced.
pub(super) enum Sealed {
    Data(usize),
    Initiation(usize),
    Queued,
    Err(DropReason),
}

pub(super) fn seal(peer: &Owned, r: TunnResult<'_>, plain_len: usize, now: Now) -> Sealed {
    match r {
        TunnResult::WriteToNetwork(p) if p.len() == plain_len + OVERHEAD => Sealed::Data(p.len()),
        TunnResult::WriteToNetwork(p) => {
            peer.note_sent(p, now);
            Sealed::Initiation(p.len())
        }
        TunnResult::Err(e) => Sealed::Err(classify(&e)),
        _ => Sealed::Queued,
    }
}

/// What a `decapsulate` call produced, with the borrow of the output ended.
#[derive(Clone, Copy)]
pub(super) enum Decap {
    Tunnel(usize, IpAddr),
    Network(usize),
    Done,
    Err(DropReason),
}

pub(super) fn decap(r: TunnResult<'_>) -> Decap {
    match r {
        TunnResult::Done => Decap::Done,
        TunnResult::Err(e) => Decap::Err(classify(&e)),
        TunnResult::WriteToNetwork(p) => Decap::Network(p.len()),
        TunnResult::WriteToTunnelV4(p, a) => Decap::Tunnel(p.len(), IpAddr::V4(a)),
        TunnResult::WriteToTunnelV6(p, a) => Decap::Tunnel(p.len(), IpAddr::V6(a)),
    }
}

/// The datagrams one TUN read became, back to back in the room: `data`
/// equal-size data messages (the last may be shorter), then the handshake
/// initiation boringtun wrote where its session ended (none before it, or
/// at its limits on the way; what follows waits in its queue).
#[derive(Default)]
pub(super) struct Run {
    pub(super) pos: usize,
    pub(super) data: usize,
    pub(super) stride: usize,
    pub(super) last: usize,
    pub(super) init: usize,
    pub(super) bytes: u64,
    pub(super) err: Option<DropReason>,
}

impl Run {
    pub(super) fn add(&mut self, s: Sealed, plain_len: usize) {
        match s {
            Sealed::Data(n) if self.init == 0 => {
                if self.data == 0 {
                    self.stride = n;
                }
                self.data += 1;
                self.last = n;
                self.pos += n;
                self.bytes += plain_len as u64;
            }
            Sealed::Initiation(n) if self.init == 0 => {
                self.init = n;
                self.pos += n;
            }
            Sealed::Err(r) => self.err = Some(r),
            _ => {}
        }
    }

    pub(super) fn push(&self, to: SocketAddr, out: &mut impl Out) {
        for i in 0..self.data {
            let len = if i + 1 == self.data {
                self.last
            } else {
                self.stride
            };
            out.push(to, len);
        }
        if self.init > 0 {
            out.push(to, self.init);
        }
    }
}
