//! The `wireguard` backend on weft's userspace engine (boringtun), so it runs
//! where the kernel has no WireGuard, and speaks to any WireGuard peer:
//! flannel nodes with the kernel module, wireguard-go, boringtun (spec §2.6, §5).
//!
//! - Key: [`super::key`] (`/run/flannel/wgkey` or `$WIREGUARD_KEY_FILE`).
//! - Lease: BackendType `wireguard`, BackendData `{"PublicKey":"<b64>","Port":<ListenPort>}`
//!   (IPv4 on), BackendV6Data the same with `ListenPortV6` (IPv6 on), byte-exact.
//! - Devices (TUN): `separate` mode: `flannel-wg` (IPv4, ListenPort) and
//!   `flannel-wg-v6` (IPv6, ListenPortV6); `auto`/`ipv4`/`ipv6`: one
//!   `flannel-wg` carrying both families. Address `<subnet IP>/32` (`/128`),
//!   MTU cfg.MTU − 80, route `Network dev flannel-wg scope link` (and
//!   `IPv6Network`). A leftover device of that name is deleted first;
//!   devices disappear on exit (the engine closes the TUN).
//! - Peers: one per wireguard lease; AllowedIPs = the peer's subnet(s);
//!   endpoint `PublicIP:Port` (`[PublicIPv6]:Port`), a missing or 0 Port
//!   meaning our own port; PSK and PersistentKeepaliveInterval from the
//!   options. Non-wireguard leases are ignored.
//! - NAT traversal (`--nat-traversal` or `WeftNATTraversal`, docs/nat.md,
//!   [`super::nat`]): the lease gets `WeftNAT`, the engine asks the peers
//!   [`super::nat::server`] names for this node's endpoint (the main loop
//!   publishes it), a punched peer's endpoint is the one its lease
//!   publishes, and keepalives hold the mappings. Off: nothing of it runs.
//! - Relays (`--nat-relay`, docs/nat.md "Relays"): a relay node runs a
//!   [`weft_engine::relay::RelayServer`] on its relay port for the keys of
//!   the wireguard leases; a node whose own address is private registers
//!   with every relay (at most 4) and sends a punched peer that never
//!   answered through one ([`super::nat::Peers::choose_relays`], at
//!   reconcile).
//!   While a peer is relayed, the engine probes the direct path
//!   ([`weft_engine::path::wg::direct`]; which peers and when:
//!   [`super::nat::Peers::probes_due`]); an ack moves the peer back to it
//!   at the next reconcile ([`super::nat::Peers::direct`]). Every node
//!   with NAT traversal answers the probes of the leases' keys (the pair
//!   keys: one X25519 per lease, cached).
//!   A punched peer that falls silent is checked with direct probes and
//!   relayed when they go unanswered, and one whose engine endpoint moved
//!   to a relay is taken as relayed via it ([`super::nat::Peers::watch`],
//!   from the engine's per-peer `last_heard`/`last_sent`/`current`).
//! - Differences: the engine's socket listens on one address family, so in
//!   `auto` mode the endpoint family is the underlay family we listen on (IPv4
//!   when IPv4 is enabled), not flannel's per-peer `selectMode`.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use weft_engine::path::wg::direct::{Probe, pair_key};
use weft_engine::path::wg::disco::{MAX_RELAYS, RELAY_SILENT, Registration};
use weft_engine::path::wg::relay::registration;
use weft_engine::relay::RelayServer;
use weft_engine::{Encap, Peer, WgPeer};

use super::nat::{self, Path};
use super::{Carries, Node, NodeSpec};
use crate::backend::Missing;
use crate::backend::tunnel::{self, Tunnel, Userspace};
use crate::backend::{
    ApplyError, Backend, BackendError, Batch, Dataplane, EngineTuning, Observe, Prepared, Running,
    Setup,
};
use crate::config::backend::WireguardOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, NatAttrs};

#[derive(Debug)]
struct Device {
    carries: Carries,
    port: u16,
    tunnel: Tunnel,
}

/// See the module docs: the backend as the factory builds it.
#[derive(Debug)]
pub struct Wireguard {
    spec: NodeSpec,
    tuning: EngineTuning,
    us: Userspace,
}

/// [`Wireguard`] with its key ([`Setup`]) and, once set up, running.
#[derive(Debug)]
struct Live {
    node: Node,
    tuning: EngineTuning,
    us: Userspace,
    devices: Vec<Device>,
    /// `FLANNEL_MTU` (set up).
    mtu: u32,
    /// NAT traversal: the discovery servers and each peer's path.
    nat: nat::Peers,
    /// This node's relay (`--nat-relay`).
    relay: Option<RelayServer>,
    /// The cluster's WireGuard keys by lease key (who may register).
    members: BTreeMap<String, [u8; 32]>,
    /// The relay's datagrams over its limit at the last look.
    relay_limited: u64,
    /// When the relay's counters were last logged, and its forwarded count.
    relay_logged: Option<(std::time::Instant, u64)>,
    /// Each member's key and the pair key of direct probes with it, by
    /// lease key (one X25519 per lease key and WireGuard key).
    pair_keys: BTreeMap<String, ([u8; 32], [u8; 32])>,
    /// The direct probes in flight: lease key, address probed, and
    /// whether it checks a punched peer (else: a relayed one's way back).
    probing: Vec<(String, std::net::SocketAddrV4, bool)>,
}

/// The relay's counters in `weft status` and `/metrics`.
#[derive(Debug)]
struct RelayProbe(weft_engine::relay::RelayCounters);

impl crate::view::DeviceProbe for RelayProbe {
    fn report(&self, st: &mut crate::view::model::BackendStatus) {
        let s = self.0.read();
        st.relay = Some(crate::view::model::RelayStatus {
            forwarded: s.forwarded,
            bytes: s.bytes,
            registered: s.registered,
            limited: s.limited,
            dropped: s.dropped,
        });
    }
}

/// A relay logs its counters at most this often, when they moved.
const RELAY_LOG_EVERY: Duration = Duration::from_secs(60);

/// Margin on top of [`weft_engine::wg::BORINGTUN_TAI64_AHEAD`]: the kernel
/// rounds its timestamps down to 1/64 s, and ours are noted just after
/// boringtun made its.
const HANDOVER_MARGIN: Duration = Duration::from_millis(500);

/// When the kernel's WireGuard, with our key, can start sessions with every
/// peer that got the engine's initiations at `sent`: each peer refuses an
/// initiation whose timestamp is not newer than the newest it accepted, and
/// boringtun's run 27 s ahead of the kernel's.
pub(super) fn kernel_handover_at(sent: impl Iterator<Item = SystemTime>) -> Option<SystemTime> {
    sent.max()
        .map(|t| t + weft_engine::wg::BORINGTUN_TAI64_AHEAD + HANDOVER_MARGIN)
}

impl Wireguard {
    /// A wireguard backend for the enabled networks (call [`super::validate`]
    /// first: an invalid PSK is ignored here); the key is read in `lease_attrs`.
    pub fn new(
        opts: WireguardOptions,
        network: Option<Ipv4Net>,
        network_v6: Option<Ipv6Net>,
        tuning: EngineTuning,
        us: Userspace,
    ) -> Wireguard {
        Wireguard {
            spec: NodeSpec::new(opts, network, network_v6),
            tuning,
            us,
        }
    }

    /// Uses `path` instead of `$WIREGUARD_KEY_FILE` / `/run/flannel/wgkey` (tests).
    pub fn with_key_file(mut self, path: std::path::PathBuf) -> Wireguard {
        self.spec.key_file = path;
        self
    }
}

impl Live {
    async fn start_device(
        &mut self,
        name: &str,
        carries: Carries,
        port: u16,
        local: IpAddr,
        addrs: &[IpNet],
        mtu: u32,
    ) -> Result<(), BackendError> {
        let key = self.node.key;
        if let Some(old) = self.us.nl.link_detail(name).await? {
            tracing::info!("deleting existing device {name}");
            self.us.nl.delete_link(old.link.index).await?;
        }
        let encap = Encap::WireGuard {
            port,
            private_key: key,
        };
        let cfg = (self.tuning).engine(name.to_string(), encap, local, None, mtu);
        let first = *addrs.first().ok_or(BackendError::Missing {
            backend: "wireguard",
            what: Missing::DeviceAddress,
        })?;
        let mut tunnel = Tunnel::start(&self.us, cfg, first, mtu, self.tuning.anti_spoof).await?;
        for a in &addrs[1..] {
            self.us.nl.add_addr(tunnel.index(), *a).await?;
        }
        for net in self.node.routes(carries) {
            tunnel.add_route(net, false).await?;
        }
        self.devices.push(Device {
            carries,
            port,
            tunnel,
        });
        Ok(())
    }

    /// The peers a lease gives each device (empty when it is not usable)
    /// and the path to it.
    fn peers_for(&self, lease: &Lease, dev: &Device) -> (Vec<Peer>, Path) {
        let Some(mut p) = self.node.peer(lease, dev.carries, false) else {
            return (Vec::new(), Path::Direct);
        };
        let (mut path, mut keepalive) = (Path::Direct, self.node.keepalive());
        if self.tuning.nat && p.endpoint.is_ipv4() {
            // BackendData's Port 0 means our own port (flannel's rule).
            let port = if p.port == 0 { dev.port } else { p.port };
            let base = nat::path(lease, port, dev.tunnel.seen());
            path = self.nat.resolve(&lease.key().to_string(), base);
            match path {
                Path::Punched(e) => (p.endpoint, p.port) = (IpAddr::V4(*e.ip()), e.port()),
                Path::Relayed(r) => (p.endpoint, p.port) = (IpAddr::V4(r.ip), r.at.port()),
                Path::Direct => {}
            }
            let own = IpAddr::V4(self.own_addr());
            keepalive = nat::keepalive(keepalive, path, own);
        }
        let wg = WgPeer {
            public_key: p.key,
            port: p.port,
            psk: self.node.psk,
            keepalive,
        };
        let peers = p
            .subnets
            .into_iter()
            .map(|subnet| Peer {
                subnet,
                endpoint: p.endpoint,
                vtep_mac: None,
                nat: None,
                wireguard: Some(wg.clone()),
                tunnel_gso: false,
            })
            .collect();
        (peers, path)
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "wireguard"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }

    fn view(&self) -> crate::view::BackendView {
        let v = tunnel::view(self.name(), self.devices.iter().map(|d| &d.tunnel));
        match &self.relay {
            Some(r) => v.device(std::sync::Arc::new(RelayProbe(r.counters()))),
            None => v,
        }
    }
}

#[async_trait]
impl Backend for Wireguard {
    fn name(&self) -> &'static str {
        "wireguard"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        let (mut attrs, node) = self.spec.lease_attrs(ext, "")?;
        if self.tuning.nat {
            attrs.weft_nat = Some(NatAttrs {
                endpoint: None,
                relay: self.tuning.relay.map(|r| r.port),
            });
        }
        let live = Live {
            node,
            tuning: self.tuning,
            us: self.us,
            devices: Vec::new(),
            mtu: 0,
            nat: nat::Peers::default(),
            relay: None,
            members: BTreeMap::new(),
            relay_limited: 0,
            relay_logged: None,
            pair_keys: BTreeMap::new(),
            probing: Vec::new(),
        };
        Ok(Prepared {
            attrs,
            backend: Box::new(live),
        })
    }
}

#[async_trait]
impl Setup for Live {
    async fn setup(mut self: Box<Self>, lease: &Lease) -> Result<Box<dyn Running>, BackendError> {
        let (mtu, plan) = self.node.plan(lease);
        for d in plan {
            self.start_device(d.name, d.carries, d.port, d.bind, &d.addrs, mtu)
                .await?;
        }
        if self.tuning.nat {
            // Answer discovery from the start; servers come with the peers.
            for d in &self.devices {
                d.tunnel.set_discovery(true, Vec::new());
            }
            if let Some(r) = self.tuning.relay {
                let ip = self.own_addr();
                let bind = SocketAddr::new(IpAddr::V4(ip), r.port);
                let server = RelayServer::start(bind, self.node.key.0, r.mbit)
                    .map_err(|source| BackendError::Relay { bind, source })?;
                let limit = r.mbit.map_or("no limit".into(), |m| format!("{m} Mbit/s"));
                tracing::info!("NAT: relaying on {bind} ({limit})");
                self.relay = Some(server);
            }
        }
        self.mtu = mtu;
        Ok(self)
    }
}

#[async_trait]
impl Running for Live {
    fn mtu(&self) -> u32 {
        self.mtu
    }

    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        let mut out = ApplyError::default();
        for (i, c) in batch.changes.iter().enumerate() {
            out.record(i, self.change(c).await);
        }
        if self.tuning.nat {
            let servers = self.nat.servers();
            for d in &self.devices {
                d.tunnel.set_discovery(true, servers.clone());
            }
            self.relays_changed();
        }
        for d in &mut self.devices {
            d.tunnel.flush();
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        for d in &mut self.devices {
            d.tunnel.reconcile().await?;
        }
        if self.tuning.nat {
            // Our own endpoint moved: which peers share our NAT may have too.
            let seen = self.devices.first().and_then(|d| d.tunnel.seen());
            for lease in self.nat.again(seen) {
                self.change(&Change::Add(lease)).await?;
            }
            self.relays_changed();
            for lease in self.found_direct() {
                self.change(&Change::Add(lease)).await?;
            }
            for lease in self.watch() {
                self.change(&Change::Add(lease)).await?;
            }
            for lease in self.choose_relays() {
                self.change(&Change::Add(lease)).await?;
            }
            self.probe();
            for d in &mut self.devices {
                d.tunnel.flush();
            }
            let stats = self.devices.iter().filter_map(|d| d.tunnel.peer_stats());
            let handshakes = stats.flatten().map(|(net, s)| (net, s.last_handshake));
            for (net, live) in self.nat.sessions(handshakes, SystemTime::now()) {
                match live {
                    true => tracing::info!("NAT: peer {net} has a session"),
                    false => {
                        tracing::warn!("NAT: peer {net} is unreachable (no handshake for 180 s)")
                    }
                }
            }
        }
        Ok(())
    }

    async fn teardown(&mut self) {
        if let Some(r) = self.relay.take() {
            // Joins its thread (it looks at its stop flag every 200 ms).
            let _ = tokio::task::spawn_blocking(move || drop(r)).await;
        }
        for mut d in self.devices.drain(..) {
            d.tunnel.stop().await;
        }
    }

    fn handover_at(&self) -> Option<SystemTime> {
        let last = self
            .devices
            .iter()
            .filter_map(|d| d.tunnel.peer_stats())
            .flatten()
            .filter_map(|(_, s)| s.last_initiation);
        kernel_handover_at(last)
    }
}

impl Live {
    /// This node's external address (unspecified when it has none yet).
    fn own_addr(&self) -> std::net::Ipv4Addr {
        self.node
            .ext
            .ext_addr
            .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED)
    }

    /// The relay's members and this node's registrations, from the leases:
    /// a node whose own address is private registers with every relay (a
    /// fresh counter each time: a registration from a new NAT mapping is
    /// taken).
    fn relays_changed(&mut self) {
        if let Some(r) = &self.relay {
            r.set_members(self.members.values().copied().collect());
            let st = r.stats();
            if st.limited > self.relay_limited {
                tracing::warn!(
                    "NAT relay: {} datagrams over the bandwidth limit dropped ({} forwarded, {} bytes)",
                    st.limited - self.relay_limited,
                    st.forwarded,
                    st.bytes
                );
                self.relay_limited = st.limited;
            }
            let due = self
                .relay_logged
                .is_none_or(|(t, _)| t.elapsed() >= RELAY_LOG_EVERY);
            if due && self.relay_logged.is_none_or(|(_, f)| f != st.forwarded) {
                tracing::info!(
                    "NAT relay: {} datagrams forwarded ({} bytes), {} registrations, {} over the limit, {} dropped",
                    st.forwarded,
                    st.bytes,
                    st.registered,
                    st.limited,
                    st.dropped
                );
                self.relay_logged = Some((std::time::Instant::now(), st.forwarded));
            }
        }
        if let Some(d) = self.devices.first().and_then(|d| d.tunnel.direct()) {
            let own = weft_engine::WgSecret(self.node.key.0).public_key();
            d.set_members(own, self.pair_keys.values().copied().collect());
        }
        let own = self.own_addr();
        if nat::is_public(own) {
            return;
        }
        let counter = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let regs: Vec<Registration> = (self.nat.relays().iter())
            .take(MAX_RELAYS)
            .map(|r| Registration {
                to: SocketAddr::V4(r.at),
                msg: registration(&self.node.key.0, &r.key, counter),
            })
            .collect();
        for d in &self.devices {
            d.tunnel.set_relays(regs.clone());
        }
    }

    /// The relayed peers whose direct probe was acked since the last
    /// look: they leave their relay ([`nat::Peers::direct`]).
    fn found_direct(&mut self) -> Vec<Lease> {
        let Some(d) = self.devices.first().and_then(|d| d.tunnel.direct()) else {
            return Vec::new();
        };
        let now = SystemTime::now();
        let acked: Vec<_> = (self.probing.iter())
            .filter(|(_, to, _)| d.acked(SocketAddr::V4(*to)).is_some())
            .cloned()
            .collect();
        let mut leases = Vec::new();
        for (key, at, check) in acked {
            self.probing.retain(|(k, _, _)| *k != key);
            match check {
                true => self.nat.checked(&key, now),
                false => leases.extend(self.nat.direct(&key, at, now)),
            }
        }
        leases
    }

    /// Sends the direct probes that are due ([`nat::Peers::probes_due`]);
    /// a new set replaces the last (whose acks [`Live::found_direct`] read).
    fn probe(&mut self) {
        let Some(dev) = self.devices.first() else {
            return;
        };
        let Some(d) = dev.tunnel.direct() else {
            return;
        };
        let keys = &self.pair_keys;
        let probed_by = |l: &Lease| d.probed(&keys.get(&l.key().to_string())?.0);
        let now = SystemTime::now();
        let due = self.nat.probes_due(probed_by, now);
        let due = (due.into_iter().map(|(l, to)| (l, to, false)))
            .chain((self.nat.checks_due(now).into_iter()).map(|(l, to)| (l, vec![to], true)));
        let due: Vec<_> = due.collect();
        if due.is_empty() {
            return;
        }
        let mut counter = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |dur| dur.as_millis() as u64);
        let (mut probes, mut probing) = (Vec::new(), Vec::new());
        for (lease, addrs, check) in due {
            let key = lease.key().to_string();
            let Some((peer, pair)) = self.pair_keys.get(&key) else {
                continue;
            };
            for to in addrs {
                let p = Probe::new(&self.node.key.0, peer, pair, SocketAddr::V4(to), counter);
                counter += 1;
                probes.push(p);
                probing.push((key.clone(), to, check));
            }
        }
        tracing::debug!("NAT: direct probes to {probing:?}");
        d.set_probes(probes);
        self.probing = probing;
    }

    /// What the engine saw of each punched peer ([`nat::Peers::watch`]):
    /// the leases whose path changed. Only a node behind NAT (one that
    /// can relay) checks its punched peers.
    fn watch(&mut self) -> Vec<Lease> {
        let Some(dev) = behind_nat(&self.devices, self.own_addr()) else {
            return Vec::new();
        };
        let stats: BTreeMap<IpNet, nat::Seen> = (dev.tunnel.peer_stats())
            .into_iter()
            .flatten()
            .map(|(net, s)| {
                let at = match s.current {
                    Some(SocketAddr::V4(a)) => Some(a),
                    _ => None,
                };
                let seen = nat::Seen {
                    heard: s.last_heard,
                    sent: s.last_sent,
                    at,
                };
                (net, seen)
            })
            .collect();
        let seen = |l: &Lease| stats.get(&IpNet::V4(l.subnet?)).copied();
        self.nat.watch(seen, SystemTime::now())
    }

    /// The leases whose relay changed ([`nat::Peers::choose_relays`]).
    /// Only a node behind NAT relays: it registers with the relays, and
    /// a relay forwards nothing for a node that did not.
    fn choose_relays(&mut self) -> Vec<Lease> {
        let Some(dev) = behind_nat(&self.devices, self.own_addr()) else {
            return Vec::new();
        };
        let stats: BTreeMap<IpNet, Option<SystemTime>> = (dev.tunnel.peer_stats())
            .into_iter()
            .flatten()
            .map(|(net, s)| (net, s.last_handshake))
            .collect();
        let now = SystemTime::now();
        let handshake = |l: &Lease| {
            let net = IpNet::V4(l.subnet?);
            stats.get(&net).copied().flatten()
        };
        let live = |r: &nat::RelayNode| {
            dev.tunnel
                .relay_ack(SocketAddr::V4(r.at))
                .and_then(|t| now.duration_since(t).ok())
                .is_some_and(|age| age < RELAY_SILENT)
        };
        self.nat.choose_relays(handshake, live, now)
    }

    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        let (lease, add) = match change {
            Change::Add(l) => (l, true),
            Change::Remove(l) => (l, false),
        };
        if add && lease.attrs.backend_type != "wireguard" {
            tracing::info!(
                "ignoring non-wireguard v4Subnet({:?}) v6Subnet({:?}): type={}",
                lease.subnet,
                lease.ipv6_subnet,
                lease.attrs.backend_type
            );
            return Ok(());
        }
        let key = lease.key().to_string();
        match lease
            .attrs
            .backend_data
            .as_deref()
            .and_then(super::parse_backend_data)
        {
            Some((k, _)) if add => {
                if self.tuning.nat && self.pair_keys.get(&key).is_none_or(|(p, _)| *p != k) {
                    let pair = pair_key(&self.node.key.0, &k);
                    self.pair_keys.insert(key.clone(), (k, pair));
                }
                self.members.insert(key, k)
            }
            _ => {
                self.pair_keys.remove(&key);
                self.members.remove(&key)
            }
        };
        let subnets = [
            lease.subnet.map(IpNet::V4),
            lease.ipv6_subnet.map(IpNet::V6),
        ];
        for i in 0..self.devices.len() {
            let (peers, path) = if add {
                self.peers_for(lease, &self.devices[i])
            } else {
                (Vec::new(), Path::Direct)
            };
            if self.tuning.nat && i == 0 {
                let port = self.devices[0].port;
                self.nat.note(lease, add, path, port);
            }
            let dev = &mut self.devices[i];
            if add && peers.is_empty() {
                tracing::error!(
                    "wireguard lease {:?} has no usable BackendData for {}: {:?}",
                    lease.subnet,
                    dev.tunnel.name(),
                    lease.attrs.backend_data
                );
                continue;
            }
            for s in subnets.iter().flatten() {
                if !peers.iter().any(|p| p.subnet == *s) {
                    dev.tunnel.remove_peer(*s);
                }
            }
            for p in peers {
                tracing::debug!(
                    "peer {} on {} (port {})",
                    p.subnet,
                    dev.tunnel.name(),
                    dev.port
                );
                dev.tunnel.upsert(p);
            }
        }
        Ok(())
    }
}

/// The WireGuard device when this node, at `own`, is behind NAT (it has no
/// public address): only such a node watches its punched peers and relays.
/// A free function so that it borrows the devices alone.
fn behind_nat(devices: &[Device], own: std::net::Ipv4Addr) -> Option<&Device> {
    devices.first().filter(|_| !nat::is_public(own))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_takes_over_27_s_after_the_last_initiation() {
        use std::time::UNIX_EPOCH;
        let t = |ms| UNIX_EPOCH + Duration::from_millis(ms);
        assert_eq!(kernel_handover_at(std::iter::empty()), None);
        assert_eq!(
            kernel_handover_at([t(1_000_000), t(1_004_000), t(1_002_000)].into_iter()),
            Some(t(1_004_000 + 27_500))
        );
    }
}
