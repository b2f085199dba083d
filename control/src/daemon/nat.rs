//! The main loop's part of NAT traversal (docs/nat.md): every [`POLL`] it
//! reads the endpoint the engine's discovery last saw this node from (an
//! atomic load through the published backend view, never a wait on the
//! backend) and, when it differs from the one the lease publishes, puts
//! the lease again with it (a store round trip, like the renewal: the
//! loop's own job). A node with the feature off has no `WeftNAT` in its
//! lease and never gets here.

use std::time::Duration;

use crate::lease::{Lease, NatAttrs};
use crate::view::Observer;

/// How often the loop looks: discovery's fastest round ([`weft_engine::path::wg::disco::FAST`]).
pub const POLL: Duration = weft_engine::path::wg::disco::FAST;

/// A node with NAT traversal reconciles every this many [`POLL`]s (2 s)
/// instead of every 10 s: the path choice (punched, relayed, which relay)
/// runs there, and a relay that went silent
/// ([`weft_engine::path::wg::disco::RELAY_SILENT`], 7 s) is then left
/// within 9 s. A reconcile of the WireGuard backend is a netlink look at
/// one device and its routes.
pub const NAT_RECONCILE_EVERY: u64 = 2;

/// The lease to publish when discovery saw this node from a new endpoint.
pub fn changed(obs: &Observer, lease: &Lease) -> Option<Lease> {
    let nat = lease.attrs.weft_nat?;
    let view = obs.backend()?;
    let seen = view.devices.iter().find_map(|d| d.nat_seen())?;
    if nat.endpoint == Some(seen) {
        return None;
    }
    match nat.endpoint {
        None => tracing::info!("NAT: this node is seen from {seen}"),
        Some(was) => tracing::info!("NAT: this node is now seen from {seen} (was {was})"),
    }
    let mut next = lease.clone();
    next.attrs.weft_nat = Some(NatAttrs {
        endpoint: Some(seen),
        ..nat
    });
    Some(next)
}
