//! Device reports for [`super::BackendStatus`]: a userspace engine's counters
//! (read from its per-worker blocks on request) and a kernel device's own
//! statistics (`/sys/class/net/<dev>/statistics`). Nothing here runs per
//! packet.

use std::path::Path;

use weft_engine::Engine;

use super::model::{Batching, Counters, DeviceStatus, Drops, Offloads, PeerCounters};

/// The status of the engine running TUN `name`, and its peer table.
pub fn engine_device(engine: &Engine) -> (DeviceStatus, Vec<PeerCounters>) {
    let s = engine.stats();
    let o = engine.offloads();
    let d = &s.drops;
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
        batching: Some(Batching {
            udp_sends: s.udp_sends,
            udp_recvs: s.udp_recvs,
            tun_reads: s.tun_reads,
            tun_writes: s.tun_writes,
            gso_super_packets: s.gso_super_packets,
            gro_coalesced: s.gro_coalesced,
            handoffs: s.handoffs,
            icmp_sent: s.icmp_sent,
        }),
        drops: Some(Drops {
            malformed: d.malformed,
            bad_vni: d.bad_vni,
            bad_mac: d.wrong_dst_mac,
            unknown_peer: d.unknown_peer,
            spoofed_source: d.spoofed_source,
            no_route: d.no_route,
            ttl_expired: d.ttl_expired,
            mtu: d.mtu,
            decrypt_failure: d.bad_mac,
            unknown_key: d.unknown_key,
            replay: d.replay,
            handshake: d.handshake,
            backlog: d.backlog,
            udp_send_error: d.udp_send_errors,
            tun_write_error: d.tun_write_errors,
            io_error: d.io_errors,
        }),
    };
    let counted = engine.peer_stats();
    let peers = engine
        .peers()
        .entries()
        .iter()
        .map(|e| {
            // Same table order; matched by subnet in case the table was swapped in between.
            let stats = counted
                .as_ref()
                .and_then(|c| c.iter().find(|(s, _)| *s == e.subnet));
            let last_handshake = stats
                .and_then(|(_, p)| p.last_handshake)
                .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
                .map(|d| d.as_secs());
            let counters = stats.map(|(_, p)| Counters {
                tx_packets: p.tx_packets,
                tx_bytes: p.tx_bytes,
                rx_packets: p.rx_packets,
                rx_bytes: p.rx_bytes,
            });
            PeerCounters {
                subnet: e.subnet,
                endpoint: e.dst.ip(),
                device: name.clone(),
                counters,
                last_handshake,
            }
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
