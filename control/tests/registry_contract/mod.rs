//! The `Registry` contract, written once and run against every store
//! (tests/store_embedded.rs, tests/store_etcd.rs): what subnet allocation,
//! renewal and the daemon rely on whichever store runs. Each check takes
//! handles onto one fresh, empty store; the store's own tests add what only
//! that store has (flannel's etcd bytes, the embedded file's checksum).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use weft_control::lease::{Lease, LeaseAttrs, LeaseEvent, SubnetKey};
use weft_control::store::{Registry, StoreError};

/// How long a watch event may take (etcd on a loaded machine).
pub const WAIT: Duration = Duration::from_secs(30);

/// The i-th /24 of 10.16.0.0/12.
pub fn subnet(i: u32) -> SubnetKey {
    format!("10.{}.{}.0-24", 16 + i / 256, i % 256)
        .parse()
        .expect("key")
}

/// vxlan lease attributes with public IP `ip`.
pub fn attrs(ip: [u8; 4]) -> LeaseAttrs {
    LeaseAttrs {
        public_ip: Ipv4Addr::from(ip),
        backend_type: "vxlan".into(),
        backend_data: Some(r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#.into()),
        ..Default::default()
    }
}

/// The keys of `l`, in order.
pub fn keys(l: &[Lease]) -> Vec<SubnetKey> {
    l.iter().map(Lease::key).collect()
}

/// The next event, within [`WAIT`].
pub async fn next(rx: &mut mpsc::Receiver<LeaseEvent>) -> LeaseEvent {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a lease event")
        .expect("watch ended")
}

/// Skips events until one matches `f`, within [`WAIT`].
pub async fn wait_for(
    rx: &mut mpsc::Receiver<LeaseEvent>,
    what: &str,
    f: impl Fn(&LeaseEvent) -> bool,
) -> LeaseEvent {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        let ev = tokio::time::timeout_at(deadline, rx.recv())
            .await
            .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
            .expect("watch ended");
        if f(&ev) {
            return ev;
        }
    }
}

pub fn is_added(ev: &LeaseEvent, k: SubnetKey) -> bool {
    matches!(ev, LeaseEvent::Added(l) if l.key() == k)
}

pub fn is_removed(ev: &LeaseEvent, k: SubnetKey) -> bool {
    matches!(ev, LeaseEvent::Removed(l) if l.key() == k)
}

/// Create-if-absent between two handles, get, update (a reservation when
/// the TTL is `None`), delete (also of a missing key), create after delete,
/// and the network config written by one handle and read by the other.
pub async fn create_update_delete_and_config(a: impl Registry, b: impl Registry) {
    let k = subnet(1);
    assert!(a.list_leases().await.expect("list").is_empty());
    let exp = a
        .create_lease(&k, &attrs([192, 0, 2, 1]), Some(Duration::from_secs(600)))
        .await
        .expect("create");
    assert!(exp.expect("expiry") > SystemTime::now() + Duration::from_secs(500));
    let err = b
        .create_lease(&k, &attrs([192, 0, 2, 2]), None)
        .await
        .expect_err("second create must fail");
    assert!(matches!(err, StoreError::AlreadyExists), "{err}");
    let got = b.get_lease(&k).await.expect("get").expect("present");
    assert_eq!(
        got.attrs,
        attrs([192, 0, 2, 1]),
        "the value is the winner's"
    );
    assert_eq!(got.attrs.to_json(), attrs([192, 0, 2, 1]).to_json());
    // An update overwrites; None makes a reservation, with no expiry.
    assert_eq!(
        b.update_lease(&k, &attrs([192, 0, 2, 2]), None)
            .await
            .expect("update"),
        None
    );
    let got = a.get_lease(&k).await.expect("get").expect("present");
    assert_eq!(
        (got.attrs.public_ip, got.expiration),
        (Ipv4Addr::new(192, 0, 2, 2), None)
    );
    a.delete_lease(&k).await.expect("delete");
    a.delete_lease(&k)
        .await
        .expect("deleting a missing lease succeeds");
    assert!(b.get_lease(&k).await.expect("get").is_none());
    assert_eq!(
        b.create_lease(&k, &attrs([192, 0, 2, 3]), None)
            .await
            .expect("create after delete"),
        None,
        "a reservation has no expiry"
    );

    assert_eq!(a.get_network_config().await.expect("config"), None);
    let cfg = "{\n  \"Network\": \"10.244.0.0/16\",\n  \"Backend\": {\"Type\": \"vxlan\"}\n}\n";
    a.put_network_config(cfg).await.expect("put config");
    assert_eq!(
        b.get_network_config().await.expect("config").as_deref(),
        Some(cfg)
    );
}

/// A lease with a `short` TTL expires (a `Removed` event, gone from the
/// listings, its key free again); a renewal extends the other's expiry,
/// which listings read back; the cheap listing has the same leases.
pub async fn expiry_and_renewal(s: impl Registry, short_ttl: Duration) {
    let mut rx = s.watch_leases().await.expect("watch");
    assert_eq!(next(&mut rx).await, LeaseEvent::Snapshot(vec![]));
    let (short, renewed) = (subnet(1), subnet(2));
    s.create_lease(&short, &attrs([192, 0, 2, 1]), Some(short_ttl))
        .await
        .expect("create short");
    let e1 = s
        .create_lease(&renewed, &attrs([192, 0, 2, 2]), Some(short_ttl))
        .await
        .expect("create");
    let e2 = s
        .update_lease(
            &renewed,
            &attrs([192, 0, 2, 2]),
            Some(Duration::from_secs(60)),
        )
        .await
        .expect("renew");
    assert!(
        e2.expect("e2") > e1.expect("e1") + Duration::from_secs(50),
        "renewal extends the expiry"
    );
    let listed = s.list_leases().await.expect("list");
    let l = listed.iter().find(|l| l.key() == renewed).expect("listed");
    assert!(
        l.expiration.expect("expiry") > SystemTime::now() + Duration::from_secs(50),
        "the renewed expiry is read back"
    );
    let cheap = s.list_subnets().await.expect("list subnets");
    assert_eq!(keys(&cheap), keys(&listed));
    let same = |a: &Lease, b: &Lease| a.key() == b.key() && a.attrs == b.attrs;
    assert!(cheap.iter().all(|c| listed.iter().any(|l| same(c, l))));
    wait_for(&mut rx, "the short lease to expire", |ev| {
        is_removed(ev, short)
    })
    .await;
    assert_eq!(
        keys(&s.list_leases().await.expect("list")),
        vec![renewed],
        "only the renewed lease is left"
    );
    s.create_lease(&short, &attrs([192, 0, 2, 9]), None)
        .await
        .expect("an expired key is free");
    let got = s.get_lease(&short).await.expect("get").expect("present");
    assert_eq!(got.attrs.public_ip, Ipv4Addr::new(192, 0, 2, 9));
}

/// A watch on one handle sees what another writes: a snapshot first, then
/// an `Added` per new lease and per change, a `Removed` per delete, and
/// nothing for a config write.
pub async fn watch_sees_another_handle(writer: impl Registry, reader: impl Registry) {
    writer
        .create_lease(&subnet(1), &attrs([192, 0, 2, 1]), None)
        .await
        .expect("create");
    let mut rx = reader.watch_leases().await.expect("watch");
    match next(&mut rx).await {
        LeaseEvent::Snapshot(l) => assert_eq!(keys(&l), vec![subnet(1)]),
        other => panic!("first event must be a snapshot, got {other:?}"),
    }
    writer
        .create_lease(&subnet(2), &attrs([192, 0, 2, 2]), None)
        .await
        .expect("create 2");
    match next(&mut rx).await {
        LeaseEvent::Added(l) => assert_eq!((l.key(), l.attrs), (subnet(2), attrs([192, 0, 2, 2]))),
        other => panic!("expected Added, got {other:?}"),
    }
    writer
        .update_lease(&subnet(1), &attrs([192, 0, 2, 7]), None)
        .await
        .expect("update");
    match next(&mut rx).await {
        LeaseEvent::Added(l) => assert_eq!(
            (l.key(), l.attrs.public_ip),
            (subnet(1), Ipv4Addr::new(192, 0, 2, 7))
        ),
        other => panic!("expected Added for the change, got {other:?}"),
    }
    writer.delete_lease(&subnet(2)).await.expect("delete");
    assert!(is_removed(&next(&mut rx).await, subnet(2)));
    writer.put_network_config("{}").await.expect("config");
    writer
        .create_lease(&subnet(3), &attrs([192, 0, 2, 3]), None)
        .await
        .expect("create 3");
    // The config write produced no lease event.
    assert!(is_added(&next(&mut rx).await, subnet(3)));
}

/// Six threads, each with its own runtime and handle (`open`), race to
/// create the same 20 keys: every key is won exactly once, and the stored
/// value is the winner's.
pub fn concurrent_creators_never_both_win<R, F, Fut>(open: F)
where
    R: Registry,
    F: Fn() -> Fut + Clone + Send + 'static,
    Fut: Future<Output = R>,
{
    let keys: Vec<SubnetKey> = (0..20).map(subnet).collect();
    let rt = || {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    };
    let threads: Vec<_> = (0..6u8)
        .map(|t| {
            let (open, keys) = (open.clone(), keys.clone());
            std::thread::spawn(move || {
                rt().block_on(async {
                    let s = open().await;
                    let mut won = Vec::new();
                    // Each thread walks the keys from a different start.
                    for i in 0..keys.len() {
                        let k = keys[(i + usize::from(t) * 3) % keys.len()];
                        match s.create_lease(&k, &attrs([192, 0, 2, t]), None).await {
                            Ok(_) => won.push(k),
                            Err(StoreError::AlreadyExists) => {}
                            Err(e) => panic!("create: {e}"),
                        }
                    }
                    (t, won)
                })
            })
        })
        .collect();
    let mut winners: BTreeMap<SubnetKey, Vec<u8>> = BTreeMap::new();
    for th in threads {
        let (t, won) = th.join().expect("thread");
        for k in won {
            winners.entry(k).or_default().push(t);
        }
    }
    assert_eq!(winners.len(), keys.len(), "every key was won");
    let stored = rt()
        .block_on(async { open().await.list_leases().await })
        .expect("list");
    assert_eq!(stored.len(), keys.len());
    for l in stored {
        let w = &winners[&l.key()];
        assert_eq!(w.len(), 1, "key {} won by {w:?}", l.key());
        assert_eq!(
            l.attrs.public_ip,
            Ipv4Addr::new(192, 0, 2, w[0]),
            "stored value is the winner's"
        );
    }
}
