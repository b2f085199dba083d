//! Acting on a small path MTU: the route to a peer whose path carries less
//! than the overlay MTU gets that path MTU as its `mtu` metric, so the node
//! answers bigger DF packets of its pods with ICMP "fragmentation needed"
//! (local, never filtered) and TCP settles at the size that passes instead
//! of black-holing; when the path is whole again the metric is removed.
//!
//! Two cases, by what routes the peer's subnet:
//! - the backend's own route to exactly that subnet (kernel vxlan, IPIP,
//!   the userspace vxlan): its `mtu` metric is set and removed;
//! - a device route for the whole network (WireGuard, udp: `10.244.0.0/16
//!   dev flannel0`): a per-peer route is added beside it, the peer's subnet
//!   via the same device with the same scope and `mtu` (`proto 87`,
//!   [`crate::netlink::PEER_ROUTE_PROTO`]), only for peers whose path is
//!   smaller, so every other peer keeps the network route's full MTU. It is
//!   deleted when the path is whole again or the peer leaves; a restarted
//!   weftd adopts the ones it finds (kept until the peer's search ends,
//!   deleted at once for a peer that is gone). No backend deletes it: the
//!   userspace tunnel and kernel WireGuard only re-add their own routes.
//!
//! A route through a gateway (host-gw, the default route) is never touched.
//! Every route weft writes to a lowered subnet carries the lowered MTU
//! ([`crate::netlink::set_lowered_mtu`]), so a route the backend rewrites
//! keeps it; the routes are checked again every [`RECHECK`] (a recreated
//! device loses its routes). Netlink runs in the prober's own task, after
//! its probes: neither the main loop nor the engine waits for it.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use ipnet::{IpNet, Ipv4Net};

use crate::netlink::{Client, Netlink, NetlinkError, Route, set_lowered_mtu};
use crate::view::ProbeStatus;

/// How often the lowered routes are checked again.
pub const RECHECK: Duration = Duration::from_secs(30);

/// The route MTUs the prober set, by peer subnet.
#[derive(Debug)]
pub struct RouteMtus {
    ceiling: u32,
    nl: Option<Netlink>,
    applied: HashMap<Ipv4Net, Option<u32>>,
    /// The peers that have a per-peer route of the prober's.
    added: HashSet<Ipv4Net>,
    checked: Instant,
}

/// The `mtu` metric a peer's route should carry: its path MTU when below
/// the overlay MTU, else none.
pub fn wanted(ceiling: u32, pmtu: u32) -> Option<u32> {
    (pmtu < ceiling).then_some(pmtu)
}

/// The device route a per-peer route to `dst` copies: the longest-prefix
/// route strictly covering `dst` (not the default), through a device
/// without a gateway; its device and whether it is `scope link`.
pub fn covering(routes: &[Route], dst: Ipv4Net) -> Option<(u32, bool)> {
    let best = routes
        .iter()
        .filter_map(|r| match r.dst {
            IpNet::V4(n)
                if n.prefix_len() > 0 && n.prefix_len() < dst.prefix_len() && n.contains(&dst) =>
            {
                Some((n.prefix_len(), r))
            }
            _ => None,
        })
        .max_by_key(|(len, _)| *len)?
        .1;
    match (best.gateway, best.oif) {
        (None, Some(oif)) => Some((oif, best.scope_link)),
        _ => None,
    }
}

/// What one peer's routes went through.
#[derive(Debug, PartialEq, Eq)]
enum Done {
    /// The backend's route to the subnet got (or lost) the metric.
    Metric(bool),
    /// A per-peer route was added or replaced.
    Added,
    /// The per-peer route was deleted.
    Deleted,
    /// No route of weft's to lower.
    Nothing,
}

impl RouteMtus {
    /// Nothing applied yet; routes are lowered below `ceiling`.
    pub fn new(ceiling: u32) -> RouteMtus {
        RouteMtus {
            ceiling,
            nl: None,
            applied: HashMap::new(),
            added: HashSet::new(),
            checked: Instant::now(),
        }
    }

    /// Connects once; adopts the per-peer routes a previous weftd left.
    async fn connect(&mut self) -> Option<Netlink> {
        if let Some(nl) = &self.nl {
            return Some(nl.clone());
        }
        let nl = match Netlink::connect() {
            Ok(nl) => nl,
            Err(e) => {
                tracing::warn!("path MTU: cannot reach netlink: {e}");
                return None;
            }
        };
        match nl.peer_routes(false).await {
            Ok(found) => {
                for (net, mtu) in found {
                    if let IpNet::V4(n) = net {
                        self.applied.insert(n, mtu);
                        self.added.insert(n);
                        set_lowered_mtu(net, mtu);
                    }
                }
            }
            Err(e) => tracing::warn!("path MTU: cannot list the per-peer routes: {e}"),
        }
        self.nl = Some(nl.clone());
        Some(nl)
    }

    /// Brings every searched peer's route to what its path MTU wants, and
    /// removes what the prober set for peers that left.
    pub async fn apply(&mut self, report: &HashMap<Ipv4Net, ProbeStatus>) {
        let recheck = self.checked.elapsed() >= RECHECK;
        if recheck {
            self.checked = Instant::now();
        }
        let gone: Vec<Ipv4Net> = (self.applied.keys())
            .chain(self.added.iter())
            .filter(|k| !report.contains_key(k))
            .copied()
            .collect();
        if !gone.is_empty() || report.values().any(|s| s.pmtu.is_some()) {
            let Some(nl) = self.connect().await else {
                return;
            };
            for net in gone {
                self.applied.remove(&net);
                set_lowered_mtu(IpNet::V4(net), None);
                if self.added.remove(&net) {
                    match nl.del_peer_route(IpNet::V4(net)).await {
                        Ok(_) => tracing::info!("peer {net} left: its per-peer MTU route removed"),
                        Err(e) => tracing::warn!("path MTU: cannot remove the route to {net}: {e}"),
                    }
                }
            }
        }
        for (net, st) in report {
            let Some(pmtu) = st.pmtu else { continue };
            let want = wanted(self.ceiling, pmtu);
            let before = self.applied.get(net).copied();
            if before == Some(want) && !(recheck && want.is_some()) {
                continue;
            }
            let Some(nl) = self.connect().await else {
                return;
            };
            match self.one(&nl, *net, want).await {
                Ok(done) if before != Some(want) => self.log(*net, want, &done),
                Ok(_) => {}
                Err(e) => tracing::warn!("path MTU: cannot set the route MTU to {net}: {e}"),
            }
            self.applied.insert(*net, want);
        }
    }

    /// Brings the routes to `net` to `want`.
    async fn one(
        &mut self,
        nl: &Netlink,
        net: Ipv4Net,
        want: Option<u32>,
    ) -> Result<Done, NetlinkError> {
        let dst = IpNet::V4(net);
        // First, so that a route the backend writes from now on carries it.
        set_lowered_mtu(dst, want);
        let Some(mtu) = want else {
            if self.added.remove(&net) && nl.del_peer_route(dst).await? {
                return Ok(Done::Deleted);
            }
            return Ok(Done::Metric(nl.set_route_mtu(dst, None).await?));
        };
        if nl.has_backend_route(dst).await? {
            if self.added.remove(&net) {
                nl.del_peer_route(dst).await?;
            }
            return Ok(Done::Metric(nl.set_route_mtu(dst, Some(mtu)).await?));
        }
        let routes = nl.routes_main(false).await?;
        let Some((oif, scope_link)) = covering(&routes, net) else {
            return Ok(Done::Nothing);
        };
        nl.add_peer_route(dst, oif, scope_link, mtu).await?;
        self.added.insert(net);
        Ok(Done::Added)
    }

    fn log(&self, net: Ipv4Net, want: Option<u32>, done: &Done) {
        let ceiling = self.ceiling;
        match (want, done) {
            (Some(m), Done::Metric(true)) => tracing::warn!(
                "path MTU to {net} is {m} bytes, below the overlay's {ceiling}: its route now has mtu {m}"
            ),
            (Some(m), Done::Added) => tracing::warn!(
                "path MTU to {net} is {m} bytes, below the overlay's {ceiling}: added a route to it with mtu {m} (proto 87; the other peers keep {ceiling})"
            ),
            (Some(m), Done::Nothing) => tracing::warn!(
                "path MTU to {net} is {m} bytes, below the overlay's {ceiling}, and no route of weft's leads there to lower"
            ),
            (None, Done::Metric(true)) => {
                tracing::info!("path MTU to {net} is whole again: its route's mtu removed")
            }
            (None, Done::Deleted) => {
                tracing::info!("path MTU to {net} is whole again: its per-peer MTU route removed")
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_smaller_path_lowers_the_route() {
        assert_eq!(wanted(1450, 1354), Some(1354));
        assert_eq!(wanted(1450, 1450), None);
        assert_eq!(wanted(1450, 9000), None);
    }

    fn route(dst: &str, gateway: Option<&str>, oif: u32, scope_link: bool) -> Route {
        Route {
            dst: dst.parse().expect("dst"),
            gateway: gateway.map(|g| g.parse().expect("gateway")),
            oif: Some(oif),
            onlink: false,
            scope_link,
        }
    }

    #[test]
    fn a_per_peer_route_copies_the_device_route_of_the_network() {
        let peer: Ipv4Net = "10.244.2.0/24".parse().expect("net");
        let default = route("0.0.0.0/0", Some("192.0.2.254"), 2, false);
        let underlay = route("192.0.2.0/24", None, 2, true);
        let udp = route("10.244.0.0/16", None, 7, false);
        let wg = route("10.244.0.0/16", None, 9, true);
        // udp: universe scope; WireGuard: scope link.
        let routes = [default.clone(), underlay.clone(), udp.clone()];
        assert_eq!(covering(&routes, peer), Some((7, false)));
        assert_eq!(covering(&[default.clone(), wg], peer), Some((9, true)));
        // Only the default route (host-gw's peer through a gateway): nothing.
        assert_eq!(covering(&[default.clone(), underlay], peer), None);
        // A gateway route covering the network is never copied.
        let via = route("10.244.0.0/16", Some("192.0.2.9"), 2, false);
        assert_eq!(covering(&[default.clone(), via], peer), None);
        // The exact route is not a covering one (the backend's own: its metric is set instead).
        let exact = route("10.244.2.0/24", None, 7, false);
        assert_eq!(covering(&[default, exact, udp], peer), Some((7, false)));
    }
}
