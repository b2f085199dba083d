//! The peers' check: what weftd's overlay probes (docs/probes.md) found.

use super::facts::Facts;
use super::{Finding, Severity};

/// The backend's overlay port, for the fix text.
fn overlay_port(backend: &str) -> &'static str {
    match backend {
        "vxlan" => "UDP 8472 (or the network config's Port)",
        "udp" => "UDP 8285 (or the network config's Port)",
        "wireguard" => "UDP 51820 (or the network config's ListenPort)",
        "ipip" => "IP protocol 4",
        "ipsec" => "UDP 500/4500 and ESP",
        _ => "the backend's port",
    }
}

/// Peers the node cannot reach over the overlay (from weftd's probes).
pub fn peers(f: &Facts) -> Vec<Finding> {
    let Some(st) = f.daemon.as_ref().ok() else {
        return Vec::new();
    };
    st.peers
        .iter()
        .filter_map(|p| Some((p, p.probe.as_ref()?)))
        .filter(|(_, pr)| pr.reachable == Some(false))
        .map(|(p, pr)| {
            Finding::new(
                "peer_unreachable",
                Severity::Error,
                format!(
                    "peer {} ({}) does not answer over the overlay: pods there are unreachable from this node",
                    p.public_ip,
                    p.subnet.as_deref().unwrap_or("-")
                ),
                format!(
                    "{} consecutive probes lost ({} sent, {} answered{})",
                    pr.losses,
                    pr.sent,
                    pr.received,
                    pr.rtt_us
                        .map(|us| format!(", last round trip {:.2} ms", us as f64 / 1000.0))
                        .unwrap_or_default()
                ),
                format!(
                    "check, in this order: that weftd runs on {} (weft doctor there); that {} passes between the nodes' addresses (host firewall, cloud security group, VMware NSX) and the peer accepts weft's probes (UDP 8475 on its overlay device); that the path's MTU is not below the overlay's",
                    p.public_ip,
                    overlay_port(&st.backend.name)
                ),
            )
        })
        .collect()
}

/// Peers whose path carries less than the overlay MTU (from the probes'
/// path-MTU search): bigger packets to them are black-holed.
pub fn path_mtu(f: &Facts) -> Vec<Finding> {
    let Some(st) = f.daemon.as_ref().ok() else {
        return Vec::new();
    };
    let Some(mtu) = f
        .subnet_env
        .as_ref()
        .ok()
        .and_then(|e| e.as_ref())
        .map(|e| e.mtu)
        .filter(|m| *m > 0)
    else {
        return Vec::new();
    };
    st.peers
        .iter()
        .filter_map(|p| Some((p, p.probe.as_ref()?.pmtu?)))
        .filter(|(_, pmtu)| *pmtu < mtu)
        .map(|(p, pmtu)| {
            Finding::new(
                "path_mtu_low",
                Severity::Error,
                format!(
                    "the path to peer {} carries packets of at most {pmtu} bytes, but pods send up to {mtu}: bigger packets are black-holed unless weftd lowered that route's MTU (--probe-route-mtu, on by default)",
                    p.public_ip
                ),
                format!(
                    "path-MTU probes: {pmtu} bytes acked, larger lost; FLANNEL_MTU={mtu} in {}",
                    f.subnet_file.display()
                ),
                format!(
                    "give every node's underlay interface the same MTU (one has a smaller one: a VPN, a cloud with 1450, jumbo frames on one side), or set the network config's backend MTU so that pods use at most {pmtu} bytes, and restart weftd"
                ),
            )
        })
        .collect()
}
