//! The prober's per-peer state, sans-IO: which peer is due a probe, what an
//! ack or a timeout makes of its health. Time is an argument (nanoseconds
//! of the prober's monotonic clock), so every rule is unit-tested without
//! sleeping.
//!
//! Rules (docs/probes.md): one probe per peer every [`INTERVAL_MIN`] to
//! [`INTERVAL_MIN`] + [`JITTER`] (uniform, 5 s on average, so the probes of
//! many nodes do not line up); a probe unanswered after [`TIMEOUT`] is a
//! loss; [`LOST_AFTER`] consecutive losses (about 15 s) make the peer
//! unreachable, one ack makes it reachable again. At most one probe per
//! peer is outstanding. While a peer answers, its path MTU is searched
//! beside ([`super::pmtu`]), with probes of their own.

use std::collections::{HashMap, HashSet};
use std::net::Ipv4Addr;

use ipnet::Ipv4Net;

use super::pmtu::Search;
use super::wire::{HEADER, Kind, Msg};
use crate::view::model::ProbeStatus;

/// The shortest interval between two probes to one peer (ns).
pub const INTERVAL_MIN: u64 = 4_000_000_000;
/// The random part of the interval (ns): 0 to 2 s, 5 s on average.
pub const JITTER: u64 = 2_000_000_000;
/// How long a probe waits for its ack (ns). An overlay round trip is well
/// under 10 ms on a LAN and under 300 ms across continents; 2 s leaves room
/// for a loaded node without delaying the verdict much.
pub const TIMEOUT: u64 = 2_000_000_000;
/// Consecutive losses that make a peer unreachable.
pub const LOST_AFTER: u32 = 3;

#[derive(Debug, Clone)]
struct Peer {
    subnet: Ipv4Net,
    due: u64,
    outstanding: Option<(u64, u64)>,
    st: ProbeStatus,
    pmtu: Option<Search>,
    /// A small probe was moved up to judge a lost size.
    check: bool,
}

/// A probe to send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    /// The peer's overlay address.
    pub dst: Ipv4Addr,
    /// The message.
    pub msg: Msg,
    /// Its UDP payload length (24, or a path-MTU probe's size minus 28).
    pub len: usize,
}

/// IPv4 and UDP headers: a probe of payload `n` is an `n + 28`-byte packet.
const IP_UDP: u32 = 28;

/// Every peer's probe state, by the peer's overlay address (its subnet's
/// first address): one hash lookup per ack, whatever the peer count.
#[derive(Debug)]
pub struct Table {
    peers: HashMap<Ipv4Addr, Peer>,
    seq: u64,
    rng: u64,
    ceiling: u32,
}

impl Table {
    /// An empty table; `seed` (non-zero) drives the jitter; `mtu` is the
    /// overlay MTU path-MTU searches go up to (0: no path-MTU probes).
    pub fn new(seed: u64, mtu: u32) -> Table {
        Table {
            peers: HashMap::new(),
            seq: 0,
            rng: seed | 1,
            ceiling: if mtu >= IP_UDP + HEADER as u32 {
                mtu
            } else {
                0
            },
        }
    }

    fn jitter(&mut self) -> u64 {
        // xorshift64: jitter needs spread, not secrecy.
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng % JITTER
    }

    /// Makes the table probe exactly `subnets` (new ones first within one
    /// jitter period, gone ones forgotten).
    pub fn sync(&mut self, subnets: impl IntoIterator<Item = Ipv4Net>, now: u64) {
        let want: HashSet<Ipv4Net> = subnets.into_iter().collect();
        self.peers.retain(|_, p| want.contains(&p.subnet));
        for s in want {
            if !self.peers.contains_key(&s.network()) {
                let due = now + self.jitter() / 4;
                self.peers.insert(
                    s.network(),
                    Peer {
                        subnet: s,
                        due,
                        outstanding: None,
                        st: ProbeStatus::default(),
                        pmtu: (self.ceiling > 0).then(|| Search::new(self.ceiling, now)),
                        check: false,
                    },
                );
            }
        }
    }

    /// Whether `addr` is a probed peer's overlay address.
    pub fn knows(&self, addr: Ipv4Addr) -> bool {
        self.peers.contains_key(&addr)
    }

    /// Expires unanswered probes and returns the probes due now, each with
    /// the peer's overlay address (its subnet's first address).
    pub fn due(&mut self, now: u64) -> Vec<Probe> {
        let mut out = Vec::new();
        let keys: Vec<Ipv4Addr> = self.peers.keys().copied().collect();
        for k in keys {
            let j = self.jitter();
            let seq = self.seq;
            let Some(p) = self.peers.get_mut(&k) else {
                continue;
            };
            if let Some((_, sent)) = p.outstanding
                && now >= sent + TIMEOUT
            {
                p.outstanding = None;
                p.st.losses = p.st.losses.saturating_add(1);
                if p.st.losses >= LOST_AFTER {
                    p.st.reachable = Some(false);
                }
            }
            if now >= p.due && p.outstanding.is_none() {
                p.outstanding = Some((seq, now));
                p.due = now + INTERVAL_MIN + j;
                p.st.sent += 1;
                self.seq += 1;
                out.push(Probe {
                    dst: k,
                    msg: Msg {
                        kind: Kind::Probe,
                        seq,
                        stamp: now,
                    },
                    len: HEADER,
                });
            }
            let answering = p.st.reachable == Some(true) && p.st.losses == 0;
            if let Some(pm) = &mut p.pmtu {
                let seq = self.seq;
                if let Some(size) = pm.next(seq, now, answering) {
                    self.seq += 1;
                    out.push(Probe {
                        dst: k,
                        msg: Msg {
                            kind: Kind::Probe,
                            seq,
                            stamp: now,
                        },
                        len: (size - IP_UDP) as usize,
                    });
                }
                p.st.pmtu = pm.found;
                // A lost size waits for a small probe sent after it: send
                // one at the next scan rather than at the interval.
                if pm.wants_check() && p.outstanding.is_none() && !p.check {
                    p.due = p.due.min(now);
                    p.check = true;
                }
            }
        }
        out
    }

    /// Takes an ack from `from` (a peer's overlay address); false when it
    /// answers no outstanding probe (late, duplicated or forged).
    pub fn ack(&mut self, from: Ipv4Addr, m: &Msg, now: u64) -> bool {
        if !matches!(m.kind, Kind::Ack { .. }) {
            return false;
        }
        let Some(p) = self.peers.get_mut(&from) else {
            return false;
        };
        match p.outstanding {
            Some((seq, sent)) if seq == m.seq && sent == m.stamp && now >= sent => {
                p.outstanding = None;
                p.st.received += 1;
                p.st.losses = 0;
                p.st.reachable = Some(true);
                p.st.rtt_us = Some((now - sent) / 1_000);
                p.check = false;
                if let Some(pm) = &mut p.pmtu {
                    pm.path_up(sent, now);
                }
                true
            }
            _ => p
                .pmtu
                .as_mut()
                .is_some_and(|pm| pm.ack(m.seq, m.stamp, now)),
        }
    }

    /// When the table next has something to do (a probe due or a timeout).
    pub fn next_wake(&self) -> Option<u64> {
        self.peers
            .values()
            .map(|p| {
                let probe = match p.outstanding {
                    // The due time is always later (INTERVAL_MIN > TIMEOUT).
                    Some((_, sent)) => sent + TIMEOUT,
                    None => p.due,
                };
                let answering = p.st.reachable == Some(true) && p.st.losses == 0;
                match &p.pmtu {
                    Some(pm) if answering => probe.min(pm.wake()),
                    _ => probe,
                }
            })
            .min()
    }

    /// Every peer's health, by subnet.
    pub fn report(&self) -> HashMap<Ipv4Net, ProbeStatus> {
        self.peers
            .values()
            .map(|p| (p.subnet, p.st.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn net(s: &str) -> Ipv4Net {
        s.parse().expect("test fixture")
    }

    fn ack_of(m: &Msg) -> Msg {
        m.ack(24)
    }

    #[test]
    fn probes_at_the_interval_with_jitter_and_measures_rtt() {
        let mut t = Table::new(42, 0);
        t.sync([net("10.244.2.0/24")], 0);
        let first = t.next_wake().expect("test fixture");
        assert!(first < JITTER, "{first}");
        let out = t.due(first);
        assert_eq!(out.len(), 1);
        assert_eq!(
            out[0].dst,
            "10.244.2.0".parse::<Ipv4Addr>().expect("test fixture")
        );
        assert!(t.due(first + 1).is_empty(), "one probe outstanding at most");
        assert!(t.ack(
            "10.244.2.0".parse().expect("test fixture"),
            &ack_of(&out[0].msg),
            first + 3_000_000
        ));
        let st = &t.report()[&net("10.244.2.0/24")];
        assert_eq!(st.reachable, Some(true));
        assert_eq!(st.rtt_us, Some(3_000));
        assert_eq!((st.sent, st.received, st.losses), (1, 1, 0));
        // A duplicate ack counts nothing.
        assert!(!t.ack(
            "10.244.2.0".parse().expect("test fixture"),
            &ack_of(&out[0].msg),
            first + 4_000_000
        ));
        let next = t.next_wake().expect("test fixture") - first;
        assert!(
            (INTERVAL_MIN..INTERVAL_MIN + JITTER).contains(&next),
            "{next}"
        );
    }

    #[test]
    fn three_losses_make_a_peer_unreachable_and_one_ack_reachable() {
        let n = net("10.244.3.0/24");
        let mut t = Table::new(7, 0);
        t.sync([n], 0);
        let mut sent = 0;
        while t.report()[&n].reachable != Some(false) {
            assert_ne!(t.report()[&n].reachable, Some(true));
            let now = t.next_wake().expect("test fixture");
            sent += t.due(now).len();
            assert!(now < 60 * S, "still not unreachable at {now}");
        }
        assert_eq!(sent, LOST_AFTER as usize);
        assert_eq!(t.report()[&n].losses, LOST_AFTER);
        let now = t.next_wake().expect("test fixture");
        let probe = t.due(now).pop().expect("probes continue while unreachable");
        // A forged ack (wrong seq, wrong source) does not revive it.
        let mut forged = ack_of(&probe.msg);
        forged.seq += 1;
        assert!(!t.ack(probe.dst, &forged, now + 1));
        assert!(!t.ack(
            "10.244.9.0".parse().expect("test fixture"),
            &ack_of(&probe.msg),
            now + 1
        ));
        assert!(t.ack(probe.dst, &ack_of(&probe.msg), now + 1));
        assert_eq!(t.report()[&n].reachable, Some(true));
        assert_eq!(t.report()[&n].losses, 0);
    }

    #[test]
    fn sync_adds_and_forgets_peers() {
        let mut t = Table::new(1, 0);
        t.sync([net("10.244.2.0/24"), net("10.244.3.0/24")], 0);
        assert_eq!(t.report().len(), 2);
        t.sync([net("10.244.3.0/24")], 10 * S);
        assert_eq!(t.report().len(), 1);
        assert!(t.report().contains_key(&net("10.244.3.0/24")));
        t.sync([], 20 * S);
        assert!(t.next_wake().is_none());
    }
}
