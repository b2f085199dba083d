//! weft's userspace dataplane: TUN <-> flannel-UDP / VXLAN / WireGuard.
//!
//! # Bird's-eye view
//!
//! [`Engine::start`] creates a multi-queue TUN device and `workers` threads.
//! Each worker owns one TUN queue, one receive socket bound to
//! `local_addr:port` (all workers share the port through `SO_REUSEPORT`; a
//! classic BPF program picks the worker from a symmetric hash of the inner
//! flow, so that both directions of a flow stay on one worker), a few
//! send sockets on ephemeral ports (the outer source port is chosen by a hash of
//! the inner flow, as the kernel's vxlan does), and all of its buffers. The
//! control plane talks to the engine through exactly one handoff,
//! [`Engine::set_peers`], which swaps an immutable [`PeerTable`] snapshot
//! (`arc-swap`); workers load it once per batch. The engine does not configure
//! addresses, MTU or routes of the TUN device: the daemon does, over netlink
//! (the engine only lengthens its transmit queue, [`TUN_TXQUEUELEN`]).
//!
//! Code map: [`wire`] (zero-copy header views, checksums), [`encap`] (the
//! one sans-IO codec layer: flannel-UDP, VXLAN, IPIP and WireGuard's
//! framing), [`offload`] (userspace GSO, USO and GRO),
//! [`path`] (every per-packet decision, sans-IO: the transmit step from a
//! TUN read to datagrams in the caller's arena, the receive step from a
//! datagram to the inner packet to deliver, or a drop reason; [`path::wg`]
//! is WireGuard's core, which owns the sessions), [`peers`]
//! (the snapshot), `builder` (the one start-up every encapsulation shares),
//! `worker` (the one worker run loop, generic over an `Encapsulation`:
//! budgeted TUN reads, the receive step, counters, the idle wait, and the
//! buffers every worker has), `udp` (the flannel-UDP/VXLAN engine: its
//! sockets and its `Encapsulation`, an I/O shell around [`path`]), [`wg`]
//! and [`ipip`] (the other two encapsulations, siblings of `udp`), `idle`
//! (how the run loop waits between packets: a short poll-on window, then
//! `poll`), `spare` (whether the node has CPU to spare for that window:
//! a sampler thread), `sys` (the
//! only `unsafe`: TUN ioctls, `sendmmsg`/`recvmmsg`, the
//! AVX2 checksum loop), `steer` (the flow
//! steering program), [`Stats`] (per-worker counters, summed on read).
//!
//! # One packet's walk (pod A on node 1 -> pod B on node 2, VXLAN)
//!
//! 1. Pod A's TCP stack sends; the host routes `10.244.2.0/24` to the TUN
//!    (`flannel.1`). With `offload`, the TUN hands the engine a TCP
//!    super-packet of up to 64 KiB with a `virtio_net_hdr` (`GSO_TCPV4`, partial
//!    checksum). The TUN sends a flow to the queue the engine last wrote it
//!    on, and `steer.rs` steers received datagrams by a symmetric hash of the
//!    inner flow, so both directions of a flow meet one worker per node.
//! 2. The worker's run loop loads the peer snapshot once per round and hands
//!    each TUN read to its encapsulation's transmit step
//!    ([`path::tx::udp_plan`], then [`path::gather::udp_gather`]) looks the
//!    destination up in the peer snapshot (longest prefix) and writes, per
//!    MSS-sized segment of the super-packet, a header block into its TX
//!    arena: the VXLAN header (I flag, VNI), the inner Ethernet header
//!    (dst = peer VtepMAC, src = our VTEP MAC) and the segment's IP and TCP
//!    headers (userspace GSO: IPv4 length, ID and checksum, TCP
//!    seq/flags/checksum fixed per segment); the payload stays in the TUN
//!    read (one packet or a UDP super-packet is copied or cut into the arena
//!    by [`path::tx::udp_write`] instead).
//! 3. The equal-size segments form one `sendmmsg` message with a `UDP_SEGMENT`
//!    control message (UDP GSO), gathered from header block + payload slice
//!    per segment; the kernel adds outer UDP/IP headers once per segment, to
//!    `peer:8472`.
//! 4. On node 2 the receive socket (with `UDP_GRO`) returns the train as one
//!    buffer; the receive step ([`path::rx::udp`]) checks the VNI, the inner destination MAC, and the
//!    outer and inner sources against the peer table ([`antispoof`]: in
//!    strict mode the outer source must be a peer and the inner source must
//!    lie in that peer's subnet), and strips the 22 bytes.
//! 5. Userspace GRO merges adjacent segments of the flow (checksums verified)
//!    and one `writev` hands the TUN a super-packet with a `GSO_TCPV4`
//!    `virtio_net_hdr`; node 2's kernel routes it to pod B via `cni0`.
//!
//! flannel-UDP is the same walk with zero headroom, TTL decremented on send and
//! on receive, and an ICMP net-unreachable written back into the TUN when no
//! peer matches.
//!
//! WireGuard walks the same way through its core ([`path::wg::Core`], on
//! boringtun's `Tunn`): segments are encrypted one by one into the TX arena
//! and leave as a UDP GSO train from the listen port; received trains are
//! decrypted segment by segment (handshakes behind the gate: MAC1, cookies,
//! a token bucket per source), checked against the peer's AllowedIPs and
//! coalesced. A peer's `Tunn` is owned by exactly one worker; the [`wg`]
//! docs explain how packets reach it without a lock.
//!
//! IPIP ([`ipip`]) has no header of its own: segments leave one by one on a
//! raw `IPPROTO_IPIP` socket (the kernel writes the outer IPv4 header; raw IP
//! has no GSO), and received packets are stripped of the outer header, checked
//! (outer source a peer, inner source in its subnet) and coalesced.
//!
//! # Architecture invariants
//!
//! - The hot path does not allocate, lock, block on the control plane, log
//!   above `trace`, or make a syscall per packet (only per batch / per TUN
//!   packet or super-packet).
//! - Encapsulation code and the packet path ([`encap`], [`offload`],
//!   [`wire`], [`path`]) do no I/O and never panic on any input; untrusted
//!   bytes go through `new_checked`. Workers make no per-packet decision of
//!   their own: they read, write, flush and count around [`path`]. These
//!   modules import no worker, builder or start-up module
//!   (`tests/layers.rs`), so the import graph has no circle.
//! - One run loop (`worker.rs`) serves every encapsulation, statically
//!   dispatched: the round, the TUN budget, counter publishing and the idle
//!   policy exist once.
//! - Per-flow order is kept: a flow maps to one TUN queue, one worker, one
//!   send socket; GRO emits in arrival order.
//! - `unsafe` lives only in `sys/`, each block with a `SAFETY` comment.
//! - The engine never talks to etcd or the apiserver.

pub mod antispoof;
mod builder;
pub mod encap;
mod idle;
pub mod ipip;
pub mod offload;
pub mod path;
pub mod peers;
pub mod relay;
mod spare;
mod stats;
mod steer;
mod sys;
/// The TUN module (`sys::tun`), exposed for `benches/tun_ab` only: not an API.
#[doc(hidden)]
pub mod bench_tun {
    pub use crate::sys::tun::{
        Device, Queue, TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6, TUN_F_USO4, TUN_F_USO6, open,
    };
}
#[cfg(test)]
mod test_util;
mod tun_out;
mod udp;
mod udp_tx;
pub mod wg;
pub mod wire;
mod worker;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use arc_swap::ArcSwap;

pub use antispoof::AntiSpoofing;
pub use idle::PollWindow;
pub use ipnet;
pub use peers::{NatPath, Peer, PeerTable, WgPeer};
pub use stats::{
    Batching, Counter, CounterSet, DropReason, Drops, PeerReport, PeerStats, Report, Stats,
};
pub use sys::clock::clock_synchronised;
pub use sys::ethtool::{feature as ethtool_feature, set_tx_checksum, tx_checksum};
pub use sys::udp::set_pmtu_probe;
pub use wg::WgSecret;

use crate::peers::WgIds;
use crate::stats::Shared;

/// flannel's default udp backend port.
pub const FLANNEL_UDP_PORT: u16 = 8285;
/// The Linux kernel's (and flannel's) default VXLAN port.
pub const VXLAN_PORT: u16 = 8472;
/// flannel's default WireGuard listen port (IPv4 device).
pub const WIREGUARD_PORT: u16 = 51820;
/// Transmit queue length the engine sets on its TUN device (the kernel default, 500, overflows under load).
pub const TUN_TXQUEUELEN: i32 = sys::tun::TXQUEUELEN;

/// Socket buffer size forced on every engine socket.
pub const SOCKET_BUFFER: usize = 4 << 20;

/// Which encapsulation the engine speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encap {
    /// flannel's udp backend: bare IPv4 in UDP.
    FlannelUdp {
        /// UDP port, local and remote (flannel `Backend.Port`, default 8285).
        port: u16,
    },
    /// VXLAN as a flannel-configured kernel vxlan device speaks it.
    Vxlan {
        /// VNI (24 bits, flannel default 1).
        vni: u32,
        /// UDP port, local and remote (default 8472).
        port: u16,
        /// Our VTEP MAC (inner Ethernet source; decap accepts only this destination).
        local_mac: [u8; 6],
    },
    /// WireGuard (interoperates with the kernel module, wireguard-go, boringtun).
    /// Peers need [`Peer::wireguard`]; peers without it are not reachable.
    WireGuard {
        /// Listen port; also the default peer port (flannel `ListenPort`, 51820).
        port: u16,
        /// Our static private key.
        private_key: WgSecret,
    },
    /// IPv4-in-IPv4 (IP protocol 4) on a raw socket, as flannel's kernel
    /// `ipip` device speaks it ([`ipip`]). IPv4 only; no port.
    Ipip,
}

impl Encap {
    /// The UDP port (0 for [`Encap::Ipip`]).
    pub fn port(&self) -> u16 {
        match self {
            Encap::FlannelUdp { port }
            | Encap::Vxlan { port, .. }
            | Encap::WireGuard { port, .. } => *port,
            Encap::Ipip => 0,
        }
    }
}

/// Engine configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// TUN name, e.g. `flannel0` (udp) or `flannel.1` (vxlan); a `%d` template is allowed.
    pub tun_name: String,
    /// Encapsulation.
    pub encap: Encap,
    /// Underlay address the UDP sockets bind to (v4 or v6).
    pub local_addr: IpAddr,
    /// Source of generated ICMP errors (the node's subnet IP); flannel-UDP only.
    pub tun_addr: Option<IpAddr>,
    /// TUN MTU (the daemon sets it on the device). Outgoing segments follow the
    /// kernel's `gso_size`; received packets larger than this (a kernel peer's
    /// GSO train delivered whole over a veth underlay) are re-segmented to it.
    pub mtu: u16,
    /// Worker threads (and TUN queues); 0 = one per CPU.
    pub workers: usize,
    /// Try TUN vnet_hdr/TSO and UDP GSO/GRO.
    pub offload: bool,
    /// Drop decapsulated packets from unknown peers or spoofed inner sources
    /// (WireGuard: inner sources outside the peer's AllowedIPs): the engine
    /// starts in [`AntiSpoofing::Strict`] when set, [`AntiSpoofing::Off`]
    /// when not; [`Engine::set_anti_spoofing`] picks any mode.
    pub anti_spoof: bool,
    /// VXLAN or flannel-UDP over IPv4: write TCP super-packets whole to
    /// this tunnel TAP (issue 32, [`TunnelTap`]); ignored by every other
    /// engine.
    pub tunnel_tap: Option<TunnelTap>,
}

/// The tunnel TAP a VXLAN or flannel-UDP engine on an IPv4 node is asked to
/// write TCP super-packets to (UDP-tunnel GSO, Linux 6.17+, [`path::tap`];
/// flannel-UDP only to peers with [`Peer::tunnel_gso`]). The
/// engine creates it, not persistent (it goes with the engine), with one
/// queue per worker, and leaves it down: bringing it up, with
/// `rp_filter=0` and `accept_local=1` on it, is the daemon's job. While
/// it is down, packets go through the UDP sockets.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TunnelTap {
    /// The TAP's name (at most 15 bytes, no `%d` template).
    pub name: String,
    /// Whether the engine refuses to start without it
    /// ([`EngineError::TunnelTap`]); else it logs why and uses its sockets.
    pub required: bool,
}

/// Whether an engine writes through its tunnel TAP ([`Engine::tunnel_tap`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TunnelTapState {
    /// Not asked for ([`EngineConfig::tunnel_tap`] is `None`).
    NotAsked,
    /// Open, under this name.
    Open(String),
    /// Asked for but not opened (not over IPv4, or the kernel refused
    /// the TAP or its UDP-tunnel offloads): why.
    Unavailable(String),
}

/// Which offloads are active.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadState {
    /// TUN reads/writes carry a `virtio_net_hdr` (userspace GRO is on).
    pub tun_vnet_hdr: bool,
    /// The TUN hands over TCP super-packets (TSO4/6 accepted; userspace GSO is on).
    pub tun_tso: bool,
    /// The TUN hands over UDP super-packets (USO4/6 accepted; userspace USO
    /// is on). The flannel-UDP and VXLAN engines ask for it; WireGuard and
    /// IPIP do not.
    pub tun_uso: bool,
    /// The TUN hands over partial checksums.
    pub tun_csum: bool,
    /// UDP GSO (`UDP_SEGMENT`) is in use (turns off at runtime on `EIO`).
    pub udp_gso: bool,
    /// UDP GRO (`UDP_GRO`) is enabled on the receive sockets.
    pub udp_gro: bool,
}

/// Errors of [`Engine::start`].
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The configuration is unusable.
    #[error("invalid engine config: {0}")]
    Config(&'static str),
    /// Creating the TUN device or its queues failed.
    #[error("cannot open tun device {name}")]
    Tun {
        /// Requested name.
        name: String,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Creating or binding a UDP socket failed.
    #[error("cannot bind udp socket {addr}")]
    Socket {
        /// Address.
        addr: SocketAddr,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
    /// Spawning a worker thread failed.
    #[error("cannot spawn worker thread")]
    Spawn(#[source] std::io::Error),
    /// A required tunnel TAP ([`TunnelTap::required`]) could not be opened.
    #[error("cannot open tunnel TAP {name}: {why}")]
    TunnelTap {
        /// The TAP's name.
        name: String,
        /// Why (the kernel's error, or the engine's reason).
        why: String,
    },
}

/// A running dataplane for one TUN device.
pub struct Engine {
    tun_name: String,
    port: u16,
    peers: Arc<ArcSwap<PeerTable>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    counters: Vec<Arc<Shared>>,
    offloads: OffloadState,
    udp_gso: Arc<AtomicBool>,
    /// WireGuard ids of public keys (control path only, see [`peers::WgIds`]).
    wg_ids: std::sync::Mutex<WgIds>,
    /// The anti-spoofing mode the workers read once per batch.
    anti_spoofing: Arc<antispoof::Mode>,
    /// The workers' poll-on window.
    spin: idle::Spin,
    /// The CPU sampler of the default latency mode (`spare.rs`).
    sampler: Option<JoinHandle<()>>,
    /// Why the default window stays closed for good, if it does.
    poll_window_off: Option<String>,
    /// Endpoint discovery (WireGuard, vxlan, flannel-UDP; `None` for IPIP).
    disco: Option<Arc<path::wg::disco::Discovery>>,
    /// The tunnel TAP, if asked for ([`EngineConfig::tunnel_tap`]).
    tunnel_tap: TunnelTapState,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("tun_name", &self.tun_name)
            .field("workers", &self.threads.len())
            .finish()
    }
}

impl Engine {
    /// Creates the TUN device (all queues), binds the sockets and starts the workers.
    /// The peer table starts empty.
    pub fn start(cfg: EngineConfig) -> Result<Engine, EngineError> {
        let b = builder::Builder::new(&cfg)?;
        match cfg.encap {
            Encap::WireGuard { port, private_key } => wg::start(b, port, private_key),
            Encap::Ipip => ipip::start(b),
            Encap::FlannelUdp { .. } | Encap::Vxlan { .. } => {
                let codec = udp::codec(cfg.encap, cfg.local_addr)?;
                udp::start(b, codec)
            }
        }
    }

    /// Switches the anti-spoofing mode (see [`antispoof`]); workers apply it
    /// from their next receive batch.
    pub fn set_anti_spoofing(&self, mode: AntiSpoofing) {
        self.anti_spoofing.set(mode);
    }

    /// The current anti-spoofing mode.
    pub fn anti_spoofing(&self) -> AntiSpoofing {
        self.anti_spoofing.get()
    }

    /// Replaces the peer table (atomically; traffic keeps flowing). WireGuard
    /// peers keep their sessions when their key, PSK and keepalive stay.
    pub fn set_peers(&self, peers: Vec<Peer>) {
        let mut ids = self.wg_ids.lock().unwrap_or_else(|p| p.into_inner());
        let mut table = PeerTable::with_ids(&peers, self.port, &mut ids);
        table.attach_counters(&self.peers.load(), self.counters.len());
        self.peers.store(Arc::new(table));
    }

    /// Per-peer counters of the current table, by subnet, in table order
    /// (WireGuard: with the peer's last handshake and our last initiation
    /// to it); `None` before a worker has started counting. Reads the
    /// counters; nothing is asked of the workers.
    pub fn peer_stats(&self) -> Option<Vec<(ipnet::IpNet, PeerStats)>> {
        if !stats::counts_peers(self.counters.iter().map(|c| &**c)) {
            return None;
        }
        let t = self.peers.load();
        Some(
            t.entries()
                .iter()
                .map(|e| (e.subnet, peer_sum(&t, e)))
                .collect(),
        )
    }

    /// Everything the engine counts, read at once: the totals, the offloads
    /// and each entry of the current peer table with its own counters (one
    /// pass over one table snapshot, so peers and counters always match).
    /// Reads the counters; nothing is asked of the workers.
    pub fn report(&self) -> Report {
        let blocks = || self.counters.iter().map(|c| &**c);
        let counting = stats::counts_peers(blocks());
        let t = self.peers.load();
        let peers = t
            .entries()
            .iter()
            .map(|e| PeerReport {
                subnet: e.subnet,
                endpoint: e.dst,
                stats: counting.then(|| peer_sum(&t, e)),
            })
            .collect();
        Report {
            stats: Stats::sum(blocks()),
            offloads: self.offloads(),
            peers,
        }
    }

    /// The current peer snapshot.
    pub fn peers(&self) -> Arc<PeerTable> {
        self.peers.load_full()
    }

    /// Counters summed over workers.
    pub fn stats(&self) -> Stats {
        Stats::sum(self.counters.iter().map(|c| &**c))
    }

    /// Active offloads.
    pub fn offloads(&self) -> OffloadState {
        OffloadState {
            udp_gso: self.udp_gso.load(Ordering::Relaxed),
            ..self.offloads
        }
    }

    /// Endpoint discovery (docs/nat.md): off until turned on; `None` for
    /// IPIP.
    pub fn discovery(&self) -> Option<&path::wg::disco::Discovery> {
        self.disco.as_deref()
    }

    /// The TUN device's name as the kernel reports it.
    pub fn tun_name(&self) -> &str {
        &self.tun_name
    }

    /// What the workers' poll-on window is doing (`WEFT_ENGINE_SPIN_US`).
    pub fn poll_window(&self) -> PollWindow {
        match &self.poll_window_off {
            Some(why) => PollWindow::Unavailable(why.clone()),
            None => self.spin.report(),
        }
    }

    /// Whether TCP super-packets go through a tunnel TAP, and if one was
    /// asked for and is not open, why.
    pub fn tunnel_tap(&self) -> &TunnelTapState {
        &self.tunnel_tap
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.threads.len()
    }

    /// Stops and joins the workers; the TUN device disappears with its last queue.
    pub fn stop(self) {
        drop(self);
    }
}

/// Entry `e`'s counters summed over workers (WireGuard: with the peer's
/// last handshake and our last initiation to it).
fn peer_sum(t: &PeerTable, e: &peers::Entry) -> PeerStats {
    let mut s = e.counters.sum();
    let w = e.wg.and_then(|i| t.wg_peers().get(i));
    s.last_handshake = w.and_then(|w| w.last_handshake());
    s.last_initiation = w.and_then(|w| w.last_initiation());
    s.last_heard = w.and_then(|w| w.last_heard());
    s.last_sent = w.and_then(|w| w.last_sent());
    s.current = w.and_then(|w| w.current_endpoint());
    s
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(s) = self.sampler.take() {
            s.thread().unpark();
            let _ = s.join();
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}
