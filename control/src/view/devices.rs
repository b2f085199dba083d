//! Device reports for [`super::BackendStatus`]: a userspace engine's counters
//! (read from its per-worker blocks on request) and a kernel device's own
//! statistics (`/sys/class/net/<dev>/statistics`), each also as a
//! [`DeviceProbe`] a backend publishes ([`EngineProbe`], [`KernelDevice`]).
//! Nothing here runs per packet.

use std::path::Path;
use std::sync::{Arc, Weak};

use weft_engine::{Engine, Report};

use super::DeviceProbe;
use super::model::{BackendStatus, Counters, DeviceStatus, Offloads, PeerCounters};

/// A running engine as readers see it: a weak reference, so that a reader
/// never keeps an engine alive that its backend stopped (the backend waits
/// out a report in progress before it stops the engine; see
/// `backend::tunnel`).
#[derive(Debug, Clone)]
pub struct EngineProbe(pub Weak<Engine>);

impl DeviceProbe for EngineProbe {
    fn report(&self, st: &mut BackendStatus) {
        if let Some(e) = self.0.upgrade() {
            let (dev, peers) = engine_device(&e);
            st.devices.push(dev);
            st.peer_counters.extend(peers);
        }
    }

    fn nat_seen(&self) -> Option<std::net::SocketAddrV4> {
        let e = self.0.upgrade()?;
        let d = e.discovery()?;
        d.enabled().then(|| d.seen()).flatten().map(|(a, _)| a)
    }
}

/// A kernel device, by name (absent devices report nothing).
#[derive(Debug, Clone)]
pub struct KernelDevice(pub String);

impl KernelDevice {
    /// The probe of kernel device `name`.
    pub fn probe(name: &str) -> Arc<dyn DeviceProbe> {
        Arc::new(KernelDevice(name.to_string()))
    }
}

impl DeviceProbe for KernelDevice {
    fn report(&self, st: &mut BackendStatus) {
        st.devices.extend(kernel_device(&self.0));
    }
}

/// The status of an engine's TUN device, and its peer table, from one
/// [`Engine::report`] (peers come already joined to their counters).
pub fn engine_device(engine: &Engine) -> (DeviceStatus, Vec<PeerCounters>) {
    let Report {
        stats: s,
        offloads: o,
        peers,
    } = engine.report();
    let name = engine.tun_name().to_string();
    let dev = DeviceStatus {
        name: name.clone(),
        kind: "engine".into(),
        workers: u32::try_from(engine.workers()).ok(),
        offloads: Some(Offloads {
            tun_vnet_hdr: o.tun_vnet_hdr,
            tun_tso: o.tun_tso,
            tun_uso: o.tun_uso,
            tun_csum: o.tun_csum,
            udp_gso: o.udp_gso,
            udp_gro: o.udp_gro,
        }),
        counters: Counters {
            tx_packets: s.tx_packets,
            tx_bytes: s.tx_bytes,
            rx_packets: s.rx_packets,
            rx_bytes: s.rx_bytes,
        },
        batching: Some(s.batching),
        drops: Some(s.drops),
        peers: u32::try_from(peers.len()).ok(),
        poll_window: Some(engine.poll_window().to_string()),
        tunnel_gso: None,
    };
    let peers = peers
        .into_iter()
        .map(|p| PeerCounters {
            subnet: p.subnet,
            endpoint: p.endpoint.ip(),
            device: name.clone(),
            counters: p.stats.map(|c| Counters {
                tx_packets: c.tx_packets,
                tx_bytes: c.tx_bytes,
                rx_packets: c.rx_packets,
                rx_bytes: c.rx_bytes,
            }),
            last_handshake: p
                .stats
                .and_then(|c| c.last_handshake)
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
            current: p.stats.and_then(|c| c.current),
            roamed: p
                .stats
                .and_then(|c| c.current)
                .is_some_and(|c| c != p.endpoint),
        })
        .collect();
    (dev, peers)
}

/// The status of kernel device `name` from its statistics; `None` when it does not exist.
pub fn kernel_device(name: &str) -> Option<DeviceStatus> {
    kernel_device_in(Path::new("/sys/class/net"), name)
}

/// [`kernel_device`] under another sysfs root (for tests).
pub fn kernel_device_in(root: &Path, name: &str) -> Option<DeviceStatus> {
    let dir = root.join(name).join("statistics");
    if name.is_empty() || name.contains('/') || !dir.is_dir() {
        return None;
    }
    let read = |f: &str| {
        std::fs::read_to_string(dir.join(f))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    Some(DeviceStatus {
        name: name.to_string(),
        kind: "kernel".into(),
        workers: None,
        offloads: None,
        counters: Counters {
            tx_packets: read("tx_packets"),
            tx_bytes: read("tx_bytes"),
            rx_packets: read("rx_packets"),
            rx_bytes: read("rx_bytes"),
        },
        batching: None,
        drops: None,
        peers: None,
        poll_window: None,
        tunnel_gso: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_statistics_are_read_and_bad_names_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let st = dir.path().join("flannel.1/statistics");
        std::fs::create_dir_all(&st).expect("mkdir");
        for (f, v) in [
            ("tx_packets", "7\n"),
            ("tx_bytes", "700\n"),
            ("rx_packets", "5\n"),
            ("rx_bytes", "garbage"),
        ] {
            std::fs::write(st.join(f), v).expect("write");
        }
        let d = kernel_device_in(dir.path(), "flannel.1").expect("device");
        assert_eq!(
            d.counters,
            Counters {
                tx_packets: 7,
                tx_bytes: 700,
                rx_packets: 5,
                rx_bytes: 0
            }
        );
        assert_eq!(d.kind, "kernel");
        assert!(kernel_device_in(dir.path(), "nope").is_none());
        assert!(kernel_device_in(dir.path(), "../flannel.1").is_none());
    }
}
