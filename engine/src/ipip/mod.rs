//! Userspace IPIP engine: its start-up here, its half of the worker run
//! loop in [`worker`]; the codec (outer header fields, decapsulation, the
//! steering hash and filter) is [`crate::encap::ipip`], re-exported here.

pub(crate) mod worker;

use std::net::{IpAddr, SocketAddr};

pub use crate::encap::ipip::*;

use crate::builder::Builder;
use crate::sys::raw::Raw;
use crate::worker::Worker;
use crate::{Engine, EngineError, SOCKET_BUFFER};
use worker::IpipEncap;

/// Starts an IPIP engine (see [`crate::Engine::start`]): one raw socket per
/// worker bound to `cfg.local_addr` with its steering filter, the TUN
/// queues, and the workers.
pub(crate) fn start(b: Builder<'_>) -> Result<Engine, EngineError> {
    let cfg = b.cfg;
    let IpAddr::V4(local) = cfg.local_addr else {
        return Err(EngineError::Config("ipip is ipv4 only"));
    };
    let workers = b.workers;
    let sock_err = |source| EngineError::Socket {
        addr: SocketAddr::new(cfg.local_addr, 0),
        source,
    };
    // Sockets first: without CAP_NET_RAW nothing else is created.
    let mut socks = Vec::with_capacity(workers);
    for i in 0..workers {
        let s = Raw::open(local, SOCKET_BUFFER).map_err(sock_err)?;
        if workers > 1 {
            s.attach_filter(&steering_filter(i, workers))
                .map_err(sock_err)?;
        }
        socks.push(s);
    }
    // Copies queued before the filters were attached would be handled twice.
    socks.iter().for_each(Raw::drain);
    let dev = b.open_tun(false)?;
    let offloads = b.offloads(&dev, false);
    let built = dev
        .queues
        .into_iter()
        .zip(socks)
        .enumerate()
        .map(|(i, (q, sock))| {
            Worker::new(i, q, dev.vnet_hdr, cfg.mtu, &b.shared, IpipEncap { sock })
        })
        .collect();
    b.spawn(dev.name, 0, offloads, "weft-ipip", built)
}
