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

use std::io::{Read, Write};
use std::net::{Ipv4Addr, Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::Duration;

use etcd_client::Client;
use tokio::time::Instant;
use weft_control::lease::{LeaseAttrs, SubnetKey};
use weft_control::store::Registry;
use weft_control::store::etcd::{EtcdOptions, EtcdStore};
use weft_tests::etcd::Etcd;
use weft_tests::require_etcd;

/// Well above the store's 10 s request timeout.
const WAIT: Duration = Duration::from_secs(30);
const TTL: Option<Duration> = Some(Duration::from_secs(600));

/// A TCP proxy on 127.0.0.1 in front of etcd. Client bytes always reach
/// etcd; once [`Proxy::swallow_replies_after`] is armed, the connection that
/// sends the needle gets nothing more back. Dropping it cuts every connection.
struct Proxy {
    port: u16,
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    needle: Mutex<Option<Vec<u8>>>,
    conns: Mutex<Vec<Conn>>,
    closed: AtomicBool,
}

/// Both sockets of one proxied connection, kept to cut it.
struct Conn {
    client: TcpStream,
    server: TcpStream,
}

impl Proxy {
    fn start(etcd_port: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().expect("proxy address").port();
        let shared = Arc::new(Shared::default());
        let s = Arc::clone(&shared);
        thread::spawn(move || {
            for client in listener.incoming() {
                if s.closed.load(Ordering::SeqCst) {
                    break;
                }
                // A refused connection shows up as a client error; the
                // assertions catch that.
                if let Ok(client) = client
                    && let Ok(server) = TcpStream::connect(("127.0.0.1", etcd_port))
                {
                    s.add(client, server).expect("clone a proxied socket");
                }
            }
        });
        Proxy { port, shared }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// From the next client bytes containing `needle` on, that connection's
    /// replies are dropped (it stays open, silent, like a stalled peer).
    fn swallow_replies_after(&self, needle: &[u8]) {
        *lock(&self.shared.needle) = Some(needle.to_vec());
    }

    /// Closes every connection (a silent one can never recover: replies went
    /// missing mid-stream); the client's next connection works both ways.
    fn cut_all(&self) {
        *lock(&self.shared.needle) = None;
        for c in lock(&self.shared.conns).drain(..) {
            let _ = c.client.shutdown(Shutdown::Both);
            let _ = c.server.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.closed.store(true, Ordering::SeqCst);
        self.cut_all();
        // Wakes the accept loop so that it sees `closed`.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

impl Shared {
    fn add(self: &Arc<Self>, client: TcpStream, server: TcpStream) -> std::io::Result<()> {
        let silent = Arc::new(AtomicBool::new(false));
        let (s, up_from, up_to, up_silent) = (
            Arc::clone(self),
            client.try_clone()?,
            server.try_clone()?,
            Arc::clone(&silent),
        );
        thread::spawn(move || s.upstream(up_from, up_to, &up_silent));
        let (down_from, down_to) = (server.try_clone()?, client.try_clone()?);
        thread::spawn(move || downstream(down_from, down_to, &silent));
        lock(&self.conns).push(Conn { client, server });
        Ok(())
    }

    /// Client to etcd: forwards everything; marks the connection silent
    /// before forwarding the bytes that complete the needle, so that no byte
    /// of their reply gets through.
    fn upstream(&self, mut from: TcpStream, mut to: TcpStream, silent: &AtomicBool) {
        let mut buf = [0; 16 * 1024];
        // The stream's last bytes, to find a needle split across reads.
        let mut tail = Vec::new();
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let mut needle = lock(&self.needle);
            if let Some(want) = needle.as_deref() {
                tail.extend_from_slice(&buf[..n]);
                let found = tail.windows(want.len()).any(|w| w == want);
                tail.drain(..tail.len().saturating_sub(want.len()));
                if found {
                    silent.store(true, Ordering::SeqCst);
                    *needle = None;
                }
            }
            drop(needle);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Write);
    }
}

/// etcd to client: forwards everything until the connection goes silent,
/// then reads and drops.
fn downstream(mut from: TcpStream, mut to: TcpStream, silent: &AtomicBool) {
    let mut buf = [0; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if !silent.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

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
    let proxy = Proxy::start(etcd.port());
    let opts = EtcdOptions {
        endpoints: proxy.endpoint(),
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
    proxy.cut_all();
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
