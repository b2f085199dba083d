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
//!   ([`owner`](crate::encap::wg::owner)).
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
//! TUN super-packet -> userspace GSO in place in the read buffer
//! ([`crate::path::wg::seg`]) ->
//! `encapsulate` each segment into the TX arena (boringtun copies the
//! plaintext behind the 16-byte header and seals in place there: the only
//! pass over the bytes besides the cipher and the TCP checksum) -> equal-size
//! runs leave as one `UDP_SEGMENT` train.
//!
//! Receive: `UDP_GRO` train -> handshake messages through the gate
//! ([`crate::path::wg::gate`]: MAC1, cookies under load, a token bucket
//! per source) -> `decapsulate` each segment into the plaintext arena ->
//! AllowedIPs check of the inner source -> inner TCP checksum marked partial
//! instead of verified (Poly1305 has authenticated the bytes, see
//! [`crate::path::wg::seg::trust_tcp_checksum`]) -> userspace GRO -> one
//! TUN write per coalesced packet.
//!
//! Every per-packet decision above (routing to the owner, segmentation,
//! encryption, the handshake gate, decryption, AllowedIPs, roaming, what of
//! a train goes to another worker, the timers) is the sans-IO core's,
//! [`crate::path::wg`]; this module holds the start-up and the worker's I/O
//! shell. Timers (`update_timers`) run every
//! [`TIMER_TICK`](crate::path::wg::TIMER_TICK) per owned peer. A new `Tunn`
//! sends its handshake initiation at once, without waiting for traffic: a
//! peer still holding a session with our previous process (same key,
//! restart) would otherwise keep encrypting into it until its 15 s rekey
//! timer gave up. The owner follows the peer's endpoint to the source of
//! authenticated packets (WireGuard roaming).
//!
//! NAT traversal's endpoint discovery (docs/nat.md,
//! [`crate::path::wg::disco`]) shares the listen socket, so a NAT maps its
//! requests as it maps WireGuard's packets: off until the control plane
//! turns it on ([`crate::Engine::discovery`]); worker 0 asks, on its timer
//! tick, with a nonce drawn here; the core looks at a datagram's first byte
//! only after WireGuard's own check refused it.

pub(crate) mod handoff;
pub(crate) mod worker;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use boringtun::x25519;

pub use crate::encap::wg::{key_from_base64, key_to_base64};

use crate::builder::Builder;
use crate::encap::wg::steering_program;
use crate::path::wg::Config;
use crate::path::wg::disco::Discovery;
use crate::path::wg::gate::Load;
use crate::sys::udp::Udp;
use crate::worker::Worker;
use crate::{Engine, EngineError, SOCKET_BUFFER};

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

/// Starts a WireGuard engine (see [`crate::Engine::start`]): the TUN queues,
/// one socket per worker on the listen `port` (`SO_REUSEPORT`, steered by
/// [`steering_program`]), the handoff hub, and the workers.
pub(crate) fn start(b: Builder<'_>, port: u16, key: WgSecret) -> Result<Engine, EngineError> {
    let cfg = b.cfg;
    let workers = b.workers;
    let dev = b.open_tun(false)?;
    let mut offloads = b.offloads(&dev, true);
    let load = Arc::new(Load::new(Instant::now()));
    let disco = Arc::new(Discovery::default());
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
            let mut seed = [0u8; 64];
            getrandom::fill(&mut seed).map_err(|e| EngineError::Tun {
                name: cfg.tun_name.clone(),
                source: std::io::Error::other(e.to_string()),
            })?;
            let encap = worker::WgEncap {
                sock,
                hub: hub.clone(),
                inbox,
                core: Config {
                    me: i,
                    workers,
                    secret: key.0,
                    seed,
                    load: Arc::clone(&load),
                    now: Instant::now(),
                    disco: Arc::clone(&disco),
                },
            };
            Ok(Worker::new(i, q, dev.vnet_hdr, cfg.mtu, &b.shared, encap))
        })
        .collect::<Result<Vec<_>, EngineError>>()?;
    let mut engine = b.spawn(dev.name, port, offloads, "weft-wg", built)?;
    engine.disco = Some(disco);
    Ok(engine)
}
