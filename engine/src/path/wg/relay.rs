//! A WireGuard relay for nodes behind NATs that cannot be punched
//! (docs/nat.md, "Relays"), sans-IO: the registrations, the forwarding
//! decision for one datagram, and the bandwidth limit. The socket and its
//! thread are [`crate::relay`].
//!
//! Design (the simplest one that is safe, chosen over a relay header):
//!
//! - The relay listens on its own **relay port**, not its WireGuard port,
//!   so a datagram there is never one of the relay's own sessions and the
//!   relay never needs to tell them apart.
//! - A node behind NAT **registers** from its WireGuard socket
//!   ([`crate::wire::disco::RelayMsg::Register`]; the NAT maps it exactly
//!   as it maps the node's WireGuard traffic to the relay) with its
//!   WireGuard public key, a growing counter and a MAC keyed by the
//!   static-static X25519 of the node's and the relay's keys
//!   ([`registration_key`]): only the key's holder can register it, and
//!   only a key in the cluster ([`Relay::datagram`]'s `members`, the keys of
//!   the leases) is taken. A registration moves a node's address only when
//!   its counter grew (the same counter may refresh the same address), so
//!   a replayed one cannot.
//! - The peers then send each other plain WireGuard datagrams to the relay
//!   port, and the relay **forwards them unchanged** (it never decrypts; it
//!   has no key for them) from the relay port, so the receiver's WireGuard
//!   roams the sender's endpoint to the relay and answers through it:
//!   - an **initiation** goes to the registered node whose public key
//!     MAC1 was made for (one keyed BLAKE2s per registered node, at most
//!     [`MAX_NODES`], on handshakes only); the initiator's sender index is
//!     learned;
//!   - a **response**, **cookie reply** or **data** message goes where its
//!     receiver index was learned from, keyed by (its source node, index):
//!     the indices of two nodes may collide, a pair's may not. A response
//!     teaches the responder's index.
//! - A datagram from an address no registered node is at is dropped, so
//!   the relay is no open reflector; a forwarded datagram is never larger
//!   than the one received, and an ack is half a registration.
//! - Fixed tables ([`MAX_NODES`], [`MAX_SESSIONS`]), allocated once; the
//!   packet path allocates nothing and takes no lock. A datagram's two
//!   lookups (the registered node at its source, the learned index) are
//!   fixed-size hash maps ([`super::fixmap`]: open addressing, at most a
//!   quarter full, at most 16 buckets read, keyed by a secret derived from
//!   the relay's key): constant time however full the tables are
//!   (`relay_lookup` bench: 1024 indices learned, see docs/nat.md).
//!   Registrations and initiations still scan the 64 nodes (a key, a
//!   MAC1 per node: handshake pace). The X25519 runs once
//!   per member key taking a slot (cached with the slot); a slot whose
//!   registration failed is the first to be taken over, so forged
//!   registrations (public keys are public) cannot crowd real nodes out.
//!   Each one for a key not cached costs an X25519 (tens of microseconds),
//!   so at most [`DH_PER_SEC`] are computed a second (a bucket of as many):
//!   a flood costs the relay a bounded share of a core, and a real node
//!   refused during one registers at its next try, 2 s later.
//! - **Limit**: a token bucket of the configured Mbit/s with a burst of
//!   [`BURST`] of it; a datagram over it is dropped and counted.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use boringtun::x25519;

use super::fixmap::FixMap;
use super::gate::{LABEL_MAC1, hash, mac, same, static_pair_key};
use crate::wire::disco::{ACK_LEN, REGISTER_MACED, RelayMsg};
use crate::wire::wg::{self as msg, Message};

/// Registered nodes a relay holds (a cluster's NATed nodes, fits one page of
/// state per relay).
pub const MAX_NODES: usize = 64;
/// Learned receiver indices: two per pair session, with room for rekeys.
pub const MAX_SESSIONS: usize = 1024;
/// A registration is dropped this long after its last refresh (nodes
/// refresh every [`super::disco::REGISTER_EVERY`]).
pub const NODE_TTL: Duration = Duration::from_secs(30);
/// A learned index is forgotten after this long unused: WireGuard's
/// `REJECT_AFTER_TIME`, after which no session uses it.
pub const SESSION_TTL: Duration = Duration::from_secs(180);
/// The bucket holds this share of a second's worth of the limit.
pub const BURST: Duration = Duration::from_millis(100);

/// X25519s (registrations of keys not cached) a relay computes per second
/// at most: 100 x ~50 us is 0.5 % of a core; a cluster's nodes register
/// once each (then the key is cached), so 100 a second is far more than a
/// relay restart needs.
pub const DH_PER_SEC: u32 = 100;

const LABEL_REGISTER: &[u8] = b"weft relay register v1";
/// Derives the tables' hash seeds from the relay's key.
const LABEL_TABLES: &[u8] = b"weft relay tables v1";

/// The MAC key of registrations between `secret` and `peer` (either end).
pub fn registration_key(secret: &[u8; 32], peer: &[u8; 32]) -> [u8; 32] {
    static_pair_key(LABEL_REGISTER, secret, peer)
}

/// A registration of `secret`'s key with the relay whose key is `relay`.
pub fn registration(secret: &[u8; 32], relay: &[u8; 32], counter: u64) -> [u8; 64] {
    let key = x25519::PublicKey::from(&x25519::StaticSecret::from(*secret)).to_bytes();
    let mut out = [0u8; 64];
    let unmaced = RelayMsg::Register {
        key,
        counter,
        mac: [0; 16],
    };
    unmaced.write(&mut out);
    let m = mac(&registration_key(secret, relay), &[&out[..REGISTER_MACED]]);
    out[REGISTER_MACED..].copy_from_slice(&m);
    out
}

/// What to do with one datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Send it unchanged to this address.
    Forward(SocketAddr),
    /// Send the first [`ACK_LEN`] bytes of the caller's `ack` buffer back.
    Ack,
    /// Drop it.
    Drop(RelayDrop),
}

/// Why a datagram was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayDrop {
    /// Not a relay message or WireGuard message.
    Malformed,
    /// From an address no registered node is at.
    Unregistered,
    /// A registration of a key that no lease has, with a bad MAC or an old
    /// counter, or with every slot taken.
    Refused,
    /// No registered node for this initiation, or no learned index.
    NoRoute,
    /// Over the bandwidth limit.
    Limit,
}

/// Counters, read by the thread that owns the relay.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RelayStats {
    /// Datagrams forwarded.
    pub forwarded: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Registrations taken.
    pub registered: u64,
    /// Dropped over the limit.
    pub limited: u64,
    /// Dropped for any other reason.
    pub dropped: u64,
}

#[derive(Debug, Clone, Copy)]
struct Node {
    key: [u8; 32],
    reg_key: [u8; 32],
    mac1_key: [u8; 32],
    /// Where it registered from (`None`: key cached, not registered).
    at: Option<SocketAddr>,
    counter: u64,
    seen: Instant,
}

/// A learned index, by (node slot the datagram comes from, index).
#[derive(Debug, Clone, Copy)]
struct Session {
    /// Node slot it goes to.
    to: u8,
    used: Instant,
}

/// One relay's state (see the module docs).
pub struct Relay {
    secret: [u8; 32],
    nodes: Vec<Option<Node>>,
    /// The registered nodes' slots by address.
    at: FixMap<SocketAddr, u8>,
    /// Learned indices, at most [`MAX_SESSIONS`], in four times as many
    /// buckets (see [`super::fixmap`] for why a quarter).
    sessions: FixMap<(u8, u32), Session>,
    /// Bytes per second (0: no limit), the bucket and its last fill.
    rate: u64,
    tokens: u64,
    filled: Instant,
    /// X25519s left this second, and when the second began.
    dh_left: u32,
    dh_since: Instant,
    /// Counters.
    pub stats: RelayStats,
}

impl std::fmt::Debug for Relay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Relay")
            .field("stats", &self.stats)
            .finish_non_exhaustive()
    }
}

impl Relay {
    /// A relay with WireGuard private key `secret`, limited to `mbit`
    /// Mbit/s (`None`: no limit).
    pub fn new(secret: [u8; 32], mbit: Option<u64>, now: Instant) -> Relay {
        let rate = mbit.map_or(0, |m| m.saturating_mul(125_000));
        let h = hash(LABEL_TABLES, &secret);
        let seed = |i: usize| u64::from_le_bytes(h[i..i + 8].try_into().unwrap_or_default());
        Relay {
            secret,
            nodes: vec![None; MAX_NODES],
            at: FixMap::new(4 * MAX_NODES, seed(0)),
            sessions: FixMap::new(4 * MAX_SESSIONS, seed(8)),
            rate,
            tokens: burst(rate),
            filled: now,
            dh_left: DH_PER_SEC,
            dh_since: now,
            stats: RelayStats::default(),
        }
    }

    /// Registered nodes (with an address).
    pub fn registered(&self) -> usize {
        self.nodes
            .iter()
            .flatten()
            .filter(|n| n.at.is_some())
            .count()
    }

    /// One datagram `d` from `src` at `now`; `members` are the cluster's
    /// WireGuard keys, `ack` room for an ack.
    pub fn datagram(
        &mut self,
        d: &[u8],
        src: SocketAddr,
        now: Instant,
        members: &[[u8; 32]],
        ack: &mut [u8; ACK_LEN],
    ) -> Verdict {
        let v = self.decide(d, src, now, members, ack);
        match v {
            Verdict::Forward(_) => {
                self.stats.forwarded += 1;
                self.stats.bytes += d.len() as u64;
            }
            Verdict::Ack => self.stats.registered += 1,
            Verdict::Drop(RelayDrop::Limit) => self.stats.limited += 1,
            Verdict::Drop(_) => self.stats.dropped += 1,
        }
        v
    }

    fn decide(
        &mut self,
        d: &[u8],
        src: SocketAddr,
        now: Instant,
        members: &[[u8; 32]],
        ack: &mut [u8; ACK_LEN],
    ) -> Verdict {
        if let Ok(RelayMsg::Register { key, counter, mac }) = RelayMsg::parse(d) {
            return self.register(d, key, counter, mac, src, now, members, ack);
        }
        let Ok(m) = Message::new_checked(d) else {
            return Verdict::Drop(RelayDrop::Malformed);
        };
        let Some(from) = self.slot_at(src, now) else {
            return Verdict::Drop(RelayDrop::Unregistered);
        };
        let to = match m.receiver() {
            None => self.initiation_to(&m, from, now),
            Some(r) => self.learned(from, r, now),
        };
        let Some(to) = to else {
            return Verdict::Drop(RelayDrop::NoRoute);
        };
        let Some(dst) = self.nodes[usize::from(to)].and_then(|n| n.at) else {
            return Verdict::Drop(RelayDrop::NoRoute);
        };
        if !self.take(d.len() as u64, now) {
            return Verdict::Drop(RelayDrop::Limit);
        }
        match m.kind() {
            msg::INITIATION => self.learn(to, m.sender(), from, now),
            msg::RESPONSE => self.learn(to, m.sender(), from, now),
            _ => {}
        }
        Verdict::Forward(dst)
    }

    #[allow(clippy::too_many_arguments)]
    fn register(
        &mut self,
        d: &[u8],
        key: [u8; 32],
        counter: u64,
        got: [u8; 16],
        src: SocketAddr,
        now: Instant,
        members: &[[u8; 32]],
        ack: &mut [u8; ACK_LEN],
    ) -> Verdict {
        if !members.contains(&key) {
            return Verdict::Drop(RelayDrop::Refused);
        }
        let slot = match self
            .nodes
            .iter()
            .position(|n| n.is_some_and(|n| n.key == key))
        {
            Some(i) => i,
            None => {
                // A free slot, else one that never registered (a key
                // cached for a registration that failed), else one whose
                // node went quiet: failed registrations cannot hold slots.
                let free = self.nodes.iter().position(Option::is_none);
                let pending = || {
                    self.nodes
                        .iter()
                        .position(|n| n.is_some_and(|n| n.at.is_none()))
                };
                let quiet = || {
                    self.nodes.iter().position(|n| {
                        n.is_some_and(|n| now.saturating_duration_since(n.seen) > NODE_TTL)
                    })
                };
                let Some(i) = free.or_else(pending).or_else(quiet) else {
                    return Verdict::Drop(RelayDrop::Refused);
                };
                if now.saturating_duration_since(self.dh_since) >= Duration::from_secs(1) {
                    (self.dh_left, self.dh_since) = (DH_PER_SEC, now);
                }
                if self.dh_left == 0 {
                    return Verdict::Drop(RelayDrop::Refused);
                }
                self.dh_left -= 1;
                self.forget(i);
                if let Some(old) = self.nodes[i].and_then(|n| n.at) {
                    self.at.remove(&old);
                }
                self.nodes[i] = Some(Node {
                    key,
                    reg_key: registration_key(&self.secret, &key),
                    mac1_key: hash(LABEL_MAC1, &key),
                    at: None,
                    counter: 0,
                    seen: now,
                });
                i
            }
        };
        let Some(n) = self.nodes[slot].as_mut() else {
            return Verdict::Drop(RelayDrop::Refused);
        };
        if !same(&mac(&n.reg_key, &[&d[..REGISTER_MACED]]), &got) {
            return Verdict::Drop(RelayDrop::Refused);
        }
        let newer = counter > n.counter;
        let refresh = counter == n.counter && n.at == Some(src);
        if !(newer || refresh) {
            return Verdict::Drop(RelayDrop::Refused);
        }
        n.counter = counter;
        let moved = n.at.replace(src).filter(|a| *a != src);
        n.seen = now;
        if let Some(old) = moved {
            self.at.remove(&old);
        }
        // Another slot at this address (a node that re-keyed) gives it up.
        let slot8 = u8::try_from(slot).unwrap_or(u8::MAX);
        if let Some(&o) = self.at.get(&src)
            && o != slot8
            && let Some(n) = self.nodes.get_mut(usize::from(o))
        {
            *n = None;
        }
        self.at.insert(src, slot8, |_| 0);
        match (RelayMsg::Ack { counter, mac: got }).write(ack) {
            Some(_) => Verdict::Ack,
            None => Verdict::Drop(RelayDrop::Malformed),
        }
    }

    /// The slot of the registered node at `src`.
    fn slot_at(&self, src: SocketAddr, now: Instant) -> Option<u8> {
        let i = *self.at.get(&src)?;
        let n = self.nodes.get(usize::from(i))?.as_ref()?;
        (n.at == Some(src) && now.saturating_duration_since(n.seen) <= NODE_TTL).then_some(i)
    }

    /// The registered node (not `from`) whose key `m`'s MAC1 was made for.
    fn initiation_to(&self, m: &Message<&[u8]>, from: u8, now: Instant) -> Option<u8> {
        let i = self.nodes.iter().enumerate().position(|(i, n)| {
            n.is_some_and(|n| {
                i != usize::from(from)
                    && n.at.is_some()
                    && now.saturating_duration_since(n.seen) <= NODE_TTL
                    && same(&mac(&n.mac1_key, &[m.until_mac1()]), m.mac1())
            })
        })?;
        u8::try_from(i).ok()
    }

    /// Where a datagram from `from` to receiver index `index` goes.
    fn learned(&mut self, from: u8, index: u32, now: Instant) -> Option<u8> {
        let s = self.sessions.get_mut(&(from, index))?;
        if now.saturating_duration_since(s.used) > SESSION_TTL {
            return None;
        }
        s.used = now;
        Some(s.to)
    }

    /// Datagrams from `from` to index `index` go to `to` from now on.
    fn learn(&mut self, from: u8, index: u32, to: u8, now: Instant) {
        let key = (from, index);
        if self.sessions.len() >= MAX_SESSIONS && self.sessions.get(&key).is_none() {
            // All taken: the least recently used goes (a scan, on a
            // handshake only, and only with every index learned).
            if let Some(old) = self.sessions.min_by(|s| s.used) {
                self.sessions.remove(&old);
            }
        }
        // A full window gives up its least recently used.
        self.sessions
            .insert(key, Session { to, used: now }, |s| s.used);
    }

    /// Forgets the sessions of node slot `i` (its slot is taken over).
    fn forget(&mut self, i: usize) {
        let i = u8::try_from(i).unwrap_or(u8::MAX);
        self.sessions
            .remove_where(|(from, _), s| *from == i || s.to == i);
    }

    /// Takes `bytes` from the bucket; whether there were enough.
    fn take(&mut self, bytes: u64, now: Instant) -> bool {
        if self.rate == 0 {
            return true;
        }
        let dt = now.saturating_duration_since(self.filled);
        let add = (dt.as_nanos().min(u128::from(u64::MAX)) as u64).saturating_mul(self.rate)
            / 1_000_000_000;
        if add > 0 {
            self.tokens = (self.tokens.saturating_add(add)).min(burst(self.rate));
            self.filled = now;
        }
        if self.tokens < bytes {
            return false;
        }
        self.tokens -= bytes;
        true
    }
}

/// The bucket's size for `rate` bytes per second: [`BURST`] of it, at
/// least one 64 KiB datagram.
fn burst(rate: u64) -> u64 {
    (rate / (1000 / BURST.as_millis() as u64)).max(65_536)
}

#[cfg(test)]
#[path = "relay_tests.rs"]
mod tests;
