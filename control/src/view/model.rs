//! The status model: what `weft status --json` prints and what the status
//! socket returns (one JSON object per line). Its shape (key names and value
//! types) is fixed by `control/src/status/snapshots/status.shape.json`,
//! which a unit test and `tests/observability.rs` check against.
//!
//! ```json
//! {
//!   "version": "0.1.0", "pid": 1234,
//!   "lease": { "subnet": "10.244.1.0/24", "ipv6_subnet": null, "public_ip": "192.0.2.1",
//!              "public_ipv6": null, "backend_type": "vxlan", "expires": 1764547200 },
//!   "backend": { "name": "vxlan", "dataplane": "userspace", "requested": "auto",
//!                "devices": [ { "name": "flannel.1", "kind": "engine", "workers": 2,
//!                               "offloads": { "tun_vnet_hdr": true, ... },
//!                               "counters": { "tx_packets": 10, ... },
//!                               "batching": { "udp_sends": 3, ... },
//!                               "drops": { "malformed": 0, ... } } ] },
//!   "peers": [ { "subnet": "10.244.2.0/24", "ipv6_subnet": null, "public_ip": "192.0.2.2",
//!                "public_ipv6": null, "backend_type": "vxlan", "device": "flannel.1",
//!                "counters": { "tx_packets": 5, "tx_bytes": 420, "rx_packets": 5, "rx_bytes": 420 },
//!                "last_handshake": null,
//!                "probe": { "reachable": true, "rtt_us": 420, "losses": 0, "sent": 12,
//!                           "received": 12, "pmtu": 1450 } } ]
//! }
//! ```
//!
//! Optional parts are `null`, never absent: `lease` before the lease is
//! acquired; a device's `workers`, `offloads`, `batching` and `drops` on the
//! kernel dataplane (whose packet counters come from the device's own
//! statistics); a peer's `device` and `counters` when the dataplane keeps no
//! per-peer counters (the kernel) or does not carry that peer; a peer's
//! `last_handshake` unless it is a userspace WireGuard peer that has
//! completed a handshake; a peer's `probe` when weftd's overlay prober has
//! no result for it (probing off, no overlay address, not probed yet), and
//! its `reachable`, `rtt_us` and `pmtu` until known (docs/probes.md); a
//! peer's `path` unless the node runs NAT traversal (docs/nat.md).
//!
//! `batching` and `drops` are the engine's counter sets ([`Batching`],
//! [`Drops`]): their keys are the engine's counter names, in the engine's
//! table order, and nothing here lists them again. Reading, a key this
//! build does not know (a newer weftd) is ignored and a missing one is 0.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
pub use weft_engine::{Batching, Drops};

use crate::lease::Lease;

/// The whole status of one weftd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// weftd's version.
    pub version: String,
    /// weftd's pid.
    pub pid: u32,
    /// The node's own lease (`null` until acquired).
    pub lease: Option<LeaseStatus>,
    /// The running backend.
    pub backend: BackendStatus,
    /// Every peer lease the node knows, in subnet order.
    pub peers: Vec<PeerStatus>,
}

/// A lease as shown in status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseStatus {
    /// IPv4 subnet.
    pub subnet: Option<String>,
    /// IPv6 subnet.
    pub ipv6_subnet: Option<String>,
    /// Public IPv4 address.
    pub public_ip: String,
    /// Public IPv6 address.
    pub public_ipv6: Option<String>,
    /// The lease's `BackendType` (`""` for udp).
    pub backend_type: String,
    /// Expiry, seconds since the Unix epoch (`null`: never).
    pub expires: Option<u64>,
}

/// What a backend reports ([`super::BackendView::read`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackendStatus {
    /// Backend type.
    pub name: String,
    /// `kernel`, `userspace` or `none`.
    pub dataplane: String,
    /// The dataplane choice in effect, or being switched to while a switch
    /// is pending (`auto`, `kernel`, `userspace`: `--dataplane`, or what
    /// `weft dataplane set` asked for); a refused switch leaves it as it
    /// was. Set by weftd's main loop.
    #[serde(default)]
    pub requested: String,
    /// The devices the dataplane runs on.
    pub devices: Vec<DeviceStatus>,
    /// Per-peer counters by subnet (merged into [`Status::peers`]; not serialised).
    #[serde(skip)]
    pub peer_counters: Vec<PeerCounters>,
    /// This node's NAT relay (`--nat-relay`, docs/nat.md "Relays").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay: Option<RelayStatus>,
}

/// A NAT relay's counters since it started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RelayStatus {
    /// Datagrams forwarded.
    pub forwarded: u64,
    /// Their bytes.
    pub bytes: u64,
    /// Registrations taken.
    pub registered: u64,
    /// Datagrams dropped over the bandwidth limit.
    pub limited: u64,
    /// Datagrams dropped for any other reason.
    pub dropped: u64,
}

/// One dataplane device (a TUN run by the engine, or a kernel device).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeviceStatus {
    /// Interface name.
    pub name: String,
    /// `engine` (weft's userspace engine) or `kernel`.
    pub kind: String,
    /// Engine worker threads.
    pub workers: Option<u32>,
    /// Active offloads (engine).
    pub offloads: Option<Offloads>,
    /// Packets and bytes (engine: inner packets; kernel: the device's statistics).
    pub counters: Counters,
    /// Syscalls against packets (engine).
    #[serde(default, with = "counter_set")]
    pub batching: Option<Batching>,
    /// Drops by reason (engine).
    #[serde(default, with = "counter_set")]
    pub drops: Option<Drops>,
    /// Entries in the engine's peer table (engine): what it forwards to, as
    /// opposed to the leases weftd knows ([`Status::peers`]).
    #[serde(default)]
    pub peers: Option<u32>,
    /// What the workers' poll-on window is doing (engine), e.g. `auto,
    /// open (50 us)`.
    #[serde(default)]
    pub poll_window: Option<String>,
    /// The userspace IPv4 vxlan device's tunnel TAP (`--tunnel-gso`,
    /// issue 32): in use, or why not; `null` for every other device.
    #[serde(default)]
    pub tunnel_gso: Option<TunnelGsoStatus>,
}

/// Whether TCP super-packets leave through the tunnel TAP (`--tunnel-gso`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TunnelGsoStatus {
    /// The flag: `off`, `auto` or `on`.
    pub mode: String,
    /// The TAP, when in use (`null`: the engine's UDP sockets).
    pub tap: Option<String>,
    /// Why the TAP is not in use (`off`, or the condition that failed).
    pub reason: Option<String>,
}

/// Active offloads of an engine device.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Offloads {
    /// TUN reads/writes carry a virtio-net header.
    pub tun_vnet_hdr: bool,
    /// The TUN hands over TCP super-packets.
    pub tun_tso: bool,
    /// The TUN hands over UDP super-packets (USO).
    #[serde(default)]
    pub tun_uso: bool,
    /// The TUN hands over partial checksums.
    pub tun_csum: bool,
    /// UDP GSO in use.
    pub udp_gso: bool,
    /// UDP GRO enabled.
    pub udp_gro: bool,
}

/// Packet and byte counters, tx = towards peers, rx = from peers.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Packets sent.
    pub tx_packets: u64,
    /// Bytes sent.
    pub tx_bytes: u64,
    /// Packets received.
    pub rx_packets: u64,
    /// Bytes received.
    pub rx_bytes: u64,
}

/// Counters of one peer as a dataplane device keeps them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerCounters {
    /// The peer's subnet (as programmed).
    pub subnet: IpNet,
    /// Where the dataplane sends its packets.
    pub endpoint: IpAddr,
    /// The device carrying it.
    pub device: String,
    /// Its counters, when the dataplane keeps them.
    pub counters: Option<Counters>,
    /// WireGuard: when the last handshake completed (seconds since the Unix epoch).
    pub last_handshake: Option<u64>,
    /// WireGuard on the engine: where it sends now (after roaming), when
    /// known.
    pub current: Option<std::net::SocketAddr>,
    /// Whether `current` differs from the configured `ip:port`.
    pub roamed: bool,
}

/// One peer in status.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerStatus {
    /// IPv4 subnet.
    pub subnet: Option<String>,
    /// IPv6 subnet.
    pub ipv6_subnet: Option<String>,
    /// Public IPv4 address (the tunnel endpoint).
    pub public_ip: String,
    /// Public IPv6 address.
    pub public_ipv6: Option<String>,
    /// The peer lease's `BackendType`.
    pub backend_type: String,
    /// The device that carries it (`null`: not in a userspace peer table).
    pub device: Option<String>,
    /// Its counters (summed over its subnets), when the dataplane keeps them.
    pub counters: Option<Counters>,
    /// WireGuard: when the last handshake completed, seconds since the Unix
    /// epoch (`null`: not WireGuard, not in a userspace peer table, or none yet).
    #[serde(default)]
    pub last_handshake: Option<u64>,
    /// What weftd's overlay probes learned of the peer (`null`: not probed,
    /// e.g. probing off or the node holds no overlay address).
    #[serde(default)]
    pub probe: Option<ProbeStatus>,
    /// NAT traversal: `direct`, `punched`, `relayed via <ip>` or
    /// `unreachable` ([`super::path`], from where the engine sends now;
    /// `null`: NAT traversal off, or not a userspace WireGuard peer).
    #[serde(default)]
    pub path: Option<String>,
    /// Userspace WireGuard: the address the engine sends this peer's
    /// packets to now, `ip:port` (WireGuard roaming may have moved it;
    /// `null`: not known, e.g. another dataplane or IPv6).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Whether `endpoint` differs from the one configured from the lease
    /// (the peer roamed; `null` when `endpoint` is).
    #[serde(default)]
    pub roamed: Option<bool>,
}

/// A peer's health as weftd's overlay probes see it (docs/probes.md).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProbeStatus {
    /// Reachable over the overlay (`null`: no verdict yet).
    pub reachable: Option<bool>,
    /// The last round trip, microseconds.
    pub rtt_us: Option<u64>,
    /// Consecutive probes lost.
    pub losses: u32,
    /// Probes sent.
    pub sent: u64,
    /// Acks received.
    pub received: u64,
    /// The largest packet (IP length) the path carries, as the last
    /// path-MTU search found it (`null`: not searched yet).
    #[serde(default)]
    pub pmtu: Option<u32>,
}

// === impl LeaseStatus ===

impl LeaseStatus {
    /// The status view of `l`.
    pub fn of(l: &Lease) -> LeaseStatus {
        LeaseStatus {
            subnet: l.subnet.map(|s| s.to_string()),
            ipv6_subnet: l.ipv6_subnet.map(|s| s.to_string()),
            public_ip: l.attrs.public_ip.to_string(),
            public_ipv6: l.attrs.public_ipv6.map(|a| a.to_string()),
            backend_type: l.attrs.backend_type.clone(),
            expires: l
                .expiration
                .and_then(|e| e.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_secs()),
        }
    }
}

// === impl BackendStatus ===

impl BackendStatus {
    /// A backend with no devices.
    pub fn new(name: &str, dataplane: Option<super::Dataplane>) -> BackendStatus {
        BackendStatus {
            name: name.to_string(),
            dataplane: super::Dataplane::name(dataplane).to_string(),
            ..Default::default()
        }
    }
}

// === impl Counters ===

impl Counters {
    /// Field-wise sum.
    pub fn plus(self, o: Counters) -> Counters {
        Counters {
            tx_packets: self.tx_packets + o.tx_packets,
            tx_bytes: self.tx_bytes + o.tx_bytes,
            rx_packets: self.rx_packets + o.rx_packets,
            rx_bytes: self.rx_bytes + o.rx_bytes,
        }
    }
}

// === impl Status ===

impl Status {
    /// Assembles the status from the own lease, the backend's report and
    /// the known peer leases (each matched to the backend's per-peer
    /// counters by subnet).
    pub fn build<'a>(
        own: Option<&Lease>,
        backend: BackendStatus,
        peers: impl IntoIterator<Item = &'a Lease>,
    ) -> Status {
        // Each subnet's counters in report order, so that a peer is joined
        // with one lookup per subnet (not a scan of every device's peers).
        let mut by_subnet: HashMap<IpNet, Vec<(usize, &PeerCounters)>> = HashMap::new();
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        for (i, p) in backend.peer_counters.iter().enumerate() {
            by_subnet.entry(p.subnet.trunc()).or_default().push((i, p));
        }
        let peers: Vec<&Lease> = peers.into_iter().collect();
        let relays = super::path::relays(peers.iter().copied());
        let peers = peers
            .into_iter()
            .map(|l| {
                let nets = l
                    .subnet
                    .map(IpNet::V4)
                    .into_iter()
                    .chain(l.ipv6_subnet.map(IpNet::V6));
                let mut mine: Vec<(usize, &PeerCounters)> = nets
                    .filter_map(|n| by_subnet.get(&n))
                    .flatten()
                    .copied()
                    .collect();
                mine.sort_unstable_by_key(|(i, _)| *i);
                let mine: Vec<&PeerCounters> = mine.into_iter().map(|(_, p)| p).collect();
                let device = mine.first().map(|p| p.device.clone());
                let counters = mine
                    .iter()
                    .filter_map(|p| p.counters)
                    .reduce(Counters::plus);
                let last_handshake = mine.iter().filter_map(|p| p.last_handshake).max();
                let current = mine.first().and_then(|p| p.current);
                let configured = mine.first().map(|p| p.endpoint);
                let endpoint = current.map(|c| c.ip()).or(configured);
                let path = super::path::of(own, l, endpoint, last_handshake, now, &relays);
                let roamed = current.map(|_| mine.iter().any(|p| p.roamed));
                PeerStatus {
                    subnet: l.subnet.map(|s| s.to_string()),
                    ipv6_subnet: l.ipv6_subnet.map(|s| s.to_string()),
                    public_ip: l.attrs.public_ip.to_string(),
                    public_ipv6: l.attrs.public_ipv6.map(|a| a.to_string()),
                    backend_type: l.attrs.backend_type.clone(),
                    device,
                    counters,
                    last_handshake,
                    probe: None,
                    path,
                    endpoint: current.map(|c| c.to_string()),
                    roamed,
                }
            })
            .collect();
        Status {
            version: env!("CARGO_PKG_VERSION").to_string(),
            pid: std::process::id(),
            lease: own.map(LeaseStatus::of),
            backend,
            peers,
        }
    }

    /// Sum of the device counters.
    pub fn totals(&self) -> Counters {
        self.backend
            .devices
            .iter()
            .map(|d| d.counters)
            .fold(Counters::default(), Counters::plus)
    }

    /// Seconds until the own lease expires (`None`: no lease or no expiry).
    pub fn lease_expires_in(&self) -> Option<i64> {
        let at = self.lease.as_ref()?.expires?;
        let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
        Some(i64::try_from(at).ok()? - i64::try_from(now).ok()?)
    }
}

/// Serde for an engine counter set as a JSON object `{name: count}` in the
/// engine's table order (see the module docs).
mod counter_set {
    use std::collections::BTreeMap;

    use serde::{Deserialize, Deserializer, Serialize, Serializer};
    use weft_engine::CounterSet;

    struct AsMap<'a, T>(&'a T);

    impl<T: CounterSet> Serialize for AsMap<'_, T> {
        fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
            s.collect_map(self.0.iter().map(|(c, n)| (c.name, n)))
        }
    }

    pub(super) fn serialize<S: Serializer, T: CounterSet>(
        v: &Option<T>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match v {
            Some(v) => s.serialize_some(&AsMap(v)),
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>, T: CounterSet>(
        d: D,
    ) -> Result<Option<T>, D::Error> {
        let map = Option::<BTreeMap<String, u64>>::deserialize(d)?;
        Ok(map.map(|m| {
            let mut set = T::default();
            for (name, n) in m {
                set.set(&name, n);
            }
            set
        }))
    }
}
