//! The flannel-UDP and VXLAN engine: its start-up here, its half of the
//! worker run loop in [`worker`]: per worker a receive socket on the shared port
//! (`SO_REUSEPORT`, `UDP_GRO`) and [`SEND_SOCKETS`] send sockets on
//! ephemeral ports, and the flow steering program on the group
//! ([`crate::steer`]). What all engines share is [`crate::builder`].

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use crate::builder::Builder;
use crate::encap::{Codec, Vxlan};
use crate::path::wg::disco::Discovery;
use crate::sys::udp::Udp;
use crate::{Encap, Engine, EngineError, SOCKET_BUFFER, steer, wire};

pub(crate) mod nat;
pub(crate) mod worker;

use crate::worker::Worker;
use worker::{SEND_SOCKETS, TapTx, UdpEncap};

/// The codec `encap` (flannel-UDP or VXLAN) runs, validated.
pub(crate) fn codec(encap: Encap, local_addr: IpAddr) -> Result<Codec, EngineError> {
    match encap {
        Encap::FlannelUdp { .. } if local_addr.is_ipv6() => {
            Err(EngineError::Config("flannel-udp is ipv4 only"))
        }
        Encap::FlannelUdp { .. } => Ok(Codec::FlannelUdp),
        Encap::Vxlan { vni, .. } if vni > wire::vxlan::MAX_VNI => {
            Err(EngineError::Config("vni does not fit in 24 bits"))
        }
        Encap::Vxlan { local_mac, .. } if local_mac[0] & 1 != 0 => {
            Err(EngineError::Config("vtep mac must be unicast"))
        }
        Encap::Vxlan { vni, local_mac, .. } => Ok(Codec::Vxlan(Vxlan { vni, local_mac })),
        Encap::WireGuard { .. } | Encap::Ipip => Err(EngineError::Config("not a udp codec")),
    }
}

/// Experimental (issue 32): with `WEFT_ENGINE_TAP_GSO=<name>` in the
/// environment, a VXLAN engine on an IPv4 node opens TAP `<name>` with
/// UDP-tunnel GSO (Linux 6.17+) and writes TCP super-packets to it whole
/// ([`crate::path::tap`]). The TAP is the operator's to bring up, with
/// `accept_local=1` and `rp_filter=0` on it and `ip_forward=1` on the
/// node; while it is down, packets go through the UDP sockets as without.
fn tunnel_tap(local: IpAddr, codec: Codec, workers: usize) -> Vec<TapTx> {
    let Ok(name) = std::env::var("WEFT_ENGINE_TAP_GSO") else {
        return Vec::new();
    };
    let (IpAddr::V4(local), Codec::Vxlan(_)) = (local, codec) else {
        tracing::warn!("WEFT_ENGINE_TAP_GSO: only for VXLAN over IPv4; ignored");
        return Vec::new();
    };
    match crate::sys::tun::open_tunnel_tap(&name, workers) {
        Ok(t) => {
            tracing::info!(tap = %t.name, "VXLAN TCP super-packets go whole through the tunnel TAP");
            let side = crate::path::tap::TapSide {
                tap_mac: t.mac,
                local,
            };
            t.queues
                .into_iter()
                .map(|queue| TapTx {
                    queue,
                    side,
                    id: std::cell::Cell::new(0),
                })
                .collect()
        }
        Err(e) => {
            tracing::warn!("WEFT_ENGINE_TAP_GSO: tunnel TAP {name}: {e}; UDP sockets only");
            Vec::new()
        }
    }
}

/// Starts a flannel-UDP or VXLAN engine.
pub(crate) fn start(b: Builder<'_>, codec: Codec) -> Result<Engine, EngineError> {
    let cfg = b.cfg;
    let port = cfg.encap.port();
    // The UDP worker segments UDP super-packets too (offload::uso).
    let dev = b.open_tun(true)?;
    let mut offloads = b.offloads(&dev, true);
    let icmp_src = match cfg.tun_addr {
        Some(IpAddr::V4(a)) => Some(a),
        _ => None,
    };
    let mut taps = tunnel_tap(cfg.local_addr, codec, b.workers).into_iter();
    let mut built = Vec::with_capacity(b.workers);
    let disco = Arc::new(Discovery::default());
    for q in dev.queues {
        let addr = SocketAddr::new(cfg.local_addr, port);
        let rx = Udp::bind(addr, true, true, SOCKET_BUFFER)
            .map_err(|source| EngineError::Socket { addr, source })?;
        if cfg.offload && !rx.enable_gro() {
            offloads.udp_gro = false;
        }
        let mut tx = Vec::with_capacity(SEND_SOCKETS);
        for _ in 0..SEND_SOCKETS {
            let a = SocketAddr::new(cfg.local_addr, 0);
            tx.push(
                Udp::bind(a, false, false, SOCKET_BUFFER)
                    .map_err(|source| EngineError::Socket { addr: a, source })?,
            );
        }
        let i = built.len();
        let encap = UdpEncap {
            codec,
            rx,
            tx,
            icmp_src,
            nat: nat::Nat {
                shared: Arc::clone(&disco),
            },
            tap: taps.next(),
        };
        built.push(Worker::new(i, q, dev.vnet_hdr, cfg.mtu, &b.shared, encap));
    }
    // Both directions of a flow to one worker (see `steer`); the workers bound in order.
    if built.len() > 1
        && let Err(e) = built[0]
            .encap
            .rx
            .attach_reuseport_cbpf(&steer::program(codec.headroom(), built.len()))
    {
        tracing::debug!("reuseport flow steering unavailable ({e}); the kernel hashes outer ports");
    }
    let mut engine = b.spawn(dev.name, port, offloads, "weft-w", built)?;
    engine.disco = Some(disco);
    Ok(engine)
}
