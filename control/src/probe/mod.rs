//! weftd's overlay prober: per-peer reachability and round-trip time,
//! measured through the encapsulation on every dataplane.
//!
//! One UDP socket bound to the node's overlay address (the first address
//! of its own subnet, e.g. `10.244.1.0`, which the flannel device or TUN
//! holds) on `--probe-port` ([`DEFAULT_PORT`]) both probes the peers (each
//! peer's overlay address, so a probe is routed into the overlay and
//! crosses the tunnel like pod traffic: kernel vxlan, the engine's
//! udp/vxlan/WireGuard/IPIP) and answers their probes. The rules are in
//! [`table`] (one probe per peer every ~5 s with jitter, unreachable after
//! three consecutive losses), the wire format in [`wire`] (versioned,
//! parsed as untrusted input); docs/probes.md has the rate and bytes on
//! the wire.
//!
//! Invariants: the prober is its own task, never on the engine's data path
//! and never in weftd's main loop: it reads the latest
//! [`DaemonView`](crate::view::DaemonView) (own lease, peers) and publishes
//! a [`ProbeView`] at most once a second; nobody waits for it. It answers
//! only probes from a known peer's overlay address, with an ack no larger
//! than the probe. A node whose overlay address is not local (host-gw,
//! alloc: no device holds it) keeps trying to bind every 5 s and publishes
//! nothing, so its peers show no verdict rather than a false one.

pub mod pmtu;
pub mod routes;
pub mod table;
pub mod wire;

use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipnet::Ipv4Net;
use tokio::net::UdpSocket;

use crate::view::{Observer, ProbePublisher, ProbeView};

/// The default probe port (UDP; next to flannel's 8472 for vxlan).
pub const DEFAULT_PORT: u16 = 8475;
/// How often an unbound prober retries its bind.
const BIND_RETRY: Duration = Duration::from_secs(5);
/// How often the published view is refreshed at most.
const PUBLISH_EVERY: Duration = Duration::from_secs(1);
/// The shortest time between two scans of the table for due probes.
const DUE_SCAN: Duration = Duration::from_millis(100);
/// The largest datagram read (probes are 24 bytes; PMTU probes larger).
const RECV_BUF: usize = 9216;

/// The running prober; dropping it stops the task.
#[derive(Debug)]
pub struct Prober(tokio::task::JoinHandle<()>);

impl Drop for Prober {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts the prober on `port` (`None` when 0: probing off); path-MTU
/// searches go up to `mtu`, the overlay MTU; `route_mtu`: lower a peer's
/// route MTU to its path MTU ([`routes`]).
pub fn spawn(
    port: u16,
    mtu: u32,
    route_mtu: bool,
    observer: Observer,
    out: ProbePublisher,
) -> Option<Prober> {
    if port == 0 {
        tracing::info!("overlay probes off (--probe-port=0)");
        return None;
    }
    let mtu = mtu.min(RECV_BUF as u32);
    let routes = route_mtu.then(|| routes::RouteMtus::new(mtu));
    Some(Prober(tokio::spawn(run(port, mtu, routes, observer, out))))
}

/// The peer leases of one snapshot (compared by pointer: the main loop
/// publishes a new slice only when the lease set changes).
type Peers = Arc<[Arc<crate::lease::Lease>]>;

/// The own overlay address and the peer leases, from the latest snapshot.
fn targets(observer: &Observer) -> (Option<Ipv4Addr>, Option<Peers>) {
    let Some(d) = observer.daemon() else {
        return (None, None);
    };
    let own = d.lease.as_ref().and_then(|l| l.subnet);
    (own.map(|s| s.network()), Some(d.peers))
}

/// The subnets to probe: every peer's IPv4 subnet but the own.
fn subnets(peers: &Peers, own: Option<Ipv4Addr>) -> impl Iterator<Item = Ipv4Net> + '_ {
    peers
        .iter()
        .filter_map(|l| l.subnet)
        .filter(move |s| Some(s.network()) != own)
}

fn bind(addr: Ipv4Addr, port: u16) -> std::io::Result<UdpSocket> {
    let s = std::net::UdpSocket::bind(SocketAddrV4::new(addr, port))?;
    s.set_nonblocking(true)?;
    {
        use std::os::fd::AsRawFd;
        weft_engine::set_pmtu_probe(s.as_raw_fd())?;
    }
    UdpSocket::from_std(s)
}

async fn recv(sock: &Option<UdpSocket>, buf: &mut [u8]) -> std::io::Result<(usize, SocketAddr)> {
    match sock {
        Some(s) => s.recv_from(buf).await,
        None => std::future::pending().await,
    }
}

async fn run(
    port: u16,
    mtu: u32,
    mut routes: Option<routes::RouteMtus>,
    observer: Observer,
    out: ProbePublisher,
) {
    let start = Instant::now();
    let now = || u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
    let seed = u64::from(std::process::id()) ^ now().rotate_left(32);
    let mut t = table::Table::new(seed, mtu);
    let mut sock: Option<UdpSocket> = None;
    let mut bound: Option<Ipv4Addr> = None;
    let mut next_bind = start;
    let mut published = start;
    let mut buf = vec![0u8; RECV_BUF];
    let mut logged = false;
    let mut synced: Option<Peers> = None;
    let mut due_at = start;
    loop {
        let (own, peers) = targets(&observer);
        if own != bound {
            sock = None;
            bound = None;
        }
        if sock.is_none()
            && let Some(addr) = own
            && Instant::now() >= next_bind
        {
            match bind(addr, port) {
                Ok(s) => {
                    tracing::info!("overlay probes on {addr}:{port}");
                    sock = Some(s);
                    bound = Some(addr);
                }
                Err(e) => {
                    if !logged {
                        tracing::info!("overlay probes wait for {addr}:{port} ({e})");
                        logged = true;
                    }
                    next_bind = Instant::now() + BIND_RETRY;
                }
            }
        }
        if let (Some(_), Some(peers)) = (&sock, &peers)
            && !synced.as_ref().is_some_and(|p| Arc::ptr_eq(p, peers))
        {
            t.sync(subnets(peers, own), now());
            synced = Some(peers.clone());
        }
        if let Some(s) = &sock
            && Instant::now() >= due_at
        {
            // One scan of the table per DUE_SCAN at most, so that 5,000
            // peers (1,000 probes/s) cost 10 scans a second, not one per probe.
            due_at = Instant::now() + DUE_SCAN;
            for p in t.due(now()) {
                let Some(room) = buf.get_mut(..p.len) else {
                    continue;
                };
                if let Some(n) = p.msg.write(room) {
                    // A failed send (EMSGSIZE included) is a loss, found by the timeout.
                    let _ = s.try_send_to(&buf[..n], SocketAddrV4::new(p.dst, port).into());
                }
            }
            if published.elapsed() >= PUBLISH_EVERY {
                let report = t.report();
                if let Some(r) = &mut routes {
                    r.apply(&report).await;
                }
                out.publish(ProbeView::from(Arc::new(report)));
                published = Instant::now();
            }
        }
        let wait = t
            .next_wake()
            .map_or(PUBLISH_EVERY, |w| {
                Duration::from_nanos(w.saturating_sub(now()))
            })
            .clamp(
                due_at.saturating_duration_since(Instant::now()),
                PUBLISH_EVERY,
            );
        tokio::select! {
            r = recv(&sock, &mut buf) => match r {
                Ok((n, SocketAddr::V4(from))) => {
                    let known = t.knows(*from.ip());
                    if let (true, Ok(m), Some(s)) = (known, wire::Msg::parse(&buf[..n]), &sock) {
                        match m.kind {
                            wire::Kind::Probe => {
                                let mut ack = [0u8; wire::HEADER];
                                if let Some(k) = m.ack(n).write(&mut ack) {
                                    let _ = s.try_send_to(&ack[..k], from.into());
                                }
                            }
                            wire::Kind::Ack { .. } => {
                                t.ack(*from.ip(), &m, now());
                            }
                        }
                    }
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::debug!("overlay probes: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            () = tokio::time::sleep(wait) => {}
        }
    }
}
