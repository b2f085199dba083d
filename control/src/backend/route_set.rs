//! flannel's RouteNetwork (fl:pkg/backend/route_network.go, spec §4.5): the
//! per-peer routes of host-gw and ipip, remembered so that a periodic check
//! re-adds any that went missing.
//!
//! `add`: list the routes with the same destination; if the first differs
//! (gateway or device) delete it (`Replacing existing route to ...`); add
//! unless an identical one exists (`Route to ... already exists, skipping.`).
//! `remove` always deletes. `reconcile` re-adds missing ones (`Route recovered`).

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
        self.routes.insert(r.dst, r.clone());
        let existing = self.nl.routes_exact(r.dst).await?;
        if let Some(first) = existing.first() {
            if !first.same_as(&r) {
                tracing::warn!("Replacing existing route to {} with {}", first, r);
                self.nl.route_del(first).await?;
            } else {
                tracing::info!("Route to {} already exists, skipping.", r);
                return Ok(());
            }
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
        let mut n = 0;
        for r in self.routes.values() {
            let present = self.nl.routes_exact(r.dst).await?;
            if !present.iter().any(|p| p.same_as(r)) {
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
