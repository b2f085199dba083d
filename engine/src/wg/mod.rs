//! Userspace WireGuard on boringtun's `Tunn` (the Noise and transport core
//! only; the I/O layer is ours: batched UDP with GSO/GRO, TUN offload).
//!
//! # Peers and workers: who owns a `Tunn`
//!
//! A WireGuard session is one sender counter and one replay window per
//! direction, so a peer's `Tunn` must live in exactly one place; a `Tunn`
//! per (peer, worker) would make several sessions race for the same peer, and
//! a lock per peer would put a lock on the packet path. Instead every peer has
//! an **owner worker** and only the owner ever touches its `Tunn` (no lock):
//!
//! - Each public key gets a stable 24-bit id from the control path
//!   ([`crate::peers::WgIds`]); boringtun puts it in the upper 24 bits of every
//!   receiver index we hand out. The owner is `(id & 0xff) % workers`
//!   ([`owner`]).
//! - Receive: all workers bind the listen port with `SO_REUSEPORT`, and a
//!   classic BPF program on the group ([`steering_program`]) reads the owner
//!   byte out of the receiver index of handshake responses, cookie replies and
//!   data packets, so the kernel delivers them straight to the owner's socket.
//!   Handshake initiations carry no receiver index: the receiving worker
//!   checks MAC1 and decrypts the initiator's static key
//!   (`parse_handshake_anon`) to find the peer.
//! - Send: the kernel picks the TUN queue by flow hash, but the TUN's flow
//!   table then follows the queue we *write* a flow's packets to, so once the
//!   owner has written the reverse direction of a flow (TCP ACKs), the kernel
//!   reads that flow out on the owner's queue too.
//! - Whatever still lands on another worker (a flow's first packets, one-way
//!   flows, initiations, a kernel without the BPF program) is copied into a
//!   pooled buffer and passed to the owner through its bounded inbox
//!   ([`handoff`]), then the owner's `eventfd` wakes it. Buffers circulate
//!   between a fixed pool and the inboxes: nothing is allocated per packet;
//!   an empty pool drops the packet (counted as `backlog`).
//!
//! All packets of a peer are therefore encrypted in one thread, in order, and
//! sent from the listen port (WireGuard peers learn our endpoint from it).
//!
//! # Data path
//!
//! TUN super-packet -> userspace GSO in place in the read buffer ([`seg`]) ->
//! `encapsulate` each segment into the TX arena (boringtun copies the
//! plaintext behind the 16-byte header and seals in place there: the only
//! pass over the bytes besides the cipher and the TCP checksum) -> equal-size
//! runs leave as one `UDP_SEGMENT` train.
//!
//! Receive: `UDP_GRO` train -> `decapsulate` each segment into the plaintext
//! arena -> AllowedIPs check of the inner source -> inner TCP checksum marked
//! partial instead of verified (Poly1305 has authenticated the bytes, see
//! [`seg::trust_tcp_checksum`]) -> userspace GRO -> one TUN write per
//! coalesced packet.
//!
//! Timers (`update_timers`) run every [`TIMER_TICK`] per owned peer. A new
//! `Tunn` sends its handshake initiation at once, without waiting for
//! traffic: a peer still holding a session with our previous process (same
//! key, restart) would otherwise keep encrypting into it until its 15 s
//! rekey timer gave up. The owner follows the peer's endpoint to the source
//! of authenticated packets (WireGuard roaming).

pub(crate) mod handoff;
pub mod input;
pub mod seg;
pub(crate) mod worker;

pub use worker::{classify, receiver_id};

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::x25519;

use crate::builder::Builder;
use crate::sys::udp::Udp;
use crate::worker::Worker;
use crate::{Engine, EngineError, SOCKET_BUFFER};

/// How often each peer's timers run (boringtun's own device uses 250 ms).
pub const TIMER_TICK: Duration = Duration::from_millis(250);
/// Bytes WireGuard adds to an inner packet (16 header + 16 tag).
pub const OVERHEAD: usize = 32;
/// Smallest output buffer boringtun accepts (a handshake initiation).
pub const MIN_DST: usize = 148;
/// How far ahead of the kernel's (and wireguard-go's) boringtun's handshake
/// timestamps run: boringtun stamps TAI64N as `2^62 + 37 + unix seconds`,
/// the kernel and wireguard-go as `2^62 + 10 + unix seconds`. A peer keeps
/// the newest timestamp it accepted from a key and refuses initiations
/// carrying an older one (replay protection), so after this engine sent a
/// peer an initiation at time T, the kernel's WireGuard with the same key
/// cannot start a session with that peer before T + 27 s: only the peer can
/// (its 15 s timer, if it has traffic for us). Switching a node from this
/// engine to the kernel waits for that (`control`'s `dual.rs`); each peer's
/// last initiation is [`crate::PeerStats::last_initiation`].
pub const BORINGTUN_TAI64_AHEAD: Duration = Duration::from_secs(27);
/// Handshakes per second before the rate limiter asks for cookies. Every
/// handshake message is verified twice (once to find its owner), so this is
/// twice boringtun's device default of 100.
pub const HANDSHAKE_RATE_LIMIT: u64 = 200;

/// A static private key; `Debug` does not print it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct WgSecret(pub [u8; 32]);

impl std::fmt::Debug for WgSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "WgSecret(<redacted>, public {})",
            key_to_base64(&self.public_key())
        )
    }
}

impl WgSecret {
    /// The matching public key (X25519 base point multiplication).
    pub fn public_key(&self) -> [u8; 32] {
        let s = x25519::StaticSecret::from(self.0);
        x25519::PublicKey::from(&s).to_bytes()
    }
}

/// The worker owning peer `id` among `workers` (matches [`steering_program`]).
#[inline]
pub fn owner(id: u32, workers: usize) -> usize {
    (id & 0xff) as usize % workers.max(1)
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (44 characters), as `wg` and Go's
/// `wgtypes.Key.String()` print keys.
pub fn key_to_base64(key: &[u8; 32]) -> String {
    let mut out = String::with_capacity(44);
    for chunk in key.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Parses exactly 44 characters of standard, padded base64 encoding 32 bytes
/// (Go's `base64.StdEncoding`, which also tolerates non-zero trailing bits).
/// Any other input, including surrounding whitespace, is `None`.
pub fn key_from_base64(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 44 || s[43] != b'=' {
        return None;
    }
    let val = |c: u8| B64.iter().position(|&x| x == c).map(|p| p as u32);
    let mut out = [0u8; 32];
    let mut o = 0;
    for q in s[..44].chunks(4) {
        let last = o + 3 > 32;
        let n = if last {
            (val(q[0])? << 18) | (val(q[1])? << 12) | (val(q[2])? << 6)
        } else {
            (val(q[0])? << 18) | (val(q[1])? << 12) | (val(q[2])? << 6) | val(q[3])?
        };
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let take = if last { 2 } else { 3 };
        out[o..o + take].copy_from_slice(&bytes[..take]);
        o += take;
    }
    Some(out)
}

/// The `SO_ATTACH_REUSEPORT_CBPF` program: socket index = owner byte of the
/// receiver index, modulo `workers`. The program sees the UDP payload:
/// handshake responses carry the receiver index at bytes 8..12, cookie
/// replies and data packets at 4..8 (little endian; byte 1 of it is `id & 0xff`).
/// Initiations read a byte of the (random) sender index: some worker, which
/// hands them on.
pub fn steering_program(workers: usize) -> [libc::sock_filter; 8] {
    let n = u32::try_from(workers.max(1)).unwrap_or(1);
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    [
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 0),
        // Type 2: receiver index at 8..12, owner byte at 9; else go to 5.
        op(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 3, 2),
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 9),
        op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, 0, 0, n),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
        // Types 3/4 (and 1): receiver (sender) index at 4..8, owner byte at 5.
        op(libc::BPF_LD | libc::BPF_B | libc::BPF_ABS, 0, 0, 5),
        op(libc::BPF_ALU | libc::BPF_MOD | libc::BPF_K, 0, 0, n),
        op(libc::BPF_RET | libc::BPF_A, 0, 0, 0),
    ]
}

/// Starts a WireGuard engine (see [`crate::Engine::start`]): the TUN queues,
/// one socket per worker on the listen `port` (`SO_REUSEPORT`, steered by
/// [`steering_program`]), the handoff hub, and the workers.
pub(crate) fn start(b: Builder<'_>, port: u16, key: WgSecret) -> Result<Engine, EngineError> {
    let cfg = b.cfg;
    let workers = b.workers;
    let dev = b.open_tun(false)?;
    let mut offloads = b.offloads(&dev, true);
    let public = x25519::PublicKey::from(key.public_key());
    let rate_limiter = Arc::new(RateLimiter::new(&public, HANDSHAKE_RATE_LIMIT));
    let (hub, inboxes) =
        handoff::Hub::new(workers, crate::worker::TUN_BUF).map_err(|e| EngineError::Tun {
            name: cfg.tun_name.clone(),
            source: e,
        })?;
    let addr = SocketAddr::new(cfg.local_addr, port);
    let mut socks = Vec::with_capacity(workers);
    for _ in 0..workers {
        let s = Udp::bind(addr, true, true, SOCKET_BUFFER)
            .map_err(|source| EngineError::Socket { addr, source })?;
        if cfg.offload && !s.enable_gro() {
            offloads.udp_gro = false;
        }
        socks.push(s);
    }
    if workers > 1
        && let Err(e) = socks[0].attach_reuseport_cbpf(&steering_program(workers))
    {
        tracing::debug!(
            "reuseport steering unavailable ({e}); packets are handed off between workers"
        );
    }
    let built = dev
        .queues
        .into_iter()
        .zip(socks)
        .zip(inboxes)
        .enumerate()
        .map(|(i, ((q, sock), inbox))| {
            let encap = worker::WgEncap {
                workers,
                sock,
                secret: x25519::StaticSecret::from(key.0),
                public,
                rate_limiter: rate_limiter.clone(),
                hub: hub.clone(),
                inbox,
            };
            Worker::new(i, q, dev.vnet_hdr, cfg.mtu, &b.shared, encap)
        })
        .collect();
    b.spawn(dev.name, port, offloads, "weft-wg", built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips_and_matches_wg() {
        // RFC 7748 section 6.1 (Alice's key pair).
        let alice_priv = [
            0x77, 0x07, 0x6d, 0x0a, 0x73, 0x18, 0xa5, 0x7d, 0x3c, 0x16, 0xc1, 0x72, 0x51, 0xb2,
            0x66, 0x45, 0xdf, 0x4c, 0x2f, 0x87, 0xeb, 0xc0, 0x99, 0x2a, 0xb1, 0x77, 0xfb, 0xa5,
            0x1d, 0xb9, 0x2c, 0x2a,
        ];
        let alice_pub = [
            0x85, 0x20, 0xf0, 0x09, 0x89, 0x30, 0xa7, 0x54, 0x74, 0x8b, 0x7d, 0xdc, 0xb4, 0x3e,
            0xf7, 0x5a, 0x0d, 0xbf, 0x3a, 0x0d, 0x26, 0x38, 0x1a, 0xf4, 0xeb, 0xa4, 0xa9, 0x8e,
            0xaa, 0x9b, 0x4e, 0x6a,
        ];
        assert_eq!(WgSecret(alice_priv).public_key(), alice_pub);
        let s = key_to_base64(&alice_pub);
        assert_eq!(s, "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=");
        assert_eq!(key_from_base64(&s), Some(alice_pub));
        for k in [[0u8; 32], [0xff; 32]] {
            assert_eq!(key_from_base64(&key_to_base64(&k)), Some(k));
        }
        assert_eq!(key_from_base64(&format!("{s}\n")), None);
        assert_eq!(key_from_base64(&s[..43]), None);
        assert_eq!(key_from_base64(&s.replace('h', "*")), None);
        assert!(!format!("{:?}", WgSecret(alice_priv)).contains("dwdtCnMYpX08FsFyUbJm"));
    }

    #[test]
    fn owner_matches_the_steering_byte() {
        // Receiver index = id << 8 | session; byte 1 (LE) is id & 0xff.
        for id in [1u32, 2, 255, 256, 257, 0x12_3456] {
            let ridx = (id << 8) | 7;
            let b = ridx.to_le_bytes()[1];
            for n in 1..5 {
                assert_eq!(owner(id, n), usize::from(b) % n);
            }
        }
        assert_eq!(steering_program(2)[3].k, 2);
    }
}
