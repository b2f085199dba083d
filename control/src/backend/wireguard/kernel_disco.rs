//! Endpoint discovery for the kernel WireGuard path (docs/nat.md, "Kernel
//! WireGuard"): the 0xd1 messages of [`weft_engine::wire::disco`], sent and
//! received **on the kernel device's own listen port** without a socket
//! bound to it, so a NAT maps a request exactly as it maps the device's
//! WireGuard traffic (same 5-tuple, same conntrack entry).
//!
//! - **Sending**: one raw `IPPROTO_UDP` socket (`IP_HDRINCL` off: the
//!   kernel builds the IPv4 header); weftd writes the UDP header itself,
//!   source port = the device's listen port, with the UDP checksum over the
//!   pseudo-header of the source address routing picks for the destination
//!   (a connected UDP socket's `getsockname`, no packet sent).
//! - **Receiving**: Linux hands a copy of every incoming UDP datagram to
//!   the raw sockets of protocol 17 before UDP delivers it
//!   (`ip_protocol_deliver_rcu` → `raw_local_deliver`); the kernel
//!   WireGuard socket then drops the 0xd1 datagram as an unknown message
//!   type. A classic BPF filter ([`filter`]) keeps only unfragmented
//!   datagrams to the listen port whose first payload byte is 0xd1, so weftd
//!   sees a few 48-byte datagrams a minute, never WireGuard's. The kernel
//!   still clones each incoming UDP datagram for the filter (one `skb_clone`
//!   and ~10 BPF instructions, only on a node with NAT traversal on).
//! - **Asking**: every [`SLOW`] once answered, [`FAST`](weft_engine::path::wg::disco::FAST) with the engine's
//!   [`backoff`] before (or when the last answer is older than three
//!   [`SLOW`]s), a fresh random nonce to at most [`MAX_SERVERS`] servers; an
//!   answer counts only with the outstanding nonce and from a server asked,
//!   and only changes what this node publishes ([`KernelDisco::seen`]).
//!   The engine's own round state (`path::wg::disco::Asker`) is private to
//!   the engine's worker; [`Rounds`] is its timing with the engine's public
//!   constants, without relays, probes or the stale-handshake hurry.
//! - **Answering**: any request gets a same-length answer naming its source,
//!   from the listen port (no state, no amplification), so a public node on
//!   the kernel path is a discovery server like one on the engine.
//!
//! Everything received is untrusted: [`parse_ipv4_udp`] and
//! [`Disco::parse`] check every length, and nothing here panics on input.
//! IPv4 only, as on the engine.

use std::io::Read;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use socket2::{Domain, Protocol, SockAddr, SockFilter, Socket, Type};
use weft_engine::path::wg::disco::{MAX_SERVERS, SLOW, backoff};
use weft_engine::wire::checksum;
use weft_engine::wire::disco::{Disco, FIRST, LEN};

/// Why discovery on the kernel path cannot run.
#[derive(Debug, thiserror::Error)]
pub enum KernelDiscoError {
    /// The raw UDP socket (needs `CAP_NET_RAW`).
    #[error("raw UDP socket for NAT discovery on port {port}: {source}")]
    Socket {
        /// The listen port it serves.
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Its thread.
    #[error("NAT discovery thread: {0}")]
    Thread(#[source] std::io::Error),
}

/// Why a received packet is not a datagram for us (never logged per packet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PacketError {
    /// Shorter than its headers say, or not IPv4 UDP.
    #[error("not an IPv4 UDP datagram")]
    Malformed,
    /// A fragment (the filter drops them; checked again here).
    #[error("a fragment")]
    Fragment,
    /// To another port.
    #[error("to another port")]
    OtherPort,
}

/// The UDP header's length.
const UDP_HDR: usize = 8;
/// How long the thread blocks in a read before it looks at its stop flag
/// and its round timer.
const TICK: Duration = Duration::from_millis(200);

/// The classic BPF program that keeps, of the IPv4 packets a raw UDP socket
/// sees (from the IPv4 header on), only unfragmented UDP datagrams to
/// `port` whose first payload byte is [`FIRST`] (0xd1); it returns 0
/// (drop) for everything else.
pub fn filter(port: u16) -> [SockFilter; 11] {
    const LD_B_ABS: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_ABS) as u16;
    const LD_H_ABS: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_ABS) as u16;
    const LD_H_IND: u16 = (libc::BPF_LD | libc::BPF_H | libc::BPF_IND) as u16;
    const LD_B_IND: u16 = (libc::BPF_LD | libc::BPF_B | libc::BPF_IND) as u16;
    const LDX_MSH: u16 = (libc::BPF_LDX | libc::BPF_B | libc::BPF_MSH) as u16;
    const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
    const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
    const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
    // A jump goes to pc + 1 + offset: 9 keeps, 10 drops.
    [
        // 0: protocol == UDP (the socket's protocol; checked anyway)
        SockFilter::new(LD_B_ABS, 0, 0, 9),
        SockFilter::new(JEQ, 0, 8, libc::IPPROTO_UDP as u32),
        // 2: no fragment offset, no more-fragments flag
        SockFilter::new(LD_H_ABS, 0, 0, 6),
        SockFilter::new(JSET, 6, 0, 0x3fff),
        // 4: X = the IPv4 header's length
        SockFilter::new(LDX_MSH, 0, 0, 0),
        // 5: UDP destination port
        SockFilter::new(LD_H_IND, 0, 0, 2),
        SockFilter::new(JEQ, 0, 3, u32::from(port)),
        // 7: the first payload byte
        SockFilter::new(LD_B_IND, 0, 0, UDP_HDR as u32),
        SockFilter::new(JEQ, 0, 1, u32::from(FIRST)),
        // 9: keep (the whole packet), 10: drop
        SockFilter::new(RET, 0, 0, 0xffff),
        SockFilter::new(RET, 0, 0, 0),
    ]
}

/// Parses a packet a raw IPv4 socket received (IPv4 header first): its
/// source and UDP payload, when it is an unfragmented UDP datagram to
/// `port`.
pub fn parse_ipv4_udp(p: &[u8], port: u16) -> Result<(SocketAddrV4, &[u8]), PacketError> {
    let first = *p.first().ok_or(PacketError::Malformed)?;
    let ihl = usize::from(first & 0x0f) * 4;
    if first >> 4 != 4 || ihl < 20 || p.len() < ihl + UDP_HDR || p[9] != 17 {
        return Err(PacketError::Malformed);
    }
    let total = usize::from(u16::from_be_bytes([p[2], p[3]]));
    if total < ihl + UDP_HDR || total > p.len() {
        return Err(PacketError::Malformed);
    }
    if u16::from_be_bytes([p[6], p[7]]) & 0x3fff != 0 {
        return Err(PacketError::Fragment);
    }
    let udp = &p[ihl..total];
    let dport = u16::from_be_bytes([udp[2], udp[3]]);
    if dport != port {
        return Err(PacketError::OtherPort);
    }
    let ulen = usize::from(u16::from_be_bytes([udp[4], udp[5]]));
    if ulen < UDP_HDR || ulen > udp.len() {
        return Err(PacketError::Malformed);
    }
    let src = SocketAddrV4::new(
        Ipv4Addr::new(p[12], p[13], p[14], p[15]),
        u16::from_be_bytes([udp[0], udp[1]]),
    );
    Ok((src, &udp[UDP_HDR..ulen]))
}

/// Writes a UDP datagram `src` → `dst` carrying `payload` (header and
/// checksum, RFC 768) to the start of `out`; its length, `None` when `out`
/// is too short.
pub fn udp_datagram(
    src: SocketAddrV4,
    dst: SocketAddrV4,
    payload: &[u8],
    out: &mut [u8],
) -> Option<usize> {
    let len = UDP_HDR + payload.len();
    let len16 = u16::try_from(len).ok()?;
    let out = out.get_mut(..len)?;
    out[0..2].copy_from_slice(&src.port().to_be_bytes());
    out[2..4].copy_from_slice(&dst.port().to_be_bytes());
    out[4..6].copy_from_slice(&len16.to_be_bytes());
    out[6..8].fill(0);
    out[UDP_HDR..].copy_from_slice(payload);
    let pseudo = checksum::pseudo_v4(&src.ip().octets(), &dst.ip().octets(), 17, u32::from(len16));
    let c = checksum::finish(checksum::combine(pseudo, checksum::sum(out)));
    // 0 means "no checksum" in UDP over IPv4: a computed 0 goes as 0xffff.
    let c = if c == 0 { 0xffff } else { c };
    out[6..8].copy_from_slice(&c.to_be_bytes());
    Some(len)
}

/// When to ask: the engine's discovery rounds (see the module docs).
#[derive(Debug)]
pub struct Rounds {
    nonce: Option<[u8; 16]>,
    next: Instant,
    last_answer: Option<Instant>,
    answered: bool,
    unanswered: u32,
    sent: bool,
}

impl Rounds {
    /// The first round is due at `now`.
    pub fn new(now: Instant) -> Rounds {
        Rounds {
            nonce: None,
            next: now,
            last_answer: None,
            answered: false,
            unanswered: 0,
            sent: false,
        }
    }

    /// Whether a round is due.
    pub fn due(&self, now: Instant) -> bool {
        now >= self.next
    }

    /// When the next round is due.
    pub fn next(&self) -> Instant {
        self.next
    }

    /// Starts a round at `now` with `nonce`, asking anyone (`asking`).
    pub fn start(&mut self, now: Instant, nonce: [u8; 16], asking: bool) {
        if self.sent && !self.answered {
            self.unanswered = self.unanswered.saturating_add(1);
        }
        let fresh = self
            .last_answer
            .is_some_and(|t| now.saturating_duration_since(t) < 3 * SLOW);
        self.next = now
            + if fresh {
                SLOW
            } else {
                backoff(self.unanswered)
            };
        self.nonce = Some(nonce);
        self.answered = false;
        self.sent = asking;
    }

    /// An answer with `nonce` from a server asked (`from_server`) at `now`:
    /// whether it counts.
    pub fn answer(&mut self, nonce: [u8; 16], from_server: bool, now: Instant) -> bool {
        if self.nonce != Some(nonce) || !from_server {
            return false;
        }
        self.last_answer = Some(now);
        self.answered = true;
        self.unanswered = 0;
        self.next = now + SLOW;
        true
    }
}

/// What the thread and the backend share.
#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    servers: Mutex<Vec<SocketAddrV4>>,
    seen: Mutex<Option<SocketAddrV4>>,
    answered: AtomicU64,
    /// Bumped when the servers change: a new list is asked at once.
    generation: AtomicU64,
}

impl Shared {
    fn servers(&self) -> Vec<SocketAddrV4> {
        self.servers.lock().map(|s| s.clone()).unwrap_or_default()
    }

    fn seen(&self) -> Option<SocketAddrV4> {
        self.seen.lock().ok().and_then(|s| *s)
    }
}

/// Discovery on a kernel device's port: a thread with one raw UDP socket
/// (see the module docs). Dropping it stops the thread (within 200 ms).
#[derive(Debug)]
pub struct KernelDisco {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

/// [`KernelDisco`] as a device of the backend view: the endpoint this node
/// was seen from (what the main loop publishes, `daemon::nat`).
#[derive(Debug)]
struct SeenProbe(Arc<Shared>);

impl crate::view::DeviceProbe for SeenProbe {
    fn report(&self, _: &mut crate::view::model::BackendStatus) {}

    fn nat_seen(&self) -> Option<SocketAddrV4> {
        self.0.seen()
    }
}

/// Opens the raw UDP socket with [`filter`] for `port`, then drops what
/// queued before the filter was on.
pub fn open(port: u16) -> std::io::Result<Socket> {
    let s = Socket::new(
        Domain::IPV4,
        Type::RAW.cloexec(),
        Some(Protocol::from(libc::IPPROTO_UDP)),
    )?;
    s.attach_filter(&filter(port))?;
    s.set_nonblocking(true)?;
    let mut b = [0u8; 64];
    while (&s).read(&mut b).is_ok() {}
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(TICK))?;
    Ok(s)
}

/// The source address routing picks toward `dst` (no packet is sent).
fn source_for(dst: SocketAddrV4) -> std::io::Result<Ipv4Addr> {
    let u = UdpSocket::bind("0.0.0.0:0")?;
    u.connect(dst)?;
    match u.local_addr()?.ip() {
        IpAddr::V4(a) => Ok(a),
        IpAddr::V6(_) => Err(std::io::ErrorKind::InvalidData.into()),
    }
}

/// Sends `msg` to `dst` from `port` through the raw socket `s`.
pub fn send(s: &Socket, port: u16, dst: SocketAddrV4, msg: &Disco) -> std::io::Result<()> {
    let mut payload = [0u8; LEN];
    let n = msg
        .write(&mut payload)
        .ok_or(std::io::ErrorKind::InvalidInput)?;
    let src = SocketAddrV4::new(source_for(dst)?, port);
    let mut out = [0u8; UDP_HDR + LEN];
    let len =
        udp_datagram(src, dst, &payload[..n], &mut out).ok_or(std::io::ErrorKind::InvalidInput)?;
    let to = SockAddr::from(SocketAddr::V4(SocketAddrV4::new(*dst.ip(), 0)));
    s.send_to(&out[..len], &to)?;
    Ok(())
}

impl KernelDisco {
    /// Starts discovery on listen port `port` (no servers yet: it answers).
    pub fn start(port: u16) -> Result<KernelDisco, KernelDiscoError> {
        let sock = open(port).map_err(|source| KernelDiscoError::Socket { port, source })?;
        let shared = Arc::new(Shared::default());
        let sh = shared.clone();
        let thread = std::thread::Builder::new()
            .name("weft-nat-disco".into())
            .spawn(move || run(&sock, port, &sh))
            .map_err(KernelDiscoError::Thread)?;
        Ok(KernelDisco {
            shared,
            thread: Some(thread),
        })
    }

    /// The servers to ask (IPv4 ones are kept, at most [`MAX_SERVERS`]
    /// asked); a changed list is asked at once.
    pub fn set_servers(&self, servers: &[SocketAddr]) {
        let v4: Vec<SocketAddrV4> = servers
            .iter()
            .filter_map(|s| match s {
                SocketAddr::V4(a) => Some(*a),
                SocketAddr::V6(_) => None,
            })
            .collect();
        if let Ok(mut s) = self.shared.servers.lock()
            && *s != v4
        {
            *s = v4;
            self.shared.generation.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The endpoint this node was last seen from.
    pub fn seen(&self) -> Option<SocketAddrV4> {
        self.shared.seen()
    }

    /// Requests answered (this node as a server).
    pub fn answered(&self) -> u64 {
        self.shared.answered.load(Ordering::Relaxed)
    }

    /// The view's device for it: it reports the endpoint this node was seen from.
    pub fn probe(&self) -> Arc<dyn crate::view::DeviceProbe> {
        Arc::new(SeenProbe(self.shared.clone()))
    }
}

impl Drop for KernelDisco {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread: rounds, answers and requests until stopped.
fn run(s: &Socket, port: u16, sh: &Shared) {
    let mut rounds = Rounds::new(Instant::now());
    let mut generation = sh.generation.load(Ordering::Relaxed);
    let mut buf = [0u8; 2048];
    let mut warned = false;
    while !sh.stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let g = sh.generation.load(Ordering::Relaxed);
        if rounds.due(now) || g != generation {
            if g != generation {
                generation = g;
                rounds = Rounds::new(now);
            }
            let servers = sh.servers();
            let nonce: [u8; 16] = rand::random();
            rounds.start(now, nonce, !servers.is_empty());
            for to in servers.iter().take(MAX_SERVERS) {
                if let Err(e) = send(s, port, *to, &Disco::Request { nonce })
                    && !std::mem::replace(&mut warned, true)
                {
                    tracing::warn!("NAT: discovery request to {to} not sent: {e}");
                }
            }
        }
        let n = match (&*s).read(&mut buf) {
            Ok(n) => n,
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock
                        | std::io::ErrorKind::TimedOut
                        | std::io::ErrorKind::Interrupted
                ) =>
            {
                continue;
            }
            Err(e) => {
                tracing::warn!("NAT: discovery socket: {e}");
                std::thread::sleep(TICK);
                continue;
            }
        };
        let Ok((src, payload)) = parse_ipv4_udp(&buf[..n.min(buf.len())], port) else {
            continue;
        };
        match Disco::parse(payload) {
            Ok(Disco::Request { nonce }) => {
                let answer = Disco::Answer {
                    nonce,
                    seen: SocketAddr::V4(src),
                };
                match send(s, port, src, &answer) {
                    Ok(()) => {
                        sh.answered.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(e) => tracing::debug!("NAT: discovery answer to {src}: {e}"),
                }
            }
            Ok(Disco::Answer { nonce, seen }) => {
                let asked = sh.servers().contains(&src);
                if rounds.answer(nonce, asked, Instant::now())
                    && let SocketAddr::V4(v4) = seen
                    && let Ok(mut s) = sh.seen.lock()
                {
                    *s = Some(v4);
                }
            }
            Err(_) => {}
        }
    }
}

#[cfg(test)]
#[path = "kernel_disco_tests.rs"]
mod tests;
