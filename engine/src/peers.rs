//! The peer table: an immutable snapshot the control plane swaps atomically.
//!
//! Workers `load()` the current `Arc<PeerTable>` once per batch and never wait
//! on the control plane. Lookups allocate nothing: destination lookup is a
//! longest-prefix match over one hash map per distinct prefix length (a flannel
//! network has one), source validation is a hash lookup of the outer address.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ipnet::IpNet;

use crate::stats::PeerSlots;

/// A remote node, as the daemon derives it from a lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The node's pod subnet (lease `Subnet`, or `IPv6Subnet` for a v6 engine).
    pub subnet: IpNet,
    /// The node's underlay address (lease `PublicIP` / `PublicIPv6`).
    pub endpoint: IpAddr,
    /// The node's VTEP MAC (VXLAN only; lease `BackendData.VtepMAC`).
    pub vtep_mac: Option<[u8; 6]>,
    /// WireGuard parameters (WireGuard engines only). Several `Peer`s with the
    /// same public key form one WireGuard peer whose AllowedIPs are their subnets.
    pub wireguard: Option<WgPeer>,
    /// NAT traversal's path to a vxlan / flannel-UDP peer (docs/nat.md,
    /// "vxlan and udp"); `None` (as without the feature): sent to
    /// `endpoint` from the engine's send sockets.
    pub nat: Option<NatPath>,
    /// flannel-UDP: the peer takes a UDP-tunnel GSO datagram whole (its
    /// lease's `WeftGSO`: a weft node), so the tunnel TAP may send to it
    /// ([`crate::path::tap`]). VXLAN ignores it: every VXLAN receiver,
    /// kernel or weft, takes them.
    pub tunnel_gso: bool,
}

/// How a vxlan / flannel-UDP engine reaches a peer whose lease runs NAT
/// traversal. It comes from the lease store only: nothing received moves it
/// (these encapsulations authenticate nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NatPath {
    /// Where its traffic goes: the endpoint its NAT maps (punched) or its
    /// `PublicIP` and port. Sent **from the backend port** (the receive
    /// socket), so this node's NAT maps it exactly as it mapped the
    /// discovery request whose answer this node published, and the
    /// peer's packets to that published endpoint come back through it.
    /// Outer sources from `to`'s address are the peer's (anti-spoofing).
    pub to: SocketAddr,
    /// Whether it gets a NAT keepalive ([`crate::wire::disco::KEEPALIVE_MSG`])
    /// every [`crate::path::wg::disco::KEEPALIVE`].
    pub keepalive: bool,
}

/// A peer's WireGuard parameters (flannel: lease `BackendData` + backend options).
#[derive(Clone, PartialEq, Eq)]
pub struct WgPeer {
    /// The peer's static public key.
    pub public_key: [u8; 32],
    /// The peer's listen port (`BackendData.Port`); 0 means our own port.
    pub port: u16,
    /// Pre-shared key (the `PSK` option), if any.
    pub psk: Option<[u8; 32]>,
    /// Persistent keepalive in seconds; 0 = off.
    pub keepalive: u16,
}

impl std::fmt::Debug for WgPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WgPeer")
            .field(
                "public_key",
                &crate::encap::key::key_to_base64(&self.public_key),
            )
            .field("port", &self.port)
            .field("psk", &self.psk.map(|_| "<redacted>"))
            .field("keepalive", &self.keepalive)
            .finish()
    }
}

/// One WireGuard peer of the table (all entries sharing a public key).
#[derive(Debug, Clone)]
pub struct WgEntry {
    /// Stable 24-bit id while the key stays in the table: the upper bits of
    /// every receiver index we hand out, and the owner worker (`id % workers`).
    pub id: u32,
    /// Parameters.
    pub params: WgPeer,
    /// Configured endpoint (`PublicIP:Port`).
    pub endpoint: SocketAddr,
    /// AllowedIPs: the subnets of the peer's entries.
    pub allowed: Vec<IpNet>,
    /// Unix time (seconds) of the last completed handshake, 0 = none yet;
    /// written by the owner worker on its timer tick, kept across tables.
    pub(crate) handshake: Arc<AtomicU64>,
    /// Unix time (milliseconds) of the last handshake initiation we sent,
    /// 0 = none yet; written by the owner worker when it sends one (control
    /// pace: greetings, retries, rekeys), kept across tables.
    pub(crate) initiated: Arc<AtomicU64>,
    /// What the owner worker last saw of the peer ([`WgSeen`]), kept across
    /// tables.
    pub(crate) seen: Arc<WgSeen>,
}

/// What a WireGuard peer's owner worker publishes on its timer tick (every
/// 250 ms, never per packet): when an authenticated packet last came from
/// the peer, when a data packet last went to it, and where it sends now
/// (after roaming). The control plane reads them (docs/nat.md, "Back to
/// the relay" and "Observing it").
#[derive(Debug, Default)]
pub struct WgSeen {
    /// Unix ms of the last authenticated packet received, 0 = none yet.
    heard: AtomicU64,
    /// Unix ms of the last data packet sent, 0 = none yet.
    sent: AtomicU64,
    /// The current IPv4 endpoint ([`pack`]), 0 = not known (IPv6).
    at: AtomicU64,
}

/// `a` as one word: bit 48 set, the address in bits 16..48, the port below.
fn pack(a: SocketAddr) -> u64 {
    match a {
        SocketAddr::V4(v) => 1 << 48 | u64::from(u32::from(*v.ip())) << 16 | u64::from(v.port()),
        SocketAddr::V6(_) => 0,
    }
}

fn unpack(w: u64) -> Option<SocketAddr> {
    (w >> 48 == 1).then(|| {
        let ip = std::net::Ipv4Addr::from((w >> 16) as u32);
        SocketAddr::from((ip, w as u16))
    })
}

fn ms(t: u64) -> Option<SystemTime> {
    (t != 0).then(|| UNIX_EPOCH + Duration::from_millis(t))
}

impl WgSeen {
    /// The owner worker's tick: `heard` and `sent` (Unix ms, 0 = none)
    /// and the endpoint it sends to.
    pub(crate) fn publish(&self, heard: u64, sent: u64, at: SocketAddr) {
        self.heard.store(heard, Ordering::Relaxed);
        self.sent.store(sent, Ordering::Relaxed);
        self.at.store(pack(at), Ordering::Relaxed);
    }
}

impl WgEntry {
    /// When an authenticated packet last came from this peer.
    pub fn last_heard(&self) -> Option<SystemTime> {
        ms(self.seen.heard.load(Ordering::Relaxed))
    }

    /// When a data packet (not a keepalive) last went to this peer.
    pub fn last_sent(&self) -> Option<SystemTime> {
        ms(self.seen.sent.load(Ordering::Relaxed))
    }

    /// Where the owner worker sends now: the configured endpoint or the
    /// one WireGuard roamed to (`None` before its first tick, or IPv6).
    pub fn current_endpoint(&self) -> Option<SocketAddr> {
        unpack(self.seen.at.load(Ordering::Relaxed))
    }
}

impl WgEntry {
    /// When the last handshake with this peer completed.
    pub fn last_handshake(&self) -> Option<SystemTime> {
        match self.handshake.load(Ordering::Relaxed) {
            0 => None,
            s => Some(UNIX_EPOCH + Duration::from_secs(s)),
        }
    }

    /// When we last sent the peer a handshake initiation. The peer keeps its
    /// TAI64N timestamp and refuses initiations from our key that carry an
    /// older one (see [`crate::wg::BORINGTUN_TAI64_AHEAD`]).
    pub fn last_initiation(&self) -> Option<SystemTime> {
        match self.initiated.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(UNIX_EPOCH + Duration::from_millis(ms)),
        }
    }
}

/// Stable ids for WireGuard public keys across table swaps (control path only).
#[derive(Debug, Default)]
pub struct WgIds {
    by_key: HashMap<[u8; 32], u32>,
    next: u32,
}

/// Largest id (ids are 24 bits: boringtun shifts them left by 8).
const MAX_WG_ID: u32 = (1 << 24) - 1;

impl WgIds {
    /// The id of `key`, allocating one if new.
    fn get(&mut self, key: &[u8; 32]) -> u32 {
        if let Some(id) = self.by_key.get(key) {
            return *id;
        }
        loop {
            self.next = if self.next >= MAX_WG_ID {
                1
            } else {
                self.next + 1
            };
            let n = self.next;
            if !self.by_key.values().any(|v| *v == n) {
                self.by_key.insert(*key, n);
                return n;
            }
        }
    }

    /// Forgets keys not in `keep`.
    fn retain(&mut self, keep: &[[u8; 32]]) {
        self.by_key.retain(|k, _| keep.contains(k));
    }
}

/// One resolved peer entry.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Subnet behind the peer.
    pub subnet: IpNet,
    /// Where to send (endpoint address, engine port).
    pub dst: SocketAddr,
    /// Inner Ethernet destination (VXLAN); zero when unknown.
    pub mac: [u8; 6],
    /// Index into [`PeerTable::wg_peers`] (WireGuard).
    pub wg: Option<usize>,
    /// vxlan / flannel-UDP: sent from the backend port ([`NatPath`]).
    pub from_port: bool,
    /// flannel-UDP: the tunnel TAP may send to it ([`Peer::tunnel_gso`]).
    pub tunnel_gso: bool,
    /// Per-peer counters (empty until [`PeerTable::attach_counters`]).
    pub(crate) counters: Arc<PeerSlots>,
}

/// Immutable routing + anti-spoofing table.
#[derive(Debug, Default)]
pub struct PeerTable {
    entries: Vec<Entry>,
    /// (prefix length, masked network -> entry index), longest prefix first.
    v4: Vec<(u8, HashMap<u32, usize>)>,
    v6: Vec<(u8, HashMap<u128, usize>)>,
    /// Outer source address -> entry indices of that endpoint.
    by_endpoint: HashMap<IpAddr, Vec<usize>>,
    /// WireGuard peers (grouped by public key).
    wg: Vec<WgEntry>,
    /// WireGuard id -> index into `wg`.
    wg_by_id: HashMap<u32, usize>,
    /// Where NAT keepalives go ([`NatPath::keepalive`]), deduplicated.
    keepalives: Vec<SocketAddr>,
}

fn mask4(a: u32, len: u8) -> u32 {
    if len == 0 {
        0
    } else {
        a & (u32::MAX << (32 - u32::from(len)))
    }
}

fn mask6(a: u128, len: u8) -> u128 {
    if len == 0 {
        0
    } else {
        a & (u128::MAX << (128 - u32::from(len)))
    }
}

impl PeerTable {
    /// Builds a table; every peer is reached on `port`. Later duplicates of a subnet win.
    pub fn new(peers: &[Peer], port: u16) -> Self {
        Self::with_ids(peers, port, &mut WgIds::default())
    }

    /// Like [`PeerTable::new`], taking WireGuard ids from `ids` (so that they
    /// stay stable across tables) and forgetting ids of keys no longer present.
    pub fn with_ids(peers: &[Peer], port: u16, ids: &mut WgIds) -> Self {
        let mut t = PeerTable::default();
        let mut keys = Vec::new();
        for p in peers {
            let subnet = p.subnet.trunc();
            let idx = t.entries.len();
            let wg = p.wireguard.as_ref().map(|w| {
                let id = ids.get(&w.public_key);
                keys.push(w.public_key);
                match t.wg_by_id.get(&id) {
                    Some(&i) => {
                        t.wg[i].allowed.push(subnet);
                        i
                    }
                    None => {
                        let i = t.wg.len();
                        let port = if w.port == 0 { port } else { w.port };
                        t.wg.push(WgEntry {
                            id,
                            params: w.clone(),
                            endpoint: SocketAddr::new(p.endpoint, port),
                            allowed: vec![subnet],
                            handshake: Arc::default(),
                            initiated: Arc::default(),
                            seen: Arc::default(),
                        });
                        t.wg_by_id.insert(id, i);
                        i
                    }
                }
            });
            let dst_port = match &p.wireguard {
                Some(w) if w.port != 0 => w.port,
                _ => port,
            };
            let nat = p.nat.filter(|_| p.wireguard.is_none());
            t.entries.push(Entry {
                subnet,
                dst: nat.map_or(SocketAddr::new(p.endpoint, dst_port), |n| n.to),
                mac: p.vtep_mac.unwrap_or([0; 6]),
                wg,
                from_port: nat.is_some(),
                tunnel_gso: p.tunnel_gso,
                counters: Arc::default(),
            });
            if let Some(n) = nat {
                if n.keepalive && !t.keepalives.contains(&n.to) {
                    t.keepalives.push(n.to);
                }
                // Its NAT's public address sends its packets: only that
                // address, for this peer's subnet (`antispoof::check`).
                if n.to.ip() != p.endpoint {
                    t.by_endpoint.entry(n.to.ip()).or_default().push(idx);
                }
            }
            match subnet {
                IpNet::V4(n) => {
                    let len = n.prefix_len();
                    let key = u32::from(n.network());
                    match t.v4.iter_mut().find(|(l, _)| *l == len) {
                        Some((_, m)) => {
                            m.insert(key, idx);
                        }
                        None => t.v4.push((len, HashMap::from([(key, idx)]))),
                    }
                }
                IpNet::V6(n) => {
                    let len = n.prefix_len();
                    let key = u128::from(n.network());
                    match t.v6.iter_mut().find(|(l, _)| *l == len) {
                        Some((_, m)) => {
                            m.insert(key, idx);
                        }
                        None => t.v6.push((len, HashMap::from([(key, idx)]))),
                    }
                }
            }
            t.by_endpoint.entry(p.endpoint).or_default().push(idx);
        }
        t.v4.sort_by_key(|e| std::cmp::Reverse(e.0));
        t.v6.sort_by_key(|e| std::cmp::Reverse(e.0));
        ids.retain(&keys);
        t
    }

    /// Gives every entry per-peer counters for `workers` workers, taking
    /// over those of `prev`'s entry with the same subnet, and every
    /// WireGuard peer the handshake and initiation times of `prev`'s peer
    /// with the same key (control path only).
    pub(crate) fn attach_counters(&mut self, prev: &PeerTable, workers: usize) {
        for w in &mut self.wg {
            if let Some(o) = prev.wg_by_key(&w.params.public_key) {
                w.handshake = Arc::clone(&o.handshake);
                w.initiated = Arc::clone(&o.initiated);
                w.seen = Arc::clone(&o.seen);
            }
        }
        let old: HashMap<IpNet, &Arc<PeerSlots>> = prev
            .entries
            .iter()
            .filter(|o| !o.counters.is_empty())
            .map(|o| (o.subnet, &o.counters))
            .collect();
        for e in &mut self.entries {
            e.counters = old
                .get(&e.subnet)
                .map_or_else(|| PeerSlots::new(workers), |c| Arc::clone(c));
        }
    }

    /// Which of `entries` (indices from [`PeerTable::endpoint_entries`]) has
    /// `inner_src` in its subnet.
    #[inline]
    pub fn src_entry(&self, entries: &[usize], inner_src: IpAddr) -> Option<&Entry> {
        entries
            .iter()
            .filter_map(|&i| self.entries.get(i))
            .find(|e| e.subnet.contains(&inner_src))
    }

    /// The WireGuard peers.
    pub fn wg_peers(&self) -> &[WgEntry] {
        &self.wg
    }

    /// The WireGuard peer with id `id`.
    #[inline]
    pub fn wg_by_id(&self, id: u32) -> Option<&WgEntry> {
        self.wg_by_id.get(&id).and_then(|&i| self.wg.get(i))
    }

    /// The entry of WireGuard peer `id` whose subnet holds `inner_src`
    /// (longest-prefix match; `None` if that subnet is another peer's).
    #[inline]
    pub fn wg_src_entry(&self, id: u32, inner_src: IpAddr) -> Option<&Entry> {
        let i = *self.wg_by_id.get(&id)?;
        let e = self.lookup(inner_src)?;
        (e.wg == Some(i)).then_some(e)
    }

    /// The WireGuard peer with public key `key`.
    pub fn wg_by_key(&self, key: &[u8; 32]) -> Option<&WgEntry> {
        self.wg.iter().find(|w| &w.params.public_key == key)
    }

    /// Where NAT keepalives go (vxlan / flannel-UDP, [`NatPath`]).
    pub fn keepalives(&self) -> &[SocketAddr] {
        &self.keepalives
    }

    /// Number of peers.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the table is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entries, in insertion order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// Longest-prefix match for a destination of either version.
    #[inline]
    pub fn lookup(&self, dst: IpAddr) -> Option<&Entry> {
        match dst {
            IpAddr::V4(a) => self.lookup_v4(a.octets()),
            IpAddr::V6(a) => self.lookup_v6(a.octets()),
        }
    }

    /// Longest-prefix match for an IPv4 destination.
    #[inline]
    pub fn lookup_v4(&self, dst: [u8; 4]) -> Option<&Entry> {
        let a = u32::from_be_bytes(dst);
        self.v4
            .iter()
            .find_map(|(len, m)| m.get(&mask4(a, *len)))
            .and_then(|&i| self.entries.get(i))
    }

    /// Longest-prefix match for an IPv6 destination.
    #[inline]
    pub fn lookup_v6(&self, dst: [u8; 16]) -> Option<&Entry> {
        let a = u128::from_be_bytes(dst);
        self.v6
            .iter()
            .find_map(|(len, m)| m.get(&mask6(a, *len)))
            .and_then(|&i| self.entries.get(i))
    }

    /// Entry indices whose endpoint is `outer_src` (empty when unknown).
    #[inline]
    pub fn endpoint_entries(&self, outer_src: IpAddr) -> &[usize] {
        self.by_endpoint.get(&outer_src).map_or(&[], Vec::as_slice)
    }

    /// Whether `inner_src` lies in the subnet of one of `entries`.
    #[inline]
    pub fn src_allowed(&self, entries: &[usize], inner_src: IpAddr) -> bool {
        entries.iter().any(|&i| {
            self.entries
                .get(i)
                .is_some_and(|e| e.subnet.contains(&inner_src))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_nat_path_moves_the_destination_and_admits_only_the_nats_address() {
        let mut punched = peer("10.244.2.0/24", "10.12.0.2");
        let to: SocketAddr = "203.0.113.9:40001".parse().expect("addr");
        punched.nat = Some(NatPath {
            to,
            keepalive: true,
        });
        let mut plain = peer("10.244.3.0/24", "192.0.2.3");
        plain.nat = Some(NatPath {
            to: "192.0.2.3:8472".parse().expect("addr"),
            keepalive: false,
        });
        let t = PeerTable::new(&[punched, plain, peer("10.244.4.0/24", "192.0.2.4")], 8472);
        let e = t.lookup("10.244.2.9".parse().expect("ip")).expect("entry");
        assert_eq!((e.dst, e.from_port), (to, true));
        let nat = t.endpoint_entries(to.ip());
        assert_eq!(nat.len(), 1, "the NAT's address is this peer's");
        assert!(t.src_allowed(nat, "10.244.2.9".parse().expect("ip")));
        assert!(!t.src_allowed(nat, "10.244.4.9".parse().expect("ip")));
        assert_eq!(t.keepalives(), &[to], "only asked-for keepalives");
        let other = t.lookup("10.244.4.9".parse().expect("ip")).expect("entry");
        assert!(!other.from_port, "without NAT: as before");
    }

    fn peer(s: &str, ep: &str) -> Peer {
        Peer {
            subnet: s.parse().expect("cidr"),
            endpoint: ep.parse().expect("ip"),
            vtep_mac: Some([2, 0, 0, 0, 0, 1]),
            nat: None,
            wireguard: None,
            tunnel_gso: false,
        }
    }

    fn wg(s: &str, ep: &str, key: u8, port: u16) -> Peer {
        Peer {
            wireguard: Some(WgPeer {
                public_key: [key; 32],
                port,
                psk: None,
                keepalive: 0,
            }),
            vtep_mac: None,
            nat: None,
            ..peer(s, ep)
        }
    }

    #[test]
    fn wireguard_peers_group_by_key_and_keep_ids() {
        let mut ids = WgIds::default();
        let t = PeerTable::with_ids(
            &[
                wg("10.244.2.0/24", "192.0.2.2", 2, 0),
                wg("fd00:2::/64", "192.0.2.2", 2, 0),
                wg("10.244.3.0/24", "192.0.2.3", 3, 51999),
            ],
            51820,
            &mut ids,
        );
        assert_eq!(t.wg_peers().len(), 2);
        let a = t.wg_by_key(&[2; 32]).expect("peer 2");
        assert_eq!(a.allowed.len(), 2);
        assert_eq!(a.endpoint, "192.0.2.2:51820".parse().expect("sa"));
        let b = t.wg_by_key(&[3; 32]).expect("peer 3");
        assert_eq!(b.endpoint, "192.0.2.3:51999".parse().expect("sa"));
        assert_ne!(a.id, b.id);
        let e = t.lookup_v4([10, 244, 3, 1]).expect("route");
        assert_eq!(e.wg.map(|i| t.wg_peers()[i].id), Some(b.id));
        let (ida, idb) = (a.id, b.id);
        // Peer 2 leaves; peer 3 keeps its id; a new key gets a fresh id.
        let t2 = PeerTable::with_ids(
            &[
                wg("10.244.3.0/24", "192.0.2.3", 3, 0),
                wg("10.244.4.0/24", "192.0.2.4", 4, 0),
            ],
            51820,
            &mut ids,
        );
        assert_eq!(t2.wg_by_key(&[3; 32]).map(|w| w.id), Some(idb));
        let c = t2.wg_by_key(&[4; 32]).expect("peer 4").id;
        assert!(c != idb && c != ida && c <= MAX_WG_ID && c > 0);
        assert!(t2.wg_by_id(ida).is_none());
    }

    #[test]
    fn handshake_and_initiation_times_follow_the_key_across_tables() {
        let mut ids = WgIds::default();
        let t = PeerTable::with_ids(&[wg("10.244.2.0/24", "192.0.2.2", 2, 0)], 51820, &mut ids);
        let w = t.wg_by_key(&[2; 32]).expect("peer 2");
        assert_eq!((w.last_handshake(), w.last_initiation()), (None, None));
        w.handshake.store(1_700_000_000, Ordering::Relaxed);
        w.initiated.store(1_700_000_000_250, Ordering::Relaxed);
        let roamed: SocketAddr = "198.51.100.7:40001".parse().expect("addr");
        w.seen.publish(1_700_000_000_500, 1_700_000_000_600, roamed);
        // The peer moves (new endpoint, a second subnet): same key, same slots.
        let mut t2 = PeerTable::with_ids(
            &[
                wg("10.244.2.0/24", "192.0.2.22", 2, 0),
                wg("fd00:2::/64", "192.0.2.22", 2, 0),
                wg("10.244.3.0/24", "192.0.2.3", 3, 0),
            ],
            51820,
            &mut ids,
        );
        t2.attach_counters(&t, 1);
        let w2 = t2.wg_by_key(&[2; 32]).expect("peer 2");
        assert_eq!(
            w2.last_handshake(),
            Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000))
        );
        assert_eq!(
            w2.last_initiation(),
            Some(UNIX_EPOCH + Duration::from_millis(1_700_000_000_250))
        );
        let ms = |m| Some(UNIX_EPOCH + Duration::from_millis(m));
        assert_eq!(
            (w2.last_heard(), w2.last_sent(), w2.current_endpoint()),
            (ms(1_700_000_000_500), ms(1_700_000_000_600), Some(roamed))
        );
        let w3 = t2.wg_by_key(&[3; 32]).expect("peer 3");
        assert_eq!((w3.last_handshake(), w3.last_initiation()), (None, None));
        assert_eq!((w3.last_heard(), w3.current_endpoint()), (None, None));
    }

    #[test]
    fn longest_prefix_wins_and_misses_are_none() {
        let t = PeerTable::new(
            &[
                peer("10.244.0.0/16", "192.0.2.9"),
                peer("10.244.2.0/24", "192.0.2.2"),
                peer("fd00:2::/64", "2001:db8::2"),
            ],
            8472,
        );
        assert_eq!(
            t.lookup_v4([10, 244, 2, 7]).map(|e| e.dst),
            Some("192.0.2.2:8472".parse().expect("sa"))
        );
        assert_eq!(
            t.lookup_v4([10, 244, 3, 7]).map(|e| e.dst),
            Some("192.0.2.9:8472".parse().expect("sa"))
        );
        assert!(t.lookup_v4([10, 245, 0, 1]).is_none());
        let v6: std::net::Ipv6Addr = "fd00:2::5".parse().expect("v6");
        assert!(t.lookup_v6(v6.octets()).is_some());
        assert!(t.lookup_v6([0; 16]).is_none());
    }

    #[test]
    fn anti_spoofing_lookups() {
        let t = PeerTable::new(&[peer("10.244.2.0/24", "192.0.2.2")], 8285);
        let e = t.endpoint_entries("192.0.2.2".parse().expect("ip"));
        assert_eq!(e.len(), 1);
        assert!(t.src_allowed(e, "10.244.2.9".parse().expect("ip")));
        assert!(!t.src_allowed(e, "10.244.3.9".parse().expect("ip")));
        assert!(
            t.endpoint_entries("192.0.2.3".parse().expect("ip"))
                .is_empty()
        );
    }

    #[test]
    fn peer_counters_survive_table_swaps_by_subnet() {
        let mut t1 = PeerTable::new(&[peer("10.244.2.0/24", "192.0.2.2")], 8472);
        t1.attach_counters(&PeerTable::default(), 2);
        t1.entries()[0].counters.add(0, true, 3, 300);
        t1.entries()[0].counters.add(1, false, 2, 200);
        t1.entries()[0].counters.add(7, false, 1, 1); // no such worker: ignored
        let mut t2 = PeerTable::new(
            &[
                peer("10.244.3.0/24", "192.0.2.3"),
                peer("10.244.2.0/24", "192.0.2.2"),
            ],
            8472,
        );
        t2.attach_counters(&t1, 2);
        let s = t2.entries()[1].counters.sum();
        assert_eq!(
            (s.tx_packets, s.tx_bytes, s.rx_packets, s.rx_bytes),
            (3, 300, 2, 200)
        );
        assert_eq!(t2.entries()[0].counters.sum(), crate::PeerStats::default());
        let e = t2.endpoint_entries("192.0.2.2".parse().expect("ip"));
        let hit = t2.src_entry(e, "10.244.2.9".parse().expect("ip"));
        assert_eq!(
            hit.map(|e| e.subnet),
            Some("10.244.2.0/24".parse().expect("net"))
        );
        assert!(t2.src_entry(e, "10.244.3.9".parse().expect("ip")).is_none());
    }

    #[test]
    fn host_bits_are_masked() {
        let t = PeerTable::new(&[peer("10.244.2.7/24", "192.0.2.2")], 8285);
        assert!(t.lookup_v4([10, 244, 2, 200]).is_some());
    }
}
