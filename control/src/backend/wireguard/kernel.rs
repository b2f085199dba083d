//! The `wireguard` backend on the kernel's WireGuard module, as flannel runs
//! it (fl:pkg/backend/wireguard, spec §2.6, §5, checklist 23). The factory
//! picks it when [`crate::backend::probe`] finds the `wireguard` link kind; otherwise
//! [`super::userspace`] (the userspace engine) runs, and [`crate::backend::dual`]
//! switches between the two live: both read the same key file
//! ([`super::key`]) and publish byte-identical lease attributes
//! ([`super::backend_data`]).
//!
//! - Devices: `separate` mode `flannel-wg` (IPv4, ListenPort) and
//!   `flannel-wg-v6` (IPv6, ListenPortV6); other modes one `flannel-wg`.
//!   Each: an existing link of that name is deleted (flannel: "already
//!   exists; recreating device"), `ip link add NAME mtu cfg.MTU−80 type
//!   wireguard` (rtnetlink), then `wg set NAME private-key K listen-port P`
//!   with ReplacePeers (generic netlink), address `<subnet IP>/32` (`/128`),
//!   link up, route `Network dev NAME scope link` (and `IPv6Network`).
//!   Devices are deleted on teardown, as flannel does on shutdown.
//! - Peers, per wireguard lease: `wg set NAME private-key K listen-port P
//!   peer KEY [preshared-key PSK] endpoint E persistent-keepalive N
//!   replace-allowed-ips allowed-ips SUBNETS`; endpoint `PublicIP:Port`
//!   (`[PublicIPv6]:Port`), a missing or 0 Port meaning our own port; in
//!   `auto` mode flannel's `selectPublicEndpoint`. Another key we configured
//!   at the same endpoint IP is removed (flannel's `cleanupEndpointPeers`,
//!   tracked here instead of read back; not for punched peers, which share
//!   their NAT's address). Lease removal removes the peer by key.
//! - A peer new on a device is greeted: unless it has a keepalive, it is
//!   first configured with a keepalive of 1 s, then with 0, so that the
//!   kernel initiates a handshake at once (see `greeting`).
//! - Reconciliation restores the device address, link state and routes, and
//!   reads the peers back (`wg show`, [`WgClient::wg_get`]): a missing peer
//!   is configured again (greeted like a new one), a present one only gets
//!   what differs (allowed-ips, keepalive), never its endpoint, which may
//!   have roamed. Peers we did not configure are left alone. A
//!   deleted device is reported as [`BackendError::DeviceGone`] (the daemon
//!   rebuilds the backend, which re-applies every peer).
//! - NAT traversal (`--nat-traversal` or `WeftNATTraversal`, docs/nat.md
//!   "Kernel WireGuard"): the lease gets `WeftNAT`; [`super::kernel_disco`]
//!   asks the peers [`super::nat::server`] names for this node's endpoint
//!   from the IPv4 device's own listen port (raw sockets) and answers
//!   others' requests (the main loop publishes the endpoint); a punched
//!   peer ([`super::nat::path`]) gets the endpoint its lease publishes and
//!   a keepalive of at most 25 s ([`super::nat::keepalive`]); a peer whose
//!   endpoint moved where the kernel has not heard from it is configured
//!   anew (removed, added: a new peer with a keepalive, or greeted, makes
//!   the kernel initiate at once, which an existing one may not for 5 s),
//!   so the punch starts without waiting for a timer; a peer behind
//!   another NAT that has published no endpoint yet is not greeted (see
//!   `Live::awaits_endpoint`). When this
//!   node's own endpoint changes, every peer's path is chosen again at the
//!   next reconcile. No relays and no direct probes on this path.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;

use async_trait::async_trait;
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use super::kernel_disco::KernelDisco;
use super::nat::{self, Path};
use super::{Carries, Node, NodeSpec};
use crate::backend::{
    ApplyError, Backend, BackendError, Batch, Dataplane, Observe, Prepared, Running, Setup,
};
use crate::config::backend::WireguardOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, NatAttrs};
use crate::netlink::{Client, LinkSpec, Route, WgClient, WgPeerSet, WgSet, WireguardLink};

#[derive(Debug)]
struct Device {
    name: &'static str,
    carries: Carries,
    port: u16,
    index: u32,
    addrs: Vec<IpNet>,
    routes: Vec<Route>,
    /// Peers configured: endpoint IP → public key.
    peers: BTreeMap<IpAddr, [u8; 32]>,
    /// Peers configured, as last set: public key → request.
    want: BTreeMap<[u8; 32], WgPeerSet>,
}

/// See the module docs: the backend as the factory builds it.
#[derive(Debug)]
pub struct KernelWireguard {
    spec: NodeSpec,
    nl: Arc<dyn Client>,
    wg: Arc<dyn WgClient>,
    nat: bool,
}

/// [`KernelWireguard`] with its key ([`Setup`]) and, once set up, running.
#[derive(Debug)]
struct Live {
    node: Node,
    nl: Arc<dyn Client>,
    wg: Arc<dyn WgClient>,
    devices: Vec<Device>,
    /// `FLANNEL_MTU` (set up).
    mtu: u32,
    /// NAT traversal on.
    nat: bool,
    /// NAT traversal: the discovery servers and each peer's path.
    paths: nat::Peers,
    /// NAT traversal: discovery on the IPv4 device's port (set up).
    disco: Option<KernelDisco>,
}

/// `peer` with a persistent keepalive of 1 s: configured on an up device
/// over a peer without one, the kernel sends the peer a keepalive at once,
/// which starts a handshake (netlink.c `set_peer`); [`KernelWireguard`]
/// then sets the configured 0 again. A new peer (on a new device: start-up,
/// a restart, a switch from the userspace engine) thus gets a handshake
/// initiation right away, as the engine's `greet` does: a peer that still
/// holds a session with our previous incarnation (same key) keeps
/// encrypting into it, and we can decrypt nothing, until we initiate (or
/// its own 15 s timer does, if it has traffic for us). With a configured
/// keepalive the kernel does this by itself.
fn greeting(peer: &WgPeerSet) -> WgPeerSet {
    WgPeerSet {
        keepalive: Some(1),
        ..peer.clone()
    }
}

impl KernelWireguard {
    /// A kernel wireguard backend (call [`super::validate`] first).
    pub fn new(
        opts: WireguardOptions,
        network: Option<Ipv4Net>,
        network_v6: Option<Ipv6Net>,
        nl: Arc<dyn Client>,
        wg: Arc<dyn WgClient>,
    ) -> KernelWireguard {
        KernelWireguard {
            spec: NodeSpec::new(opts, network, network_v6),
            nl,
            wg,
            nat: false,
        }
    }

    /// With NAT traversal (`--nat-traversal`, `WeftNATTraversal`) when `on`.
    pub fn with_nat(mut self, on: bool) -> KernelWireguard {
        self.nat = on;
        self
    }

    /// Uses `path` instead of `$WIREGUARD_KEY_FILE` / `/run/flannel/wgkey` (tests).
    pub fn with_key_file(mut self, path: PathBuf) -> KernelWireguard {
        self.spec.key_file = path;
        self
    }
}

impl Live {
    fn private_key(&self) -> [u8; 32] {
        self.node.key.0
    }

    async fn create_device(
        &mut self,
        name: &'static str,
        carries: Carries,
        port: u16,
        addrs: Vec<IpNet>,
        mtu: u32,
    ) -> Result<(), BackendError> {
        if let Some(old) = self.nl.link_detail(name).await? {
            tracing::warn!("{name:?} already exists; recreating device");
            self.nl.delete_link(old.link.index).await?;
        }
        self.nl
            .add_link(&LinkSpec::Wireguard(WireguardLink {
                name: name.into(),
                mtu,
            }))
            .await?;
        let index = self
            .nl
            .link_detail(name)
            .await?
            .ok_or_else(|| crate::netlink::NetlinkError::NoSuchLink(name.into()))?
            .link
            .index;
        let set = WgSet {
            ifname: name.into(),
            private_key: Some(self.private_key()),
            listen_port: Some(port),
            replace_peers: true,
            peers: Vec::new(),
        };
        self.wg.wg_set(&set).await?;
        let mut dev = Device {
            name,
            carries,
            port,
            index,
            addrs,
            routes: Vec::new(),
            peers: BTreeMap::new(),
            want: BTreeMap::new(),
        };
        for net in self.node.routes(carries) {
            dev.routes.push(Route {
                dst: net,
                gateway: None,
                oif: Some(index),
                onlink: false,
                scope_link: true,
            });
        }
        self.devices.push(dev);
        let i = self.devices.len() - 1;
        self.ensure(i).await
    }

    /// Address, link up and routes of device `i` (idempotent).
    async fn ensure(&self, i: usize) -> Result<(), BackendError> {
        let d = &self.devices[i];
        let have = self.nl.addrs_on(d.index).await?;
        for a in &d.addrs {
            if !have.iter().any(|h| h.net == *a) {
                self.nl.add_addr(d.index, *a).await?;
            }
        }
        self.nl.link_up(d.index, None).await?;
        for r in &d.routes {
            if !self
                .nl
                .routes_exact(r.dst)
                .await?
                .iter()
                .any(|x| x.oif == r.oif)
            {
                self.nl.route_replace(r).await?;
            }
        }
        Ok(())
    }

    /// The peer a lease gives device `d`, the path to it and whether to
    /// wait for its endpoint ([`Live::awaits_endpoint`]), or `None` when it
    /// is not usable.
    fn peer_for(&self, lease: &Lease, d: &Device) -> Option<(WgPeerSet, Path, bool)> {
        let p = self.node.peer(lease, d.carries, true)?;
        let port = if p.port == 0 { d.port } else { p.port };
        let mut endpoint = SocketAddr::new(p.endpoint, port);
        let (mut path, mut keepalive) = (Path::Direct, self.node.keepalive());
        let mut wait = false;
        if self.nat && endpoint.is_ipv4() {
            let seen = self.disco.as_ref().and_then(KernelDisco::seen);
            path = nat::path(lease, port, seen);
            if let Path::Punched(e) = path {
                endpoint = SocketAddr::V4(e);
            }
            let own = self
                .node
                .ext
                .ext_addr
                .unwrap_or(std::net::Ipv4Addr::UNSPECIFIED);
            keepalive = nat::keepalive(keepalive, path, IpAddr::V4(own));
            wait = self.awaits_endpoint(lease, path);
            if wait {
                keepalive = 0;
            }
        }
        let peer = WgPeerSet {
            public_key: p.key,
            remove: false,
            psk: self.node.psk,
            endpoint: Some(endpoint),
            keepalive: Some(keepalive),
            allowed_ips: p.subnets,
        };
        Some((peer, path, wait))
    }

    /// Whether `lease`'s node, on `path`, is behind another NAT whose
    /// mapping it has not published yet: it runs NAT traversal without an
    /// endpoint, its `PublicIP` is private and not on our own link. Such a
    /// peer gets no keepalive and no greeting until its endpoint comes:
    /// a handshake initiation to its private address would go nowhere and
    /// hold back the punch's, which the kernel sends at most once per
    /// `REKEY_TIMEOUT` (5 s; `wg_packet_send_handshake_initiation`), so
    /// the punch would wait for the retry timer. A node on a routed LAN
    /// of ours still gets its handshake once its endpoint is published
    /// (the same NAT's address: direct) or when traffic starts one.
    fn awaits_endpoint(&self, lease: &Lease, path: Path) -> bool {
        let ip = lease.attrs.public_ip;
        let unpublished = lease.attrs.weft_nat.is_some_and(|n| n.endpoint.is_none());
        let on_link = (self.node.ext.connected.iter()).any(|n| n.contains(&IpAddr::V4(ip)));
        path == Path::Direct && unpublished && !nat::is_public(ip) && !on_link
    }

    /// Reads device `d`'s peers back and restores what differs from what
    /// we set (see the module docs).
    async fn reconcile_peers(&self, d: &Device) -> Result<(), BackendError> {
        if d.want.is_empty() {
            return Ok(());
        }
        let have = self.wg.wg_get(d.name).await?;
        for (key, want) in &d.want {
            let b64 = weft_engine::wg::key_to_base64(key);
            let Some(got) = have.peer(key) else {
                tracing::info!(
                    "WireGuard peer {b64} missing on {}; adding it again",
                    d.name
                );
                if want.keepalive == Some(0) {
                    // Greeted like a new peer: a 1 s keepalive starts a handshake.
                    let greet = WgPeerSet {
                        keepalive: Some(1),
                        ..want.clone()
                    };
                    self.set(d, vec![greet]).await?;
                }
                self.set(d, vec![want.clone()]).await?;
                continue;
            };
            let mut ips = got.allowed_ips.clone();
            let mut wanted = want.allowed_ips.clone();
            ips.sort();
            wanted.sort();
            let keepalive = want.keepalive.filter(|k| *k != got.keepalive);
            if ips != wanted || keepalive.is_some() {
                tracing::info!(
                    "WireGuard peer {b64} on {}: allowed-ips {:?} (want {:?}), keepalive {}; fixing",
                    d.name,
                    got.allowed_ips,
                    want.allowed_ips,
                    got.keepalive
                );
                let fix = WgPeerSet {
                    psk: None,
                    endpoint: None,
                    keepalive,
                    ..want.clone()
                };
                self.set(d, vec![fix]).await?;
            }
        }
        Ok(())
    }

    async fn set(&self, d: &Device, peers: Vec<WgPeerSet>) -> Result<(), BackendError> {
        let set = WgSet {
            ifname: d.name.into(),
            private_key: Some(self.private_key()),
            listen_port: Some(d.port),
            replace_peers: false,
            peers,
        };
        Ok(self.wg.wg_set(&set).await?)
    }
}

impl Observe for Live {
    fn name(&self) -> &'static str {
        "wireguard"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Kernel)
    }

    fn view(&self) -> crate::view::BackendView {
        let mut v = crate::view::BackendView::new(self.name(), self.dataplane());
        v.devices.extend(
            self.devices
                .iter()
                .map(|d| crate::view::devices::KernelDevice::probe(d.name)),
        );
        v.devices
            .extend(self.disco.as_ref().map(KernelDisco::probe));
        v
    }
}

#[async_trait]
impl Backend for KernelWireguard {
    fn name(&self) -> &'static str {
        "wireguard"
    }

    async fn lease_attrs(
        self: Box<Self>,
        ext: &ExternalInterface,
        _prev: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        let (mut attrs, node) = self.spec.lease_attrs(ext, " (kernel module)")?;
        if self.nat {
            attrs.weft_nat = Some(NatAttrs {
                endpoint: None,
                relay: None,
            });
        }
        let live = Live {
            node,
            nl: self.nl,
            wg: self.wg,
            devices: Vec::new(),
            mtu: 0,
            nat: self.nat,
            paths: nat::Peers::default(),
            disco: None,
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
            self.create_device(d.name, d.carries, d.port, d.addrs, mtu)
                .await?;
        }
        if self.nat
            && let Some(d) = self.devices.iter().find(|d| d.carries != Carries::V6)
        {
            // Answer discovery from the start; servers come with the peers.
            self.disco = Some(KernelDisco::start(d.port)?);
            tracing::info!(
                "NAT: discovery on {}'s port {} (raw UDP socket)",
                d.name,
                d.port
            );
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
        if let Some(disco) = &self.disco {
            disco.set_servers(&self.paths.servers());
        }
        out.into_result()
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        for i in 0..self.devices.len() {
            let d = &self.devices[i];
            match self.nl.link_detail(d.name).await? {
                Some(l) if l.link.index == d.index => self.ensure(i).await?,
                _ => return Err(BackendError::DeviceGone(d.name.into())),
            }
            self.reconcile_peers(&self.devices[i]).await?;
        }
        if let Some(disco) = &self.disco {
            // Our own endpoint moved: which peers share our NAT may have too.
            for lease in self.paths.again(disco.seen()) {
                self.change(&Change::Add(lease)).await?;
            }
        }
        Ok(())
    }

    async fn teardown(&mut self) {
        if let Some(d) = self.disco.take() {
            // Joins its thread (it looks at its stop flag every 200 ms).
            let _ = tokio::task::spawn_blocking(move || drop(d)).await;
        }
        for d in self.devices.drain(..) {
            match self.nl.delete_link(d.index).await {
                Ok(()) => tracing::info!("Removed wireguard device {}", d.name),
                Err(e) => tracing::error!("Error while removing device {}: {e}", d.name),
            }
        }
    }
}

impl Live {
    /// Programs (`Add`) or removes (`Remove`) one peer.
    async fn change(&mut self, change: &Change) -> Result<(), BackendError> {
        let (lease, add) = match change {
            Change::Add(l) => (l, true),
            Change::Remove(l) => (l, false),
        };
        if lease.attrs.backend_type != "wireguard" {
            tracing::warn!(
                "Ignoring non-wireguard subnet: type={}",
                lease.attrs.backend_type
            );
            return Ok(());
        }
        for i in 0..self.devices.len() {
            let d = &self.devices[i];
            let nat_device = self.nat && d.carries != Carries::V6;
            if !add {
                if nat_device {
                    self.paths.note(lease, false, Path::Direct, d.port);
                }
                let Some(key) = self.node.key_for(lease, d.carries) else {
                    continue;
                };
                self.set(d, vec![WgPeerSet::removal(key)]).await?;
                let d = &mut self.devices[i];
                d.peers.retain(|_, k| *k != key);
                d.want.remove(&key);
                continue;
            }
            let Some((peer, path, wait)) = self.peer_for(lease, d) else {
                tracing::error!(
                    "wireguard lease {:?} has no usable BackendData for {}",
                    lease.subnet,
                    d.name
                );
                continue;
            };
            let (key, ip) = (peer.public_key, peer.endpoint.map(|e| e.ip()));
            tracing::info!(
                "Subnet(s) added: {:?} via {:?} on {}",
                peer.allowed_ips,
                peer.endpoint,
                d.name
            );
            if nat_device {
                self.paths.note(lease, true, path, d.port);
            }
            let moved = d
                .want
                .get(&key)
                .is_some_and(|w| w.endpoint != peer.endpoint);
            let mut fresh = false;
            if moved && nat_device {
                // Its endpoint moved (a punch begins) and the kernel has
                // not heard from it there (roaming would have moved it):
                // configured anew, so that the kernel initiates at once.
                // The same peer would not: it sends at most one initiation
                // per REKEY_TIMEOUT (5 s), and traffic may just have sent
                // one to the old endpoint.
                let have = self.wg.wg_get(d.name).await?;
                if have.peer(&key).and_then(|p| p.endpoint) != peer.endpoint {
                    self.set(d, vec![WgPeerSet::removal(key)]).await?;
                    fresh = true;
                }
            }
            let new = fresh || !d.peers.values().any(|k| *k == key);
            if !wait && peer.keepalive == Some(0) && new {
                self.set(d, vec![greeting(&peer)]).await?;
            }
            self.set(d, vec![peer.clone()]).await?;
            self.devices[i].want.insert(key, peer);
            // flannel's one-key-per-endpoint-IP rule, for direct peers
            // only: punched peers behind one NAT share its address.
            if let Some(ip) = ip.filter(|_| path == Path::Direct) {
                let d = &mut self.devices[i];
                let stale = d.peers.insert(ip, key).filter(|old| *old != key);
                if let Some(old) = stale {
                    d.want.remove(&old);
                    let d = &self.devices[i];
                    self.set(d, vec![WgPeerSet::removal(old)]).await?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "kernel_tests.rs"]
mod tests;
