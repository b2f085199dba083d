//! Acting on a small path MTU: the route to a peer whose path carries less
//! than the overlay MTU gets that path MTU as its `mtu` metric, so the node
//! answers bigger DF packets of its pods with ICMP "fragmentation needed"
//! (local, never filtered) and TCP settles at the size that passes instead
//! of black-holing; when the path is whole again the metric is removed.
//!
//! Only the exact route to the peer's subnet is touched, weft's own (kernel
//! vxlan, host-gw-like per-peer routes); a backend with one route for the
//! whole network (WireGuard, udp) has none, and nothing is changed. A route
//! the backend rewrites (a lease change) loses the metric; it is put back
//! within [`RECHECK`]. Netlink runs in the prober's own task, after its
//! probes: neither the main loop nor the engine waits for it.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};

use crate::netlink::Netlink;
use crate::view::ProbeStatus;

/// How often the lowered routes are checked again.
pub const RECHECK: Duration = Duration::from_secs(30);

/// The route MTUs the prober set, by peer subnet.
#[derive(Debug)]
pub struct RouteMtus {
    ceiling: u32,
    nl: Option<Netlink>,
    applied: HashMap<Ipv4Net, Option<u32>>,
    checked: Instant,
}

/// The `mtu` metric a peer's route should carry: its path MTU when below
/// the overlay MTU, else none.
pub fn wanted(ceiling: u32, pmtu: u32) -> Option<u32> {
    (pmtu < ceiling).then_some(pmtu)
}

impl RouteMtus {
    /// Nothing applied yet; routes are lowered below `ceiling`.
    pub fn new(ceiling: u32) -> RouteMtus {
        RouteMtus {
            ceiling,
            nl: None,
            applied: HashMap::new(),
            checked: Instant::now(),
        }
    }

    /// Brings every searched peer's route to what its path MTU wants.
    pub async fn apply(&mut self, report: &HashMap<Ipv4Net, ProbeStatus>) {
        let recheck = self.checked.elapsed() >= RECHECK;
        if recheck {
            self.checked = Instant::now();
        }
        self.applied.retain(|k, _| report.contains_key(k));
        for (net, st) in report {
            let Some(pmtu) = st.pmtu else { continue };
            let want = wanted(self.ceiling, pmtu);
            let done = self.applied.get(net) == Some(&want);
            if done && !(recheck && want.is_some()) {
                continue;
            }
            if self.nl.is_none() {
                match Netlink::connect() {
                    Ok(nl) => self.nl = Some(nl),
                    Err(e) => {
                        tracing::warn!("path MTU: cannot reach netlink: {e}");
                        return;
                    }
                }
            }
            let Some(nl) = &self.nl else { return };
            match nl.set_route_mtu(IpNet::V4(*net), want).await {
                Ok(true) => match want {
                    Some(m) => tracing::warn!(
                        "path MTU to {net} is {m} bytes, below the overlay's {}: its route now has mtu {m}",
                        self.ceiling
                    ),
                    None => {
                        tracing::info!("path MTU to {net} is whole again: its route's mtu removed")
                    }
                },
                Ok(false) => {}
                Err(e) => tracing::warn!("path MTU: cannot set the route MTU to {net}: {e}"),
            }
            self.applied.insert(*net, want);
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn only_a_smaller_path_lowers_the_route() {
        assert_eq!(super::wanted(1450, 1354), Some(1354));
        assert_eq!(super::wanted(1450, 1450), None);
        assert_eq!(super::wanted(1450, 9000), None);
    }
}
