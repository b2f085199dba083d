//! `--tunnel-gso` as `weft doctor` sees it (issue 32): weftd checks the
//! uplink's `tx-udp_tnl-segmentation` once, at start. The TAP path pays only
//! while the uplink segments UDP tunnels; if the offload went off under a
//! running weftd (an `ethtool -K`, a NIC driver reload), the node's stack
//! cuts every super-packet and the path costs 2.3x the CPU per bit of the
//! sockets (docs/performance.md, "The engine writing through it"). Pure
//! over [`Facts`].

use super::facts::Facts;
use super::{Finding, Severity};
use crate::backend::tunnel::gso::UPLINK_FEATURE;

/// `tunnel_gso_stack_segments` and `tunnel_gso_unused`.
pub fn tunnel_gso(f: &Facts) -> Vec<Finding> {
    let Ok(st) = &f.daemon else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for d in &st.backend.devices {
        let Some(g) = &d.tunnel_gso else {
            continue;
        };
        match (&g.tap, g.mode.as_str()) {
            (Some(tap), _) => {
                let Some((uplink, on)) = &f.tunnel_uplink else {
                    continue;
                };
                if !on {
                    out.push(Finding::new(
                        "tunnel_gso_stack_segments",
                        Severity::Warning,
                        format!(
                            "{} sends TCP super-packets through {tap}, but uplink {uplink} no longer segments UDP tunnels: the node's stack cuts them, at about 2.3x the CPU per bit of the UDP sockets",
                            d.name
                        ),
                        format!("SIOCETHTOOL: {UPLINK_FEATURE} off on {uplink}; weftd status: tunnel gso {} via {tap}", g.mode),
                        format!(
                            "turn the offload back on (ethtool -K {uplink} {UPLINK_FEATURE} on), or restart weftd: --tunnel-gso=auto checks the uplink at start and uses the sockets without it"
                        ),
                    ));
                }
            }
            (None, "auto" | "on") => out.push(Finding::new(
                "tunnel_gso_unused",
                Severity::Info,
                format!(
                    "{}: --tunnel-gso={} but TCP super-packets go through the UDP sockets",
                    d.name, g.mode
                ),
                format!(
                    "weftd status: {}",
                    g.reason.as_deref().unwrap_or("no reason given")
                ),
                "nothing, if the uplink has no UDP-tunnel segmentation (the sockets are the cheaper path there); else meet the condition named and restart weftd",
            )),
            (None, _) => {}
        }
    }
    out
}
