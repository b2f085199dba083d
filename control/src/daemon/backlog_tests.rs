//! The backlog's contract: the newest state wins, batches are bounded and
//! oldest first, and a snapshot is complete only with its last batch.

use std::time::{Duration, Instant};

use super::*;
use crate::lease::LeaseAttrs;
use crate::lease::LeaseEvent;

fn lease(i: u32, ip: u8) -> Lease {
    let key: SubnetKey = format!("10.{}.{}.0-24", 1 + i / 256, i % 256)
        .parse()
        .expect("key");
    Lease {
        subnet: key.v4,
        ipv6_subnet: key.v6,
        attrs: LeaseAttrs {
            public_ip: [192, 0, 2, ip].into(),
            ..Default::default()
        },
        expiration: None,
    }
}

fn watcher() -> LeaseWatcher {
    LeaseWatcher::new("10.255.255.0-24".parse().expect("own"))
}

/// Feeds `ev` to the watcher and the backlog, as the main loop does.
fn feed(w: &mut LeaseWatcher, b: &mut Backlog, ev: LeaseEvent, at: Instant) {
    let snapshot = matches!(ev, LeaseEvent::Snapshot(_));
    let changes = w.apply(ev);
    b.note(&changes, snapshot, at);
}

/// Sends every batch and returns them.
fn drain(w: &LeaseWatcher, b: &mut Backlog) -> Vec<Outgoing> {
    let mut out = Vec::new();
    while let Some(o) = b.next(w) {
        b.applied(&o);
        out.push(o);
    }
    out
}

#[test]
fn a_burst_while_busy_costs_one_change_per_lease_and_the_newest_wins() {
    let (mut w, mut b) = (watcher(), Backlog::new());
    let t0 = Instant::now();
    feed(&mut w, &mut b, LeaseEvent::Snapshot(vec![]), t0);
    assert_eq!(
        drain(&w, &mut b).len(),
        1,
        "the empty snapshot still completes"
    );
    // While the backend is busy: lease 1 moves three times, lease 2 comes and goes.
    for (n, ip) in [(1, 2), (1, 3), (1, 4)] {
        feed(
            &mut w,
            &mut b,
            LeaseEvent::Added(lease(n, ip)),
            t0 + Duration::from_millis(u64::from(ip)),
        );
    }
    feed(&mut w, &mut b, LeaseEvent::Added(lease(2, 9)), t0);
    feed(&mut w, &mut b, LeaseEvent::Removed(lease(2, 9)), t0);
    let out = drain(&w, &mut b);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].changes, vec![Change::Add(lease(1, 4))]);
    assert!(!out[0].snapshot);
    // The latency counts from the first event the backend had not seen.
    assert_eq!(out[0].since, vec![t0 + Duration::from_millis(2)]);
    // The same state again: nothing to do.
    feed(&mut w, &mut b, LeaseEvent::Removed(lease(1, 4)), t0);
    feed(&mut w, &mut b, LeaseEvent::Added(lease(1, 4)), t0);
    assert_eq!(b.next(&w), None);
    // A removal carries the lease the backend was given.
    feed(&mut w, &mut b, LeaseEvent::Removed(lease(1, 4)), t0);
    assert_eq!(
        drain(&w, &mut b)[0].changes,
        vec![Change::Remove(lease(1, 4))]
    );
}

#[test]
fn a_large_snapshot_goes_in_bounded_batches_and_syncs_with_the_last() {
    let (mut w, mut b) = (watcher(), Backlog::new());
    let n = 5_000u32;
    let all: Vec<Lease> = (0..n).map(|i| lease(i, 2)).collect();
    feed(&mut w, &mut b, LeaseEvent::Snapshot(all), Instant::now());
    assert!(!b.synced());
    let mut batches = 0;
    let mut seen = 0;
    while let Some(o) = b.next(&w) {
        batches += 1;
        seen += o.changes.len();
        assert!(o.changes.len() <= MAX_BATCH);
        assert_eq!(o.snapshot, b.is_empty(), "only the last batch completes it");
        assert!(!b.synced(), "not synced before the last batch is applied");
        // A change arriving mid-way joins the queue behind the snapshot's keys.
        if batches == 3 {
            feed(
                &mut w,
                &mut b,
                LeaseEvent::Added(lease(n, 7)),
                Instant::now(),
            );
        }
        b.applied(&o);
    }
    assert_eq!(seen, n as usize + 1);
    assert_eq!(batches, (n as usize + 1).div_ceil(MAX_BATCH));
    assert!(b.synced());
    // A newer snapshot while the last batch of the old one is applied: not synced.
    let same: Vec<Lease> = w.leases().cloned().collect();
    feed(&mut w, &mut b, LeaseEvent::Snapshot(same), Instant::now());
    let first = b.next(&w).expect("batch");
    assert!(first.snapshot && first.changes.is_empty(), "{first:?}");
    feed(
        &mut w,
        &mut b,
        LeaseEvent::Snapshot(vec![lease(0, 2)]),
        Instant::now(),
    );
    b.applied(&first);
    assert!(!b.synced(), "the newer snapshot is not applied yet");
    drain(&w, &mut b);
    assert!(b.synced());
}

#[test]
fn a_replay_after_a_rebuild_gives_every_known_peer_again() {
    let (mut w, mut b) = (watcher(), Backlog::new());
    feed(
        &mut w,
        &mut b,
        LeaseEvent::Snapshot(vec![lease(1, 2), lease(2, 3)]),
        Instant::now(),
    );
    drain(&w, &mut b);
    b.replay(&w, Instant::now());
    assert!(!b.synced());
    let out = drain(&w, &mut b);
    assert_eq!(
        out[0].changes,
        vec![Change::Add(lease(1, 2)), Change::Add(lease(2, 3))]
    );
    assert!(out[0].snapshot && b.synced());
}
