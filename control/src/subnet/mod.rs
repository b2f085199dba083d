//! Subnet allocation on a [`Registry`] (flannel's etcd `LocalManager`,
//! pkg/subnet/etcd/local_manager.go), shared by every store but kube.
//!
//! `acquire_lease` does, in order (spec §6.1):
//! 1. reuse the lease already held for our public IP, if it still fits the
//!    config (else delete it);
//! 2. reuse the previous subnet from subnet.env, if nobody holds it;
//! 3. pick uniformly at random among the first 100 free aligned subnets in
//!    `[SubnetMin, SubnetMax]`;
//!
//! and creates the lease with a create-if-absent, retrying from the top when
//! another node won the race (at most [`RACE_RETRIES`] times).
//!
//! Where weft differs from flannel, on purpose:
//! - a reservation (a lease without TTL) stays a reservation when reused
//!   (flannel v3 attaches a 24 h TTL to it);
//! - a lost create race is retried (flannel's check compares the wrong error
//!   and fails hard).

mod manager;
pub mod manual;
#[cfg(test)]
mod tests;

pub use manager::SubnetManager;

use std::collections::BTreeSet;
use std::time::{Duration, SystemTime};

use ipnet::{Ipv4Net, Ipv6Net};
use rand::Rng;

use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::store::{Registry, StoreError};

/// How many lost create races `acquire_lease` retries (flannel's `raceRetries`).
pub const RACE_RETRIES: usize = 10;

/// How many free subnets the random pick chooses among.
const CANDIDATES: usize = 100;

/// Errors from allocation.
#[derive(Debug, thiserror::Error)]
pub enum SubnetError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// Every subnet in range is taken (flannel's text).
    #[error("out of subnets")]
    OutOfSubnets,
    /// Lost the create race too often (flannel's text).
    #[error("max retries reached trying to acquire a subnet")]
    MaxRetries,
    /// The config lacks what allocation needs (not checked).
    #[error("network config is not checked: {0}")]
    Unchecked(&'static str),
}

/// Subnets remembered from the previous subnet.env.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Previous {
    /// Previous FLANNEL_SUBNET, as a network.
    pub subnet: Option<Ipv4Net>,
    /// Previous FLANNEL_IPV6_SUBNET, as a network.
    pub ipv6_subnet: Option<Ipv6Net>,
}

/// The allocator. See the module docs.
#[derive(Debug, Clone)]
pub struct LocalManager<R> {
    reg: R,
    cfg: Config,
    prev: Previous,
    ttl: Option<Duration>,
}

impl<R: Registry> LocalManager<R> {
    /// An allocator for a checked config. `ttl` is the lease TTL (flannel: 24 h).
    pub fn new(reg: R, cfg: Config, prev: Previous, ttl: Option<Duration>) -> Self {
        LocalManager {
            reg,
            cfg,
            prev,
            ttl,
        }
    }

    /// Acquires a lease for a node publishing `attrs`.
    pub async fn acquire_lease(&self, attrs: &LeaseAttrs) -> Result<Lease, SubnetError> {
        for _ in 0..RACE_RETRIES {
            match self.try_acquire(attrs).await {
                Err(SubnetError::Store(StoreError::AlreadyExists)) => {
                    tracing::info!("subnet already taken by another node, retrying");
                }
                other => return other,
            }
        }
        Err(SubnetError::MaxRetries)
    }

    /// Renews our lease (a plain put with a fresh TTL); returns the new lease.
    pub async fn renew_lease(&self, lease: &Lease) -> Result<Lease, SubnetError> {
        let ttl = if lease.expiration.is_some() {
            self.ttl
        } else {
            None
        };
        let expiration = self
            .reg
            .update_lease(&lease.key(), &lease.attrs, ttl)
            .await?;
        Ok(Lease {
            expiration,
            ..lease.clone()
        })
    }

    async fn try_acquire(&self, attrs: &LeaseAttrs) -> Result<Lease, SubnetError> {
        let leases = self.reg.list_subnets().await?;

        // 1. The lease we already hold (by public IP), with its real expiry
        //    (none: a reservation) read afresh; it may have just expired.
        let found = leases.iter().find(|l| self.same_node(l, attrs));
        let old = match found {
            Some(l) => self.reg.get_lease(&l.key()).await?,
            None => None,
        };
        if let Some(old) = old.as_ref() {
            if self.is_compatible(old) {
                let ttl = if old.expiration.is_some() {
                    self.ttl
                } else {
                    None
                };
                let expiration = self.reg.update_lease(&old.key(), attrs, ttl).await?;
                tracing::info!(
                    "Found lease ({}) for current IP ({}), reusing",
                    old.key(),
                    attrs.public_ip
                );
                return Ok(Lease {
                    attrs: attrs.clone(),
                    expiration,
                    ..old.clone()
                });
            }
            tracing::info!(
                "Found lease ({}) for current IP ({}) but not compatible with current config, deleting",
                old.key(),
                attrs.public_ip
            );
            self.reg.delete_lease(&old.key()).await?;
        }

        // 2. The subnet from the previous subnet.env, if free and compatible.
        let taken4: BTreeSet<Ipv4Net> = leases.iter().filter_map(|l| l.subnet).collect();
        let taken6: BTreeSet<Ipv6Net> = leases.iter().filter_map(|l| l.ipv6_subnet).collect();
        let wide4: Vec<Ipv4Net> = taken4
            .iter()
            .filter(|t| u32::from(t.prefix_len()) < self.cfg.subnet_len)
            .copied()
            .collect();
        let wide6: Vec<Ipv6Net> = taken6
            .iter()
            .filter(|t| u32::from(t.prefix_len()) < self.cfg.ipv6_subnet_len)
            .copied()
            .collect();
        let prev = Lease {
            subnet: self.prev.subnet.filter(|_| self.cfg.enable_ipv4),
            ipv6_subnet: self.prev.ipv6_subnet.filter(|_| self.cfg.enable_ipv6),
            attrs: attrs.clone(),
            expiration: None,
        };
        let prev_usable = (prev.subnet.is_some() || prev.ipv6_subnet.is_some())
            && self.is_compatible(&prev)
            && prev.subnet.is_none_or(|s| !overlaps4(&taken4, &wide4, s))
            && prev
                .ipv6_subnet
                .is_none_or(|s| !overlaps6(&taken6, &wide6, s));
        let (subnet, ipv6_subnet) = if prev_usable {
            tracing::info!("Found previously leased subnet ({}), reusing", prev.key());
            (prev.subnet, prev.ipv6_subnet)
        } else {
            // 3. A random free subnet.
            let subnet = if self.cfg.enable_ipv4 {
                Some(self.pick_v4(&taken4, &wide4)?)
            } else {
                None
            };
            let ipv6_subnet = if self.cfg.enable_ipv6 {
                Some(self.pick_v6(&taken6, &wide6)?)
            } else {
                None
            };
            (subnet, ipv6_subnet)
        };
        let key = SubnetKey {
            v4: subnet,
            v6: ipv6_subnet,
        };
        let expiration = self.reg.create_lease(&key, attrs, self.ttl).await?;
        tracing::info!(
            "Allocated lease (ip: {} ipv6: {}) to current node ({})",
            subnet.map_or("<nil>".to_string(), |s| s.to_string()),
            ipv6_subnet.map_or("<nil>".to_string(), |s| s.to_string()),
            attrs.public_ip
        );
        Ok(Lease {
            subnet,
            ipv6_subnet,
            attrs: attrs.clone(),
            expiration,
        })
    }

    fn same_node(&self, l: &Lease, attrs: &LeaseAttrs) -> bool {
        if self.cfg.enable_ipv4 {
            l.attrs.public_ip == attrs.public_ip
        } else {
            attrs.public_ipv6.is_some() && l.attrs.public_ipv6 == attrs.public_ipv6
        }
    }

    /// flannel's `isSubnetConfigCompat` for both families (the IPv4 check is
    /// skipped for an IPv6-only network).
    fn is_compatible(&self, l: &Lease) -> bool {
        let c = &self.cfg;
        (!c.enable_ipv4 || c.is_subnet_compatible(l.subnet))
            && c.is_ipv6_subnet_compatible(l.ipv6_subnet)
    }

    fn pick_v4(&self, taken: &BTreeSet<Ipv4Net>, wide: &[Ipv4Net]) -> Result<Ipv4Net, SubnetError> {
        let c = &self.cfg;
        if !(1..=32).contains(&c.subnet_len) {
            return Err(SubnetError::Unchecked("SubnetLen"));
        }
        tracing::info!(
            "Picking subnet in range {} ... {}",
            c.subnet_min,
            c.subnet_max
        );
        choose(
            c.subnet_candidates()
                .filter(|n| !overlaps4(taken, wide, *n))
                .take(CANDIDATES)
                .collect(),
        )
    }

    fn pick_v6(&self, taken: &BTreeSet<Ipv6Net>, wide: &[Ipv6Net]) -> Result<Ipv6Net, SubnetError> {
        let c = &self.cfg;
        let (Some(min), Some(max)) = (c.ipv6_subnet_min, c.ipv6_subnet_max) else {
            return Err(SubnetError::Unchecked("IPv6SubnetMin/Max"));
        };
        tracing::info!("Picking subnet in range {min} ... {max}");
        choose(
            c.ipv6_subnet_candidates()
                .filter(|n| !overlaps6(taken, wide, *n))
                .take(CANDIDATES)
                .collect(),
        )
    }
}

impl<R: Registry + Clone> SubnetManager for LocalManager<R> {
    fn name(&self) -> String {
        match self.prev.subnet {
            Some(s) => format!("Local Manager with Previous Subnet: {s}"),
            None => "Local Manager with Previous Subnet: None".to_string(),
        }
    }

    async fn previous_own_lease(&self, ext: &crate::iface::ExternalInterface) -> Option<Lease> {
        let leases = self.reg.list_subnets().await.ok()?;
        leases.into_iter().find(|l| match ext.ext_addr {
            Some(ip) => l.attrs.public_ip == ip,
            None => ext.ext_v6_addr.is_some() && l.attrs.public_ipv6 == ext.ext_v6_addr,
        })
    }

    async fn acquire_lease(&self, attrs: &LeaseAttrs) -> Result<Lease, SubnetError> {
        LocalManager::acquire_lease(self, attrs).await
    }

    async fn renew_lease(&self, lease: &Lease) -> Result<Lease, SubnetError> {
        LocalManager::renew_lease(self, lease).await
    }

    async fn watch_leases(
        &self,
    ) -> Result<tokio::sync::mpsc::Receiver<crate::lease::LeaseEvent>, StoreError> {
        self.reg.watch_leases().await
    }
}

fn choose<T: Copy>(free: Vec<T>) -> Result<T, SubnetError> {
    if free.is_empty() {
        return Err(SubnetError::OutOfSubnets);
    }
    let i = rand::rng().random_range(0..free.len());
    Ok(free[i])
}

/// Whether `net` overlaps any taken subnet: one that starts inside `net`
/// (a range query on the sorted set), or one that starts before it and reaches
/// into it, which only a lease larger than the current SubnetLen (left by an
/// older config) can do; those few are in `wide`.
fn overlaps4(taken: &BTreeSet<Ipv4Net>, wide: &[Ipv4Net], net: Ipv4Net) -> bool {
    let lo = Ipv4Net::new_assert(net.network(), 0);
    taken
        .range(lo..)
        .next()
        .is_some_and(|t| t.network() <= net.broadcast())
        || wide.iter().any(|t| t.contains(&net.network()))
}

fn overlaps6(taken: &BTreeSet<Ipv6Net>, wide: &[Ipv6Net], net: Ipv6Net) -> bool {
    let lo = Ipv6Net::new_assert(net.network(), 0);
    taken
        .range(lo..)
        .next()
        .is_some_and(|t| t.network() <= net.broadcast())
        || wide.iter().any(|t| t.contains(&net.network()))
}

/// When to renew a lease expiring at `exp`: `margin` before, but never more
/// often than every half TTL (flannel would spin when margin ≥ TTL).
pub fn renew_at(exp: SystemTime, margin: Duration, ttl: Duration) -> SystemTime {
    exp.checked_sub(margin.min(ttl / 2)).unwrap_or(exp)
}
