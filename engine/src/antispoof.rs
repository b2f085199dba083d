//! Anti-spoofing: which decapsulated packets the engine delivers, by their
//! outer (underlay) and inner (pod) source addresses.
//!
//! A lease publishes a node's subnet and its `PublicIP`; the peer table maps
//! each published address to the subnets behind it. Three modes
//! ([`AntiSpoofing`]):
//!
//! - **strict**: the outer source must be a peer's published address and the
//!   inner source must lie in that peer's subnet. A node whose packets leave
//!   from another address than the one it publishes (`--public-ip` behind a
//!   1:1 NAT, a multi-homed host whose route to us leaves by another
//!   interface) is dropped as an unknown peer.
//! - **subnet** (weftd's default): as strict for packets from a published
//!   address; a packet from any other outer source is still delivered when
//!   its inner source lies in a peer's subnet, and counted as
//!   `unexpected_source` on that peer (the daemon logs it once per peer). The
//!   inner-source check still keeps a known node's pods from spoofing other
//!   nodes' subnets and drops inner sources outside every peer's subnet;
//!   what it gives up is tying an inner source to one underlay address.
//! - **off**: no checks (flannel's udp, vxlan and ipip backends check nothing).
//!
//! WireGuard authenticates peers by key and follows roaming endpoints, so its
//! check is the AllowedIPs one in both strict and subnet modes.
//!
//! [`check`] is the whole decision; it allocates nothing and takes no lock.
//! Workers read the mode (one relaxed atomic load) once per receive batch.

use std::net::IpAddr;
use std::sync::atomic::{AtomicU8, Ordering};

use crate::encap::DropReason;
use crate::peers::{Entry, PeerTable};

/// How strictly the engine checks the sources of decapsulated packets (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AntiSpoofing {
    /// No source checks.
    Off,
    /// The inner source must lie in a peer's subnet (in the sending peer's,
    /// when the outer source is a published address).
    #[default]
    Subnet,
    /// The outer source must be a peer's published address and the inner
    /// source must lie in that peer's subnet.
    Strict,
}

impl AntiSpoofing {
    /// The mode's name (`off`, `subnet`, `strict`).
    pub fn as_str(self) -> &'static str {
        match self {
            AntiSpoofing::Off => "off",
            AntiSpoofing::Subnet => "subnet",
            AntiSpoofing::Strict => "strict",
        }
    }

    /// The mode [`crate::EngineConfig::anti_spoof`] starts with.
    pub fn from_flag(anti_spoof: bool) -> AntiSpoofing {
        if anti_spoof {
            AntiSpoofing::Strict
        } else {
            AntiSpoofing::Off
        }
    }

    /// Whether a packet whose outer source is no peer's is dropped before
    /// decapsulation (strict mode).
    #[inline]
    pub fn drops_unknown_outer(self) -> bool {
        self == AntiSpoofing::Strict
    }

    fn to_u8(self) -> u8 {
        match self {
            AntiSpoofing::Off => 0,
            AntiSpoofing::Subnet => 1,
            AntiSpoofing::Strict => 2,
        }
    }

    fn from_u8(v: u8) -> AntiSpoofing {
        match v {
            0 => AntiSpoofing::Off,
            1 => AntiSpoofing::Subnet,
            _ => AntiSpoofing::Strict,
        }
    }
}

impl std::fmt::Display for AntiSpoofing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The mode shared by the engine's handle and its workers.
#[derive(Debug, Default)]
pub(crate) struct Mode(AtomicU8);

impl Mode {
    pub(crate) fn new(m: AntiSpoofing) -> Mode {
        Mode(AtomicU8::new(m.to_u8()))
    }

    #[inline]
    pub(crate) fn get(&self) -> AntiSpoofing {
        AntiSpoofing::from_u8(self.0.load(Ordering::Relaxed))
    }

    pub(crate) fn set(&self, m: AntiSpoofing) {
        self.0.store(m.to_u8(), Ordering::Relaxed);
    }
}

/// What to do with one decapsulated packet.
#[derive(Debug, Clone, Copy)]
pub enum Verdict<'a> {
    /// Deliver it; count it on this entry, if any.
    Accept(Option<&'a Entry>),
    /// Deliver it (subnet mode): its inner source lies in this entry's
    /// subnet, but its outer source is not the entry's published address.
    Unexpected(&'a Entry),
    /// Drop it for this reason.
    Drop(DropReason),
}

/// The decision for a packet with inner source `inner_src` whose outer
/// source is the published address of `from` (entry indices from
/// [`PeerTable::endpoint_entries`]; empty when the outer source is no
/// peer's).
#[inline]
pub fn check<'a>(
    mode: AntiSpoofing,
    table: &'a PeerTable,
    from: &[usize],
    inner_src: IpAddr,
) -> Verdict<'a> {
    let own = table.src_entry(from, inner_src);
    match mode {
        AntiSpoofing::Off => Verdict::Accept(own),
        _ if from.is_empty() => match mode {
            AntiSpoofing::Subnet => match table.lookup(inner_src) {
                Some(e) => Verdict::Unexpected(e),
                None => Verdict::Drop(DropReason::UnknownPeer),
            },
            _ => Verdict::Drop(DropReason::UnknownPeer),
        },
        _ => match own {
            Some(e) => Verdict::Accept(Some(e)),
            None => Verdict::Drop(DropReason::SpoofedSource),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::peers::Peer;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    fn table() -> PeerTable {
        let peer = |s: &str, ep: &str| Peer {
            subnet: s.parse().expect("subnet"),
            endpoint: ip(ep),
            vtep_mac: None,
            nat: None,
            wireguard: None,
            tunnel_gso: false,
        };
        PeerTable::new(
            &[
                // Node B publishes 198.51.100.2 (its packets may leave from 192.0.2.2).
                peer("10.244.2.0/24", "198.51.100.2"),
                peer("fd00:244:2::/64", "198.51.100.2"),
                peer("10.244.3.0/24", "192.0.2.3"),
            ],
            8285,
        )
    }

    fn subnet(v: Verdict<'_>) -> String {
        match v {
            Verdict::Accept(Some(e)) => format!("accept {}", e.subnet),
            Verdict::Accept(None) => "accept".into(),
            Verdict::Unexpected(e) => format!("unexpected {}", e.subnet),
            Verdict::Drop(r) => format!("drop {r:?}"),
        }
    }

    /// Every mode against the four kinds of packet: from a published address
    /// with its own subnet as inner source, from a published address with
    /// another node's subnet, from an unknown address with a peer subnet,
    /// from an unknown address with no peer's subnet.
    #[test]
    fn decision_table() {
        let t = table();
        let b = t.endpoint_entries(ip("198.51.100.2"));
        let c = t.endpoint_entries(ip("192.0.2.3"));
        let stranger = t.endpoint_entries(ip("192.0.2.2"));
        assert_eq!(b.len(), 2);
        assert!(stranger.is_empty());
        let cases = [
            (b, "10.244.2.9", "accept 10.244.2.0/24"),
            (b, "fd00:244:2::9", "accept fd00:244:2::/64"),
            (c, "10.244.2.9", "spoofed"),
            (stranger, "10.244.2.9", "from a peer subnet"),
            (stranger, "fd00:244:2::9", "from a peer subnet v6"),
            (stranger, "10.244.9.9", "from nowhere"),
            (stranger, "10.1.0.1", "from nowhere"),
        ];
        let expect = |mode: AntiSpoofing, what: &str, inner: &str| -> String {
            let peer_subnet = if inner.contains(':') {
                "fd00:244:2::/64"
            } else {
                "10.244.2.0/24"
            };
            match (mode, what) {
                (_, w) if w.starts_with("accept") => w.to_string(),
                (AntiSpoofing::Off, "spoofed") => "accept".into(),
                (_, "spoofed") => "drop SpoofedSource".into(),
                (AntiSpoofing::Off, _) => "accept".into(),
                (AntiSpoofing::Subnet, w) if w.starts_with("from a peer subnet") => {
                    format!("unexpected {peer_subnet}")
                }
                _ => "drop UnknownPeer".into(),
            }
        };
        for mode in [
            AntiSpoofing::Off,
            AntiSpoofing::Subnet,
            AntiSpoofing::Strict,
        ] {
            for (from, inner, what) in cases {
                assert_eq!(
                    subnet(check(mode, &t, from, ip(inner))),
                    expect(mode, what, inner),
                    "{mode} {what} {inner}"
                );
            }
        }
    }

    #[test]
    fn only_strict_drops_before_decapsulation() {
        assert!(AntiSpoofing::Strict.drops_unknown_outer());
        assert!(!AntiSpoofing::Subnet.drops_unknown_outer());
        assert!(!AntiSpoofing::Off.drops_unknown_outer());
    }

    #[test]
    fn mode_round_trips_and_starts_from_the_config_flag() {
        let m = Mode::new(AntiSpoofing::from_flag(true));
        assert_eq!(m.get(), AntiSpoofing::Strict);
        for a in [
            AntiSpoofing::Off,
            AntiSpoofing::Subnet,
            AntiSpoofing::Strict,
        ] {
            m.set(a);
            assert_eq!(m.get(), a);
        }
        assert_eq!(AntiSpoofing::from_flag(false), AntiSpoofing::Off);
        assert_eq!(AntiSpoofing::default(), AntiSpoofing::Subnet);
    }
}
