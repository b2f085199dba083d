//! NAT traversal for the userspace `vxlan` and `udp` backends (docs/nat.md,
//! "vxlan and udp"): the same choices as WireGuard's
//! ([`crate::backend::wireguard::nat`]: discovery servers, `direct` or
//! `punched`, the keepalive rule, the paths chosen again when this node's
//! own endpoint moves), applied to an engine peer as a
//! [`weft_engine::NatPath`].
//!
//! - **Trust**: vxlan and flannel-UDP authenticate nothing, so a peer's
//!   path comes from the lease store alone (its published `WeftNAT`
//!   endpoint); nothing the engine receives moves it (no roaming). The
//!   engine admits a punched peer's packets from its NAT's public address
//!   (for its subnet only) and from nowhere else new.
//! - **Only peers with `WeftNAT`** get a [`weft_engine::NatPath`]: a
//!   flanneld or kernel vxlan peer (or weft with the feature off) is sent
//!   to as before, from the engine's send sockets, and never gets a
//!   keepalive or a discovery request.
//! - **No relays**: relays forward WireGuard only (they steer by its
//!   receiver index and MAC1); a vxlan/udp pair behind symmetric NATs does
//!   not meet.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};

use weft_engine::NatPath;

use super::Tunnel;
use crate::backend::wireguard::nat::{self, Path, Peers};
use crate::lease::Lease;

/// A vxlan/udp backend's NAT traversal state (IPv4: NAT66 is out of scope).
#[derive(Debug)]
pub struct TunnelNat {
    /// Servers, paths (logged when they change), and the leases to choose
    /// again when this node's endpoint moves.
    peers: Peers,
    /// This node's `PublicIP`.
    own: Ipv4Addr,
    /// The backend port (the cluster's: flannel configures one).
    port: u16,
}

impl TunnelNat {
    /// For a node at `own` whose backend listens on `port`.
    pub fn new(own: Ipv4Addr, port: u16) -> TunnelNat {
        TunnelNat {
            peers: Peers::default(),
            own,
            port,
        }
    }

    /// The engine path of the peer `lease` is (or was, `add` false) the
    /// lease of, this node being seen from `seen`; noted (servers, the
    /// path's log line). `None`: sent as without NAT traversal.
    pub fn path(
        &mut self,
        lease: &Lease,
        add: bool,
        seen: Option<SocketAddrV4>,
    ) -> Option<NatPath> {
        let path = nat::path(lease, self.port, seen);
        self.peers.note(lease, add, path, self.port);
        engine_path(lease, path, self.own, self.port).filter(|_| add)
    }

    /// After a batch of changes and at reconcile: the discovery servers to
    /// the engine (discovery on), and the leases whose path is to be
    /// chosen again because this node's own endpoint moved.
    pub fn sync(&mut self, t: &Tunnel) -> Vec<Lease> {
        t.set_discovery(true, self.peers.servers());
        self.peers.again(t.seen())
    }
}

/// The engine path for `lease` on `path` from a node at `own` (see the
/// module docs): only a peer with `WeftNAT`, and only when it is punched or
/// this node is behind NAT (then it is kept alive, and sent to from the
/// backend port so that the peer's answers come back through this node's
/// NAT mapping).
pub fn engine_path(lease: &Lease, path: Path, own: Ipv4Addr, port: u16) -> Option<NatPath> {
    lease.attrs.weft_nat?;
    let to = match path {
        Path::Punched(e) => SocketAddr::V4(e),
        Path::Direct | Path::Relayed(_) => SocketAddr::new(IpAddr::V4(lease.attrs.public_ip), port),
    };
    let keepalive = nat::keepalive(0, path, IpAddr::V4(own)) > 0;
    keepalive.then_some(NatPath { to, keepalive })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::{LeaseAttrs, NatAttrs};

    fn lease(ip: &str, nat: Option<&str>) -> Lease {
        let last = ip.rsplit('.').next().expect("octet");
        Lease {
            subnet: Some(format!("10.244.{last}.0/24").parse().expect("net")),
            ipv6_subnet: None,
            attrs: LeaseAttrs {
                public_ip: ip.parse().expect("ip"),
                backend_type: "vxlan".into(),
                weft_nat: nat.map(|e| NatAttrs {
                    endpoint: (!e.is_empty()).then(|| e.parse().expect("ep")),
                    relay: None,
                }),
                ..Default::default()
            },
            expiration: None,
        }
    }

    #[test]
    fn only_nat_peers_get_a_path_and_only_when_it_matters() {
        let public: Ipv4Addr = "192.0.2.1".parse().expect("ip");
        let private: Ipv4Addr = "10.12.0.2".parse().expect("ip");
        let mut n = TunnelNat::new(public, 8472);
        let behind = lease("10.13.0.4", Some("203.0.113.9:40001"));
        let to: SocketAddr = "203.0.113.9:40001".parse().expect("addr");
        assert_eq!(
            n.path(&behind, true, None),
            Some(NatPath {
                to,
                keepalive: true
            })
        );
        // Its lease says nothing of NAT (flanneld, the feature off): as before.
        assert_eq!(n.path(&lease("10.13.0.5", None), true, None), None);
        // Both public: nothing changes.
        let p = lease("192.0.2.3", Some("192.0.2.3:8472"));
        assert_eq!(n.path(&p, true, None), None);
        // Behind NAT ourselves: every NAT peer, kept alive, from the port.
        let mut m = TunnelNat::new(private, 8472);
        let got = m.path(&p, true, None).expect("kept alive");
        assert_eq!(got.to, "192.0.2.3:8472".parse().expect("addr"));
        assert!(got.keepalive);
        assert_eq!(m.path(&lease("192.0.2.6", None), true, None), None);
        // The same NAT as ours: its LAN address.
        let ours = Some("203.0.113.9:8472".parse().expect("addr"));
        let same = m.path(&behind, true, ours).expect("kept alive");
        assert_eq!(same.to, "10.13.0.4:8472".parse().expect("addr"));
        // Public servers are asked; a removed peer is forgotten.
        assert_eq!(
            m.peers.servers(),
            vec!["192.0.2.3:8472".parse().expect("a")]
        );
        assert_eq!(m.path(&p, false, None), None);
        assert!(m.peers.servers().is_empty());
    }
}
