//! A lease renewal whose reply is lost must not delete the lease it renewed.
//!
//! A TCP proxy between the store and a real etcd forwards the renewal's
//! transaction, which etcd commits, and swallows every reply after it, so the
//! store's request times out. The renewal put the key with its newly granted
//! etcd lease; revoking that lease after the failure (what `put_lease` did
//! before the fix) deleted the node's own subnet key, and weftd shut down
//! ("Lease has been revoked"). The test checks, reading etcd directly, that
//! the key is still there after the failed renewal, and that renewal works
//! again over a new connection. (Cutting the connection instead of silencing
//! it does not show the bug: the old code's revoke then failed as well.)

use std::net::{Ipv4Addr, TcpListener};
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;
use weft_control::lease::{LeaseAttrs, SubnetKey};
use weft_control::store::Registry;
use weft_control::store::etcd::{EtcdOptions, EtcdStore};
use weft_tests::etcd::Etcd;
use weft_tests::proxy::TcpProxy;
use weft_tests::require_etcd;

/// Well above the store's 10 s request timeout.
const WAIT: Duration = Duration::from_secs(30);
const TTL: Option<Duration> = Some(Duration::from_secs(600));

fn attrs(last: u8) -> LeaseAttrs {
    LeaseAttrs {
        public_ip: Ipv4Addr::new(192, 0, 2, last),
        backend_type: "vxlan".into(),
        backend_data: Some(r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#.into()),
        ..Default::default()
    }
}

/// The etcd lease `key` is attached to, read from etcd itself.
async fn lease_of(etcd: &mut Client, key: &str) -> Option<i64> {
    let r = etcd.get(key, None).await.expect("read etcd directly");
    r.kvs().first().map(|kv| kv.lease())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewal_whose_reply_is_lost_keeps_the_lease() {
    require_etcd!();
    let etcd = Etcd::start();
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
    let proxy = TcpProxy::start(listener, etcd.port());
    let opts = EtcdOptions {
        endpoints: format!("http://127.0.0.1:{}", proxy.port()),
        ..EtcdOptions::default()
    };
    let store = EtcdStore::connect(&opts)
        .await
        .expect("connect via the proxy");
    let mut direct = Client::connect([etcd.endpoint()], None)
        .await
        .expect("connect to etcd");
    let key: SubnetKey = "10.244.1.0-24".parse().expect("key");
    let raw_key = store.lease_key(&key);
    store
        .create_lease(&key, &attrs(1), TTL)
        .await
        .expect("create");
    let created = lease_of(&mut direct, &raw_key).await.expect("created");

    // Only the renewal's transaction carries the key: the lease grant before
    // it is answered, the transaction is not.
    proxy.swallow_replies_after(raw_key.as_bytes());
    let renewal = tokio::spawn({
        let store = store.clone();
        async move { store.update_lease(&key, &attrs(2), TTL).await }
    });
    let deadline = Instant::now() + WAIT;
    let landed = loop {
        match lease_of(&mut direct, &raw_key).await {
            Some(l) if l != created => break l,
            _ => {}
        }
        assert!(Instant::now() < deadline, "the renewal never reached etcd");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let err = tokio::time::timeout(WAIT, renewal)
        .await
        .expect("the renewal hangs")
        .expect("renewal task")
        .expect_err("the renewal's reply was lost");
    assert!(
        err.is_retryable() && err.to_string().contains("timed out"),
        "{err}"
    );
    assert_eq!(
        lease_of(&mut direct, &raw_key).await,
        Some(landed),
        "the failed renewal's put landed and must stay (revoking its etcd \
         lease deletes the node's subnet key)"
    );

    // Over a new connection the next renewal (retried as weftd does) works.
    proxy.cut();
    let deadline = Instant::now() + WAIT;
    let expiration = loop {
        match store.update_lease(&key, &attrs(3), TTL).await {
            Ok(exp) => break exp,
            Err(e) if e.is_retryable() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("renewal after reconnecting: {e}"),
        }
    };
    assert!(expiration.is_some(), "a renewal with a TTL expires");
    let renewed = lease_of(&mut direct, &raw_key).await;
    assert!(renewed.is_some_and(|l| l != landed), "{renewed:?}");
    let got = store.get_lease(&key).await.expect("get").expect("present");
    assert_eq!(got.attrs, attrs(3));
}
