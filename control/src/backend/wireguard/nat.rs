//! NAT traversal for the userspace WireGuard path (docs/nat.md): which
//! peers this node asks for its endpoint, which endpoint it sends a peer's
//! traffic to, and the keepalive that holds a NAT mapping open. Pure
//! functions of leases; `userspace.rs` applies them.
//!
//! - A peer is **asked** (a discovery server) when it runs NAT traversal
//!   (its lease has `WeftNAT`) and its address is reachable: its
//!   `PublicIP` is not private (RFC 1918, 100.64/10 shared, loopback,
//!   link-local), or it was itself seen from exactly its `PublicIP` and port.
//! - A peer is **punched** when both nodes run NAT traversal and the peer
//!   was seen from an endpoint other than its `PublicIP`: its traffic goes
//!   to that endpoint (the lease store is the only source of it; WireGuard
//!   roaming may move it further, authenticated), unless this node was seen
//!   from the same public address (the same NAT: Linux MASQUERADE does not
//!   hairpin, so the pair talk over their LAN, directly). Every other peer
//!   is **direct**, exactly as without the feature.
//! - **Keepalive**: a punched peer, and every peer of a node whose own
//!   address is private, gets at least [`NAT_KEEPALIVE`] seconds: WireGuard's
//!   own recommendation for NAT, below the 30 s Linux keeps an unreplied UDP
//!   mapping (`nf_conntrack_udp_timeout`) and the 120 s of an assured one.
//! - **Relayed** (docs/nat.md, "Relays"): a punched peer that has had no
//!   handshake for [`RELAY_AFTER`] since punching began goes through a relay
//!   (and no live session from before, [`FRESH`]) goes through a relay
//!   (a peer whose lease has `"Relay":true`, reachable, acknowledging this
//!   node's registrations): its traffic goes to the relay's relay port, and
//!   the relay forwards it. Both ends choose the same relay (the first live
//!   one in lease order), so a pair's handshake and data meet there. A relay
//!   that stops acknowledging (`RELAY_SILENT` in the engine) is left for
//!   the next live one.
//! - **Back to direct** (docs/nat.md): while a peer is relayed, this node
//!   sends it a direct probe ([`weft_engine::path::wg::direct`]) at its
//!   published endpoint and its `PublicIP:port` every [`PROBE_EVERY`], at
//!   once when those addresses change, and at once when the peer probed
//!   this node since the last round (so the second of a simultaneous open
//!   answers quickly). A valid ack from one of them moves the peer off the
//!   relay to that address ([`Peers::direct`]): the WireGuard endpoint
//!   moves, the session stays.
//! - **Back to the relay** (docs/nat.md): a punched peer that is
//!   [`silent`] (no authenticated packet for [`QUIET`] although data went
//!   to it, or for [`QUIET_IDLE`] at all) is sent a direct probe at the
//!   address the engine sends it to, every reconcile ([`Peers::checks_due`]);
//!   when [`CHECKS`] go unanswered and it is still silent, it goes through
//!   the first live relay as at the start. An ack ends the check and holds
//!   the next one off for [`PROBE_EVERY`] (a one-way flow is silent and
//!   healthy). A punched peer whose engine endpoint roamed to a relay (the
//!   other end relayed it first and its handshake came through the relay)
//!   is taken as relayed via that relay ([`Peers::watch`]): both ends end
//!   up on the same relay and probe their way back to direct.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::time::{Duration, SystemTime};

use ipnet::IpNet;

use crate::lease::Lease;
use crate::view::path::FRESH;

/// The persistent keepalive (seconds) that holds a NAT mapping.
pub const NAT_KEEPALIVE: u16 = 25;

/// How this node reaches a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Path {
    /// At its `PublicIP` (as without NAT traversal).
    Direct,
    /// At the endpoint it was seen from, through its NAT.
    Punched(SocketAddrV4),
    /// Through a relay.
    Relayed(RelayNode),
}

/// A relay as its lease names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayNode {
    /// Its `PublicIP` (how `weft status` names it).
    pub ip: Ipv4Addr,
    /// Where it relays: `PublicIP` and `RelayPort`.
    pub at: SocketAddrV4,
    /// Its WireGuard public key (registrations are made for it).
    pub key: [u8; 32],
}

/// How long a punched peer may go without a handshake before it is
/// relayed: N = 2 WireGuard handshake rounds (`REKEY_TIMEOUT`, 5 s) and a
/// second of margin. A pair behind cone NATs meets in the first or second
/// round (the first packets of both sides race their NATs; tests/nat.rs
/// measures 5.3-6.0 s from weftd start to the first reply, startup
/// included), so two rounds tell an unpunchable pair (symmetric NAT) from
/// a slow one without holding it up for long.
pub const RELAY_AFTER: Duration = Duration::from_secs(2 * 5 + 1);

/// How often a relayed peer is probed for a direct path: a third of the
/// 30 s Linux keeps an unreplied UDP mapping (`nf_conntrack_udp_timeout`),
/// so the mapping one side's probe opened is still there when the other
/// side's next probe arrives (the simultaneous open needs both), and a
/// change that the published endpoints do not show (a firewall opened) is
/// found within 10 s. A changed endpoint, or a probe from the peer, is
/// answered with a probe at the next reconcile instead. Two 64-byte
/// datagrams per relayed peer every 10 s cost nothing measurable, so no
/// backoff.
pub const PROBE_EVERY: Duration = Duration::from_secs(10);

/// A busy punched peer is [`silent`] when no authenticated packet came
/// from it for this long although data went to it since: a ping or a TCP
/// flow hears back within a round trip, a one-way flow within WireGuard's
/// 10 s passive keepalive (its check is answered: it stays). 2 s is one
/// reconcile, so a broken path is probed at the first or second reconcile
/// after it broke.
pub const QUIET: Duration = Duration::from_secs(2);

/// Any punched peer is [`silent`] after this long without an authenticated
/// packet: it sends a persistent keepalive at least every 25 s
/// ([`NAT_KEEPALIVE`]; a punched peer is behind NAT, so all its peers are
/// kept alive), so 30 s is one keepalive missed with 5 s of margin for a
/// tick (250 ms) and a handshake in progress (keepalives wait for it).
pub const QUIET_IDLE: Duration = Duration::from_secs(30);

/// Direct probes a silent punched peer leaves unanswered before it is
/// relayed: one per reconcile (2 s), so one lost probe on a working path
/// does not move it, and the pair is relayed 4-6 s after it was found
/// silent: 6.5-7.0 s after its direct path was cut in tests/nat_relay.rs
/// (ten runs, both ends).
pub const CHECKS: u32 = 2;

/// What the engine saw of a peer lately (its 250 ms tick publishes it).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Seen {
    /// When an authenticated packet last came from it.
    pub heard: Option<SystemTime>,
    /// When a data packet last went to it.
    pub sent: Option<SystemTime>,
    /// Where the engine sends now (roaming included).
    pub at: Option<SocketAddrV4>,
}

/// Whether a punched peer that the engine saw as `seen` is silent at `now`:
/// nothing authenticated for [`QUIET`] although data went to it after the
/// last packet came, or nothing for [`QUIET_IDLE`]. Never heard at all is
/// not silent: that is the start, which [`RELAY_AFTER`] covers.
pub fn silent(seen: &Seen, now: SystemTime) -> bool {
    let Some(heard) = seen.heard else {
        return false;
    };
    let quiet = now.duration_since(heard).unwrap_or_default();
    let sent_since = seen.sent.is_some_and(|s| s > heard);
    quiet >= QUIET && (sent_since || quiet >= QUIET_IDLE)
}

/// A silent punched peer being checked.
#[derive(Debug, Clone, Copy)]
struct Check {
    /// Its last authenticated packet when the check began.
    heard: Option<SystemTime>,
    /// Where it is probed (where the engine sends it).
    to: SocketAddrV4,
    /// Probes sent, and when the last went.
    sent: u32,
    last: Option<SystemTime>,
}

/// The relay `lease` offers: it runs NAT traversal with `"Relay":true`, is
/// reachable, and has a WireGuard key.
pub fn relay(lease: &Lease) -> Option<RelayNode> {
    let port = lease.attrs.weft_nat?.relay?;
    let ip = lease.attrs.public_ip;
    if !is_public(ip) {
        return None;
    }
    let (key, _) = super::parse_backend_data(lease.attrs.backend_data.as_deref()?)?;
    Some(RelayNode {
        ip,
        at: SocketAddrV4::new(ip, port),
        key,
    })
}

/// Whether `ip` looks reachable from other sites (not a private range).
pub fn is_public(ip: Ipv4Addr) -> bool {
    let shared = ip.octets()[0] == 100 && (ip.octets()[1] & 0xc0) == 64;
    !(ip.is_private() || shared || ip.is_loopback() || ip.is_link_local() || ip.is_unspecified())
}

/// The address to ask `lease`'s node for our endpoint, if it is a
/// discovery server (see the module docs): its BackendData's port, or
/// `port` (ours) when that is 0 or missing, as flannel reads it.
pub fn server(lease: &Lease, port: u16) -> Option<SocketAddr> {
    let nat = lease.attrs.weft_nat?;
    let data = lease.attrs.backend_data.as_deref();
    let port = match data.and_then(super::parse_backend_data) {
        Some((_, p)) if p != 0 => p,
        _ => port,
    };
    let own = SocketAddrV4::new(lease.attrs.public_ip, port);
    (is_public(lease.attrs.public_ip) || nat.endpoint == Some(own)).then_some(SocketAddr::V4(own))
}

/// How to reach `lease`'s node, listening on `port`, when this node was
/// seen from `seen` (see the module docs).
pub fn path(lease: &Lease, port: u16, seen: Option<SocketAddrV4>) -> Path {
    let Some(e) = lease.attrs.weft_nat.and_then(|n| n.endpoint) else {
        return Path::Direct;
    };
    let direct = SocketAddrV4::new(lease.attrs.public_ip, port);
    if e == direct || seen.is_some_and(|s| s.ip() == e.ip()) {
        return Path::Direct;
    }
    Path::Punched(e)
}

fn waited_secs(now: SystemTime, since: SystemTime) -> u64 {
    now.duration_since(since).unwrap_or_default().as_secs()
}

/// The keepalive for a peer on `path` of a node at `own` configured with
/// `configured` seconds (0: off).
pub fn keepalive(configured: u16, path: Path, own: IpAddr) -> u16 {
    let behind = matches!(own, IpAddr::V4(a) if !is_public(a));
    if matches!(path, Path::Punched(_) | Path::Relayed(_)) || behind {
        match configured {
            0 => NAT_KEEPALIVE,
            c => c.min(NAT_KEEPALIVE),
        }
    } else {
        configured
    }
}

/// What the backend knows of its peers: the discovery servers and each
/// peer's path, by lease key.
#[derive(Debug, Default)]
pub struct Peers {
    servers: BTreeMap<String, SocketAddr>,
    paths: BTreeMap<String, Path>,
    /// The leases, to choose the paths again when our own endpoint changes.
    leases: BTreeMap<String, Lease>,
    /// Our own endpoint when the paths were chosen.
    pub seen: Option<SocketAddrV4>,
    /// Whether each peer (by subnet) had a live session at the last look.
    live: BTreeMap<IpNet, bool>,
    /// The relays, by lease key.
    relays: BTreeMap<String, RelayNode>,
    /// Punched peers: since when.
    punching: BTreeMap<String, SystemTime>,
    /// Relayed peers: through which relay.
    relayed: BTreeMap<String, RelayNode>,
    /// Each peer's port (its BackendData's, or ours).
    ports: BTreeMap<String, u16>,
    /// Relayed peers: when they were last probed, and where.
    probed: BTreeMap<String, (SystemTime, Vec<SocketAddrV4>)>,
    /// Peers a direct probe found: their published endpoint then, and the
    /// address that answered.
    found: BTreeMap<String, (SocketAddrV4, SocketAddrV4)>,
    /// Silent punched peers being checked.
    checks: BTreeMap<String, Check>,
    /// When each punched peer last answered a check.
    passed: BTreeMap<String, SystemTime>,
    /// Punched peers whose engine endpoint was a relay's at the last look.
    roams: BTreeMap<String, SocketAddrV4>,
}

impl Peers {
    /// `lease` added (or removed) on `path`, its node listening on `port`
    /// if its lease says nothing else; a changed path is logged.
    pub fn note(&mut self, lease: &Lease, add: bool, path: Path, port: u16) {
        let key = lease.key().to_string();
        match server(lease, port).filter(|_| add) {
            Some(s) => self.servers.insert(key.clone(), s),
            None => self.servers.remove(&key),
        };
        match relay(lease).filter(|_| add) {
            Some(r) => self.relays.insert(key.clone(), r),
            None => self.relays.remove(&key),
        };
        if !add {
            self.paths.remove(&key);
            self.leases.remove(&key);
            self.punching.remove(&key);
            self.relayed.remove(&key);
            self.ports.remove(&key);
            self.probed.remove(&key);
            self.found.remove(&key);
            self.checks.remove(&key);
            self.passed.remove(&key);
            self.roams.remove(&key);
            return;
        }
        self.leases.insert(key.clone(), lease.clone());
        self.ports.insert(key.clone(), port);
        match path {
            Path::Punched(_) => {
                self.punching
                    .entry(key.clone())
                    .or_insert_with(SystemTime::now);
            }
            Path::Direct => {
                self.punching.remove(&key);
                self.relayed.remove(&key);
                self.found.remove(&key);
                self.checks.remove(&key);
            }
            Path::Relayed(_) => {
                self.checks.remove(&key);
            }
        }
        if !matches!(path, Path::Relayed(_)) {
            self.probed.remove(&key);
        }
        if self.paths.insert(key.clone(), path) != Some(path) {
            match path {
                Path::Direct => {
                    tracing::info!("NAT: peer {key} is direct at {}", lease.attrs.public_ip)
                }
                Path::Punched(e) => {
                    tracing::info!("NAT: peer {key} is behind NAT, punching to {e}")
                }
                Path::Relayed(r) => {
                    tracing::info!("NAT: peer {key} is relayed via {} ({})", r.ip, r.at)
                }
            }
        }
    }

    /// The relay a punched peer (by lease key) goes through, if any.
    pub fn relayed(&self, key: &str) -> Option<RelayNode> {
        self.relayed.get(key).copied()
    }

    /// The path to the peer with lease key `key` whose lease alone gives
    /// `base` ([`path`]): through its relay while relayed, at the address
    /// a direct probe found while its published endpoint is the one it was
    /// found with.
    pub fn resolve(&self, key: &str, base: Path) -> Path {
        let Path::Punched(e) = base else {
            return base;
        };
        if let Some(r) = self.relayed.get(key) {
            return Path::Relayed(*r);
        }
        match self.found.get(key) {
            Some((was, at)) if *was == e => Path::Punched(*at),
            _ => base,
        }
    }

    /// The relayed peers to probe at `now` and the addresses to probe:
    /// its published endpoint and its `PublicIP:port`. Due every
    /// [`PROBE_EVERY`], at once when the addresses changed, and at once
    /// when the peer's own valid probe came here since the last round
    /// (`probed_by`).
    pub fn probes_due(
        &mut self,
        probed_by: impl Fn(&Lease) -> Option<SystemTime>,
        now: SystemTime,
    ) -> Vec<(Lease, Vec<SocketAddrV4>)> {
        let mut due = Vec::new();
        for key in self.relayed.keys() {
            let Some(lease) = self.leases.get(key) else {
                continue;
            };
            let mut to: Vec<SocketAddrV4> = lease
                .attrs
                .weft_nat
                .and_then(|n| n.endpoint)
                .into_iter()
                .collect();
            if let Some(port) = self.ports.get(key) {
                let own = SocketAddrV4::new(lease.attrs.public_ip, *port);
                if !to.contains(&own) {
                    to.push(own);
                }
            }
            let go = match self.probed.get(key) {
                None => true,
                Some((last, was)) => {
                    *was != to
                        || now.duration_since(*last).is_ok_and(|d| d >= PROBE_EVERY)
                        || probed_by(lease).is_some_and(|t| t > *last)
                }
            };
            if go {
                self.probed.insert(key.clone(), (now, to.clone()));
                due.push((lease.clone(), to));
            }
        }
        due
    }

    /// The relayed peer with lease key `key` answered a direct probe at
    /// `at` (at `now`): it leaves its relay for `at`. Its lease, to
    /// program again (`None` when it was not relayed).
    pub fn direct(&mut self, key: &str, at: SocketAddrV4, now: SystemTime) -> Option<Lease> {
        let lease = self.leases.get(key)?.clone();
        let published = lease.attrs.weft_nat.and_then(|n| n.endpoint)?;
        let r = self.relayed.remove(key)?;
        tracing::info!(
            "NAT: peer {key} answered a direct probe at {at}, leaving relay {}",
            r.ip
        );
        self.found.insert(key.to_string(), (published, at));
        self.probed.remove(key);
        // Punching starts over: the session from the relay carries on, and
        // a path that stops working is relayed again (choose_relays).
        self.punching.insert(key.to_string(), now);
        Some(lease)
    }

    /// Looks at each punched peer that is not relayed, from what the
    /// engine saw of it (`seen(lease)`) at `now`: a [`silent`] one is
    /// checked (unless it answered a check within [`PROBE_EVERY`]), one
    /// that spoke since its check began is not; one whose engine endpoint
    /// is a relay's at two looks in a row is relayed via that relay (the
    /// other end chose it and greeted this node through it). The leases
    /// whose path changed, to program again.
    pub fn watch(&mut self, seen: impl Fn(&Lease) -> Option<Seen>, now: SystemTime) -> Vec<Lease> {
        let mut changed = Vec::new();
        for key in self.punching.keys() {
            let (Some(lease), None) = (self.leases.get(key), self.relayed.get(key)) else {
                continue;
            };
            let Some(s) = seen(lease) else {
                continue;
            };
            // At a relay two looks in a row (2 s): a handshake came through
            // it, not a packet still in flight through the relay left
            // just now (that one roams the engine back within a round trip).
            let at_relay = (self.relays.values()).find(|r| s.at == Some(r.at));
            let was = match at_relay {
                Some(r) => self.roams.insert(key.clone(), r.at),
                None => self.roams.remove(key),
            };
            let roamed = at_relay.filter(|r| was == Some(r.at));
            if let Some(r) = roamed {
                self.roams.remove(key);
                tracing::info!(
                    "NAT: peer {key} came through relay {}, relaying via it too",
                    r.ip
                );
                self.relayed.insert(key.clone(), *r);
                self.checks.remove(key);
                changed.push(lease.clone());
                continue;
            }
            if at_relay.is_some() {
                // Its traffic goes through a relay now: nothing to probe.
                continue;
            }
            let held = (self.passed.get(key))
                .is_some_and(|t| now.duration_since(*t).is_ok_and(|d| d < PROBE_EVERY));
            let spoke = |c: &Check| c.heard != s.heard;
            match self.checks.get(key) {
                Some(c) if spoke(c) => {
                    self.checks.remove(key);
                }
                Some(_) => {}
                None if silent(&s, now) && !held => {
                    let to = s.at.or(match self.paths.get(key) {
                        Some(Path::Punched(e)) => Some(*e),
                        _ => None,
                    });
                    if let Some(to) = to {
                        tracing::info!(
                            "NAT: peer {key} is silent for {} s, probing {to}",
                            s.heard.map_or(0, |h| waited_secs(now, h))
                        );
                        let c = Check {
                            heard: s.heard,
                            to,
                            sent: 0,
                            last: None,
                        };
                        self.checks.insert(key.clone(), c);
                    }
                }
                None => {}
            }
        }
        changed
    }

    /// The silent punched peers to probe at `now`, and where: each one once
    /// per reconcile (every 2 s; due after 1.5 s so a late reconcile does
    /// not skip a round), until [`CHECKS`] went.
    pub fn checks_due(&mut self, now: SystemTime) -> Vec<(Lease, SocketAddrV4)> {
        let mut due = Vec::new();
        for (key, c) in &mut self.checks {
            let Some(lease) = self.leases.get(key) else {
                continue;
            };
            let go = c.sent < CHECKS
                && c.last.is_none_or(|t| {
                    now.duration_since(t)
                        .is_ok_and(|d| d >= Duration::from_millis(1500))
                });
            if go {
                c.sent += 1;
                c.last = Some(now);
                due.push((lease.clone(), c.to));
            }
        }
        due
    }

    /// The punched peer with lease key `key` answered a check at `now`:
    /// its direct path works (the flow was one-way).
    pub fn checked(&mut self, key: &str, now: SystemTime) {
        if self.checks.remove(key).is_some() {
            tracing::debug!("NAT: peer {key} answered its check");
            self.passed.insert(key.to_string(), now);
        }
    }

    /// The relays, in lease order.
    pub fn relays(&self) -> Vec<RelayNode> {
        self.relays.values().copied().collect()
    }

    /// Chooses relays at `now` from each punched peer's last handshake
    /// (`handshake(lease)`) and which relays are live: a peer that had no
    /// handshake for [`RELAY_AFTER`] since punching began, or whose check
    /// went unanswered [`CHECKS`] times ([`Peers::watch`]), goes through
    /// the first live relay; a relayed peer whose relay went silent,
    /// through the next. The leases whose path changed, to program again.
    pub fn choose_relays(
        &mut self,
        handshake: impl Fn(&Lease) -> Option<SystemTime>,
        live: impl Fn(&RelayNode) -> bool,
        now: SystemTime,
    ) -> Vec<Lease> {
        let mut changed = Vec::new();
        let live_relays: Vec<RelayNode> = self.relays.values().copied().filter(&live).collect();
        for (key, since) in &self.punching {
            let Some(lease) = self.leases.get(key) else {
                continue;
            };
            // A silent peer whose CHECKS probes went unanswered (the last
            // one at least a second ago: a reconcile).
            let failed = self.checks.get(key).filter(|c| {
                c.sent >= CHECKS
                    && c.last.is_some_and(|t| {
                        now.duration_since(t)
                            .is_ok_and(|d| d >= Duration::from_secs(1))
                    })
            });
            let next = match self.relayed.get(key) {
                Some(r) if live(r) => continue,
                Some(r) => live_relays.iter().find(|n| n.at != r.at).copied(),
                None => {
                    // A handshake since punching began, or a session
                    // still alive (it may predate the punch: roaming).
                    let met = handshake(lease).is_some_and(|h| {
                        h >= *since
                            || now
                                .duration_since(h)
                                .is_ok_and(|age| age.as_secs() <= FRESH)
                    });
                    let waited = now.duration_since(*since).unwrap_or_default();
                    if failed.is_none() && (met || waited < RELAY_AFTER) {
                        continue;
                    }
                    live_relays.first().copied()
                }
            };
            let Some(r) = next else {
                continue;
            };
            match (self.relayed.insert(key.clone(), r), failed) {
                (Some(was), _) => tracing::warn!(
                    "NAT: relay {} went silent, peer {key} fails over to {}",
                    was.ip,
                    r.ip
                ),
                (None, Some(c)) => tracing::warn!(
                    "NAT: peer {key} silent for {} s, {CHECKS} direct probes to {} unanswered, relaying",
                    c.heard.map_or(0, |h| waited_secs(now, h)),
                    c.to
                ),
                (None, None) => tracing::info!(
                    "NAT: no handshake with peer {key} for {} s of punching, relaying",
                    waited_secs(now, *since)
                ),
            }
            self.checks.remove(key);
            changed.push(lease.clone());
        }
        changed
    }

    /// The discovery servers.
    pub fn servers(&self) -> Vec<SocketAddr> {
        self.servers.values().copied().collect()
    }

    /// The peers (by subnet) whose session came or went since the last
    /// look, from each one's last handshake at `now`: live while younger
    /// than [`FRESH`] (WireGuard's `REJECT_AFTER_TIME`). A peer seen for
    /// the first time is reported only when live.
    pub fn sessions(
        &mut self,
        handshakes: impl IntoIterator<Item = (IpNet, Option<SystemTime>)>,
        now: SystemTime,
    ) -> Vec<(IpNet, bool)> {
        let mut changed = Vec::new();
        let mut next = BTreeMap::new();
        for (net, at) in handshakes {
            let age = at.and_then(|t| now.duration_since(t).ok());
            let live = age.is_some_and(|a| a.as_secs() <= FRESH);
            if self.live.get(&net).copied().unwrap_or(false) != live {
                changed.push((net, live));
            }
            next.insert(net, live);
        }
        self.live = next;
        changed
    }

    /// The leases to choose paths for again when our own endpoint moved
    /// from the one they were chosen with (a peer behind our own NAT is
    /// direct, others are not): empty when it did not.
    pub fn again(&mut self, seen: Option<SocketAddrV4>) -> Vec<Lease> {
        if seen == self.seen {
            return Vec::new();
        }
        self.seen = seen;
        self.leases.values().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{LeaseAttrs, NatAttrs};

    fn lease(ip: &str, nat: Option<&str>) -> Lease {
        Lease {
            subnet: Some("10.244.3.0/24".parse().expect("net")),
            ipv6_subnet: None,
            attrs: LeaseAttrs {
                public_ip: ip.parse().expect("ip"),
                backend_type: "wireguard".into(),
                weft_nat: nat.map(|e| NatAttrs {
                    endpoint: (!e.is_empty()).then(|| e.parse().expect("ep")),
                    relay: None,
                }),
                ..Default::default()
            },
            expiration: None,
        }
    }

    fn v4(s: &str) -> SocketAddrV4 {
        s.parse().expect("addr")
    }

    #[test]
    fn servers_are_reachable_nodes_with_the_feature() {
        let s = |l: &Lease| server(l, 51820);
        assert_eq!(
            s(&lease("192.0.2.1", Some(""))),
            Some("192.0.2.1:51820".parse().expect("a"))
        );
        assert_eq!(s(&lease("192.0.2.1", None)), None, "feature off");
        assert_eq!(s(&lease("10.12.0.2", Some(""))), None, "private");
        assert_eq!(s(&lease("100.64.1.2", Some(""))), None, "shared range");
        let seen_as_itself = lease("10.12.0.2", Some("10.12.0.2:51820"));
        assert!(s(&seen_as_itself).is_some());
    }

    #[test]
    fn a_peer_seen_through_a_nat_is_punched_unless_it_shares_ours() {
        let behind = lease("10.12.0.2", Some("203.0.113.9:40001"));
        assert_eq!(
            path(&behind, 51820, None),
            Path::Punched(v4("203.0.113.9:40001"))
        );
        let ours = Some(v4("203.0.113.9:51820"));
        assert_eq!(path(&behind, 51820, ours), Path::Direct, "same NAT");
        assert_eq!(path(&lease("10.12.0.2", None), 51820, None), Path::Direct);
        assert_eq!(
            path(&lease("10.12.0.2", Some("")), 51820, None),
            Path::Direct
        );
        let public = lease("192.0.2.1", Some("192.0.2.1:51820"));
        assert_eq!(path(&public, 51820, None), Path::Direct);
    }

    #[test]
    fn sessions_that_come_and_go_are_reported_once() {
        use std::time::{Duration, UNIX_EPOCH};
        let mut p = Peers::default();
        let t = |s| UNIX_EPOCH + Duration::from_secs(s);
        let a: IpNet = "10.244.2.0/24".parse().expect("net");
        let b: IpNet = "10.244.3.0/24".parse().expect("net");
        assert_eq!(
            p.sessions([(a, Some(t(990))), (b, None)], t(1000)),
            vec![(a, true)]
        );
        assert_eq!(p.sessions([(a, Some(t(990))), (b, None)], t(1100)), vec![]);
        assert_eq!(
            p.sessions([(a, Some(t(990))), (b, Some(t(1190)))], t(1200)),
            vec![(a, false), (b, true)]
        );
    }

    fn relay_lease(net: &str, ip: &str, key: u8) -> Lease {
        let mut l = lease(ip, Some(""));
        l.subnet = Some(net.parse().expect("net"));
        let k = weft_engine::wg::key_to_base64(&[key; 32]);
        l.attrs.backend_data = Some(format!("{{\"PublicKey\":\"{k}\",\"Port\":51820}}"));
        l.attrs.weft_nat = Some(NatAttrs {
            endpoint: None,
            relay: Some(51830),
        });
        l
    }

    #[test]
    fn an_unpunchable_peer_is_relayed_and_fails_over_to_a_live_relay() {
        use std::time::Duration;
        let mut p = Peers::default();
        let r1 = relay_lease("10.244.11.0/24", "192.0.2.11", 1);
        let r2 = relay_lease("10.244.12.0/24", "192.0.2.12", 2);
        assert!(relay(&r1).is_some() && relay(&r2).is_some());
        let private = relay_lease("10.244.13.0/24", "10.12.0.9", 3);
        assert_eq!(relay(&private), None, "a relay must be reachable");
        for r in [&r2, &r1] {
            p.note(r, true, Path::Direct, 51820);
        }
        let peer = lease("10.12.0.2", Some("203.0.113.9:40001"));
        let punched = Path::Punched(v4("203.0.113.9:40001"));
        p.note(&peer, true, punched, 51820);
        let since = *p.punching.values().next().expect("punching");
        let key = peer.key().to_string();
        let all_live = |_: &RelayNode| true;
        let no_hs = |_: &Lease| None;
        // Within N rounds: keep punching.
        let early = since + RELAY_AFTER - Duration::from_secs(1);
        assert!(p.choose_relays(no_hs, all_live, early).is_empty());
        // A handshake since punching began: the punch worked.
        let met = |_: &Lease| Some(since + Duration::from_secs(3));
        assert!(
            p.choose_relays(met, all_live, since + RELAY_AFTER)
                .is_empty()
        );
        // A session from before the punch (roaming) that is still alive.
        let alive = |_: &Lease| Some(since - Duration::from_secs(30));
        assert!(
            p.choose_relays(alive, all_live, since + RELAY_AFTER)
                .is_empty()
        );
        // No relay live yet: nothing to do.
        let none_live = |_: &RelayNode| false;
        assert!(
            p.choose_relays(no_hs, none_live, since + RELAY_AFTER)
                .is_empty()
        );
        // N rounds without a handshake: the first live relay in lease order.
        let got = p.choose_relays(no_hs, all_live, since + RELAY_AFTER);
        assert_eq!(got.len(), 1);
        assert_eq!(p.relayed(&key).map(|r| r.at), Some(v4("192.0.2.11:51830")));
        // It stays while its relay is live, even with no handshake.
        assert!(
            p.choose_relays(no_hs, all_live, since + 10 * RELAY_AFTER)
                .is_empty()
        );
        // Its relay goes silent: the other one.
        let r1_dead = |r: &RelayNode| r.ip.octets()[3] != 11;
        assert_eq!(
            p.choose_relays(no_hs, r1_dead, since + 11 * RELAY_AFTER)
                .len(),
            1
        );
        assert_eq!(p.relayed(&key).map(|r| r.at), Some(v4("192.0.2.12:51830")));
        // The peer's path turns direct (e.g. it left its NAT): relaying ends.
        p.note(&peer, true, Path::Direct, 51820);
        assert_eq!(p.relayed(&key), None);
    }

    #[test]
    fn a_relayed_peer_is_probed_and_an_ack_takes_it_back_to_direct() {
        use std::time::Duration;
        let mut p = Peers::default();
        let r1 = relay_lease("10.244.11.0/24", "192.0.2.11", 1);
        p.note(&r1, true, Path::Direct, 51820);
        let peer = lease("10.12.0.2", Some("203.0.113.9:40001"));
        let key = peer.key().to_string();
        let base = path(&peer, 51820, None);
        p.note(&peer, true, p.resolve(&key, base), 51820);
        let since = *p.punching.values().next().expect("punching");
        let never = |_: &Lease| None;
        // Not relayed: nothing to probe.
        assert!(p.probes_due(never, since).is_empty());
        let t = |s: u64| since + RELAY_AFTER + Duration::from_secs(s);
        assert_eq!(p.choose_relays(never, |_| true, t(0)).len(), 1);
        let relayed = p.resolve(&key, base);
        assert!(matches!(relayed, Path::Relayed(_)));
        p.note(&peer, true, relayed, 51820);
        // Relayed: its published endpoint and its PublicIP:port, at once.
        let both = vec![v4("203.0.113.9:40001"), v4("10.12.0.2:51820")];
        assert_eq!(
            p.probes_due(never, t(0)),
            vec![(peer.clone(), both.clone())]
        );
        // Then every PROBE_EVERY ...
        assert!(p.probes_due(never, t(2)).is_empty());
        let period = PROBE_EVERY.as_secs();
        assert_eq!(p.probes_due(never, t(period)).len(), 1);
        // ... or at once when the peer probed us since the last round.
        assert!(p.probes_due(never, t(period + 2)).is_empty());
        let probed = |_: &Lease| Some(t(period + 3));
        assert_eq!(p.probes_due(probed, t(period + 4)).len(), 1);
        assert!(p.probes_due(probed, t(period + 6)).is_empty(), "once");
        // ... or when its published endpoint moved.
        let moved = lease("10.12.0.2", Some("203.0.113.9:51820"));
        p.note(
            &moved,
            true,
            p.resolve(&key, path(&moved, 51820, None)),
            51820,
        );
        let got = p.probes_due(never, t(period + 7));
        assert_eq!(got[0].1[0], v4("203.0.113.9:51820"));
        // An ack from the published endpoint: punched there, relay left,
        // nothing more to probe, and no relaying again while the session
        // lives.
        let at = v4("203.0.113.9:51820");
        assert_eq!(p.direct(&key, at, t(period + 8)), Some(moved.clone()));
        assert_eq!(p.relayed(&key), None);
        let now_path = p.resolve(&key, path(&moved, 51820, None));
        assert_eq!(now_path, Path::Punched(at));
        p.note(&moved, true, now_path, 51820);
        assert!(p.probes_due(never, t(period + 30)).is_empty());
        let alive = |_: &Lease| Some(t(period));
        assert!(p.choose_relays(alive, |_| true, t(period + 30)).is_empty());
        assert_eq!(p.direct(&key, at, t(period + 31)), None, "not relayed");
        // An ack at its PublicIP:port would be kept while the published
        // endpoint stays, and forgotten when it moves.
        p.found.insert(key.clone(), (at, v4("10.12.0.2:51820")));
        let base = path(&moved, 51820, None);
        assert_eq!(p.resolve(&key, base), Path::Punched(v4("10.12.0.2:51820")));
        let again = lease("10.12.0.2", Some("203.0.113.9:40777"));
        let base = path(&again, 51820, None);
        assert_eq!(p.resolve(&key, base), base);
    }

    #[test]
    fn silent_means_no_answer_to_data_or_no_keepalive() {
        use std::time::{Duration, UNIX_EPOCH};
        let t = |ms: u64| Some(UNIX_EPOCH + Duration::from_millis(ms));
        let now = UNIX_EPOCH + Duration::from_secs(1000);
        let seen = |heard, sent| Seen {
            heard,
            sent,
            at: None,
        };
        // Busy: data went after the last packet came, 2 s ago.
        assert!(silent(&seen(t(998_000), t(999_900)), now));
        assert!(!silent(&seen(t(998_100), t(999_900)), now), "1.9 s");
        // Heard after the last data went: answered, not silent.
        assert!(!silent(&seen(t(990_000), t(989_000)), now));
        // Idle: only keepalives, one missed.
        assert!(!silent(&seen(t(971_000), None), now), "29 s");
        assert!(silent(&seen(t(970_000), None), now), "30 s");
        // Never heard: the start (RELAY_AFTER), not this rule.
        assert!(!silent(&seen(None, t(999_000)), now));
    }

    #[test]
    fn a_silent_punched_peer_is_checked_then_relayed_and_both_ends_meet() {
        use std::time::Duration;
        let mut p = Peers::default();
        let r1 = relay_lease("10.244.11.0/24", "192.0.2.11", 1);
        let r2 = relay_lease("10.244.12.0/24", "192.0.2.12", 2);
        for r in [&r1, &r2] {
            p.note(r, true, Path::Direct, 51820);
        }
        let peer = lease("10.12.0.2", Some("203.0.113.9:40001"));
        let key = peer.key().to_string();
        let ep = v4("203.0.113.9:40001");
        p.note(&peer, true, Path::Punched(ep), 51820);
        let since = *p.punching.values().next().expect("punching");
        let t = |s: u64| since + Duration::from_secs(s);
        let hs = |_: &Lease| Some(since + Duration::from_secs(1));
        let live = |_: &RelayNode| true;
        // Talking: nothing to check.
        let ok = |now: u64| {
            move |_: &Lease| {
                Some(Seen {
                    heard: Some(t(now)),
                    sent: Some(t(now)),
                    at: Some(ep),
                })
            }
        };
        assert!(p.watch(ok(20), t(20)).is_empty());
        assert!(p.checks_due(t(20)).is_empty());
        // The path breaks at 30 s: data still goes, nothing comes.
        let broken = |now: u64| {
            move |_: &Lease| {
                Some(Seen {
                    heard: Some(t(30)),
                    sent: Some(t(now)),
                    at: Some(ep),
                })
            }
        };
        assert!(p.watch(broken(31), t(31)).is_empty());
        assert!(p.checks_due(t(31)).is_empty(), "1 s: not silent yet");
        p.watch(broken(32), t(32));
        assert_eq!(p.checks_due(t(32)), vec![(peer.clone(), ep)]);
        assert!(p.choose_relays(hs, live, t(32)).is_empty(), "one probe");
        assert!(p.checks_due(t(33)).is_empty(), "one per reconcile");
        p.watch(broken(34), t(34));
        assert!(
            p.choose_relays(hs, live, t(34)).is_empty(),
            "one unanswered"
        );
        assert_eq!(p.checks_due(t(34)).len(), 1);
        // Two unanswered, a reconcile later: the first live relay.
        p.watch(broken(36), t(36));
        assert_eq!(p.choose_relays(hs, live, t(36)), vec![peer.clone()]);
        assert_eq!(p.relayed(&key).map(|r| r.ip.octets()[3]), Some(11));
        assert!(p.checks_due(t(36)).is_empty(), "relayed: no more checks");
        // The relayed peer probes its way back as before.
        let relayed = p.resolve(&key, Path::Punched(ep));
        p.note(&peer, true, relayed, 51820);
        assert_eq!(p.probes_due(|_| None, t(36)).len(), 1);

        // A one-way flow: silent, but the check is answered: it stays,
        // and is not checked again for PROBE_EVERY.
        let mut q = Peers::default();
        q.note(&r1, true, Path::Direct, 51820);
        q.note(&peer, true, Path::Punched(ep), 51820);
        q.watch(broken(40), t(40));
        assert_eq!(q.checks_due(t(40)).len(), 1);
        q.checked(&key, t(40));
        q.watch(broken(42), t(42));
        assert!(q.checks_due(t(42)).is_empty(), "held off");
        assert!(q.choose_relays(hs, live, t(44)).is_empty());
        q.watch(broken(51), t(51));
        assert_eq!(q.checks_due(t(51)).len(), 1, "checked again");
        // It speaks before the second probe is due: the check ends.
        q.watch(ok(52), t(52));
        assert!(q.checks_due(t(53)).is_empty());
        assert!(q.choose_relays(hs, live, t(60)).is_empty());

        // The other end: its engine roamed to the relay the first end
        // chose (the handshake came through it): relayed via that one.
        let mut b = Peers::default();
        for r in [&r1, &r2] {
            b.note(r, true, Path::Direct, 51820);
        }
        b.note(&peer, true, Path::Punched(ep), 51820);
        // (Silent too: data went since it last heard; still no probe to
        // the relay.)
        let via_r2 = |_: &Lease| {
            Some(Seen {
                heard: Some(t(30)),
                sent: Some(t(36)),
                at: Some(v4("192.0.2.12:51830")),
            })
        };
        assert!(b.watch(via_r2, t(37)).is_empty(), "one look: in flight?");
        assert!(b.checks_due(t(37)).is_empty(), "a relay is not probed");
        assert_eq!(b.watch(via_r2, t(39)), vec![peer.clone()]);
        assert_eq!(b.relayed(&key).map(|r| r.ip.octets()[3]), Some(12));
        assert!(b.watch(via_r2, t(41)).is_empty(), "once");
        // A packet still in flight through the relay when the pair went
        // direct roams the engine there for one look only: nothing moves.
        let mut c = Peers::default();
        c.note(&r1, true, Path::Direct, 51820);
        c.note(&peer, true, Path::Punched(ep), 51820);
        let at = |a: &'static str| {
            move |_: &Lease| {
                Some(Seen {
                    heard: Some(t(50)),
                    sent: Some(t(50)),
                    at: Some(v4(a)),
                })
            }
        };
        assert!(c.watch(at("192.0.2.11:51830"), t(50)).is_empty());
        assert!(c.watch(at("203.0.113.9:40001"), t(52)).is_empty());
        assert!(c.watch(at("192.0.2.11:51830"), t(54)).is_empty());
        assert_eq!(c.relayed(&key), None);
    }

    #[test]
    fn keepalive_holds_mappings() {
        let public: IpAddr = "192.0.2.1".parse().expect("ip");
        let private: IpAddr = "10.12.0.2".parse().expect("ip");
        let punched = Path::Punched(v4("203.0.113.9:1"));
        assert_eq!(keepalive(0, Path::Direct, public), 0);
        assert_eq!(keepalive(0, punched, public), NAT_KEEPALIVE);
        assert_eq!(keepalive(0, Path::Direct, private), NAT_KEEPALIVE);
        assert_eq!(keepalive(5, punched, public), 5);
        assert_eq!(keepalive(60, Path::Direct, private), NAT_KEEPALIVE);
    }
}
