//! A recording [`StartEngine`] for unit tests: each "engine" is a TUN link
//! in a [`FakeNetlink`] and a peer table the test reads back, so a userspace
//! backend's lease → peer translation runs without root or a real engine.
//! (A fake exists only here: the real engine is exercised end to end by the
//! root tests in tests/.)

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use weft_engine::{AntiSpoofing, EngineConfig, Peer, PeerStats};

use super::{StartEngine, TunnelEngine, Userspace};
use crate::backend::BackendError;
use crate::netlink::{FakeNetlink, LinkKind};

/// One started fake engine.
#[derive(Debug)]
pub struct FakeEngine {
    /// What it was started with.
    pub cfg: EngineConfig,
    /// Its anti-spoofing mode.
    pub anti: AntiSpoofing,
    /// The last peer table it was given.
    pub peers: Mutex<Vec<Peer>>,
    /// How many tables it was given.
    pub tables: Mutex<usize>,
    /// Whether it was stopped.
    pub stopped: AtomicBool,
    /// Endpoint discovery: on, and the servers, as last set (`None`: never).
    pub discovery: Mutex<Option<(bool, Vec<std::net::SocketAddr>)>>,
    /// The endpoint discovery "saw" (set by the test).
    pub seen: Mutex<Option<std::net::SocketAddrV4>>,
}

impl FakeEngine {
    /// The current peer table.
    pub fn peers(&self) -> Vec<Peer> {
        self.peers.lock().expect("lock").clone()
    }
}

/// Starts [`FakeEngine`]s on a [`FakeNetlink`].
#[derive(Debug)]
pub struct FakeEngines {
    nl: Arc<FakeNetlink>,
    started: Mutex<Vec<Arc<FakeEngine>>>,
    /// Makes the next starts fail (as a missing /dev/net/tun would).
    pub fail: AtomicBool,
}

impl FakeEngines {
    /// The fake engines and the [`Userspace`] that starts them on `nl`.
    pub fn new(nl: &Arc<FakeNetlink>) -> (Arc<FakeEngines>, Userspace) {
        let e = Arc::new(FakeEngines {
            nl: nl.clone(),
            started: Mutex::new(Vec::new()),
            fail: AtomicBool::new(false),
        });
        let us = Userspace {
            nl: nl.clone(),
            engines: e.clone(),
        };
        (e, us)
    }

    /// Every engine started so far, oldest first.
    pub fn started(&self) -> Vec<Arc<FakeEngine>> {
        self.started.lock().expect("lock").clone()
    }

    /// The running engine of TUN `name`.
    pub fn running(&self, name: &str) -> Arc<FakeEngine> {
        self.started()
            .into_iter()
            .rev()
            .find(|e| e.cfg.tun_name == name && !e.stopped.load(Ordering::Relaxed))
            .unwrap_or_else(|| panic!("no running engine on {name}"))
    }
}

struct Handle(Arc<FakeEngine>);

/// What readers see of a fake engine: its TUN and peer table, no counters.
#[derive(Debug)]
struct Probe(Arc<FakeEngine>);

impl crate::view::DeviceProbe for Probe {
    fn report(&self, st: &mut crate::view::BackendStatus) {
        if self.0.stopped.load(Ordering::Relaxed) {
            return;
        }
        let peers = self.0.peers();
        st.devices.push(crate::view::DeviceStatus {
            name: self.0.cfg.tun_name.clone(),
            kind: "engine".into(),
            workers: None,
            offloads: None,
            counters: Default::default(),
            batching: None,
            drops: None,
            peers: u32::try_from(peers.len()).ok(),
            poll_window: None,
            tunnel_gso: None,
        });
    }
}

impl StartEngine for FakeEngines {
    fn start(
        &self,
        cfg: EngineConfig,
        anti: AntiSpoofing,
    ) -> Result<Box<dyn TunnelEngine>, BackendError> {
        if self.fail.load(Ordering::Relaxed) {
            // What a node without /dev/net/tun gives.
            return Err(BackendError::Engine(weft_engine::EngineError::Tun {
                name: cfg.tun_name,
                source: std::io::Error::from_raw_os_error(libc::ENOENT),
            }));
        }
        self.nl
            .insert_link(&cfg.tun_name, LinkKind::Tun, u32::from(cfg.mtu), None);
        if let Some(t) = &cfg.tunnel_tap {
            self.nl.insert_link(&t.name, LinkKind::Tun, 1500, None);
        }
        let e = Arc::new(FakeEngine {
            cfg,
            anti,
            peers: Mutex::new(Vec::new()),
            tables: Mutex::new(0),
            stopped: AtomicBool::new(false),
            discovery: Mutex::new(None),
            seen: Mutex::new(None),
        });
        self.started.lock().expect("lock").push(e.clone());
        Ok(Box::new(Handle(e)))
    }
}

impl TunnelEngine for Handle {
    fn tun_name(&self) -> &str {
        &self.0.cfg.tun_name
    }
    fn set_peers(&self, peers: Vec<Peer>) {
        *self.0.peers.lock().expect("lock") = peers;
        *self.0.tables.lock().expect("lock") += 1;
    }
    fn peer_stats(&self) -> Option<Vec<(IpNet, PeerStats)>> {
        None
    }
    fn probe(&self) -> Arc<dyn crate::view::DeviceProbe> {
        Arc::new(Probe(self.0.clone()))
    }
    fn describe(&self) -> String {
        "fake engine".into()
    }
    fn tunnel_tap(&self) -> weft_engine::TunnelTapState {
        match &self.0.cfg.tunnel_tap {
            Some(t) => weft_engine::TunnelTapState::Open(t.name.clone()),
            None => weft_engine::TunnelTapState::NotAsked,
        }
    }
    fn set_discovery(&self, on: bool, servers: Vec<std::net::SocketAddr>) {
        *self.0.discovery.lock().expect("lock") = Some((on, servers));
    }
    fn seen(&self) -> Option<std::net::SocketAddrV4> {
        *self.0.seen.lock().expect("lock")
    }
    fn stop(self: Box<Self>) {
        self.0.stopped.store(true, Ordering::Relaxed);
    }
}
