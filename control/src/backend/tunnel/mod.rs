//! The userspace tunnel shared by the engine-backed backends (flannel-UDP,
//! userspace VXLAN, WireGuard and IPIP): one engine per TUN device, the
//! device's address, MTU and routes over netlink, and the engine's peer
//! table kept in step with the lease changes.
//!
//! The engine only ever sees a complete new peer table
//! ([`TunnelEngine::set_peers`]); it never waits on this code.
//!
//! The engine and netlink sit behind [`Userspace`]: the real
//! `weft_engine::Engine` and kernel netlink in weftd, a recording
//! [`fake::FakeEngines`] and [`crate::netlink::FakeNetlink`] in unit tests,
//! so every userspace backend's lease → peer translation is tested without
//! root (as the kernel backends are with the fake netlink alone).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use ipnet::IpNet;
use weft_engine::path::wg::direct::Direct;
use weft_engine::path::wg::disco::Registration;
use weft_engine::{AntiSpoofing, Engine, EngineConfig, Peer, PeerStats};

use super::BackendError;
use crate::netlink::{Client, Route};
use crate::view::{BackendView, Dataplane, DeviceProbe, TunnelGsoStatus, devices::EngineProbe};

/// The engine under a [`Tunnel`].
pub trait TunnelEngine: Send + Sync {
    /// The TUN device's name.
    fn tun_name(&self) -> &str;
    /// Replaces the peer table.
    fn set_peers(&self, peers: Vec<Peer>);
    /// Per-peer counters, when the engine keeps them.
    fn peer_stats(&self) -> Option<Vec<(IpNet, PeerStats)>>;
    /// The device and its peer table as readers see them: a probe that
    /// reads the engine's counters without asking the backend (see
    /// [`crate::view`]).
    fn probe(&self) -> Arc<dyn DeviceProbe>;
    /// One line for the log: workers, anti-spoofing, offloads.
    fn describe(&self) -> String;
    /// Whether the engine writes through a tunnel TAP (`--tunnel-gso`).
    fn tunnel_tap(&self) -> weft_engine::TunnelTapState {
        weft_engine::TunnelTapState::NotAsked
    }
    /// WireGuard's endpoint discovery on or off, and the peers it asks
    /// (docs/nat.md); engines without it ignore this.
    fn set_discovery(&self, _on: bool, _servers: Vec<SocketAddr>) {}
    /// The endpoint discovery last saw this node from.
    fn seen(&self) -> Option<SocketAddrV4> {
        None
    }
    /// The relays to register with (docs/nat.md "Relays").
    fn set_relays(&self, _relays: Vec<Registration>) {}
    /// When the relay at `to` last acknowledged a registration.
    fn relay_ack(&self, _to: SocketAddr) -> Option<SystemTime> {
        None
    }
    /// The engine's direct probes (docs/nat.md "Back to direct").
    fn direct(&self) -> Option<&Direct> {
        None
    }
    /// Stops the workers and joins them (blocking: [`Tunnel::stop`] runs it
    /// on a blocking thread); the TUN device goes with them.
    fn stop(self: Box<Self>);
}

/// Starts engines: [`RealEngines`] in weftd.
pub trait StartEngine: Send + Sync {
    /// Starts an engine for `cfg` (which creates the TUN) in anti-spoofing mode `anti`.
    fn start(
        &self,
        cfg: EngineConfig,
        anti: AntiSpoofing,
    ) -> Result<Box<dyn TunnelEngine>, BackendError>;
}

/// What the userspace backends run on: engines and the netlink that
/// configures their devices.
#[derive(Clone)]
pub struct Userspace {
    /// Device addresses, MTU and routes.
    pub nl: Arc<dyn Client>,
    /// The engine starter.
    pub engines: Arc<dyn StartEngine>,
}

impl std::fmt::Debug for Userspace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Userspace").finish_non_exhaustive()
    }
}

/// `weft_engine::Engine`.
#[derive(Debug, Clone, Copy)]
pub struct RealEngines;

impl StartEngine for RealEngines {
    fn start(
        &self,
        cfg: EngineConfig,
        anti: AntiSpoofing,
    ) -> Result<Box<dyn TunnelEngine>, BackendError> {
        let engine = Engine::start(cfg).map_err(BackendError::Engine)?;
        engine.set_anti_spoofing(anti);
        Ok(Box::new(Shared(Arc::new(engine))))
    }
}

/// A real engine, shared with status readers through weak references
/// ([`EngineProbe`]): the backend holds the only strong one, so a stop
/// waits out at most a report in progress and then joins the workers.
struct Shared(Arc<Engine>);

/// How long a stop waits for readers' reports in progress (a report of
/// 5,000 peers takes about a millisecond).
const REPORT_WAIT: Duration = Duration::from_secs(1);

impl TunnelEngine for Shared {
    fn tun_name(&self) -> &str {
        self.0.tun_name()
    }
    fn set_peers(&self, peers: Vec<Peer>) {
        self.0.set_peers(peers);
    }
    fn peer_stats(&self) -> Option<Vec<(IpNet, PeerStats)>> {
        self.0.peer_stats()
    }
    fn probe(&self) -> Arc<dyn DeviceProbe> {
        Arc::new(EngineProbe(Arc::downgrade(&self.0)))
    }
    fn set_discovery(&self, on: bool, servers: Vec<SocketAddr>) {
        if let Some(d) = self.0.discovery() {
            d.set_servers(servers);
            d.set_enabled(on);
        }
    }
    fn seen(&self) -> Option<SocketAddrV4> {
        self.0.discovery()?.seen().map(|(a, _)| a)
    }
    fn set_relays(&self, relays: Vec<Registration>) {
        if let Some(d) = self.0.discovery() {
            d.set_relays(relays);
        }
    }
    fn relay_ack(&self, to: SocketAddr) -> Option<SystemTime> {
        self.0.discovery()?.relay_ack(to)
    }
    fn direct(&self) -> Option<&Direct> {
        self.0.discovery().map(|d| &d.direct)
    }
    fn tunnel_tap(&self) -> weft_engine::TunnelTapState {
        self.0.tunnel_tap().clone()
    }
    fn describe(&self) -> String {
        let e = &self.0;
        let o = e.offloads();
        format!(
            "{} workers, anti-spoofing {}, poll-on window {}, offloads: tun vnet_hdr={} tso={} uso={} csum={}, udp gso={} gro={}",
            e.workers(),
            e.anti_spoofing(),
            e.poll_window(),
            o.tun_vnet_hdr,
            o.tun_tso,
            o.tun_uso,
            o.tun_csum,
            o.udp_gso,
            o.udp_gro
        )
    }
    fn stop(self: Box<Self>) {
        let mut engine = self.0;
        let since = Instant::now();
        loop {
            match Arc::try_unwrap(engine) {
                Ok(e) => return e.stop(),
                // A reader is summing the counters: it lets go within a millisecond.
                Err(e) if since.elapsed() < REPORT_WAIT => {
                    engine = e;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => {
                    tracing::warn!(
                        "engine on {}: a status reader held it for {REPORT_WAIT:?}; it stops when the reader lets go",
                        e.tun_name()
                    );
                    return;
                }
            }
        }
    }
}

/// A running engine with its TUN device configured.
pub struct Tunnel {
    /// Peers changed since the last flush.
    dirty: bool,
    engine: Option<Box<dyn TunnelEngine>>,
    nl: Arc<dyn Client>,
    index: u32,
    peers: BTreeMap<IpNet, Peer>,
    /// Routes this tunnel owns (re-added by `reconcile` if they go missing).
    routes: BTreeMap<IpNet, Route>,
    /// Peers already reported for packets from an unexpected outer source.
    warned: BTreeSet<IpNet>,
    /// The tunnel TAP as status shows it (`--tunnel-gso`; vxlan over IPv4).
    gso: Option<TunnelGsoStatus>,
}

impl std::fmt::Debug for Tunnel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tunnel")
            .field("index", &self.index)
            .field("peers", &self.peers.len())
            .finish_non_exhaustive()
    }
}

impl Tunnel {
    /// Starts the engine (which creates the TUN) in anti-spoofing mode
    /// `anti`, then gives the device `addr` (a /32 or /128), `mtu`, and sets
    /// it up.
    pub async fn start(
        us: &Userspace,
        cfg: EngineConfig,
        addr: IpNet,
        mtu: u32,
        anti: AntiSpoofing,
    ) -> Result<Tunnel, BackendError> {
        let engine = us.engines.start(cfg, anti)?;
        let name = engine.tun_name().to_string();
        let nl = &us.nl;
        // One RTM_GETLINK by name, not a dump of every link: this runs while
        // a dataplane switch has the node cut off.
        let link = nl
            .link_detail(&name)
            .await?
            .ok_or_else(|| BackendError::TunVanished(name.clone()))?
            .link;
        nl.link_up(link.index, Some(mtu)).await?;
        nl.add_addr(link.index, addr).await?;
        tracing::info!("userspace engine on {name}: {}", engine.describe());
        Ok(Tunnel {
            dirty: false,
            engine: Some(engine),
            nl: nl.clone(),
            index: link.index,
            peers: BTreeMap::new(),
            routes: BTreeMap::new(),
            warned: BTreeSet::new(),
            gso: None,
        })
    }

    /// The TUN device's interface index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The TUN device's name.
    pub fn name(&self) -> &str {
        self.engine.as_ref().map_or("", |e| e.tun_name())
    }

    /// `ip route replace DST dev <tun>` (scope link unless `universe`), remembered for reconcile.
    pub async fn add_route(&mut self, dst: IpNet, universe: bool) -> Result<(), BackendError> {
        let r = Route {
            dst,
            gateway: None,
            oif: Some(self.index),
            onlink: false,
            scope_link: !universe,
        };
        self.nl.route_replace(&r).await?;
        self.routes.insert(dst, r);
        Ok(())
    }

    /// Removes a route added with [`Tunnel::add_route`].
    pub async fn del_route(&mut self, dst: IpNet) -> Result<(), BackendError> {
        if let Some(r) = self.routes.remove(&dst) {
            self.nl.route_del(&r).await?;
        }
        Ok(())
    }

    /// Adds or replaces a peer; the engine gets it at the next [`Tunnel::flush`].
    pub fn upsert_peer(&mut self, subnet: IpNet, endpoint: IpAddr, vtep_mac: Option<[u8; 6]>) {
        self.peers.insert(
            subnet,
            Peer {
                subnet,
                endpoint,
                vtep_mac,
                wireguard: None,
                nat: None,
                tunnel_gso: false,
            },
        );
        self.dirty = true;
    }

    /// Sets the NAT path of the peer with `subnet` (docs/nat.md, "vxlan and
    /// udp"; `None`: as without NAT traversal); the engine gets it at the
    /// next [`Tunnel::flush`].
    pub fn set_nat(&mut self, subnet: IpNet, nat: Option<weft_engine::NatPath>) {
        if let Some(p) = self.peers.get_mut(&subnet)
            && p.nat != nat
        {
            p.nat = nat;
            self.dirty = true;
        }
    }

    /// Marks the peer with `subnet` as taking UDP-tunnel GSO datagrams
    /// whole (its lease's `WeftGSO`; [`weft_engine::Peer::tunnel_gso`]);
    /// the engine gets it at the next [`Tunnel::flush`].
    pub fn set_peer_tunnel_gso(&mut self, subnet: IpNet, on: bool) {
        if let Some(p) = self.peers.get_mut(&subnet)
            && p.tunnel_gso != on
        {
            p.tunnel_gso = on;
            self.dirty = true;
        }
    }

    /// Adds or replaces a peer given in full (WireGuard peers carry keys).
    pub fn upsert(&mut self, peer: Peer) {
        self.peers.insert(peer.subnet, peer);
        self.dirty = true;
    }

    /// Removes a peer (if present); the engine forgets it at the next flush.
    pub fn remove_peer(&mut self, subnet: IpNet) {
        if self.peers.remove(&subnet).is_some() {
            self.dirty = true;
        }
    }

    /// Hands the engine the new peer table if anything changed since the
    /// last flush: one table build per batch of lease changes instead of one
    /// per peer (a 5,000-lease snapshot would otherwise be O(N²)).
    pub fn flush(&mut self) {
        if std::mem::take(&mut self.dirty)
            && let Some(e) = &self.engine
        {
            e.set_peers(self.peers.values().cloned().collect());
        }
    }

    /// Re-adds routes that went missing; reports a deleted TUN device as
    /// [`BackendError::DeviceGone`] (its queues are dead: only a new engine
    /// helps). Also flushes peer changes a caller left pending.
    pub async fn reconcile(&mut self) -> Result<(), BackendError> {
        self.flush();
        let name = self.name().to_string();
        if self
            .nl
            .link_detail(&name)
            .await?
            .is_none_or(|l| l.link.index != self.index)
        {
            return Err(BackendError::DeviceGone(name));
        }
        recover_routes(&*self.nl, self.routes.values()).await?;
        self.warn_unexpected_sources();
        Ok(())
    }

    /// Logs, once per peer, that the engine delivered packets from the
    /// peer's subnet that came from another outer source than the peer's
    /// published address (anti-spoofing `subnet`), and how to fix it.
    fn warn_unexpected_sources(&mut self) {
        let Some(e) = &self.engine else { return };
        let Some(stats) = e.peer_stats() else { return };
        for (subnet, s) in stats {
            if s.unexpected_source == 0 || !self.warned.insert(subnet) {
                continue;
            }
            let published = self.peers.get(&subnet).map(|p| p.endpoint);
            tracing::warn!(
                "{}",
                unexpected_source_message(subnet, published, s.unexpected_from)
            );
        }
        // A peer that left and comes back is reported again.
        let peers = &self.peers;
        self.warned.retain(|s| peers.contains_key(s));
    }

    /// Stops the engine (joining its workers on a blocking thread, never on
    /// the runtime's); closing the TUN removes the device and its routes.
    pub async fn stop(&mut self) {
        if let Some(e) = self.engine.take() {
            let name = e.tun_name().to_string();
            if let Err(err) = tokio::task::spawn_blocking(move || e.stop()).await {
                tracing::warn!("stopping the engine on {name}: {err}");
            }
        }
    }

    /// This tunnel's device as readers see it (counters read from the
    /// engine's per-worker blocks; see [`crate::view::devices`]), with its
    /// tunnel TAP when [`Tunnel::set_tunnel_gso`] gave one.
    pub fn probe(&self) -> Option<Arc<dyn DeviceProbe>> {
        let p = self.engine.as_ref()?.probe();
        Some(match &self.gso {
            Some(g) => Arc::new(WithGso(p, g.clone())),
            None => p,
        })
    }

    /// Whether the engine writes through a tunnel TAP.
    pub fn tunnel_tap(&self) -> weft_engine::TunnelTapState {
        self.engine
            .as_ref()
            .map_or(weft_engine::TunnelTapState::NotAsked, |e| e.tunnel_tap())
    }

    /// What status shows of the tunnel TAP from now on.
    pub fn set_tunnel_gso(&mut self, gso: TunnelGsoStatus) {
        self.gso = Some(gso);
    }

    /// Turns the engine's endpoint discovery on or off, asking `servers`.
    pub fn set_discovery(&self, on: bool, servers: Vec<SocketAddr>) {
        if let Some(e) = &self.engine {
            e.set_discovery(on, servers);
        }
    }

    /// The endpoint discovery last saw this node from.
    pub fn seen(&self) -> Option<SocketAddrV4> {
        self.engine.as_ref()?.seen()
    }

    /// The relays the engine registers with.
    pub fn set_relays(&self, relays: Vec<Registration>) {
        if let Some(e) = &self.engine {
            e.set_relays(relays);
        }
    }

    /// When the relay at `to` last acknowledged a registration.
    pub fn relay_ack(&self, to: SocketAddr) -> Option<SystemTime> {
        self.engine.as_ref()?.relay_ack(to)
    }

    /// The engine's direct probes, while it runs.
    pub fn direct(&self) -> Option<&Direct> {
        self.engine.as_ref()?.direct()
    }

    /// The engine's per-peer counters, while it runs.
    pub fn peer_stats(&self) -> Option<Vec<(IpNet, PeerStats)>> {
        self.engine.as_ref()?.peer_stats()
    }
}

impl Drop for Tunnel {
    /// A tunnel dropped without [`Tunnel::stop`] (an error path) stops its
    /// engine on a blocking thread when a runtime runs, else here.
    fn drop(&mut self) {
        if let Some(e) = self.engine.take() {
            match tokio::runtime::Handle::try_current() {
                Ok(rt) => drop(rt.spawn_blocking(move || e.stop())),
                Err(_) => e.stop(),
            }
        }
    }
}

/// A device probe whose device also reports its tunnel TAP.
#[derive(Debug)]
struct WithGso(Arc<dyn DeviceProbe>, TunnelGsoStatus);

impl DeviceProbe for WithGso {
    fn report(&self, st: &mut crate::view::BackendStatus) {
        let before = st.devices.len();
        self.0.report(st);
        if st.devices.len() > before
            && let Some(d) = st.devices.last_mut()
        {
            d.tunnel_gso = Some(self.1.clone());
        }
    }

    fn nat_seen(&self) -> Option<SocketAddrV4> {
        self.0.nat_seen()
    }
}

/// Re-adds each of `routes` that has no route to its destination left.
pub async fn recover_routes<'a>(
    nl: &dyn Client,
    routes: impl IntoIterator<Item = &'a Route>,
) -> Result<(), BackendError> {
    for r in routes {
        if nl.routes_exact(r.dst).await?.is_empty() {
            tracing::info!("Route recovered {}", r.dst);
            nl.route_replace(r).await?;
        }
    }
    Ok(())
}

/// What a userspace backend named `name` publishes: the devices and peer
/// tables of its `tunnels`.
pub fn view<'a>(name: &'static str, tunnels: impl IntoIterator<Item = &'a Tunnel>) -> BackendView {
    let mut v = BackendView::new(name, Some(Dataplane::Userspace));
    v.devices
        .extend(tunnels.into_iter().filter_map(Tunnel::probe));
    v
}

/// The warning for a peer whose packets arrive from `from` although it
/// publishes `published` (see [`Tunnel::reconcile`]).
pub fn unexpected_source_message(
    subnet: IpNet,
    published: Option<IpAddr>,
    from: Option<IpAddr>,
) -> String {
    let published = published.map_or_else(|| "?".to_string(), |a| a.to_string());
    let from = from.map_or_else(|| "another address".to_string(), |a| a.to_string());
    format!(
        "peer {subnet} publishes public IP {published} but its packets arrive from {from}; \
         accepted because their inner sources lie in its subnet (--anti-spoofing=subnet, \
         the default). Fix: on that node, make its overlay traffic leave from {published} \
         (--iface of the interface owning it, or SNAT to it), or publish the address it \
         sends from (--public-ip={from}); --anti-spoofing=strict drops these packets"
    )
}

#[cfg(test)]
#[path = "fake.rs"]
pub mod fake;
pub mod gso;
pub mod nat;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unexpected_source_warning_names_the_peer_and_the_fix() {
        let m = unexpected_source_message(
            "10.244.2.0/24".parse().expect("net"),
            Some("198.51.100.2".parse().expect("ip")),
            Some("192.0.2.2".parse().expect("ip")),
        );
        assert!(m.starts_with("peer 10.244.2.0/24 publishes public IP 198.51.100.2 but its packets arrive from 192.0.2.2;"), "{m}");
        assert!(m.contains("--public-ip=192.0.2.2"), "{m}");
        assert!(m.contains("--anti-spoofing=strict"), "{m}");
        let m = unexpected_source_message("10.244.2.0/24".parse().expect("net"), None, None);
        assert!(m.contains("arrive from another address"), "{m}");
    }
}
