//! `--ip-blackhole-route` (flannel-compat spec §8.3, flannel's
//! `AddBlackholeV4Route` / `AddBlackholeV6Route`): a blackhole route for the
//! node's own lease subnet, IPv4 and IPv6, added when missing and checked
//! again every resync period (`--iptables-resync`). Like flannel, weftd
//! never removes it, not even on exit: while no pod bridge covers the subnet
//! (before the first pod, while the bridge is down) the subnet's packets
//! are dropped instead of leaking out through the default route.
//!
//! Two differences, both to keep the route harmless:
//! - It has the largest metric, [`METRIC`]. flannel's has metric 0, the
//!   metric of the bridge's connected route; when the blackhole is there
//!   first (flannel adds it at start, before any pod) the kernel puts the
//!   connected route behind it and the node's own pods become unreachable,
//!   and when the bridge is there first the add fails with EEXIST on every
//!   check. At the largest metric it is always the last resort. A blackhole
//!   for the subnet at another metric (flannel's) is replaced.
//! - At start, a blackhole for the subnet of the previous subnet.env is
//!   deleted when the node now holds another subnet (flannel leaves it, and
//!   it then blackholes traffic to the node that took that subnet over).

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use weft_compat::subnet_env::SubnetEnv;

use crate::lease::Lease;
use crate::netlink::{Client, NetlinkError};

/// The metric of weftd's blackhole routes: after every other route.
pub const METRIC: u32 = u32::MAX;

/// The routes `--ip-blackhole-route` keeps: the lease's subnets.
pub fn wanted(lease: &Lease) -> Vec<IpNet> {
    lease
        .subnet
        .map(|s| IpNet::V4(s.trunc()))
        .into_iter()
        .chain(lease.ipv6_subnet.map(|s| IpNet::V6(s.trunc())))
        .collect()
}

/// Makes each of `nets` have exactly one blackhole route in the main table,
/// at [`METRIC`]; returns how many routes it added or replaced.
pub async fn ensure(nl: &dyn Client, nets: &[IpNet]) -> Result<usize, NetlinkError> {
    let mut changed = 0;
    for net in nets {
        let present = nl.blackholes(matches!(net, IpNet::V6(_))).await?;
        let mut ours = false;
        for &(dst, metric) in present.iter().filter(|(d, _)| d == net) {
            if metric == METRIC {
                ours = true;
            } else {
                tracing::info!(
                    "replacing the blackhole route {dst} metric {metric} with one at metric {METRIC} (it would hide the pod bridge's route)"
                );
                nl.blackhole_del(dst, metric).await?;
                changed += 1;
            }
        }
        if !ours {
            nl.blackhole_add(*net, METRIC).await?;
            changed += 1;
        }
    }
    Ok(changed)
}

/// Deletes the blackhole routes (any metric) for the subnets of `prev` (the
/// previous subnet.env) that `lease` no longer holds; returns their
/// destinations.
pub async fn remove_stale(
    nl: &dyn Client,
    prev: Option<&SubnetEnv>,
    lease: &Lease,
) -> Result<Vec<IpNet>, NetlinkError> {
    let Some(prev) = prev else {
        return Ok(Vec::new());
    };
    let now = wanted(lease);
    let old = prev
        .subnet
        .map(|s| IpNet::V4(s.trunc()))
        .into_iter()
        .chain(prev.ipv6_subnet.map(|s| IpNet::V6(s.trunc())));
    let mut removed = Vec::new();
    for net in old.filter(|n| !now.contains(n)) {
        let present = nl.blackholes(matches!(net, IpNet::V6(_))).await?;
        for &(dst, metric) in present.iter().filter(|(d, _)| *d == net) {
            nl.blackhole_del(dst, metric).await?;
            if !removed.contains(&dst) {
                removed.push(dst);
            }
        }
    }
    Ok(removed)
}

/// Re-checks the routes every `period` until dropped.
#[derive(Debug)]
pub struct Keeper(tokio::task::JoinHandle<()>);

impl Keeper {
    /// Starts the periodic check of `nets` (the first check runs after one period).
    pub fn spawn(nl: Arc<dyn Client>, nets: Vec<IpNet>, period: Duration) -> Keeper {
        Keeper(tokio::spawn(async move {
            let mut tick = tokio::time::interval(period.max(Duration::from_secs(1)));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            tick.tick().await;
            loop {
                tick.tick().await;
                match ensure(&*nl, &nets).await {
                    Ok(0) => {}
                    Ok(_) => tracing::info!("blackhole route for {nets:?} restored"),
                    Err(e) => tracing::warn!("failed to ensure blackhole route: {e}"),
                }
            }
        }))
    }
}

impl Drop for Keeper {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lease::LeaseAttrs;
    use crate::netlink::{FakeNetlink, Op};

    fn net(s: &str) -> IpNet {
        s.parse().expect("net")
    }

    fn lease(v4: Option<&str>, v6: Option<&str>) -> Lease {
        Lease {
            subnet: v4.map(|s| s.parse().expect("v4")),
            ipv6_subnet: v6.map(|s| s.parse().expect("v6")),
            attrs: LeaseAttrs::default(),
            expiration: None,
        }
    }

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    #[test]
    fn adds_the_own_subnets_once_and_restores_them() {
        rt().block_on(async {
            let f = FakeNetlink::new(&[], false);
            let nets = wanted(&lease(Some("10.244.3.7/24"), Some("fd00:244:3::/64")));
            assert_eq!(nets, vec![net("10.244.3.0/24"), net("fd00:244:3::/64")]);
            assert_eq!(ensure(&f, &nets).await.expect("ensure"), 2);
            assert_eq!(
                f.take_ops(),
                vec![
                    Op::BlackholeAdd(net("10.244.3.0/24"), u32::MAX),
                    Op::BlackholeAdd(net("fd00:244:3::/64"), u32::MAX)
                ]
            );
            // Present: nothing is sent again.
            assert_eq!(ensure(&f, &nets).await.expect("ensure"), 0);
            assert!(f.take_ops().is_empty());
            // Deleted by hand: the next check puts back only that one.
            f.forget_blackhole(net("10.244.3.0/24"));
            assert_eq!(ensure(&f, &nets).await.expect("ensure"), 1);
            assert_eq!(
                f.take_ops(),
                vec![Op::BlackholeAdd(net("10.244.3.0/24"), u32::MAX)]
            );
            assert_eq!(f.blackhole_routes().len(), 2);
            // No other route was touched.
            assert!(f.routes().is_empty());
        });
    }

    #[test]
    fn ipv4_only_lease_gets_one_route() {
        rt().block_on(async {
            let f = FakeNetlink::new(&[], false);
            let nets = wanted(&lease(Some("10.244.3.0/24"), None));
            ensure(&f, &nets).await.expect("ensure");
            assert_eq!(f.blackhole_routes(), vec![(net("10.244.3.0/24"), u32::MAX)]);
        });
    }

    /// flannel's metric-0 blackhole (it hides the pod bridge's connected
    /// route) is replaced by weftd's; other subnets' blackholes stay.
    #[test]
    fn a_blackhole_at_another_metric_is_replaced() {
        rt().block_on(async {
            let f = FakeNetlink::new(&[], false);
            f.insert_blackhole(net("10.244.3.0/24"), 0);
            f.insert_blackhole(net("10.244.9.0/24"), 0);
            let nets = wanted(&lease(Some("10.244.3.0/24"), None));
            assert_eq!(ensure(&f, &nets).await.expect("ensure"), 2);
            assert_eq!(
                f.take_ops(),
                vec![
                    Op::BlackholeDel(net("10.244.3.0/24"), 0),
                    Op::BlackholeAdd(net("10.244.3.0/24"), u32::MAX)
                ]
            );
            assert_eq!(
                f.blackhole_routes(),
                vec![(net("10.244.9.0/24"), 0), (net("10.244.3.0/24"), u32::MAX)]
            );
        });
    }

    #[test]
    fn stale_route_of_a_previous_subnet_is_removed() {
        rt().block_on(async {
            let f = FakeNetlink::new(&[], false);
            ensure(&f, &[net("10.244.7.0/24"), net("10.244.3.0/24")])
                .await
                .expect("ensure");
            f.insert_blackhole(net("10.244.7.0/24"), 0);
            f.take_ops();
            let prev = SubnetEnv::parse(
                "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n",
            );
            let now = lease(Some("10.244.3.0/24"), None);
            let removed = remove_stale(&f, Some(&prev), &now).await.expect("stale");
            assert_eq!(removed, vec![net("10.244.7.0/24")]);
            assert_eq!(
                f.take_ops(),
                vec![
                    Op::BlackholeDel(net("10.244.7.0/24"), u32::MAX),
                    Op::BlackholeDel(net("10.244.7.0/24"), 0)
                ]
            );
            assert_eq!(f.blackhole_routes(), vec![(net("10.244.3.0/24"), u32::MAX)]);
            // Same subnet as before, no previous file, or no route: nothing.
            let same = SubnetEnv::parse("FLANNEL_SUBNET=10.244.3.1/24\n");
            assert!(
                remove_stale(&f, Some(&same), &now)
                    .await
                    .expect("same")
                    .is_empty()
            );
            assert!(remove_stale(&f, None, &now).await.expect("none").is_empty());
            assert!(
                remove_stale(&f, Some(&prev), &now)
                    .await
                    .expect("gone")
                    .is_empty()
            );
            assert!(f.take_ops().is_empty());
        });
    }

    #[test]
    fn keeper_restores_within_a_period_and_stops_when_dropped() {
        rt().block_on(async {
            let f = Arc::new(FakeNetlink::new(&[], false));
            let nets = vec![net("10.244.3.0/24")];
            ensure(&*f, &nets).await.expect("ensure");
            let k = Keeper::spawn(f.clone(), nets.clone(), Duration::from_secs(1));
            f.forget_blackhole(nets[0]);
            tokio::time::sleep(Duration::from_millis(2500)).await;
            assert_eq!(
                f.blackhole_routes(),
                vec![(nets[0], METRIC)],
                "restored by the keeper"
            );
            drop(k);
            f.forget_blackhole(nets[0]);
            tokio::time::sleep(Duration::from_millis(1500)).await;
            assert!(f.blackhole_routes().is_empty(), "no checks after drop");
        });
    }
}
