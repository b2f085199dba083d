//! The userspace tunnel shared by the engine-backed backends (flannel-UDP,
//! userspace VXLAN): one `weft_engine::Engine` per TUN device, the device's
//! address, MTU and routes over netlink, and the engine's peer table kept in
//! step with the lease changes.
//!
//! The engine only ever sees a complete new peer table ([`Engine::set_peers`]);
//! it never waits on this code.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use weft_engine::{Engine, EngineConfig, Peer};

use super::BackendError;
use crate::netlink::{Netlink, Route};

/// A running engine with its TUN device configured.
pub struct Tunnel {
    /// Peers changed since the last flush.
    dirty: bool,
    engine: Option<Engine>,
    nl: Netlink,
    index: u32,
    peers: BTreeMap<IpNet, Peer>,
    /// Routes this tunnel owns (re-added by `reconcile` if they go missing).
    routes: BTreeMap<IpNet, Route>,
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
    /// Starts the engine (which creates the TUN), then gives the device
    /// `addr` (a /32 or /128), `mtu`, and sets it up.
    pub async fn start(
        nl: &Netlink,
        cfg: EngineConfig,
        addr: IpNet,
        mtu: u32,
    ) -> Result<Tunnel, BackendError> {
        let engine = Engine::start(cfg).map_err(|e| BackendError::Engine(format!("{e:#}")))?;
        let name = engine.tun_name().to_string();
        let link = nl
            .link_by_name(&name)
            .await?
            .ok_or_else(|| BackendError::Engine(format!("tun {name} vanished")))?;
        nl.set_link_up(link.index, Some(mtu)).await?;
        nl.replace_addr(link.index, addr).await?;
        let o = engine.offloads();
        tracing::info!(
            "userspace engine on {name}: {} workers, offloads: tun vnet_hdr={} tso={} uso={} csum={}, udp gso={} gro={}",
            engine.workers(),
            o.tun_vnet_hdr,
            o.tun_tso,
            o.tun_uso,
            o.tun_csum,
            o.udp_gso,
            o.udp_gro
        );
        Ok(Tunnel {
            dirty: false,
            engine: Some(engine),
            nl: nl.clone(),
            index: link.index,
            peers: BTreeMap::new(),
            routes: BTreeMap::new(),
        })
    }

    /// The TUN device's interface index.
    pub fn index(&self) -> u32 {
        self.index
    }

    /// The TUN device's name.
    pub fn name(&self) -> &str {
        self.engine.as_ref().map_or("", Engine::tun_name)
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
        self.nl.replace_route(&r).await?;
        self.routes.insert(dst, r);
        Ok(())
    }

    /// Removes a route added with [`Tunnel::add_route`].
    pub async fn del_route(&mut self, dst: IpNet) -> Result<(), BackendError> {
        if let Some(r) = self.routes.remove(&dst) {
            self.nl.del_route(&r).await?;
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
            },
        );
        self.dirty = true;
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
        if !self
            .nl
            .links()
            .await?
            .iter()
            .any(|l| l.index == self.index && l.name == name)
        {
            return Err(BackendError::DeviceGone(name));
        }
        for r in self.routes.values() {
            if self.nl.routes_to(r.dst).await?.is_empty() {
                tracing::info!("Route recovered {}", r.dst);
                self.nl.replace_route(r).await?;
            }
        }
        Ok(())
    }

    /// Stops the engine; closing the TUN removes the device and its routes.
    pub fn stop(&mut self) {
        if let Some(e) = self.engine.take() {
            e.stop();
        }
    }

    /// Adds this tunnel's device and peer table to `st` (counters are read
    /// from the engine's per-worker blocks; see [`crate::status::devices`]).
    pub fn report(&self, st: &mut crate::status::BackendStatus) {
        if let Some(e) = &self.engine {
            let (dev, peers) = crate::status::devices::engine_device(e);
            st.devices.push(dev);
            st.peer_counters.extend(peers);
        }
    }

    /// The engine, while running.
    pub fn engine(&self) -> Option<&Engine> {
        self.engine.as_ref()
    }
}

impl Drop for Tunnel {
    fn drop(&mut self) {
        self.stop();
    }
}
