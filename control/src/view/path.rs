//! A peer's path as NAT traversal sees it (docs/nat.md), for `weft status`
//! and `/metrics`: `direct` (sent to its `PublicIP`), `punched` (sent to
//! the endpoint its NAT maps, which its lease publishes), `relayed via
//! <relay's PublicIP>` (sent to a relay's relay port, docs/nat.md
//! "Relays") or `unreachable` (no WireGuard handshake within [`FRESH`]). `None` when this node does
//! not run NAT traversal or the peer has no userspace WireGuard session.
//! A userspace `vxlan` or `udp` peer (docs/nat.md, "vxlan and udp") is
//! `direct` or `punched` by its engine endpoint alone: those encapsulations
//! have no session to call it `unreachable` by, and no relay.

use std::net::{IpAddr, Ipv4Addr};

use crate::lease::Lease;

/// A session is alive while its last handshake is younger than this:
/// WireGuard rekeys every 120 s of traffic and its persistent keepalive
/// (25 s on a NAT path) keeps handshakes coming; after 180 s
/// (`REJECT_AFTER_TIME`) no session is left to carry packets.
pub const FRESH: u64 = 180;

/// The `PublicIP`s of the relays among `leases`.
pub fn relays<'a>(leases: impl IntoIterator<Item = &'a Lease>) -> Vec<Ipv4Addr> {
    (leases.into_iter())
        .filter(|l| l.attrs.weft_nat.is_some_and(|n| n.relay.is_some()))
        .map(|l| l.attrs.public_ip)
        .collect()
}

/// The path to `peer`, whose engine endpoint (where it sends now, roaming
/// included, when the engine tells; else the configured one) is `endpoint` and last
/// handshake `handshake` (Unix seconds), at `now` (Unix seconds); `relays`
/// are the relays' `PublicIP`s ([`relays`]).
pub fn of(
    own: Option<&Lease>,
    peer: &Lease,
    endpoint: Option<IpAddr>,
    handshake: Option<u64>,
    now: u64,
    relays: &[Ipv4Addr],
) -> Option<String> {
    own?.attrs.weft_nat?;
    let endpoint = endpoint?;
    // flannel's udp backend writes no BackendType (nor does weft's).
    let wireguard = match peer.attrs.backend_type.as_str() {
        "wireguard" => true,
        "vxlan" | "udp" | "" => false,
        _ => return None,
    };
    if wireguard && handshake.is_none_or(|at| now.saturating_sub(at) > FRESH) {
        return Some("unreachable".into());
    }
    if let IpAddr::V4(e) = endpoint
        && wireguard
        && e != peer.attrs.public_ip
        && relays.contains(&e)
    {
        return Some(format!("relayed via {e}"));
    }
    let published = peer.attrs.weft_nat.and_then(|n| n.endpoint);
    let punched = published.is_some_and(|e| IpAddr::V4(*e.ip()) == endpoint)
        && endpoint != IpAddr::V4(peer.attrs.public_ip);
    Some(if punched { "punched" } else { "direct" }.into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{LeaseAttrs, NatAttrs};

    fn lease(ip: &str, nat: Option<&str>) -> Lease {
        Lease {
            subnet: None,
            ipv6_subnet: None,
            attrs: LeaseAttrs {
                public_ip: ip.parse().expect("ip"),
                backend_type: "wireguard".into(),
                weft_nat: nat.map(|e| NatAttrs {
                    endpoint: e.parse().ok(),
                    relay: None,
                }),
                ..Default::default()
            },
            expiration: None,
        }
    }

    #[test]
    fn paths() {
        let own = lease("192.0.2.1", Some(""));
        let off = lease("192.0.2.1", None);
        let peer = lease("10.12.0.2", Some("203.0.113.9:40001"));
        let nat: IpAddr = "203.0.113.9".parse().expect("ip");
        let lan: IpAddr = "10.12.0.2".parse().expect("ip");
        let at = |own: &Lease, ep, hs| of(Some(own), &peer, Some(ep), hs, 1000, &[]);
        assert_eq!(at(&own, nat, Some(990)).as_deref(), Some("punched"));
        assert_eq!(at(&own, lan, Some(990)).as_deref(), Some("direct"));
        assert_eq!(at(&own, nat, None).as_deref(), Some("unreachable"));
        assert_eq!(at(&own, nat, Some(500)).as_deref(), Some("unreachable"));
        assert_eq!(at(&off, nat, Some(990)), None, "feature off");
        assert_eq!(
            of(Some(&own), &peer, None, Some(990), 1000, &[]),
            None,
            "no session"
        );
        let relay: Ipv4Addr = "192.0.2.11".parse().expect("ip");
        let via = of(
            Some(&own),
            &peer,
            Some(relay.into()),
            Some(990),
            1000,
            &[relay],
        );
        assert_eq!(via.as_deref(), Some("relayed via 192.0.2.11"));
        let relay_lease = lease("192.0.2.11", Some(""));
        let to_the_relay = of(
            Some(&own),
            &relay_lease,
            Some(relay.into()),
            Some(990),
            1000,
            &[relay],
        );
        assert_eq!(to_the_relay.as_deref(), Some("direct"), "the relay itself");
    }

    #[test]
    fn vxlan_and_udp_peers_are_punched_or_direct_without_sessions() {
        let own = lease("192.0.2.1", Some(""));
        let nat: IpAddr = "203.0.113.9".parse().expect("ip");
        let lan: IpAddr = "10.12.0.2".parse().expect("ip");
        for ty in ["vxlan", "udp", ""] {
            let mut peer = lease("10.12.0.2", Some("203.0.113.9:40001"));
            peer.attrs.backend_type = ty.into();
            let at = |ep| of(Some(&own), &peer, Some(ep), None, 1000, &[]);
            assert_eq!(at(nat).as_deref(), Some("punched"), "{ty}");
            assert_eq!(at(lan).as_deref(), Some("direct"), "{ty}");
        }
        let mut ipip = lease("10.12.0.2", Some("203.0.113.9:40001"));
        ipip.attrs.backend_type = "ipip".into();
        assert_eq!(of(Some(&own), &ipip, Some(nat), None, 1000, &[]), None);
    }
}
