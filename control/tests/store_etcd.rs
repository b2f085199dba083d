//! The etcd lease store against a real etcd (Debian's etcd-server) started by
//! the `weft-tests` harness: the `Registry` contract every store meets
//! (tests/registry_contract), flannel's keys and values, the loser's etcd
//! lease revoked, hand-written and malformed entries, watches that survive
//! deletes by hand, etcd restarts and compaction, auth and TLS.

mod registry_contract;

use std::net::Ipv4Addr;
use std::time::{Duration, SystemTime};

use registry_contract::{attrs, keys, next, subnet, wait_for};
use weft_control::lease::{LeaseEvent, SubnetKey};
use weft_control::store::etcd::{EtcdOptions, EtcdStore};
use weft_control::store::{Registry, StoreError};
use weft_testenv::require_tool;
use weft_tests::etcd::Etcd;
use weft_tests::require_etcd;

const PREFIX: &str = "/coreos.com/network";
const FLANNEL_JSON: &str = r#"{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;

async fn connect(etcd: &Etcd) -> EtcdStore {
    connect_to(etcd.endpoint()).await
}

async fn connect_to(endpoints: String) -> EtcdStore {
    let opts = EtcdOptions {
        endpoints,
        ..EtcdOptions::default()
    };
    EtcdStore::connect(&opts).await.expect("connect")
}

/// etcdctl in a blocking task (it is a child process).
async fn etcdctl(etcd: &Etcd, args: &[&str]) -> String {
    tokio::task::block_in_place(|| etcd.etcdctl_ok(args))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_create_update_delete_and_config() {
    require_etcd!();
    let etcd = Etcd::start();
    registry_contract::create_update_delete_and_config(connect(&etcd).await, connect(&etcd).await)
        .await;
}

/// etcd's leases have a TTL of whole seconds: 2 s for the short one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_expiry_and_renewal() {
    require_etcd!();
    let etcd = Etcd::start();
    registry_contract::expiry_and_renewal(connect(&etcd).await, Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registry_watch_sees_another_handle() {
    require_etcd!();
    let etcd = Etcd::start();
    registry_contract::watch_sees_another_handle(connect(&etcd).await, connect(&etcd).await).await;
}

#[test]
fn registry_concurrent_creators_on_threads_never_both_win() {
    require_etcd!();
    let etcd = Etcd::start();
    let endpoints = etcd.endpoint();
    registry_contract::concurrent_creators_never_both_win(move || connect_to(endpoints.clone()));
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

    // The config key is flannel's.
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
