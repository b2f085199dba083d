//! flannel's RouteNetwork (fl:pkg/backend/route_network.go, spec §4.5): the
//! per-peer routes of host-gw and ipip, remembered so that a periodic check
//! re-adds any that went missing.
//!
//! `add`: flannel lists the routes to the destination, deletes the first if it
//! differs and adds unless an identical one exists. weft compares with the
//! route it remembers for that destination (skip if identical, delete the old
//! one if it differs) and sends `ip route replace`, which also replaces a
//! stale kernel route to the same destination in place: the same end state
//! without reading the routing table back per route (that made 5,000 peers
//! take ~18 s). `remove` always deletes. `reconcile` reads each family's table
//! once and re-adds what is missing (`Route recovered`).

use std::collections::BTreeMap;
use std::sync::Arc;

use ipnet::IpNet;

use crate::netlink::{Client, NetlinkError, Route};

/// See the module docs.
#[derive(Debug)]
pub struct RouteSet {
    nl: Arc<dyn Client>,
    routes: BTreeMap<IpNet, Route>,
}

impl RouteSet {
    /// An empty set programming through `nl`.
    pub fn new(nl: Arc<dyn Client>) -> RouteSet {
        RouteSet {
            nl,
            routes: BTreeMap::new(),
        }
    }

    /// flannel's `routeAdd`; the route is remembered even when adding fails
    /// (the next reconcile retries it).
    pub async fn add(&mut self, r: Route) -> Result<(), NetlinkError> {
        match self.routes.insert(r.dst, r.clone()) {
            Some(old) if old.same_as(&r) => {
                tracing::debug!("Route to {} already exists, skipping.", r);
                return Ok(());
            }
            Some(old) => {
                tracing::warn!("Replacing existing route to {} with {}", old, r);
                self.nl.route_del(&old).await?;
            }
            None => {}
        }
        self.nl.route_replace(&r).await
    }

    /// Deletes (and forgets) the route to `dst`.
    pub async fn remove(&mut self, dst: IpNet) -> Result<(), NetlinkError> {
        match self.routes.remove(&dst) {
            Some(r) => self.nl.route_del(&r).await,
            None => Ok(()),
        }
    }

    /// Re-adds remembered routes that are missing; returns how many.
    pub async fn reconcile(&self) -> Result<usize, NetlinkError> {
        let present = main_routes(&*self.nl, self.routes.keys()).await?;
        let mut n = 0;
        for r in self.routes.values() {
            if !present
                .get(&r.dst)
                .is_some_and(|v| v.iter().any(|p| p.same_as(r)))
            {
                self.nl.route_replace(r).await?;
                tracing::info!("Route recovered {} : {}", r.dst, r);
                n += 1;
            }
        }
        Ok(n)
    }

    /// Deletes every remembered route (best effort) and forgets them.
    pub async fn clear(&mut self) {
        for r in std::mem::take(&mut self.routes).into_values() {
            if let Err(e) = self.nl.route_del(&r).await {
                tracing::warn!("failed to delete route {r}: {e}");
            }
        }
    }

    /// The remembered routes.
    pub fn routes(&self) -> impl Iterator<Item = &Route> {
        self.routes.values()
    }
}

/// The main table's routes by destination, read with one dump per address
/// family that `dsts` contains.
pub async fn main_routes<'a>(
    nl: &dyn Client,
    dsts: impl IntoIterator<Item = &'a IpNet>,
) -> Result<BTreeMap<IpNet, Vec<Route>>, NetlinkError> {
    let (mut v4, mut v6) = (false, false);
    for d in dsts {
        match d {
            IpNet::V4(_) => v4 = true,
            IpNet::V6(_) => v6 = true,
        }
    }
    let mut by_dst: BTreeMap<IpNet, Vec<Route>> = BTreeMap::new();
    for (want, fam_v6) in [(v4, false), (v6, true)] {
        if want {
            for r in nl.routes_main(fam_v6).await? {
                by_dst.entry(r.dst).or_default().push(r);
            }
        }
    }
    Ok(by_dst)
}
