//! Standalone forwarder: one engine with a static peer list, until SIGINT/SIGTERM.
//!
//! ```text
//! fwd --tun flannel.1 --encap vxlan --local 192.0.2.1 [--port 8472] [--vni 1]
//!     --mac 02:00:00:00:01:01 [--tun-addr 10.244.1.0] [--mtu 1450] [--workers N]
//!     [--no-offload] [--no-anti-spoof] [--stats SECS]
//!     --peer 10.244.2.0/24=192.0.2.2[,02:00:00:00:02:01] ...
//! fwd --tun flannel-wg --encap wireguard --local 192.0.2.1 [--port 51820]
//!     --key <base64 private key> [--psk <base64>] [--keepalive SECS] [--mtu 1420]
//!     --peer 10.244.2.0/24=192.0.2.2,<base64 peer public key> ...
//! ```
//! The TUN is created but not configured: set address, MTU, link up and routes
//! with `ip` after "ready" is printed on stderr. Final counters go to stderr.

use std::time::Duration;

use anyhow::{Context, Result, bail};
use weft_engine::wg::key_from_base64;
use weft_engine::{Encap, Engine, EngineConfig, Peer, WgPeer, WgSecret};

fn parse_mac(s: &str) -> Result<[u8; 6]> {
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() != 6 {
        bail!("bad mac {s}");
    }
    let mut m = [0u8; 6];
    for (d, p) in m.iter_mut().zip(parts) {
        *d = u8::from_str_radix(p, 16).with_context(|| format!("bad mac {s}"))?;
    }
    Ok(m)
}

fn parse_peer(s: &str, psk: Option<[u8; 32]>, keepalive: u16) -> Result<Peer> {
    let (subnet, rest) = s
        .split_once('=')
        .context("peer must be SUBNET=ENDPOINT[,MAC|,PUBKEY]")?;
    let (ep, mac, wireguard) = match rest.split_once(',') {
        Some((e, k)) if k.len() == 44 => {
            let public_key = key_from_base64(k).context("bad peer public key")?;
            let wg = WgPeer {
                public_key,
                port: 0,
                psk,
                keepalive,
            };
            (e, None, Some(wg))
        }
        Some((e, m)) => (e, Some(parse_mac(m)?), None),
        None => (rest, None, None),
    };
    Ok(Peer {
        subnet: subnet.parse().context("peer subnet")?,
        endpoint: ep.parse().context("peer endpoint")?,
        vtep_mac: mac,
        nat: None,
        wireguard,
        tunnel_gso: false,
    })
}

fn main() -> Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut tun, mut encap, mut local, mut port, mut vni, mut mac) =
        (None, String::from("udp"), None, None, 1u32, None);
    let (mut tun_addr, mut mtu, mut workers, mut offload, mut anti_spoof, mut stats) =
        (None, 1450u16, 0usize, true, true, 0u64);
    let (mut key, mut psk, mut keepalive) = (None, None, 0u16);
    let mut peer_args = Vec::new();
    while let Some(a) = args.next() {
        let mut val = || args.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--tun" => tun = Some(val()?),
            "--encap" => encap = val()?,
            "--local" => local = Some(val()?.parse().context("--local")?),
            "--port" => port = Some(val()?.parse().context("--port")?),
            "--vni" => vni = val()?.parse().context("--vni")?,
            "--mac" => mac = Some(parse_mac(&val()?)?),
            "--tun-addr" => tun_addr = Some(val()?.parse().context("--tun-addr")?),
            "--mtu" => mtu = val()?.parse().context("--mtu")?,
            "--workers" => workers = val()?.parse().context("--workers")?,
            "--stats" => stats = val()?.parse().context("--stats")?,
            "--no-offload" => offload = false,
            "--no-anti-spoof" => anti_spoof = false,
            "--peer" => peer_args.push(val()?),
            "--key" => key = Some(key_from_base64(&val()?).context("bad --key")?),
            "--psk" => psk = Some(key_from_base64(&val()?).context("bad --psk")?),
            "--keepalive" => keepalive = val()?.parse().context("--keepalive")?,
            other => bail!("unknown argument {other}"),
        }
    }
    let encap = match encap.as_str() {
        "udp" => Encap::FlannelUdp {
            port: port.unwrap_or(weft_engine::FLANNEL_UDP_PORT),
        },
        "vxlan" => Encap::Vxlan {
            vni,
            port: port.unwrap_or(weft_engine::VXLAN_PORT),
            local_mac: mac.context("--mac is required for vxlan")?,
        },
        "wireguard" => Encap::WireGuard {
            port: port.unwrap_or(weft_engine::WIREGUARD_PORT),
            private_key: WgSecret(key.context("--key is required for wireguard")?),
        },
        other => bail!("unknown encap {other}"),
    };
    let peers = peer_args
        .iter()
        .map(|p| parse_peer(p, psk, keepalive))
        .collect::<Result<Vec<_>>>()?;
    let cfg = EngineConfig {
        tun_name: tun.context("--tun is required")?,
        encap,
        local_addr: local.context("--local is required")?,
        tun_addr,
        mtu,
        workers,
        offload,
        anti_spoof,
        tunnel_tap: None,
    };
    // Block SIGINT/SIGTERM before the workers start so that only sigwait below sees them.
    // SAFETY: plain signal-mask manipulation on a zero-initialised sigset_t.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    };
    let engine = Engine::start(cfg).context("starting engine")?;
    engine.set_peers(peers);
    eprintln!(
        "ready tun={} workers={} offloads={:?}",
        engine.tun_name(),
        engine.workers(),
        engine.offloads()
    );
    if stats > 0 {
        let e = &engine;
        std::thread::scope(|s| {
            s.spawn(move || {
                loop {
                    std::thread::sleep(Duration::from_secs(stats));
                    eprintln!("stats {:?}", e.stats());
                }
            });
            wait(&set);
            // The scoped stats thread never ends on its own: exit after the final dump.
            eprintln!("final {:?} offloads={:?}", e.stats(), e.offloads());
            std::process::exit(0);
        });
    }
    wait(&set);
    eprintln!(
        "final {:?} offloads={:?}",
        engine.stats(),
        engine.offloads()
    );
    engine.stop();
    Ok(())
}

fn wait(set: &libc::sigset_t) {
    let mut sig = 0;
    // SAFETY: `set` is a valid, initialised sigset_t and `sig` a valid out pointer.
    unsafe { libc::sigwait(set, &mut sig) };
}
