//! The dataplane half of `/metrics`: a [`Collector`] over one [`Status`]
//! snapshot, encoded with constant metrics (nothing is kept between scrapes).

use prometheus_client::collector::Collector as PromCollector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

use weft_engine::{Batching, CounterSet};

use crate::view::Status;
use crate::view::model::{Counters, DeviceStatus, Offloads, PeerCounters};

/// The snapshot to encode.
#[derive(Debug)]
pub(super) struct Collector(pub(super) Status);

type Fmt = Result<(), std::fmt::Error>;

/// One metric family: name, help, type, and its (labels, value) samples.
struct FamilyOut<'a> {
    name: &'a str,
    help: &'a str,
    counter: bool,
    samples: Vec<(Vec<(&'a str, String)>, u64)>,
}

impl FamilyOut<'_> {
    fn encode(&self, enc: &mut DescriptorEncoder) -> Fmt {
        if self.samples.is_empty() {
            return Ok(());
        }
        let ty = if self.counter {
            MetricType::Counter
        } else {
            MetricType::Gauge
        };
        let mut m = enc.encode_descriptor(self.name, self.help, None, ty)?;
        for (labels, v) in &self.samples {
            let f = m.encode_family(labels)?;
            if self.counter {
                ConstCounter::new(*v).encode(f)?;
            } else {
                ConstGauge::new(i64::try_from(*v).unwrap_or(i64::MAX)).encode(f)?;
            }
        }
        Ok(())
    }
}

impl PromCollector for Collector {
    fn encode(&self, mut enc: DescriptorEncoder) -> Fmt {
        let s = &self.0;
        let b = &s.backend;
        let backend = || ("backend", b.name.clone());
        let dataplane = || ("dataplane", b.dataplane.clone());
        let gauge = |name, help, samples| FamilyOut {
            name,
            help,
            counter: false,
            samples,
        };
        let counter = |name, help, samples| FamilyOut {
            name,
            help,
            counter: true,
            samples,
        };

        gauge(
            "backend_info",
            "The running backend and dataplane (value 1)",
            vec![(vec![backend(), dataplane()], 1)],
        )
        .encode(&mut enc)?;
        gauge(
            "peers",
            "Peer leases known to this node",
            vec![(vec![backend()], s.peers.len() as u64)],
        )
        .encode(&mut enc)?;
        if let Some(exp) = s.lease.as_ref().and_then(|l| l.expires) {
            gauge(
                "lease_expiry_timestamp_seconds",
                "When the node's lease expires (Unix time)",
                vec![(vec![], exp)],
            )
            .encode(&mut enc)?;
        }

        let dev_labels =
            |d: &DeviceStatus| vec![backend(), dataplane(), ("device", d.name.clone())];
        let per_dev = |f: fn(&Counters) -> u64| -> Vec<_> {
            b.devices
                .iter()
                .map(|d| (dev_labels(d), f(&d.counters)))
                .collect()
        };
        counter(
            "tx_packets",
            "Packets sent towards peers (engine: inner packets)",
            per_dev(|c| c.tx_packets),
        )
        .encode(&mut enc)?;
        counter(
            "tx_bytes",
            "Bytes sent towards peers (engine: inner bytes)",
            per_dev(|c| c.tx_bytes),
        )
        .encode(&mut enc)?;
        counter(
            "rx_packets",
            "Packets received from peers (engine: inner packets)",
            per_dev(|c| c.rx_packets),
        )
        .encode(&mut enc)?;
        counter(
            "rx_bytes",
            "Bytes received from peers (engine: inner bytes)",
            per_dev(|c| c.rx_bytes),
        )
        .encode(&mut enc)?;

        let short = |d: &DeviceStatus| vec![backend(), ("device", d.name.clone())];
        let drops = b
            .devices
            .iter()
            .filter_map(|d| d.drops.map(|dr| (d, dr)))
            .flat_map(|(d, dr)| {
                dr.iter()
                    .map(|(c, n)| {
                        let mut l = short(d);
                        l.push(("reason", c.name.to_string()));
                        (l, n)
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        counter(
            "drops",
            "Packets dropped by the userspace dataplane, by reason",
            drops,
        )
        .encode(&mut enc)?;

        // One family per engine batching counter, named and explained by the engine.
        for (i, c) in Batching::COUNTERS.iter().enumerate() {
            let samples = b
                .devices
                .iter()
                .filter_map(|d| Some((short(d), d.batching?.values().nth(i)?)))
                .collect();
            counter(c.metric, c.help, samples).encode(&mut enc)?;
        }

        let offloads = b
            .devices
            .iter()
            .filter_map(|d| d.offloads.map(|o| (d, o)))
            .flat_map(|(d, o): (&DeviceStatus, Offloads)| {
                [
                    ("tun_vnet_hdr", o.tun_vnet_hdr),
                    ("tun_tso", o.tun_tso),
                    ("tun_uso", o.tun_uso),
                    ("tun_csum", o.tun_csum),
                    ("udp_gso", o.udp_gso),
                    ("udp_gro", o.udp_gro),
                ]
                .into_iter()
                .map(move |(name, on)| {
                    let mut l = short(d);
                    l.push(("offload", name.to_string()));
                    (l, u64::from(on))
                })
            })
            .chain(b.devices.iter().filter_map(|d| {
                let g = d.tunnel_gso.as_ref()?;
                let mut l = short(d);
                l.push(("offload", "tunnel_gso".to_string()));
                Some((l, u64::from(g.tap.is_some())))
            }))
            .collect();
        gauge(
            "offload_enabled",
            "Whether an offload is active (1) or not (0)",
            offloads,
        )
        .encode(&mut enc)?;
        let workers = b
            .devices
            .iter()
            .filter_map(|d| d.workers.map(|w| (short(d), u64::from(w))))
            .collect();
        gauge("engine_workers", "Userspace engine worker threads", workers).encode(&mut enc)?;

        // One series per peer for which `f` has a value.
        let peer = |f: fn(&PeerCounters) -> Option<u64>| -> Vec<_> {
            b.peer_counters
                .iter()
                .filter_map(|p| {
                    let l = vec![
                        backend(),
                        ("device", p.device.clone()),
                        ("subnet", p.subnet.to_string()),
                        ("endpoint", p.endpoint.to_string()),
                    ];
                    Some((l, f(p)?))
                })
                .collect()
        };
        counter(
            "peer_tx_packets",
            "Packets sent to one peer",
            peer(|p| p.counters.map(|c| c.tx_packets)),
        )
        .encode(&mut enc)?;
        counter(
            "peer_tx_bytes",
            "Bytes sent to one peer",
            peer(|p| p.counters.map(|c| c.tx_bytes)),
        )
        .encode(&mut enc)?;
        counter(
            "peer_rx_packets",
            "Packets received from one peer",
            peer(|p| p.counters.map(|c| c.rx_packets)),
        )
        .encode(&mut enc)?;
        counter(
            "peer_rx_bytes",
            "Bytes received from one peer",
            peer(|p| p.counters.map(|c| c.rx_bytes)),
        )
        .encode(&mut enc)?;
        gauge(
            "peer_last_handshake_seconds",
            "WireGuard: when the last handshake with the peer completed, seconds since the Unix epoch",
            peer(|p| p.last_handshake),
        )
        .encode(&mut enc)?;
        // NAT traversal (docs/nat.md): 1 on the peer's path.
        let paths = (self.0.peers.iter())
            .filter_map(|p| {
                let path = p.path.clone()?;
                // `relayed via <ip>` is path `relayed`, label `via`.
                let (path, via) = match path.strip_prefix("relayed via ") {
                    Some(ip) => ("relayed".to_string(), ip.to_string()),
                    None => (path, String::new()),
                };
                let mut l = vec![
                    backend(),
                    ("subnet", p.subnet.clone().unwrap_or_default()),
                    ("path", path),
                ];
                if !via.is_empty() {
                    l.push(("via", via));
                }
                Some((l, 1))
            })
            .collect();
        gauge(
            "peer_path",
            "NAT traversal: 1 for the peer's path (direct, punched, relayed via a node, or unreachable)",
            paths,
        )
        .encode(&mut enc)?;
        // Where WireGuard roamed a peer, when not where it was configured.
        let roamed = (self.0.peers.iter())
            .filter(|p| p.roamed == Some(true))
            .filter_map(|p| {
                let l = vec![
                    backend(),
                    ("subnet", p.subnet.clone().unwrap_or_default()),
                    ("endpoint", p.endpoint.clone()?),
                ];
                Some((l, 1))
            })
            .collect();
        gauge(
            "peer_roamed",
            "Userspace WireGuard: 1 for a peer the engine sends to an endpoint (label) other than the configured one (roaming)",
            roamed,
        )
        .encode(&mut enc)?;
        // This node's NAT relay (docs/nat.md "Relays").
        if let Some(r) = b.relay {
            for (name, help, v) in [
                (
                    "nat_relay_forwarded_datagrams",
                    "NAT relay: datagrams forwarded",
                    r.forwarded,
                ),
                (
                    "nat_relay_forwarded_bytes",
                    "NAT relay: bytes forwarded",
                    r.bytes,
                ),
                (
                    "nat_relay_registrations",
                    "NAT relay: registrations taken",
                    r.registered,
                ),
                (
                    "nat_relay_limited_datagrams",
                    "NAT relay: datagrams dropped over --nat-relay-limit",
                    r.limited,
                ),
                (
                    "nat_relay_dropped_datagrams",
                    "NAT relay: datagrams dropped for another reason (unregistered source, no route, refused registration)",
                    r.dropped,
                ),
            ] {
                counter(name, help, vec![(vec![], v)]).encode(&mut enc)?;
            }
        }
        Ok(())
    }
}
