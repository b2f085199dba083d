//! The handshake gate: what a handshake message (initiation or response)
//! must pass before any Diffie-Hellman is spent on it, as the kernel's
//! WireGuard decides it (`receive.c`, `cookie.c`, `ratelimiter.c`):
//!
//! 1. MAC1, keyed with our public key (anyone who knows it can make one).
//! 2. Under load (more than [`UNDER_LOAD`] handshake messages in a second
//!    for the whole engine, and for one second after: [`Load`]), MAC2 too:
//!    a cookie proves the sender receives at its address. Without a valid
//!    one the answer is a cookie reply; the cookie is a MAC of the source
//!    address **and port** under a secret that changes every two minutes
//!    (the paper's; boringtun 0.7 bound it to the address only).
//! 3. Under load, a message with a valid cookie still spends its source's
//!    tokens: a bucket per source address ([`Buckets`], the kernel's 20 per
//!    second, burst 5; IPv6 by /64), so that one address with cookies cannot
//!    take every handshake slot (boringtun 0.7 had one global counter only).
//!
//! Sans-IO: the time is the caller's `now`; the secret comes from the
//! caller at start. Nothing allocates after [`Gate::new`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use blake2::digest::consts::{U16, U24};
use blake2::digest::{FixedOutput, KeyInit, Update};
use blake2::{Blake2s256, Blake2sMac, Digest};
use chacha20poly1305::XChaCha20Poly1305;
use chacha20poly1305::aead::{AeadInPlace, generic_array::GenericArray};

use crate::encap::DropReason;
use crate::wire::wg::{self as msg, Message};

/// Handshake messages per second (whole engine) above which the gate asks
/// for cookies: boringtun's device default. The kernel's trigger is a
/// queue of 512 messages waiting for a CPU; a rate says the same for a
/// gate that checks inline.
pub const UNDER_LOAD: u64 = 100;
/// Handshakes per second one source may start under load (the kernel's
/// `PACKETS_PER_SECOND`).
pub const PER_SOURCE_RATE: u64 = 20;
/// Handshakes one source may start at once (the kernel's `PACKETS_BURSTABLE`).
pub const PER_SOURCE_BURST: u64 = 5;
/// Sources tracked at once per gate; when all slots hold live buckets a new
/// source is refused until one goes idle for a second (the kernel's table
/// is bounded the same way).
pub const SOURCES: usize = 4096;
/// How long a cookie secret lives (the paper's two minutes).
pub const COOKIE_SECRET_AGE: Duration = Duration::from_secs(120);

pub(crate) const LABEL_MAC1: &[u8; 8] = b"mac1----";
const LABEL_COOKIE: &[u8; 8] = b"cookie--";
const NS: u64 = 1_000_000_000;
/// A token costs this many nanoseconds of bucket time.
const TOKEN: u64 = NS / PER_SOURCE_RATE;

/// The engine-wide handshake load, shared by the workers' gates: a count per
/// second and when the engine was last under load (nanoseconds since `base`).
#[derive(Debug)]
pub struct Load {
    base: Instant,
    second: AtomicU64,
    count: AtomicU64,
    last_over: AtomicU64,
}

impl Load {
    /// A load meter whose clock starts at `base`.
    pub fn new(base: Instant) -> Load {
        Load {
            base,
            second: AtomicU64::new(0),
            count: AtomicU64::new(0),
            last_over: AtomicU64::new(0),
        }
    }

    fn ns(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Counts one handshake message at `now`; whether the engine is under
    /// load (over [`UNDER_LOAD`] this second, or within a second of it).
    pub fn note(&self, now: Instant) -> bool {
        let t = self.ns(now).max(1);
        let s = t / NS;
        if self.second.swap(s, Ordering::Relaxed) != s {
            self.count.store(0, Ordering::Relaxed);
        }
        if self.count.fetch_add(1, Ordering::Relaxed) + 1 > UNDER_LOAD {
            self.last_over.store(t, Ordering::Relaxed);
            return true;
        }
        let last = self.last_over.load(Ordering::Relaxed);
        last != 0 && t - last.min(t) < NS
    }
}

/// What the gate says of a handshake message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Go on: verify it (Diffie-Hellman).
    Pass,
    /// Under load without a valid cookie: send the cookie reply in the
    /// first [`msg::COOKIE_REPLY_LEN`] bytes of the reply buffer to the
    /// source, and count a `Handshake` drop.
    Cookie,
    /// Drop it for this reason.
    Drop(DropReason),
}

/// One source's token bucket.
#[derive(Debug, Clone, Copy, Default)]
struct Bucket {
    key: u128,
    /// Nanoseconds (gate clock) of the last refill; 0 = a free slot.
    at: u64,
    /// Bucket time in nanoseconds: `TOKEN` per token.
    tokens: u64,
}

/// Token buckets per source address in a fixed table (open addressing,
/// linear probing; an entry idle for a second is full again, so it is free).
#[derive(Debug)]
pub struct Buckets {
    slots: Box<[Bucket]>,
}

/// How far a lookup probes before it gives up.
const PROBES: usize = 16;

impl Buckets {
    fn new() -> Buckets {
        Buckets {
            slots: vec![Bucket::default(); SOURCES].into_boxed_slice(),
        }
    }

    /// The kernel's key: an IPv4 address, or an IPv6 /64.
    fn key(ip: IpAddr) -> u128 {
        match ip {
            IpAddr::V4(a) => u128::from(u32::from(a)) | (1 << 127),
            IpAddr::V6(a) => u128::from(a) >> 64,
        }
    }

    /// Takes a token from `ip`'s bucket at `t` (nanoseconds); `false` when
    /// it has none (or no slot is free).
    fn allow(&mut self, ip: IpAddr, t: u64) -> bool {
        let key = Self::key(ip);
        let h = (key as u64 ^ (key >> 64) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let start = (h >> 32) as usize % self.slots.len();
        let max = TOKEN * PER_SOURCE_BURST;
        let mut free = None;
        for i in 0..PROBES {
            let j = (start + i) % self.slots.len();
            let b = self.slots[j];
            if b.at != 0 && b.key == key {
                let tokens = (b.tokens + t.saturating_sub(b.at)).min(max);
                let ok = tokens >= TOKEN;
                self.slots[j] = Bucket {
                    key,
                    at: t,
                    tokens: if ok { tokens - TOKEN } else { tokens },
                };
                return ok;
            }
            if free.is_none() && (b.at == 0 || t.saturating_sub(b.at) >= NS) {
                free = Some(j);
            }
        }
        let Some(j) = free else {
            return false;
        };
        self.slots[j] = Bucket {
            key,
            at: t,
            tokens: max - TOKEN,
        };
        true
    }
}

/// A worker's handshake gate (see the module docs).
pub struct Gate {
    mac1_key: [u8; 32],
    cookie_key: [u8; 32],
    /// Cookie secrets are MACs of the period number under this.
    secret: [u8; 32],
    nonce_key: [u8; 32],
    nonces: u64,
    load: Arc<Load>,
    buckets: Buckets,
}

impl std::fmt::Debug for Gate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gate").field("load", &self.load).finish()
    }
}

/// A MAC key two nodes share from their static WireGuard keys alone: the
/// BLAKE2s of `label` and the X25519 of `secret` and `peer` (either end
/// computes the same). Each use has its own label (relay registrations,
/// direct probes), so one key never serves two messages.
pub(crate) fn static_pair_key(label: &[u8], secret: &[u8; 32], peer: &[u8; 32]) -> [u8; 32] {
    let s = boringtun::x25519::StaticSecret::from(*secret);
    let dh = s.diffie_hellman(&boringtun::x25519::PublicKey::from(*peer));
    hash(label, dh.as_bytes())
}

pub(crate) fn hash(a: &[u8], b: &[u8]) -> [u8; 32] {
    let mut h = Blake2s256::new();
    Digest::update(&mut h, a);
    Digest::update(&mut h, b);
    h.finalize().into()
}

/// A keyed BLAKE2s MAC of `parts` (16 bytes: MAC1, MAC2, cookies).
pub(crate) fn mac(key: &[u8], parts: &[&[u8]]) -> [u8; 16] {
    let mut m = <Blake2sMac<U16> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("blake2s takes keys of up to 32 bytes"));
    parts.iter().for_each(|p| m.update(p));
    m.finalize_fixed().into()
}

/// A 24-byte keyed BLAKE2s MAC (cookie reply nonces).
fn mac24(key: &[u8], data: &[u8]) -> [u8; 24] {
    let mut m = <Blake2sMac<U24> as KeyInit>::new_from_slice(key)
        .unwrap_or_else(|_| unreachable!("blake2s takes keys of up to 32 bytes"));
    m.update(data);
    m.finalize_fixed().into()
}

/// Constant-time comparison of two MACs.
pub(crate) fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl Gate {
    /// The gate of an engine whose static public key is `public`; `seed`
    /// is 64 random bytes (cookie secret and nonce key), `load` the
    /// engine's shared meter.
    pub fn new(public: &[u8; 32], seed: [u8; 64], load: Arc<Load>) -> Gate {
        let mut secret = [0u8; 32];
        let mut nonce_key = [0u8; 32];
        secret.copy_from_slice(&seed[..32]);
        nonce_key.copy_from_slice(&seed[32..]);
        Gate {
            mac1_key: hash(LABEL_MAC1, public),
            cookie_key: hash(LABEL_COOKIE, public),
            secret,
            nonce_key,
            nonces: 0,
            load,
            buckets: Buckets::new(),
        }
    }

    /// Whether `m`'s MAC1 is ours (cheap: one keyed BLAKE2s).
    pub fn mac1_ok(&self, m: &Message<&[u8]>) -> bool {
        same(&mac(&self.mac1_key, &[m.until_mac1()]), m.mac1())
    }

    /// The cookie of `src` at `now`.
    fn cookie(&self, src: SocketAddr, now: Instant) -> [u8; 16] {
        let t = now.saturating_duration_since(self.load.base).as_secs();
        let period = t / COOKIE_SECRET_AGE.as_secs();
        let secret = mac(&self.secret, &[&period.to_le_bytes()]);
        let port = src.port().to_be_bytes();
        match src.ip() {
            IpAddr::V4(a) => mac(&secret, &[&a.octets(), &port]),
            IpAddr::V6(a) => mac(&secret, &[&a.octets(), &port]),
        }
    }

    /// Checks the handshake message `m` from `src` at `now` (see the module
    /// docs); a cookie reply is written into `reply`.
    pub fn check(
        &mut self,
        m: &Message<&[u8]>,
        src: SocketAddr,
        now: Instant,
        reply: &mut [u8; msg::COOKIE_REPLY_LEN],
    ) -> Verdict {
        if !m.is_handshake() {
            return Verdict::Drop(DropReason::Malformed);
        }
        if !self.mac1_ok(m) {
            return Verdict::Drop(DropReason::DecryptFailure);
        }
        if !self.load.note(now) {
            return Verdict::Pass;
        }
        let cookie = self.cookie(src, now);
        if !same(&mac(&cookie, &[m.until_mac2()]), m.mac2()) {
            self.cookie_reply(m, &cookie, reply);
            return Verdict::Cookie;
        }
        if self
            .buckets
            .allow(src.ip(), self.load.ns(now).saturating_add(1))
        {
            Verdict::Pass
        } else {
            Verdict::Drop(DropReason::RateLimited)
        }
    }

    /// Writes the cookie reply to `m` carrying `cookie` (sealed with
    /// XChaCha20-Poly1305 under our cookie key, MAC1 as associated data).
    fn cookie_reply(
        &mut self,
        m: &Message<&[u8]>,
        cookie: &[u8; 16],
        out: &mut [u8; msg::COOKIE_REPLY_LEN],
    ) {
        self.nonces += 1;
        let nonce = mac24(&self.nonce_key, &self.nonces.to_le_bytes());
        out[..4].copy_from_slice(&[msg::COOKIE_REPLY, 0, 0, 0]);
        out[4..8].copy_from_slice(&m.sender().to_le_bytes());
        out[8..32].copy_from_slice(&nonce);
        out[32..48].copy_from_slice(cookie);
        let aead = <XChaCha20Poly1305 as chacha20poly1305::KeyInit>::new(&self.cookie_key.into());
        match aead.encrypt_in_place_detached(
            GenericArray::from_slice(&nonce),
            m.mac1(),
            &mut out[32..48],
        ) {
            Ok(tag) => out[48..64].copy_from_slice(&tag),
            Err(_) => unreachable!("16 bytes are within XChaCha20-Poly1305's limits"),
        }
    }
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
