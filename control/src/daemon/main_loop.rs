//! weftd's main loop: one `select!` that never waits for work.
//!
//! Its arms only take in and hand out: lease events go to the
//! [`LeaseWatcher`] and the [`Backlog`], the lease is renewed before it
//! expires, SIGHUP, `weft dataplane` commands and a pending switch's due
//! time become switch requests, the reconcile tick marks a reconcile due,
//! and the backend's task reports what it finished. Whenever that task is
//! idle the loop hands it the next item (a switch, a rebuild, a reconcile,
//! or the next bounded batch of peer changes, computed from the newest
//! lease set). **No arm awaits backend, engine or netlink work**: that all
//! runs in [`BackendTask`]. The one await an arm holds is the store's
//! renewal, which is the loop's own job. After every turn the loop
//! publishes its [`crate::view::DaemonView`] (lease, peers, dataplane
//! choice, readiness), which status, metrics and health read without asking
//! it anything.

use std::time::{Duration, Instant, SystemTime};

use anyhow::{Context, bail};
use tokio::sync::mpsc;

use super::backend_task::{BackendTask, Done, Work};
use super::backlog::Backlog;
use super::flags::Flags;
use super::stop::Stop;
use crate::backend::BackendError;
use crate::backend::dataplane_ctl::{DataplaneControl, SwitchRequest};
use crate::lease::watcher::{Change, LeaseWatcher};
use crate::lease::{Lease, LeaseEvent, SubnetKey};
use crate::metrics::DaemonMetrics;
use crate::subnet::{SubnetManager, renew_at};
use crate::view::Publisher;

/// How often backends re-check kernel state.
const RECONCILE_PERIOD: Duration = Duration::from_secs(10);

/// What the loop runs on.
pub struct LoopCx<'a, M> {
    /// The daemon's flags.
    pub flags: &'a Flags,
    /// The subnet manager (lease renewal and watch).
    pub mgr: &'a M,
    /// The dataplane choice (`weft dataplane`).
    pub ctl: &'a mut DataplaneControl,
    /// Where the loop publishes its state.
    pub publisher: &'a Publisher,
    /// The daemon's metrics.
    pub metrics: &'a DaemonMetrics,
}

/// Work the loop holds for the backend's task until it is idle.
#[derive(Debug, Default)]
struct Queue {
    /// A switch to request (from a command, SIGHUP or a due pending switch).
    switch: Option<SwitchRequest>,
    /// The switch in flight.
    switching: Option<SwitchRequest>,
    /// When a pending switch is due.
    switch_due: Option<SystemTime>,
    /// The backend's device was deleted: rebuild it.
    rebuild: bool,
    /// The reconcile tick fired.
    reconcile: bool,
}

/// Runs until a stop signal (`Ok(0)`), the loss of the own lease (`Ok(0)`)
/// or a fatal error.
pub async fn run<M: SubnetManager>(
    cx: LoopCx<'_, M>,
    task: &mut BackendTask,
    lease: &mut Lease,
    stop: &mut Stop,
) -> anyhow::Result<i32> {
    let LoopCx {
        flags,
        mgr,
        ctl,
        publisher,
        metrics,
    } = cx;
    let ttl = Duration::from_secs(flags.lease_ttl);
    let mut hup = stop.take_hup();
    let Some(mut events) = watch(mgr, stop).await else {
        return Ok(0);
    };
    let own = lease.key();
    let mut watcher = LeaseWatcher::new(own);
    let mut backlog = Backlog::new();
    let mut q = Queue::default();
    let margin =
        Duration::from_secs(60 * u64::try_from(flags.subnet_lease_renew_margin).unwrap_or(60));
    let mut reconcile = tokio::time::interval(RECONCILE_PERIOD);
    reconcile.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    reconcile.tick().await;
    let mut probes = publisher.observer();
    let nat_obs = publisher.observer();
    let mut nat_tick = tokio::time::interval(super::nat::POLL);
    nat_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut peers_reported: Option<Vec<String>> = None;
    let mut nat_polls: u64 = 0;
    loop {
        if !task.is_busy() {
            dispatch(task, &mut q, &mut backlog, &watcher, lease)?;
        }
        publisher.daemon(|d| {
            d.lease = Some(lease.clone());
            d.requested = ctl.requested().as_str().to_string();
            d.synced = backlog.synced();
        });
        let due = lease.expiration.map(|e| renew_at(e, margin, ttl));
        tokio::select! {
            _ = stop.wait() => {
                tracing::info!("shutdownHandler sent cancel signal...");
                return Ok(0);
            }
            ev = events.recv() => {
                let Some(ev) = ev else { bail!("lease watch ended unexpectedly") };
                if own_lease_gone(&ev, &own) {
                    tracing::info!("Lease has been revoked. Shutting down daemon.");
                    return Ok(0);
                }
                on_event(ev, &own, lease, &mut watcher, &mut backlog, metrics);
                publisher.daemon(|d| d.peers = watcher.shared());
            }
            _ = sleep_until(due) => {
                let late = due.and_then(|d| SystemTime::now().duration_since(d).ok());
                metrics.lease_renew_started(late.unwrap_or_default());
                match mgr.renew_lease(lease).await {
                    Ok(l) => {
                        metrics.lease_renewed(true);
                        *lease = l;
                        tracing::info!("Lease renewed, new expiration: {:?}", lease.expiration.map(humantime));
                    }
                    Err(e) => {
                        metrics.lease_renewed(false);
                        tracing::error!("Error renewing lease (trying again in 1 min): {e}");
                        // Retry in a minute, or sooner when the TTL is short.
                        let retry = Duration::from_secs(60).min(ttl / 4);
                        lease.expiration = Some(SystemTime::now() + retry + margin.min(ttl / 2));
                    }
                }
            }
            Some(()) = recv_hup(&mut hup), if q.switch.is_none() => {
                q.switch = ctl.on_hup(task.name());
            }
            Some(cmd) = ctl.next_command(), if q.switch.is_none() => {
                q.switch = ctl.on_command(cmd, task.name());
            }
            _ = sleep_until(q.switch_due), if q.switch.is_none() => {
                q.switch_due = None;
                q.switch = Some(ctl.on_due());
            }
            _ = reconcile.tick() => q.reconcile = true,
            _ = nat_tick.tick(), if lease.attrs.weft_nat.is_some() => {
                // NAT traversal's path choice (relays, their failover)
                // runs at reconcile: every NAT_RECONCILE_EVERY polls.
                nat_polls += 1;
                if nat_polls.is_multiple_of(super::nat::NAT_RECONCILE_EVERY) {
                    q.reconcile = true;
                }
                // A new endpoint from discovery: published with the lease.
                if let Some(next) = super::nat::changed(&nat_obs, lease) {
                    match mgr.renew_lease(&next).await {
                        Ok(l) => *lease = l,
                        Err(e) => tracing::warn!("cannot publish the NAT endpoint: {e}"),
                    }
                }
            }
            Some(view) = probes.probes_changed() => {
                // Only a changed set is reported (a store round trip, as the
                // lease renewal: the loop's own job); a failed report is
                // tried again at the next publication.
                let lost = unreachable(&view, &watcher);
                if peers_reported.as_ref() != Some(&lost) {
                    match mgr.report_peers(&lost).await {
                        Ok(()) => peers_reported = Some(lost),
                        Err(e) => tracing::warn!("cannot report the unreachable peers: {e}"),
                    }
                }
            }
            done = task.done() => {
                let done = done?;
                on_done(done, task.name(), &mut q, &mut backlog, ctl, metrics)?;
            }
        }
    }
}

/// The peers the probes found unreachable, as `subnet (public IP)`, in
/// subnet order.
fn unreachable(view: &crate::view::ProbeView, watcher: &LeaseWatcher) -> Vec<String> {
    let mut lost: Vec<ipnet::Ipv4Net> = view
        .iter()
        .filter(|(_, st)| st.reachable == Some(false))
        .map(|(net, _)| *net)
        .collect();
    if lost.is_empty() {
        return Vec::new();
    }
    lost.sort();
    let peers = watcher.shared();
    lost.into_iter()
        .map(|net| {
            let ip = peers
                .iter()
                .find(|l| l.subnet == Some(net))
                .map(|l| l.attrs.public_ip.to_string())
                .unwrap_or_default();
            format!("{net} ({ip})")
        })
        .collect()
}

/// Hands the idle task the most urgent item: a switch, a rebuild, a
/// reconcile (at most one batch late), else the next batch of peer changes.
fn dispatch(
    task: &mut BackendTask,
    q: &mut Queue,
    backlog: &mut Backlog,
    watcher: &LeaseWatcher,
    lease: &Lease,
) -> anyhow::Result<()> {
    let work = if let Some(req) = q.switch.take() {
        let w = Work::Switch(req.want);
        q.switching = Some(req);
        w
    } else if q.rebuild {
        q.rebuild = false;
        backlog.replay(watcher, Instant::now());
        Work::Rebuild(lease.clone())
    } else if q.reconcile {
        q.reconcile = false;
        Work::Reconcile
    } else if let Some(out) = backlog.next(watcher) {
        if !backlog.is_empty() {
            tracing::debug!(
                "applying {} peer changes, {} more waiting",
                out.changes.len(),
                backlog.len()
            );
        }
        Work::Apply(out)
    } else {
        return Ok(());
    };
    task.send(work)?;
    Ok(())
}

/// One lease event: the own lease's expiry, the watcher's set, the backlog.
fn on_event(
    ev: LeaseEvent,
    own: &SubnetKey,
    lease: &mut Lease,
    watcher: &mut LeaseWatcher,
    backlog: &mut Backlog,
    metrics: &DaemonMetrics,
) {
    let received = Instant::now();
    metrics.lease_event(match &ev {
        LeaseEvent::Snapshot(_) => "snapshot",
        LeaseEvent::Added(_) => "added",
        LeaseEvent::Removed(_) => "removed",
    });
    if let LeaseEvent::Added(l) = &ev
        && l.key() == *own
    {
        tracing::info!("Waiting for {} to renew lease", own);
        lease.expiration = l.expiration;
    }
    let snapshot = matches!(ev, LeaseEvent::Snapshot(_));
    let changes = watcher.apply(ev);
    for change in &changes {
        match change {
            Change::Add(l) => tracing::info!("Subnet added: {} {}", l.key(), l.attrs.to_json()),
            Change::Remove(l) => tracing::info!("Subnet removed: {}", l.key()),
        }
    }
    backlog.note(&changes, snapshot, received);
}

/// What the backend's task finished.
fn on_done(
    done: Done,
    name: &str,
    q: &mut Queue,
    backlog: &mut Backlog,
    ctl: &mut DataplaneControl,
    metrics: &DaemonMetrics,
) -> anyhow::Result<()> {
    match done {
        Done::Applied(out, result) => {
            let failed = result.err().unwrap_or_default();
            for (change, e) in failed.failures(&out.changes) {
                tracing::error!("failed to apply {change:?}: {e}");
            }
            if let Some(e) = &failed.prune {
                tracing::warn!("pruning state of unknown peers: {e}");
            }
            for (i, (change, at)) in out.changes.iter().zip(&out.since).enumerate() {
                if !failed.is_failed(i) {
                    metrics.peer_applied(matches!(change, Change::Add(_)), at.elapsed());
                }
            }
            backlog.applied(&out);
        }
        Done::Reconciled(Ok(())) => {}
        Done::Reconciled(Err(BackendError::DeviceGone(dev))) => {
            // Rebuilt on the same lease, then every known peer is replayed.
            tracing::error!("device {dev} was deleted; recreating the {name} backend");
            q.rebuild = true;
        }
        Done::Reconciled(Err(e)) => tracing::warn!("reconcile: {e}"),
        Done::Rebuilt(r) => {
            r.context("failed to recreate the backend")?;
            tracing::info!("the {name} backend was recreated; re-applying every known peer");
        }
        Done::Switched(out) => {
            q.switch_due = out.pending;
            let lost = match &out.result {
                Err(e @ BackendError::NoDataplane { .. }) => Some(e.to_string()),
                _ => None,
            };
            match q.switching.take() {
                Some(req) => ctl.on_switched(req, out),
                None => tracing::warn!("a switch finished that nobody requested"),
            }
            if let Some(e) = lost {
                bail!("{e}; nothing forwards, exiting so that the supervisor restarts weftd");
            }
        }
    }
    Ok(())
}

fn own_lease_gone(ev: &LeaseEvent, own: &SubnetKey) -> bool {
    match ev {
        LeaseEvent::Removed(l) => l.key() == *own,
        LeaseEvent::Snapshot(all) => !all.iter().any(|l| l.key() == *own),
        LeaseEvent::Added(_) => false,
    }
}

fn humantime(t: SystemTime) -> String {
    let secs = t
        .duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    format!("unix {secs}")
}

async fn sleep_until(at: Option<SystemTime>) {
    match at {
        Some(at) => {
            let d = at
                .duration_since(SystemTime::now())
                .unwrap_or(Duration::ZERO);
            tokio::time::sleep(d).await;
        }
        None => std::future::pending().await,
    }
}

/// The next SIGHUP (never, without a handler).
async fn recv_hup(hup: &mut Option<tokio::signal::unix::Signal>) -> Option<()> {
    match hup {
        Some(s) => s.recv().await,
        None => std::future::pending().await,
    }
}

/// Starts the lease watch, retrying while the store is unreachable; `None` on stop.
async fn watch<M: SubnetManager>(mgr: &M, stop: &mut Stop) -> Option<mpsc::Receiver<LeaseEvent>> {
    let mut backoff = Duration::from_millis(100);
    loop {
        match stop.until(mgr.watch_leases()).await? {
            Ok(rx) => return Some(rx),
            Err(e) => {
                tracing::error!("failed to watch leases: {e}; retrying in {backoff:?}");
                stop.until(tokio::time::sleep(backoff)).await?;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
