//! The etcd v3 lease store, interoperable with flanneld (pkg/subnet/etcd).
//!
//! Keys and values are flannel's exactly (spec §6.1):
//! - `<prefix>/config`: the network config text;
//! - `<prefix>/subnets/<SubnetKey>`: [`LeaseAttrs::to_json`], attached to an
//!   etcd lease of the requested TTL (none for a reservation).
//!
//! Contracts:
//! - `create_lease` grants an etcd lease and runs the transaction
//!   `If(Version(key) == 0).Then(Put(key, value, lease))`. When the key exists
//!   the granted lease is revoked and the call returns
//!   [`StoreError::AlreadyExists`] (flannel compares the wrong error here and
//!   fails hard; we report the race so the allocator retries).
//! - `update_lease` is a plain Put with a fresh lease (the old one is left to
//!   expire, as flannel does); `ttl: None` stores a reservation (no lease).
//! - Expirations are computed locally as now + the lease's remaining TTL.
//! - Unreachable etcd, timeouts and "no leader" are
//!   [`StoreError::Unavailable`] (retryable); bad TLS files, auth failures and
//!   other refusals are [`StoreError::Other`].
//! - Malformed keys or values are logged with `warn!` and skipped.
//! - The watch ([`watch`]) never ends while its receiver lives.

mod watch;

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, SystemTime};

use etcd_client::{
    Certificate, Client, Compare, CompareOp, ConnectOptions, GetOptions, Identity, KeyValue,
    PutOptions, TlsOptions, Txn, TxnOp,
};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::mpsc;
use tracing::warn;

use super::{Registry, StoreError};
use crate::lease::{Lease, LeaseAttrs, LeaseEvent, SubnetKey};

/// flanneld's default `--etcd-endpoints`.
pub const DEFAULT_ENDPOINTS: &str = "http://127.0.0.1:4001,http://127.0.0.1:2379";
/// flanneld's default `--etcd-prefix`.
pub const DEFAULT_PREFIX: &str = "/coreos.com/network";

/// Time limit for one unary request (a lost connection must not hang a caller).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How many TTL look-ups a listing runs at once.
const TTL_CONCURRENCY: usize = 16;

/// flanneld's etcd options (`--etcd-*` flags); empty strings mean unset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdOptions {
    /// Comma-separated endpoints: `http://host:port`, `https://host:port` or
    /// bare `host:port`.
    pub endpoints: String,
    /// Key prefix (`--etcd-prefix`).
    pub prefix: String,
    /// Client private key (PEM). TLS is used only with both key and cert.
    pub keyfile: String,
    /// Client certificate (PEM).
    pub certfile: String,
    /// CA bundle (PEM) to verify the server.
    pub cafile: String,
    /// Basic-auth user name (auth is used when non-empty).
    pub username: String,
    /// Basic-auth password (never printed).
    pub password: crate::secret::Secret,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            endpoints: DEFAULT_ENDPOINTS.to_string(),
            prefix: DEFAULT_PREFIX.to_string(),
            keyfile: String::new(),
            certfile: String::new(),
            cafile: String::new(),
            username: String::new(),
            password: Default::default(),
        }
    }
}

/// A connection to etcd holding flannel's keys. Cheap to clone.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    prefix: String,
}

impl std::fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

fn read_file(what: &str, path: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| StoreError::Other(format!("reading etcd {what} {path}: {e}")))
}

/// Builds the TLS settings: client identity only with both key and cert
/// (flannel's rule); a CA alone still lets `https://` endpoints verify.
fn tls_options(o: &EtcdOptions) -> Result<Option<TlsOptions>, StoreError> {
    let mut tls = TlsOptions::new();
    let identity = !o.keyfile.is_empty() && !o.certfile.is_empty();
    if identity {
        tls = tls.identity(Identity::from_pem(
            read_file("certfile", &o.certfile)?,
            read_file("keyfile", &o.keyfile)?,
        ));
    } else {
        warn!("no certificate provided: connecting to etcd with http. This is insecure");
    }
    let https = o
        .endpoints
        .split(',')
        .any(|e| e.trim().starts_with("https://"));
    if !o.cafile.is_empty() && (identity || https) {
        tls = tls.ca_certificate(Certificate::from_pem(read_file("cafile", &o.cafile)?));
    } else if !identity && !https {
        return Ok(None);
    }
    Ok(Some(tls))
}

/// Maps a client error: connection trouble is retryable, the rest is not.
fn map_err(what: &str, e: etcd_client::Error) -> StoreError {
    use etcd_client::Error as E;
    // gRPC status codes (tonic::Code discriminants): Cancelled, Unknown,
    // DeadlineExceeded, ResourceExhausted, Aborted, Unavailable.
    const RETRYABLE_CODES: [i32; 6] = [1, 2, 4, 8, 10, 14];
    let retryable = match &e {
        E::TransportError(_) | E::IoError(_) => true,
        E::GRpcStatus(s) => RETRYABLE_CODES.contains(&(s.code() as i32)),
        _ => false,
    };
    let msg = format!("etcd {what}: {e}");
    if retryable {
        StoreError::Unavailable(msg)
    } else {
        StoreError::Other(msg)
    }
}

/// An endpoint is `http://host:port`, `https://host:port` or `host:port`
/// (what etcd's client dials); anything else would be retried forever as
/// "unavailable", so it is refused at once.
fn check_endpoint(e: &str) -> Result<(), String> {
    let bad = |why: &str| {
        Err(format!(
            "invalid etcd endpoint {e:?}: {why} (expected http://host:port, https://host:port or host:port)"
        ))
    };
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .unwrap_or(e);
    if rest.contains("://") {
        return bad("unknown scheme");
    }
    let rest = rest.trim_end_matches('/');
    let Some((host, port)) = rest.rsplit_once(':') else {
        return bad("no port");
    };
    if host.is_empty() || host.contains('/') {
        return bad("no host");
    }
    match port.parse::<u16>() {
        Ok(p) if p > 0 => Ok(()),
        _ => bad("the port is not a number from 1 to 65535"),
    }
}

/// Whether etcd refused a login because it has no authentication on
/// (`etcdserver: authentication is not enabled`).
fn auth_not_enabled(e: &StoreError) -> bool {
    e.to_string().contains("authentication is not enabled")
}

/// Runs one request with [`REQUEST_TIMEOUT`].
async fn call<T>(
    what: &str,
    fut: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(REQUEST_TIMEOUT, fut).await {
        Ok(r) => r.map_err(|e| map_err(what, e)),
        Err(_) => Err(StoreError::Unavailable(format!(
            "etcd {what}: timed out after {REQUEST_TIMEOUT:?}"
        ))),
    }
}

impl EtcdStore {
    /// Connects to etcd. The connection itself is made lazily, so an etcd that
    /// is down shows up as [`StoreError::Unavailable`] on the first request
    /// (or here, when basic auth needs a token). Bad TLS files fail here with
    /// [`StoreError::Other`].
    pub async fn connect(opts: &EtcdOptions) -> Result<EtcdStore, StoreError> {
        for e in opts
            .endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
        {
            check_endpoint(e).map_err(StoreError::Other)?;
        }
        let tls = tls_options(opts)?;
        let endpoints: Vec<String> = opts
            .endpoints
            .split(',')
            .map(str::trim)
            .filter(|e| !e.is_empty())
            .map(|e| match &tls {
                // etcd-client refuses TLS settings with `http://` URLs; with TLS
                // on, every endpoint is spoken to over https like flannel does.
                Some(_) => e
                    .trim_start_matches("http://")
                    .trim_start_matches("https://")
                    .to_string(),
                None => e.to_string(),
            })
            .collect();
        if endpoints.is_empty() {
            return Err(StoreError::Other("no etcd endpoints given".to_string()));
        }
        let mut co = ConnectOptions::new()
            .with_require_leader(true)
            .with_connect_timeout(Duration::from_secs(5))
            .with_keep_alive(Duration::from_secs(10), Duration::from_secs(5));
        if let Some(tls) = tls {
            co = co.with_tls(tls);
        }
        let anonymous = co.clone();
        if !opts.username.is_empty() {
            co = co.with_user(opts.username.clone(), opts.password.expose().to_string());
        }
        let client = match call("connect", Client::connect(&endpoints, Some(co))).await {
            // flanneld (etcd's clientv3) goes on without a token when the
            // server has auth off; so does weft, and says so.
            Err(e) if !opts.username.is_empty() && auth_not_enabled(&e) => {
                warn!(
                    "etcd has authentication disabled: connecting without --etcd-username/--etcd-password \
                     (remove them, or enable auth in etcd: `etcdctl auth enable`)"
                );
                call("connect", Client::connect(&endpoints, Some(anonymous))).await?
            }
            r => r?,
        };
        Ok(EtcdStore {
            client,
            prefix: opts.prefix.trim_end_matches('/').to_string(),
        })
    }

    /// The key prefix (without a trailing slash).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The underlying client (for tests and tools that write raw keys).
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// `<prefix>/config`.
    pub fn config_key(&self) -> String {
        format!("{}/config", self.prefix)
    }

    /// `<prefix>/subnets/` (with the trailing slash).
    pub fn subnets_prefix(&self) -> String {
        format!("{}/subnets/", self.prefix)
    }

    /// `<prefix>/subnets/<key>`.
    pub fn lease_key(&self, key: &SubnetKey) -> String {
        format!("{}/subnets/{key}", self.prefix)
    }

    /// The current etcd revision (a cursor for [`EtcdStore::watch_leases_since`]).
    pub async fn revision(&self) -> Result<i64, StoreError> {
        let mut c = self.client.clone();
        let r = call(
            "get",
            c.get(self.config_key(), Some(GetOptions::new().with_count_only())),
        )
        .await?;
        Ok(r.header().map_or(0, |h| h.revision()))
    }

    /// Like [`Registry::watch_leases`], but resumes after etcd revision
    /// `revision` (flannel's watch cursor): the changes made after it come
    /// first, with no snapshot. If that history was compacted away, the watch
    /// re-lists and sends a [`LeaseEvent::Snapshot`] instead.
    pub fn watch_leases_since(&self, revision: i64) -> mpsc::Receiver<LeaseEvent> {
        watch::start(self.clone(), Some(revision))
    }

    /// Grants an etcd lease of `ttl` (rounded up to whole seconds, at least 1)
    /// and returns its id and expiration.
    async fn grant(&self, ttl: Duration) -> Result<(i64, SystemTime), StoreError> {
        let secs = i64::try_from(ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0))
            .unwrap_or(i64::MAX)
            .max(1);
        let mut c = self.client.clone();
        let r = call("lease grant", c.lease_grant(secs, None)).await?;
        let granted = u64::try_from(r.ttl()).unwrap_or(0);
        Ok((r.id(), SystemTime::now() + Duration::from_secs(granted)))
    }

    async fn revoke(&self, id: i64) {
        let mut c = self.client.clone();
        if let Err(e) = call("lease revoke", c.lease_revoke(id)).await {
            warn!("could not revoke etcd lease {id:x}: {e} (it will expire)");
        }
    }

    /// The expiration of etcd lease `id` (`None` for 0, no lease).
    async fn expiration(&self, id: i64) -> Result<Option<SystemTime>, StoreError> {
        if id == 0 {
            return Ok(None);
        }
        let mut c = self.client.clone();
        let r = call("lease time-to-live", c.lease_time_to_live(id, None)).await?;
        Ok(Some(
            SystemTime::now() + Duration::from_secs(u64::try_from(r.ttl()).unwrap_or(0)),
        ))
    }

    /// Decodes one stored lease; `None` (logged) when key or value is bad.
    fn decode(&self, kv: &KeyValue, expiration: Option<SystemTime>) -> Option<Lease> {
        let key = self.parse_key(kv.key())?;
        match LeaseAttrs::from_json(kv.value()) {
            Ok(attrs) => Some(Lease {
                subnet: key.v4,
                ipv6_subnet: key.v6,
                attrs,
                expiration,
            }),
            Err(e) => {
                warn!(key = %String::from_utf8_lossy(kv.key()), "skipping lease with a bad value: {e}");
                None
            }
        }
    }

    /// The subnet key of a raw etcd key under `<prefix>/subnets/`.
    fn parse_key(&self, raw: &[u8]) -> Option<SubnetKey> {
        let full = String::from_utf8_lossy(raw);
        let parsed = full
            .strip_prefix(&self.subnets_prefix())
            .ok_or_else(|| "not under the subnets prefix".to_string())
            .and_then(|k| k.parse::<SubnetKey>().map_err(|e| e.to_string()));
        match parsed {
            Ok(k) => Some(k),
            Err(e) => {
                warn!(key = %full, "skipping lease with a bad key: {e}");
                None
            }
        }
    }

    /// Every lease plus the revision the listing was read at; with `ttls`
    /// false, without expirations (no TimeToLive RPCs, see
    /// [`Registry::list_subnets`]).
    async fn list_at(&self, ttls: bool) -> Result<(Vec<Lease>, i64), StoreError> {
        let mut c = self.client.clone();
        let mut r = call(
            "get subnets",
            c.get(self.subnets_prefix(), Some(GetOptions::new().with_prefix())),
        )
        .await?;
        let revision = r.header().map_or(0, |h| h.revision());
        let kvs = r.take_kvs();
        let mut ids: Vec<i64> = kvs
            .iter()
            .map(KeyValue::lease)
            .filter(|&id| ttls && id != 0)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        let ttls: HashMap<i64, Option<SystemTime>> = futures::stream::iter(ids)
            .map(|id| async move { self.expiration(id).await.map(|e| (id, e)) })
            .buffer_unordered(TTL_CONCURRENCY)
            .try_collect()
            .await?;
        let leases = kvs
            .iter()
            .filter_map(|kv| self.decode(kv, ttls.get(&kv.lease()).copied().flatten()))
            .collect();
        Ok((leases, revision))
    }

    async fn put_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
        only_if_absent: bool,
    ) -> Result<Option<SystemTime>, StoreError> {
        let k = self.lease_key(key);
        let granted = match ttl {
            Some(t) => Some(self.grant(t).await?),
            None => None,
        };
        let opts = granted.map(|(id, _)| PutOptions::new().with_lease(id));
        let put = TxnOp::put(k.clone(), attrs.to_json(), opts);
        let txn = if only_if_absent {
            Txn::new()
                .when([Compare::version(k, CompareOp::Equal, 0)])
                .and_then([put])
        } else {
            Txn::new().and_then([put])
        };
        let mut c = self.client.clone();
        let what = if only_if_absent {
            "create subnet"
        } else {
            "update subnet"
        };
        let outcome = match call(what, c.txn(txn)).await {
            Ok(r) if r.succeeded() => return Ok(granted.map(|(_, exp)| exp)),
            Ok(_) => Err(StoreError::AlreadyExists),
            Err(e) => Err(e),
        };
        // Revoking the new etcd lease deletes every key attached to it. A
        // failed create is undone that way (it may have landed before a
        // timeout; the caller retries). An update has no compare, so its
        // only failures are timeouts and lost connections, after which the
        // put may have landed: revoking would then delete the node's own
        // lease and shut the daemon down. Its unused lease expires instead.
        if let Some((id, _)) = granted
            && only_if_absent
        {
            self.revoke(id).await;
        }
        outcome
    }
}

impl Registry for EtcdStore {
    async fn get_network_config(&self) -> Result<Option<String>, StoreError> {
        let mut c = self.client.clone();
        let r = call("get config", c.get(self.config_key(), None)).await?;
        Ok(r.kvs()
            .first()
            .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()))
    }

    async fn put_network_config(&self, text: &str) -> Result<(), StoreError> {
        let mut c = self.client.clone();
        call("put config", c.put(self.config_key(), text, None))
            .await
            .map(|_| ())
    }

    async fn list_leases(&self) -> Result<Vec<Lease>, StoreError> {
        self.list_at(true).await.map(|(l, _)| l)
    }

    async fn list_subnets(&self) -> Result<Vec<Lease>, StoreError> {
        self.list_at(false).await.map(|(l, _)| l)
    }

    async fn get_lease(&self, key: &SubnetKey) -> Result<Option<Lease>, StoreError> {
        let mut c = self.client.clone();
        let r = call("get subnet", c.get(self.lease_key(key), None)).await?;
        let Some(kv) = r.kvs().first() else {
            return Ok(None);
        };
        let exp = self.expiration(kv.lease()).await?;
        Ok(self.decode(kv, exp))
    }

    async fn create_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.put_lease(key, attrs, ttl, true).await
    }

    async fn update_lease(
        &self,
        key: &SubnetKey,
        attrs: &LeaseAttrs,
        ttl: Option<Duration>,
    ) -> Result<Option<SystemTime>, StoreError> {
        self.put_lease(key, attrs, ttl, false).await
    }

    async fn delete_lease(&self, key: &SubnetKey) -> Result<(), StoreError> {
        let mut c = self.client.clone();
        call("delete subnet", c.delete(self.lease_key(key), None))
            .await
            .map(|_| ())
    }

    async fn watch_leases(&self) -> Result<mpsc::Receiver<LeaseEvent>, StoreError> {
        Ok(watch::start(self.clone(), None))
    }
}

#[cfg(test)]
mod endpoint_tests {
    use super::check_endpoint;

    #[test]
    fn endpoints_that_can_never_connect_are_refused() {
        for ok in [
            "http://127.0.0.1:2379",
            "https://etcd.example:2379/",
            "10.0.0.1:4001",
            "http://[fd00::1]:2379",
        ] {
            assert_eq!(check_endpoint(ok), Ok(()), "{ok}");
        }
        for (bad, why) in [
            ("garbage", "no port"),
            ("http://127.0.0.1", "no port"),
            ("unix:///run/etcd.sock", "unknown scheme"),
            ("http://:2379", "no host"),
            ("127.0.0.1:99999", "not a number"),
            ("127.0.0.1:0", "not a number"),
        ] {
            let e = check_endpoint(bad).expect_err(bad);
            assert!(e.contains(why) && e.contains(bad), "{bad}: {e}");
        }
    }
}
