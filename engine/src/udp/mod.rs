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
use crate::{Encap, Engine, EngineError, SOCKET_BUFFER, TunnelTapState, steer, wire};

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

/// The tunnel TAP of [`crate::EngineConfig::tunnel_tap`] (issue 32): a
/// VXLAN or flannel-UDP engine on an IPv4 node opens it with UDP-tunnel GSO
/// (Linux 6.17+) and writes TCP super-packets to it whole
/// ([`crate::path::tap`]; flannel-UDP only to peers that take them); the
/// daemon brings it up. While it is down, packets go through the UDP
/// sockets as without. A TAP that cannot be had is an error when required,
/// else a warning and the sockets alone.
fn tunnel_tap(
    cfg: &crate::EngineConfig,
    codec: Codec,
    workers: usize,
) -> Result<(Vec<TapTx>, TunnelTapState), EngineError> {
    let Some(want) = &cfg.tunnel_tap else {
        return Ok((Vec::new(), TunnelTapState::NotAsked));
    };
    let opened = match cfg.local_addr {
        IpAddr::V4(local) => crate::sys::tun::open_tunnel_tap(&want.name, workers)
            .map(|t| (t, local))
            .map_err(|e| e.to_string()),
        IpAddr::V6(_) => Err("only over IPv4".to_string()),
    };
    match opened {
        Ok((t, local)) => {
            let what = match codec {
                Codec::Vxlan(_) => "VXLAN",
                Codec::FlannelUdp => "flannel-UDP",
            };
            tracing::info!(tap = %t.name, "{what} TCP super-packets go whole through the tunnel TAP");
            let side = crate::path::tap::TapSide {
                tap_mac: t.mac,
                local,
            };
            let state = TunnelTapState::Open(t.name);
            let taps = t
                .queues
                .into_iter()
                .map(|queue| TapTx {
                    queue,
                    side,
                    id: std::cell::Cell::new(0),
                })
                .collect();
            Ok((taps, state))
        }
        Err(why) if want.required => Err(EngineError::TunnelTap {
            name: want.name.clone(),
            why,
        }),
        Err(why) => {
            tracing::warn!("tunnel TAP {}: {why}; UDP sockets only", want.name);
            Ok((Vec::new(), TunnelTapState::Unavailable(why)))
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
    let (taps, tap_state) = tunnel_tap(cfg, codec, b.workers)?;
    let mut taps = taps.into_iter();
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
    engine.tunnel_tap = tap_state;
    Ok(engine)
}
