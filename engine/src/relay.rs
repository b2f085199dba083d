//! The relay's socket and thread (docs/nat.md, "Relays"; the decisions are
//! [`crate::path::wg::relay`]): one UDP socket on the relay port, one
//! thread that receives a datagram, asks the [`Relay`] and sends it on
//! unchanged (or an ack back). One 64 KiB buffer, allocated once; the
//! cluster's keys are an `ArcSwap` load per datagram, the counters relaxed
//! atomic stores. A relay carries the control traffic of a handful of
//! pairs that could not punch, not a site's bulk: one thread is enough
//! (docs/nat.md has its measured throughput).

use std::io;
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;

use crate::path::wg::relay::{Relay, RelayStats, Verdict};
use crate::wire::disco::ACK_LEN;

/// How long a receive waits before looking at the stop flag.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Default)]
struct Shared {
    stop: AtomicBool,
    members: ArcSwap<Vec<[u8; 32]>>,
    forwarded: AtomicU64,
    bytes: AtomicU64,
    registered: AtomicU64,
    limited: AtomicU64,
    dropped: AtomicU64,
}

/// A running relay; stopped (and joined) when dropped.
#[derive(Debug)]
pub struct RelayServer {
    shared: Arc<Shared>,
    local: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

impl RelayServer {
    /// Binds `bind` and relays for the WireGuard key `secret`, limited to
    /// `mbit` Mbit/s (`None`: no limit).
    pub fn start(bind: SocketAddr, secret: [u8; 32], mbit: Option<u64>) -> io::Result<Self> {
        let sock = UdpSocket::bind(bind)?;
        sock.set_read_timeout(Some(POLL))?;
        let local = sock.local_addr()?;
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        let thread = std::thread::Builder::new()
            .name("weft-relay".into())
            .spawn(move || run(&sock, &s, Relay::new(secret, mbit, Instant::now())))?;
        Ok(RelayServer {
            shared,
            local,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The cluster's WireGuard keys: only they may register.
    pub fn set_members(&self, keys: Vec<[u8; 32]>) {
        self.shared.members.store(Arc::new(keys));
    }

    /// Its counters.
    pub fn stats(&self) -> RelayStats {
        self.counters().read()
    }

    /// A handle on the relay's counters (for `/metrics`: read without the
    /// backend).
    pub fn counters(&self) -> RelayCounters {
        RelayCounters(Arc::clone(&self.shared))
    }
}

/// The counters of a [`RelayServer`], readable from anywhere.
#[derive(Debug, Clone)]
pub struct RelayCounters(Arc<Shared>);

impl RelayCounters {
    /// The counters now.
    pub fn read(&self) -> RelayStats {
        let s = &self.0;
        RelayStats {
            forwarded: s.forwarded.load(Ordering::Relaxed),
            bytes: s.bytes.load(Ordering::Relaxed),
            registered: s.registered.load(Ordering::Relaxed),
            limited: s.limited.load(Ordering::Relaxed),
            dropped: s.dropped.load(Ordering::Relaxed),
        }
    }
}

impl Drop for RelayServer {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(sock: &UdpSocket, s: &Shared, mut relay: Relay) {
    let mut buf = vec![0u8; 65536];
    let mut ack = [0u8; ACK_LEN];
    while !s.stop.load(Ordering::Relaxed) {
        let (n, src) = match sock.recv_from(&mut buf) {
            Ok(r) => r,
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                tracing::warn!("relay: receive: {e}");
                std::thread::sleep(POLL);
                continue;
            }
        };
        let d = &buf[..n];
        let members = s.members.load();
        let sent = match relay.datagram(d, src, Instant::now(), &members, &mut ack) {
            Verdict::Forward(to) => sock.send_to(d, to),
            Verdict::Ack => sock.send_to(&ack, src),
            Verdict::Drop(_) => Ok(0),
        };
        if let Err(e) = sent {
            tracing::debug!("relay: send: {e}");
        }
        let st = relay.stats;
        s.forwarded.store(st.forwarded, Ordering::Relaxed);
        s.bytes.store(st.bytes, Ordering::Relaxed);
        s.registered.store(st.registered, Ordering::Relaxed);
        s.limited.store(st.limited, Ordering::Relaxed);
        s.dropped.store(st.dropped, Ordering::Relaxed);
    }
}
