//! The one engine builder: what starting any encapsulation's engine shares.
//!
//! [`Builder::new`] validates what every encapsulation needs (MTU) and picks
//! the worker count; [`Builder::open_tun`] opens the multi-queue TUN device
//! (one queue per worker) and [`Builder::offloads`] reads what it got; the
//! encapsulation opens its sockets and builds its workers around the shared
//! state in [`Builder::shared`]; [`Builder::spawn`] makes the [`Engine`]
//! handle and starts one thread per worker (and, in the default latency
//! mode, the CPU sampler of `spare.rs`). The encapsulations' own halves
//! are `udp::start` (flannel-UDP, VXLAN), `wg::start` and `ipip::start`.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;

use arc_swap::ArcSwap;

use crate::antispoof::{self, AntiSpoofing};
use crate::idle::Spin;
use crate::peers::PeerTable;
use crate::spare;
use crate::sys::tun;
use crate::worker::{Encapsulation, SharedState, Worker};
use crate::{Engine, EngineConfig, EngineError, OffloadState};

/// Most workers (and TUN queues) an engine runs.
const MAX_WORKERS: usize = 64;

/// An engine being started.
pub(crate) struct Builder<'c> {
    pub cfg: &'c EngineConfig,
    /// Worker threads (and TUN queues).
    pub workers: usize,
    pub shared: SharedState,
}

impl<'c> Builder<'c> {
    /// Checks the MTU and picks the worker count (0: one per CPU, at most [`MAX_WORKERS`]).
    pub fn new(cfg: &'c EngineConfig) -> Result<Builder<'c>, EngineError> {
        if cfg.mtu < 68 {
            return Err(EngineError::Config("mtu below 68"));
        }
        let workers = match cfg.workers {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n,
        }
        .min(MAX_WORKERS);
        let spin = Spin::parse(std::env::var("WEFT_ENGINE_SPIN_US").ok().as_deref())
            .map_err(EngineError::Config)?;
        Ok(Builder {
            cfg,
            workers,
            shared: SharedState {
                peers: Arc::new(ArcSwap::from_pointee(PeerTable::default())),
                stop: Arc::new(AtomicBool::new(false)),
                anti_spoof: Arc::new(antispoof::Mode::new(AntiSpoofing::from_flag(
                    cfg.anti_spoof,
                ))),
                udp_gso: Arc::new(AtomicBool::new(false)),
                spin,
            },
        })
    }

    /// Opens the TUN device with one queue per worker, with offloads when
    /// configured (`uso`: UDP super-packets too).
    pub fn open_tun(&self, uso: bool) -> Result<tun::Device, EngineError> {
        tun::open(&self.cfg.tun_name, self.workers, self.cfg.offload, uso).map_err(|source| {
            EngineError::Tun {
                name: self.cfg.tun_name.clone(),
                source,
            }
        })
    }

    /// The offloads `dev` got, and UDP GSO/GRO when configured and `udp`
    /// (the encapsulation sends through UDP sockets); turns UDP GSO on.
    pub fn offloads(&self, dev: &tun::Device, udp: bool) -> OffloadState {
        let udp = udp && self.cfg.offload;
        self.shared
            .udp_gso
            .store(udp, std::sync::atomic::Ordering::Relaxed);
        OffloadState {
            tun_vnet_hdr: dev.vnet_hdr,
            tun_tso: dev.offload & (tun::TUN_F_TSO4 | tun::TUN_F_TSO6) != 0,
            tun_uso: dev.offload & tun::TUN_F_USO4 != 0,
            tun_csum: dev.offload & tun::TUN_F_CSUM != 0,
            udp_gso: udp,
            udp_gro: udp,
        }
    }

    /// The engine handle for the TUN device `tun_name` and UDP `port`, its
    /// `workers` started as threads named `{thread}{index}`.
    pub fn spawn<E: Encapsulation>(
        self,
        tun_name: String,
        port: u16,
        offloads: OffloadState,
        thread: &str,
        workers: Vec<Worker<E>>,
    ) -> Result<Engine, EngineError> {
        let SharedState {
            peers,
            stop,
            anti_spoof,
            udp_gso,
            spin,
        } = self.shared;
        let mut engine = Engine {
            tun_name,
            port,
            peers,
            stop,
            threads: Vec::with_capacity(workers.len()),
            counters: workers.iter().map(|w| w.counters.clone()).collect(),
            offloads,
            udp_gso,
            wg_ids: Default::default(),
            anti_spoofing: anti_spoof,
            spin: spin.clone(),
            sampler: None,
            poll_window_off: None,
            disco: None,
            tunnel_tap: crate::TunnelTapState::NotAsked,
        };
        for (i, w) in workers.into_iter().enumerate() {
            let h = std::thread::Builder::new()
                .name(format!("{thread}{i}"))
                .spawn(move || w.run())
                .map_err(EngineError::Spawn)?;
            engine.threads.push(h);
        }
        if let Some(g) = spin.gate() {
            match spare::start(g, &engine.stop) {
                Ok(h) => engine.sampler = Some(h),
                Err(why) => engine.poll_window_off = Some(why),
            }
        }
        tracing::debug!(tun = %engine.tun_name, workers = engine.threads.len(), ?offloads, "{thread} engine started");
        Ok(engine)
    }
}
