//! Route MTUs the overlay prober sets (`crate::probe::routes`): the `mtu`
//! metric of a peer's own route, the per-peer routes it adds where the
//! backend routes the whole network through one device, and the registry
//! that makes every route this process writes to such a peer carry it.
//!
//! Invariants: a per-peer route the prober adds is `DST dev DEV mtu MTU
//! proto 87` ([`PEER_ROUTE_PROTO`], unused by iproute2's `rt_protos`), so
//! that it is told apart from the backend's routes (which weft writes with
//! `proto boot`, as flannel does) by anyone (`ip route show proto 87`) and
//! swept by a restarted weftd; [`Netlink::set_route_mtu`] never touches one.
//! [`Netlink::replace_route`] (every backend's route writer) adds the
//! lowered MTU of its destination from [`lowered_mtu`], so a route the
//! backend rewrites (a lease change, a reconcile) keeps it instead of
//! losing it until the prober's next check.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ipnet::IpNet;
use rtnetlink::RouteMessageBuilder;
use rtnetlink::packet_route::route::{
    RouteAttribute, RouteMessage, RouteMetric, RouteProtocol, RouteScope,
};

use super::{Netlink, NetlinkError, route_dst};

/// The `proto` of the per-peer routes the prober adds (`ip route show proto 87`).
pub const PEER_ROUTE_PROTO: u8 = 87;

/// The path MTUs the prober applied, by peer subnet (process-wide: the
/// backends' route writers and the prober hold separate [`Netlink`]s).
static LOWERED: Mutex<BTreeMap<IpNet, u32>> = Mutex::new(BTreeMap::new());

/// Records (`Some`) or forgets (`None`) the lowered MTU of `dst`.
pub fn set_lowered_mtu(dst: IpNet, mtu: Option<u32>) {
    let mut m = LOWERED.lock().unwrap_or_else(|p| p.into_inner());
    match mtu {
        Some(v) => m.insert(dst, v),
        None => m.remove(&dst),
    };
}

/// The lowered MTU of exactly `dst`, if the prober set one.
pub fn lowered_mtu(dst: IpNet) -> Option<u32> {
    LOWERED
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(&dst)
        .copied()
}

/// The `mtu` metric of a route message.
fn mtu_of(m: &RouteMessage) -> Option<u32> {
    m.attributes.iter().find_map(|a| match a {
        RouteAttribute::Metrics(ms) => ms.iter().find_map(|x| match x {
            RouteMetric::Mtu(v) => Some(*v),
            _ => None,
        }),
        _ => None,
    })
}

/// Sets (or removes) the `mtu` metric of `m`, keeping its other metrics;
/// drops the attributes the kernel reports but refuses in a request.
pub fn set_mtu_metric(m: &mut RouteMessage, mtu: Option<u32>) {
    let mut metrics: Vec<RouteMetric> = m
        .attributes
        .iter()
        .find_map(|a| match a {
            RouteAttribute::Metrics(ms) => Some(ms.clone()),
            _ => None,
        })
        .unwrap_or_default();
    metrics.retain(|x| !matches!(x, RouteMetric::Mtu(_)));
    metrics.extend(mtu.map(RouteMetric::Mtu));
    m.attributes.retain(|a| {
        !matches!(
            a,
            RouteAttribute::Metrics(_) | RouteAttribute::CacheInfo(_) | RouteAttribute::Expires(_)
        )
    });
    if !metrics.is_empty() {
        m.attributes.push(RouteAttribute::Metrics(metrics));
    }
}

fn is_peer_route(m: &RouteMessage) -> bool {
    m.header.protocol == RouteProtocol::Other(PEER_ROUTE_PROTO)
}

impl Netlink {
    /// Sets (or, with `None`, removes) the `mtu` metric of the main table's
    /// route to exactly `dst` (not one the prober added), keeping the rest
    /// of it (`ip route change DST ... mtu MTU`). Returns whether it changed
    /// anything (`false`: no such route, or the metric is already so).
    pub async fn set_route_mtu(&self, dst: IpNet, mtu: Option<u32>) -> Result<bool, NetlinkError> {
        let Some(mut m) = self
            .routes_to(dst)
            .await?
            .into_iter()
            .find(|m| !is_peer_route(m))
        else {
            return Ok(false);
        };
        if mtu_of(&m) == mtu {
            return Ok(false);
        }
        set_mtu_metric(&mut m, mtu);
        let shown = mtu.map_or("without mtu".to_string(), |v| format!("mtu {v}"));
        self.replace_message(m, format!("ip route change {dst} {shown}"))
            .await?;
        Ok(true)
    }

    /// Whether the main table has a route to exactly `dst` that the prober
    /// did not add (the backend's own).
    pub async fn has_backend_route(&self, dst: IpNet) -> Result<bool, NetlinkError> {
        Ok(self.routes_to(dst).await?.iter().any(|m| !is_peer_route(m)))
    }

    /// `ip route replace DST dev OIF [scope link] mtu MTU proto 87`: a
    /// per-peer route beside the backend's route for the whole network.
    pub async fn add_peer_route(
        &self,
        dst: IpNet,
        oif: u32,
        scope_link: bool,
        mtu: u32,
    ) -> Result<(), NetlinkError> {
        let mut m = match dst {
            IpNet::V4(d) => RouteMessageBuilder::<std::net::Ipv4Addr>::new()
                .destination_prefix(d.network(), d.prefix_len())
                .build(),
            IpNet::V6(d) => RouteMessageBuilder::<std::net::Ipv6Addr>::new()
                .destination_prefix(d.network(), d.prefix_len())
                .build(),
        };
        m.attributes.push(RouteAttribute::Oif(oif));
        m.header.scope = if scope_link {
            RouteScope::Link
        } else {
            RouteScope::Universe
        };
        m.header.protocol = RouteProtocol::Other(PEER_ROUTE_PROTO);
        set_mtu_metric(&mut m, Some(mtu));
        self.replace_message(
            m,
            format!("ip route replace {dst} dev #{oif} mtu {mtu} proto {PEER_ROUTE_PROTO}"),
        )
        .await
    }

    /// Deletes the prober's per-peer route to exactly `dst`; whether there
    /// was one.
    pub async fn del_peer_route(&self, dst: IpNet) -> Result<bool, NetlinkError> {
        let mut found = false;
        for m in self.routes_to(dst).await? {
            if is_peer_route(&m) {
                found = true;
                let mut d = m.clone();
                set_mtu_metric(&mut d, None);
                match self.handle.route().del(d).execute().await {
                    Ok(()) => {}
                    Err(e) if super::errno_of(&e) == Some(libc::ESRCH) => {}
                    Err(e) => {
                        return Err(NetlinkError::Request {
                            op: format!("ip route del {dst} proto {PEER_ROUTE_PROTO}"),
                            source: e,
                        });
                    }
                }
            }
        }
        Ok(found)
    }

    /// `ip [-6] route show proto 87` (main table): the per-peer routes the
    /// prober added, with their `mtu`.
    pub async fn peer_routes(&self, v6: bool) -> Result<Vec<(IpNet, Option<u32>)>, NetlinkError> {
        Ok(self
            .route_dump(v6)
            .await?
            .iter()
            .filter(|m| m.header.table == 254 && is_peer_route(m))
            .filter_map(|m| {
                let dst = route_dst(m)?;
                let net = IpNet::new(dst, m.header.destination_prefix_length).ok()?;
                Some((net, mtu_of(m)))
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mtu_metric_is_set_and_removed_keeping_the_rest() {
        let mut m = RouteMessage::default();
        m.attributes
            .push(RouteAttribute::Metrics(vec![RouteMetric::Hoplimit(9)]));
        set_mtu_metric(&mut m, Some(1354));
        assert_eq!(mtu_of(&m), Some(1354));
        set_mtu_metric(&mut m, Some(1300));
        assert_eq!(mtu_of(&m), Some(1300));
        set_mtu_metric(&mut m, None);
        assert_eq!(mtu_of(&m), None);
        assert_eq!(
            m.attributes,
            vec![RouteAttribute::Metrics(vec![RouteMetric::Hoplimit(9)])]
        );
    }

    #[test]
    fn the_registry_remembers_a_lowered_destination_until_forgotten() {
        let net: IpNet = "10.244.77.0/24".parse().expect("net");
        assert_eq!(lowered_mtu(net), None);
        set_lowered_mtu(net, Some(1280));
        assert_eq!(lowered_mtu(net), Some(1280));
        set_lowered_mtu(net, None);
        assert_eq!(lowered_mtu(net), None);
    }
}
