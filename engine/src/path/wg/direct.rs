//! Back to direct (docs/nat.md, "Back to direct"), sans-IO: while a peer
//! is relayed, both nodes send each other small authenticated **direct
//! probes** ([`crate::wire::direct`]) from their WireGuard port to the
//! peer's punched endpoint; a valid ack from address `E` proves that the
//! direct path through `E` works both ways, and the control plane moves the
//! peer off the relay to `E` (only the WireGuard endpoint moves: the
//! session and its keys stay).
//!
//! - **Prober** (worker 0): the control plane hands [`Direct::set_probes`]
//!   ready-made probes with the ack each one expects (their MACs need the
//!   node's private key, which stays with the control plane and the
//!   cores); worker 0 sends a new set once, at once, and notes the time
//!   of an ack that comes from the address its probe went to and equals
//!   the expected one byte for byte. The control plane decides when to
//!   probe (its period and why: `control/src/backend/wireguard/nat.rs`).
//! - **Answerer** (worker 0, any node with discovery on): a probe is
//!   answered only when its key is a cluster member's
//!   ([`Direct::set_members`], from the leases), its MAC is valid under
//!   the pair's key and its counter was not taken from that key before
//!   ([`fresh`]: larger than the largest, or one of the [`WINDOW`] below it
//!   not seen yet, since one round's probes to two addresses may arrive out
//!   of order; a replayed probe proves nothing and is not answered). The
//!   ack goes to the probe's source, as long as the probe: no reflector,
//!   no amplification. Anything else is dropped silently.
//! - The per-packet work is a table scan, one or two BLAKE2s and atomics;
//!   no allocation, no lock, no X25519 (the pair keys are computed by the
//!   control plane once per lease). Tables are capped ([`MAX_PROBES`],
//!   [`MAX_MEMBERS`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;
use boringtun::x25519;

use super::gate::{mac, same, static_pair_key};
use super::{Io, Now, Out, Rx};
use crate::encap::DropReason;
use crate::wire::direct::{DirectMsg, Kind, LEN, MACED};

/// Probes sent per set at most (two addresses for each of 32 relayed peers).
pub const MAX_PROBES: usize = 64;
/// Member keys an answerer holds at most (a cluster's WireGuard leases).
pub const MAX_MEMBERS: usize = 1024;
/// Counters below the largest taken that may still be taken once (a
/// round's probes carry consecutive counters, one per address).
pub const WINDOW: u64 = 64;

/// Whether `counter` may be taken from a key whose largest counter taken
/// is `last` and whose window is `seen` (bit `k`: `last - 1 - k` was
/// taken): the new `(last, seen)`, `None` for a replay or one too old.
pub fn fresh(last: u64, seen: u64, counter: u64) -> Option<(u64, u64)> {
    if counter > last {
        let shift = counter - last;
        let moved = match shift {
            s if s > WINDOW => 0,
            WINDOW => 1 << (WINDOW - 1),
            s => (seen << s) | (1 << (s - 1)),
        };
        return Some((counter, if last == 0 { 0 } else { moved }));
    }
    let back = last - counter;
    if back == 0 || back > WINDOW || seen & (1 << (back - 1)) != 0 {
        return None;
    }
    Some((last, seen | (1 << (back - 1))))
}

const LABEL_DIRECT: &[u8] = b"weft direct probe v1";

/// The MAC key of probes between `secret` and `peer` (either end).
pub fn pair_key(secret: &[u8; 32], peer: &[u8; 32]) -> [u8; 32] {
    static_pair_key(LABEL_DIRECT, secret, peer)
}

/// `m` written with its MAC under `key`.
fn sealed(m: DirectMsg, key: &[u8; 32]) -> [u8; LEN] {
    let mut out = [0u8; LEN];
    m.write(&mut out);
    let t = mac(key, &[&out[..MACED]]);
    out[MACED..].copy_from_slice(&t);
    out
}

/// One probe to send: where, the message, and the ack it expects.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The peer's address tried.
    pub to: SocketAddr,
    /// The probe.
    pub msg: [u8; LEN],
    /// The ack that proves the path.
    pub ack: [u8; LEN],
}

impl Probe {
    /// A probe from `secret`'s node to `peer`'s at `to` with `counter`
    /// (`key`: [`pair_key`] of the two).
    pub fn new(
        secret: &[u8; 32],
        peer: &[u8; 32],
        key: &[u8; 32],
        to: SocketAddr,
        counter: u64,
    ) -> Probe {
        let own = x25519::PublicKey::from(&x25519::StaticSecret::from(*secret)).to_bytes();
        let m = |kind, key_field| DirectMsg {
            kind,
            key: key_field,
            counter,
            mac: [0; 16],
        };
        Probe {
            to,
            msg: sealed(m(Kind::Probe, own), key),
            ack: sealed(m(Kind::Ack, *peer), key),
        }
    }
}

/// A member whose probes are answered.
#[derive(Debug)]
struct Member {
    key: [u8; 32],
    pair: [u8; 32],
    /// The largest counter taken, and the window below it ([`fresh`]).
    last: AtomicU64,
    seen: AtomicU64,
    /// When a valid probe last came, Unix milliseconds.
    probed: AtomicU64,
}

#[derive(Debug, Default)]
struct Members {
    own: [u8; 32],
    list: Vec<Member>,
}

/// A set of probes and their acks: an ack late for an old set lands in the
/// old set.
#[derive(Debug, Default)]
struct Set {
    probes: Vec<Probe>,
    /// When each probe (by index) was acked, Unix milliseconds.
    acks: Vec<AtomicU64>,
}

/// The probing state the cores and the control plane share.
#[derive(Debug, Default)]
pub struct Direct {
    set: ArcSwap<Set>,
    /// The newest set's generation (one relaxed load for worker 0's loop).
    generations: AtomicU64,
    members: ArcSwap<Members>,
    /// Probes answered.
    answered: AtomicU64,
}

impl Direct {
    /// The next probes to send (at most [`MAX_PROBES`]), once; the acks of
    /// the last set are forgotten (one that comes late lands in it). One
    /// caller (the control plane): the generation is published after the
    /// set, so worker 0 never takes an old set for a new one.
    pub fn set_probes(&self, mut probes: Vec<Probe>) {
        probes.truncate(MAX_PROBES);
        let acks = probes.iter().map(|_| AtomicU64::new(0)).collect();
        let generation = self.generations.load(Ordering::Relaxed) + 1;
        self.set.store(Arc::new(Set { probes, acks }));
        self.generations.store(generation, Ordering::Release);
    }

    /// When the probe of the current set sent to `to` was acked.
    pub fn acked(&self, to: SocketAddr) -> Option<SystemTime> {
        let set = self.set.load();
        let i = set.probes.iter().position(|p| p.to == to)?;
        at(set.acks.get(i)?.load(Ordering::Relaxed))
    }

    /// The keys whose probes are answered, each with its [`pair_key`]
    /// (at most [`MAX_MEMBERS`]), and this node's own public key; a key
    /// kept keeps its last counter (so a replay stays refused).
    pub fn set_members(&self, own: [u8; 32], keys: Vec<([u8; 32], [u8; 32])>) {
        let old = self.members.load();
        let list = keys
            .into_iter()
            .take(MAX_MEMBERS)
            .map(|(key, pair)| {
                let was = old.list.iter().find(|m| m.key == key);
                let get =
                    |f: fn(&Member) -> &AtomicU64| was.map_or(0, |m| f(m).load(Ordering::Relaxed));
                Member {
                    key,
                    pair,
                    last: AtomicU64::new(get(|m| &m.last)),
                    seen: AtomicU64::new(get(|m| &m.seen)),
                    probed: AtomicU64::new(get(|m| &m.probed)),
                }
            })
            .collect();
        self.members.store(Arc::new(Members { own, list }));
    }

    /// When `key`'s node last sent a valid probe here.
    pub fn probed(&self, key: &[u8; 32]) -> Option<SystemTime> {
        let m = self.members.load();
        at(m.list
            .iter()
            .find(|m| m.key == *key)?
            .probed
            .load(Ordering::Relaxed))
    }

    /// Probes answered.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    /// The set's generation (worker 0 sends a set it has not sent).
    pub(super) fn generation(&self) -> u64 {
        self.generations.load(Ordering::Acquire)
    }

    /// Sends the current set into `out`; how many.
    pub(super) fn send(&self, out: &mut impl Out) -> usize {
        let mut sent = 0;
        for p in &self.set.load().probes {
            if let Some(dst) = out.room(LEN, 1).get_mut(..LEN) {
                dst.copy_from_slice(&p.msg);
                out.push(p.to, LEN);
                sent += 1;
            }
        }
        sent
    }
}

fn at(ms: u64) -> Option<SystemTime> {
    (ms != 0).then(|| UNIX_EPOCH + Duration::from_millis(ms))
}

/// What [`Direct::datagram`] made of a probe or ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A valid probe: send the caller's `ack` buffer back to its source.
    Ack,
    /// The ack of a probe of the current set: its path works.
    Acked,
    /// Anything else: drop it, answer nothing.
    Drop,
}

impl Direct {
    /// One parsed probe or ack `m` (the datagram `d`) from `src` at
    /// `unix_ms`; an ack to send back is written to `ack`. Worker 0 only
    /// (one writer of the counters).
    pub fn datagram(
        &self,
        m: &DirectMsg,
        d: &[u8],
        src: SocketAddr,
        unix_ms: u64,
        ack: &mut [u8; LEN],
    ) -> Answer {
        match m.kind {
            Kind::Probe => {
                let members = self.members.load();
                let Some(p) = members.list.iter().find(|p| p.key == m.key) else {
                    return Answer::Drop;
                };
                if d.len() != LEN || !same(&mac(&p.pair, &[&d[..MACED]]), &m.mac) {
                    return Answer::Drop;
                }
                let (last, seen) = (
                    p.last.load(Ordering::Relaxed),
                    p.seen.load(Ordering::Relaxed),
                );
                let Some((last, seen)) = fresh(last, seen, m.counter) else {
                    return Answer::Drop;
                };
                p.last.store(last, Ordering::Relaxed);
                p.seen.store(seen, Ordering::Relaxed);
                p.probed.store(unix_ms, Ordering::Relaxed);
                let reply = DirectMsg {
                    kind: Kind::Ack,
                    key: members.own,
                    counter: m.counter,
                    mac: [0; 16],
                };
                *ack = sealed(reply, &p.pair);
                let n = self.answered.load(Ordering::Relaxed);
                self.answered.store(n + 1, Ordering::Relaxed);
                Answer::Ack
            }
            Kind::Ack => {
                let set = self.set.load();
                let i = (set.probes.iter()).position(|p| p.to == src && same(&p.ack, d));
                match i.and_then(|i| set.acks.get(i)) {
                    Some(a) => {
                        a.store(unix_ms, Ordering::Relaxed);
                        Answer::Acked
                    }
                    None => Answer::Drop,
                }
            }
        }
    }
}

/// A direct probe or ack `m` (the datagram `d`) from `src` at worker 0.
pub(super) fn receive(
    m: DirectMsg,
    d: &[u8],
    src: SocketAddr,
    shared: &Direct,
    now: Now,
    io: &mut impl Io,
) -> Rx<'static> {
    let mut ack = [0u8; LEN];
    match shared.datagram(&m, d, src, now.unix_ms(), &mut ack) {
        Answer::Ack => match io.room(LEN, 1).get_mut(..LEN) {
            Some(out) => {
                out.copy_from_slice(&ack);
                io.push(src, LEN);
                Rx::Done { sent: 1 }
            }
            None => Rx::Drop(DropReason::Malformed),
        },
        Answer::Acked => Rx::Done { sent: 0 },
        Answer::Drop => Rx::Drop(DropReason::Malformed),
    }
}

#[cfg(test)]
#[path = "direct_tests.rs"]
mod tests;
