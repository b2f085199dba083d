//! The etcd lease store against a real etcd (Debian's etcd-server) started by
//! the `weft-tests` harness: flannel's keys and values, create-if-absent,
//! renewal, hand-written and malformed entries, and watches that survive
//! deletes by hand, etcd restarts and compaction.

use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use weft_control::lease::{Lease, LeaseAttrs, LeaseEvent, SubnetKey};
use weft_control::store::etcd::{EtcdOptions, EtcdStore};
use weft_control::store::{Registry, StoreError};
use weft_testenv::require_tool;
use weft_tests::etcd::Etcd;
use weft_tests::require_etcd;

const WAIT: Duration = Duration::from_secs(30);
const PREFIX: &str = "/coreos.com/network";
const FLANNEL_JSON: &str = r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;

fn subnet(i: u32) -> SubnetKey {
    format!("10.{}.{}.0-24", 16 + i / 256, i % 256)
        .parse()
        .expect("key")
}

fn attrs(ip: [u8; 4]) -> LeaseAttrs {
    LeaseAttrs {
        public_ip: Ipv4Addr::from(ip),
        backend_type: "vxlan".into(),
        backend_data: Some(r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#.into()),
        ..Default::default()
    }
}

async fn connect(etcd: &Etcd) -> EtcdStore {
    let opts = EtcdOptions {
        endpoints: etcd.endpoint(),
        ..EtcdOptions::default()
    };
    EtcdStore::connect(&opts).await.expect("connect")
}

/// etcdctl in a blocking task (it is a child process).
async fn etcdctl(etcd: &Etcd, args: &[&str]) -> String {
    tokio::task::block_in_place(|| etcd.etcdctl_ok(args))
}

async fn next(rx: &mut mpsc::Receiver<LeaseEvent>) -> LeaseEvent {
    tokio::time::timeout(WAIT, rx.recv())
        .await
        .expect("timed out waiting for a lease event")
        .expect("watch ended")
}

async fn wait_for(
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

fn keys(l: &[Lease]) -> Vec<SubnetKey> {
    l.iter().map(Lease::key).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flannel_layout_create_if_absent_and_lease_revoked_on_conflict() {
    require_etcd!();
    let etcd = Etcd::start();
    let a = connect(&etcd).await;
    let b = connect(&etcd).await;
    let k: SubnetKey = "10.244.1.0-24".parse().expect("key");
    let exp = a
        .create_lease(
            &k,
            &attrs([192, 168, 64, 3]),
            Some(Duration::from_secs(86_400)),
        )
        .await
        .expect("create");
    assert!(exp.expect("expiration") > SystemTime::now() + Duration::from_secs(86_000));
    // Exactly flannel's key and value bytes.
    let raw = etcdctl(&etcd, &["get", "--prefix", &format!("{PREFIX}/subnets/")]).await;
    assert_eq!(
        raw,
        format!("{PREFIX}/subnets/10.244.1.0-24\n{FLANNEL_JSON}\n")
    );
    let leases_before = etcdctl(&etcd, &["lease", "list"]).await;
    assert!(
        leases_before.starts_with("found 1 leases"),
        "{leases_before}"
    );

    let err = b
        .create_lease(&k, &attrs([192, 0, 2, 2]), Some(Duration::from_secs(60)))
        .await
        .expect_err("taken");
    assert!(matches!(err, StoreError::AlreadyExists), "{err}");
    // The loser's granted lease was revoked, and the value is the winner's.
    assert_eq!(etcdctl(&etcd, &["lease", "list"]).await, leases_before);
    assert_eq!(
        b.get_lease(&k).await.expect("get").expect("present").attrs,
        attrs([192, 168, 64, 3])
    );

    // Config key.
    assert_eq!(a.get_network_config().await.expect("config"), None);
    etcdctl(
        &etcd,
        &[
            "put",
            &format!("{PREFIX}/config"),
            r#"{"Network":"10.244.0.0/16"}"#,
        ],
    )
    .await;
    assert_eq!(
        b.get_network_config().await.expect("config").as_deref(),
        Some(r#"{"Network":"10.244.0.0/16"}"#)
    );

    // A reservation has no lease and no expiration.
    let r = subnet(7);
    assert_eq!(
        a.create_lease(&r, &attrs([192, 0, 2, 7]), None)
            .await
            .expect("reserve"),
        None
    );
    let got = b.get_lease(&r).await.expect("get").expect("present");
    assert_eq!(got.expiration, None);
    a.delete_lease(&r).await.expect("delete");
    a.delete_lease(&r)
        .await
        .expect("delete of a missing key succeeds");
    assert!(a.get_lease(&r).await.expect("get").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_extends_the_etcd_lease() {
    require_etcd!();
    let etcd = Etcd::start();
    let s = connect(&etcd).await;
    let (short, renewed) = (subnet(1), subnet(2));
    s.create_lease(&short, &attrs([192, 0, 2, 1]), Some(Duration::from_secs(2)))
        .await
        .expect("create");
    let e1 = s
        .create_lease(
            &renewed,
            &attrs([192, 0, 2, 2]),
            Some(Duration::from_secs(2)),
        )
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
    assert!(e2.expect("e2") > e1.expect("e1") + Duration::from_secs(50));
    let listed = s.list_leases().await.expect("list");
    let l = listed.iter().find(|l| l.key() == renewed).expect("listed");
    assert!(
        l.expiration.expect("ttl") > SystemTime::now() + Duration::from_secs(50),
        "TTL read back from etcd"
    );
    // The cheap listing has the same leases, without expirations.
    let cheap = s.list_subnets().await.expect("list subnets");
    assert_eq!(keys(&cheap), keys(&listed));
    assert!(cheap.iter().all(|c| c.expiration.is_none()));
    let same = |a: &Lease, b: &Lease| a.key() == b.key() && a.attrs == b.attrs;
    assert!(cheap.iter().all(|c| listed.iter().any(|l| same(c, l))));
    // etcd expires the short one; the renewed one stays.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut left = Vec::new();
    for _ in 0..50 {
        left = keys(&s.list_leases().await.expect("list"));
        if left.len() == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(left, vec![renewed]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hand_written_leases_deletes_and_malformed_entries() {
    require_etcd!();
    let etcd = Etcd::start();
    let s = connect(&etcd).await;
    s.create_lease(
        &subnet(1),
        &attrs([192, 0, 2, 1]),
        Some(Duration::from_secs(600)),
    )
    .await
    .expect("create");
    let mut rx = s.watch_leases().await.expect("watch");
    assert!(matches!(next(&mut rx).await, LeaseEvent::Snapshot(l) if keys(&l) == vec![subnet(1)]));

    // A lease written by hand, exactly as flanneld writes it.
    etcdctl(
        &etcd,
        &[
            "put",
            &format!("{PREFIX}/subnets/10.244.1.0-24"),
            FLANNEL_JSON,
        ],
    )
    .await;
    let ev = next(&mut rx).await;
    let LeaseEvent::Added(l) = ev else {
        panic!("expected Added, got {ev:?}")
    };
    assert_eq!(l.key().to_string(), "10.244.1.0-24");
    assert_eq!(l.attrs.public_ip, Ipv4Addr::new(192, 168, 64, 3));
    assert_eq!(l.attrs.backend_type, "vxlan");
    assert_eq!(l.attrs.to_json(), FLANNEL_JSON);
    assert_eq!(l.expiration, None, "put by hand without a lease");

    // Malformed entries are skipped by the watch and by listings.
    etcdctl(
        &etcd,
        &["put", &format!("{PREFIX}/subnets/garbage"), FLANNEL_JSON],
    )
    .await;
    etcdctl(
        &etcd,
        &[
            "put",
            &format!("{PREFIX}/subnets/10.244.9.0-24"),
            "{not json",
        ],
    )
    .await;
    etcdctl(
        &etcd,
        &[
            "put",
            &format!("{PREFIX}/subnets/10.244.8.0-24"),
            r#"{"PublicIP":"300.1.1.1"}"#,
        ],
    )
    .await;
    s.create_lease(&subnet(2), &attrs([192, 0, 2, 2]), None)
        .await
        .expect("create after garbage");
    let ev = next(&mut rx).await;
    assert!(
        matches!(&ev, LeaseEvent::Added(l) if l.key() == subnet(2)),
        "bad entries skipped: {ev:?}"
    );
    let mut listed = keys(&s.list_leases().await.expect("list"));
    listed.sort();
    let mut want = vec![subnet(1), subnet(2), "10.244.1.0-24".parse().expect("key")];
    want.sort();
    assert_eq!(listed, want);

    // Deleting a key by hand is a Removed event.
    etcdctl(&etcd, &["del", &format!("{PREFIX}/subnets/{}", subnet(1))]).await;
    let ev = next(&mut rx).await;
    assert!(
        matches!(&ev, LeaseEvent::Removed(l) if l.key() == subnet(1)),
        "{ev:?}"
    );
    // Deleting a bad key makes no event; the next good change still arrives.
    etcdctl(&etcd, &["del", &format!("{PREFIX}/subnets/garbage")]).await;
    s.delete_lease(&subnet(2)).await.expect("delete");
    let ev = next(&mut rx).await;
    assert!(
        matches!(&ev, LeaseEvent::Removed(l) if l.key() == subnet(2)),
        "{ev:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_resyncs_after_etcd_restart() {
    require_etcd!();
    let mut etcd = Etcd::start();
    let s = connect(&etcd).await;
    s.create_lease(&subnet(1), &attrs([192, 0, 2, 1]), None)
        .await
        .expect("create");
    let mut rx = s.watch_leases().await.expect("watch");
    assert!(matches!(next(&mut rx).await, LeaseEvent::Snapshot(l) if l.len() == 1));

    tokio::task::block_in_place(|| etcd.stop());
    let down = s.list_leases().await.expect_err("etcd is down");
    assert!(down.is_retryable(), "a stopped etcd is retryable: {down}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    tokio::task::block_in_place(|| etcd.start_again());

    // A change made while the watch was away shows up in the new snapshot.
    let writer = connect(&etcd).await;
    writer
        .create_lease(&subnet(2), &attrs([192, 0, 2, 2]), None)
        .await
        .expect("create while resyncing");
    let snap = wait_for(&mut rx, "a new snapshot", |ev| {
        matches!(ev, LeaseEvent::Snapshot(_))
    })
    .await;
    let LeaseEvent::Snapshot(l) = snap else {
        unreachable!()
    };
    // The snapshot may have been taken before or after the write.
    assert!(keys(&l).contains(&subnet(1)), "{l:?}");
    s.create_lease(&subnet(3), &attrs([192, 0, 2, 3]), None)
        .await
        .expect("create after restart");
    wait_for(
        &mut rx,
        "lease 3 after the restart",
        |ev| matches!(ev, LeaseEvent::Added(l) if l.key() == subnet(3)),
    )
    .await;
    let all = keys(&s.list_leases().await.expect("list"));
    assert_eq!(all, vec![subnet(1), subnet(2), subnet(3)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compacted_history_becomes_a_snapshot() {
    require_etcd!();
    let etcd = Etcd::start();
    let s = connect(&etcd).await;
    let start = s.revision().await.expect("revision");
    for i in 1..=3 {
        s.create_lease(&subnet(i), &attrs([192, 0, 2, 1]), None)
            .await
            .expect("create");
    }
    s.delete_lease(&subnet(2)).await.expect("delete");
    // Resuming from a cursor replays history...
    let mut rx = s.watch_leases_since(start);
    for want in [1, 2, 3] {
        let ev = next(&mut rx).await;
        assert!(
            matches!(&ev, LeaseEvent::Added(l) if l.key() == subnet(want)),
            "{ev:?}"
        );
    }
    assert!(matches!(next(&mut rx).await, LeaseEvent::Removed(l) if l.key() == subnet(2)));
    drop(rx);
    // ...until that history is compacted: then the watch re-lists.
    let now = s.revision().await.expect("revision");
    etcdctl(&etcd, &["compact", &now.to_string()]).await;
    let mut rx = s.watch_leases_since(start);
    let ev = next(&mut rx).await;
    assert!(
        matches!(&ev, LeaseEvent::Snapshot(l) if keys(l) == vec![subnet(1), subnet(3)]),
        "{ev:?}"
    );
    s.create_lease(&subnet(4), &attrs([192, 0, 2, 4]), None)
        .await
        .expect("create");
    let ev = next(&mut rx).await;
    assert!(
        matches!(&ev, LeaseEvent::Added(l) if l.key() == subnet(4)),
        "{ev:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_etcd_is_retryable_and_auth_works() {
    require_etcd!();
    // Nothing listens on a port that was just free.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .expect("bind")
        .local_addr()
        .expect("addr")
        .port();
    let opts = EtcdOptions {
        endpoints: format!("http://127.0.0.1:{port}"),
        ..EtcdOptions::default()
    };
    let err = match EtcdStore::connect(&opts).await {
        Ok(s) => s.get_network_config().await.expect_err("nothing listens"),
        Err(e) => e,
    };
    assert!(err.is_retryable(), "{err}");

    let etcd = Etcd::start();
    etcdctl(&etcd, &["user", "add", "root:s3cret"]).await;
    etcdctl(&etcd, &["auth", "enable"]).await;
    let with = EtcdOptions {
        endpoints: etcd.endpoint(),
        username: "root".into(),
        password: "s3cret".into(),
        ..EtcdOptions::default()
    };
    let s = EtcdStore::connect(&with).await.expect("connect with auth");
    s.create_lease(
        &subnet(1),
        &attrs([192, 0, 2, 1]),
        Some(Duration::from_secs(60)),
    )
    .await
    .expect("create");
    assert_eq!(keys(&s.list_leases().await.expect("list")), vec![subnet(1)]);
    let anon = connect(&etcd).await;
    let err = anon.list_leases().await.expect_err("auth required");
    assert!(
        !err.is_retryable(),
        "a permission error is not retryable: {err}"
    );
    let bad = EtcdOptions {
        password: "wrong".into(),
        ..with
    };
    let err = EtcdStore::connect(&bad).await.expect_err("bad password");
    assert!(!err.is_retryable(), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_client_certificates() {
    require_etcd!();
    require_tool!("openssl", "openssl", "openssl");
    let etcd = tokio::task::block_in_place(Etcd::start_tls);
    let t = etcd.tls().expect("tls files").clone();
    let path = |p: &std::path::Path| p.display().to_string();
    let opts = EtcdOptions {
        endpoints: etcd.endpoint(),
        keyfile: path(&t.client_key),
        certfile: path(&t.client_cert),
        cafile: path(&t.ca),
        ..EtcdOptions::default()
    };
    let s = EtcdStore::connect(&opts).await.expect("connect over TLS");
    let mut rx = s.watch_leases().await.expect("watch");
    assert_eq!(next(&mut rx).await, LeaseEvent::Snapshot(vec![]));
    s.create_lease(
        &subnet(1),
        &attrs([192, 0, 2, 1]),
        Some(Duration::from_secs(60)),
    )
    .await
    .expect("create");
    assert!(matches!(next(&mut rx).await, LeaseEvent::Added(l) if l.key() == subnet(1)));
    // flanneld users often keep `http://` in the endpoint list while giving
    // certificates: the certificates decide, as in flannel.
    let http = EtcdOptions {
        endpoints: format!("http://127.0.0.1:{}", etcd.port()),
        ..opts.clone()
    };
    let s2 = EtcdStore::connect(&http).await.expect("connect");
    assert_eq!(
        keys(&s2.list_leases().await.expect("list over TLS")),
        vec![subnet(1)]
    );
    // Without a client certificate the server refuses.
    let no_cert = EtcdOptions {
        keyfile: String::new(),
        certfile: String::new(),
        ..opts.clone()
    };
    let refused = match EtcdStore::connect(&no_cert).await {
        Ok(s) => s.list_leases().await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "a client without a certificate must be refused");
    // A missing key file is a configuration error, not a retry.
    let missing = EtcdOptions {
        keyfile: "/nonexistent/weft.key".into(),
        ..opts
    };
    let err = EtcdStore::connect(&missing)
        .await
        .expect_err("missing key file");
    assert!(
        !err.is_retryable() && err.to_string().contains("/nonexistent/weft.key"),
        "{err}"
    );
}
