//! `weft leases [put KEY VALUE | rm KEY]`: the leases of one store.
//!
//! Which store (one way to name it, in any position after `leases`):
//! `--store-path DIR` (the embedded store), `--etcd-endpoints URLS` with
//! weftd's other `--etcd-*` options, or nothing: then the weftd of
//! `--subnet-file` (default `/run/flannel/subnet.env`) is asked which store
//! it uses, over its status socket. With no store named and no weftd
//! answering, the command is refused: it never guesses a store, and it never
//! creates one (an embedded store must already hold its data file).
//!
//! `put` checks its input before it writes: the key is aligned and lies in
//! the network config's network with its `SubnetLen` (see
//! [`crate::subnet::manual`]), the value is flannel's `LeaseAttrs` with a
//! public IP, no other lease overlaps it, and a lease another node holds is
//! replaced only with `--overwrite`. `rm` of a missing lease fails. Every
//! change says what it changed.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use clap::{Args, Subcommand};

use super::{CliError, DEFAULT_SUBNET_FILE, print, print_json, status_socket};
use crate::config::Config;
use crate::lease::{Lease, LeaseAttrs, SubnetKey};
use crate::store::embedded::EmbeddedStore;
use crate::store::etcd::{EtcdOptions, EtcdStore};
use crate::store::{Registry, StoreError, StoreInfo};

/// Where weftd reads net-conf.json unless told otherwise (flannel's path).
const DEFAULT_NET_CONFIG: &str = "/etc/kube-flannel/net-conf.json";

/// `weft leases`.
#[derive(Debug, Args)]
pub struct LeasesArgs {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    store: StoreArgs,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Write a lease by hand: KEY (e.g. 10.244.3.0-24) and flannel's LeaseAttrs JSON.
    Put {
        /// The subnet key.
        key: SubnetKey,
        /// The value, e.g. {"PublicIP":"192.0.2.9","PublicIPv6":null}.
        value: String,
        /// Lease TTL in seconds (0: a reservation that never expires).
        #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(0..=315_360_000))]
        ttl: u64,
        /// Replace a lease another node (another PublicIP) holds.
        #[arg(long)]
        overwrite: bool,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Delete the lease with this key (e.g. 10.244.3.0-24); its node's
    /// weftd exits, as flanneld does, and takes a lease again when restarted.
    Rm {
        /// The subnet key.
        key: SubnetKey,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// The store options (weftd's names), accepted before and after the
/// subcommand; [`StoreArgs::merge`] refuses one given twice and
/// [`StoreArgs::check`] the combinations that name two stores.
#[derive(Debug, Clone, Default, Args)]
struct StoreArgs {
    /// The embedded store's directory (weftd's --store-path).
    #[arg(long, value_name = "DIR")]
    store_path: Option<PathBuf>,
    /// etcd at these endpoints (weftd's --etcd-endpoints).
    #[arg(long, value_name = "URLS")]
    etcd_endpoints: Option<String>,
    /// The etcd key prefix (default /coreos.com/network).
    #[arg(long, value_name = "PREFIX")]
    etcd_prefix: Option<String>,
    /// etcd client key (TLS, with --etcd-certfile).
    #[arg(long, value_name = "FILE")]
    etcd_keyfile: Option<String>,
    /// etcd client certificate (TLS, with --etcd-keyfile).
    #[arg(long, value_name = "FILE")]
    etcd_certfile: Option<String>,
    /// etcd CA bundle.
    #[arg(long, value_name = "FILE")]
    etcd_cafile: Option<String>,
    /// etcd user name.
    #[arg(long, value_name = "USER")]
    etcd_username: Option<String>,
    /// etcd password (also for the etcd weftd names); better in the
    /// environment, as FLANNELD_ETCD_PASSWORD.
    #[arg(long, value_name = "PASSWORD", value_parser = crate::secret::Secret::parse)]
    etcd_password: Option<crate::secret::Secret>,
    /// Use the store of the weftd running with this --subnet-file (the
    /// default when no store is named: /run/flannel/subnet.env).
    #[arg(long, value_name = "FILE")]
    subnet_file: Option<PathBuf>,
    /// net-conf.json to check `put` against (embedded store; default:
    /// weftd's, else /etc/kube-flannel/net-conf.json, else the store's).
    #[arg(long, value_name = "FILE")]
    net_config_path: Option<PathBuf>,
}

impl StoreArgs {
    /// The options given before and after the subcommand: each at most once.
    fn merge(self, after: StoreArgs) -> Result<StoreArgs, CliError> {
        fn one<T>(a: Option<T>, b: Option<T>, name: &str) -> Result<Option<T>, CliError> {
            match (a, b) {
                (Some(_), Some(_)) => Err(CliError::usage(format!("--{name} is given twice"))),
                (a, b) => Ok(a.or(b)),
            }
        }
        Ok(StoreArgs {
            store_path: one(self.store_path, after.store_path, "store-path")?,
            etcd_endpoints: one(self.etcd_endpoints, after.etcd_endpoints, "etcd-endpoints")?,
            etcd_prefix: one(self.etcd_prefix, after.etcd_prefix, "etcd-prefix")?,
            etcd_keyfile: one(self.etcd_keyfile, after.etcd_keyfile, "etcd-keyfile")?,
            etcd_certfile: one(self.etcd_certfile, after.etcd_certfile, "etcd-certfile")?,
            etcd_cafile: one(self.etcd_cafile, after.etcd_cafile, "etcd-cafile")?,
            etcd_username: one(self.etcd_username, after.etcd_username, "etcd-username")?,
            etcd_password: one(self.etcd_password, after.etcd_password, "etcd-password")?,
            subnet_file: one(self.subnet_file, after.subnet_file, "subnet-file")?,
            net_config_path: one(
                self.net_config_path,
                after.net_config_path,
                "net-config-path",
            )?,
        })
    }

    /// Refuses options that name two stores or apply to none named.
    fn check(&self) -> Result<(), CliError> {
        let named = [
            self.store_path.as_ref().map(|_| "--store-path"),
            self.etcd_endpoints.as_ref().map(|_| "--etcd-endpoints"),
            self.subnet_file.as_ref().map(|_| "--subnet-file"),
        ];
        let named: Vec<&str> = named.into_iter().flatten().collect();
        if named.len() > 1 {
            return Err(CliError::usage(format!(
                "{} name two stores: give one (--store-path DIR, --etcd-endpoints URLS, or --subnet-file FILE for a node's weftd)",
                named.join(" and ")
            )));
        }
        let etcd_only = [
            (self.etcd_prefix.is_some(), "--etcd-prefix"),
            (self.etcd_keyfile.is_some(), "--etcd-keyfile"),
            (self.etcd_certfile.is_some(), "--etcd-certfile"),
            (self.etcd_cafile.is_some(), "--etcd-cafile"),
            (self.etcd_username.is_some(), "--etcd-username"),
        ];
        if self.etcd_endpoints.is_none()
            && let Some((_, flag)) = etcd_only.iter().find(|(given, _)| *given)
        {
            return Err(CliError::usage(format!(
                "{flag} needs --etcd-endpoints (the etcd a running weftd uses is taken whole, with its own options)"
            )));
        }
        if self.etcd_endpoints.is_some() && self.net_config_path.is_some() {
            return Err(CliError::usage(
                "--net-config-path applies to the embedded store; on etcd the network config is <prefix>/config",
            ));
        }
        Ok(())
    }
}

/// The store a command acts on.
enum Store {
    Embedded(EmbeddedStore),
    Etcd(Box<EtcdStore>),
}

/// A resolved store and how to name it in messages.
struct Target {
    store: Store,
    name: String,
    /// `--net-config-path` as given.
    net_config: Option<PathBuf>,
    /// The running weftd's `--net-config-path`.
    daemon_net_config: Option<PathBuf>,
}

/// Runs `weft leases ...`.
pub async fn run(a: LeasesArgs) -> Result<(), CliError> {
    let (store, json) = match &a.action {
        None => (a.store.clone(), a.json),
        Some(Action::Put { store, json, .. } | Action::Rm { store, json, .. }) => {
            (a.store.clone().merge(store.clone())?, a.json || *json)
        }
    };
    store.check()?;
    let t = resolve(&store).await?;
    match &t.store {
        Store::Embedded(s) => act(s, &t, &a.action, json).await,
        Store::Etcd(s) => act(s.as_ref(), &t, &a.action, json).await,
    }
}

async fn act<R: Registry>(
    reg: &R,
    t: &Target,
    action: &Option<Action>,
    json: bool,
) -> Result<(), CliError> {
    match action {
        None => list(reg, t, json).await,
        Some(Action::Rm { key, .. }) => remove(reg, t, key, json).await,
        Some(Action::Put {
            key,
            value,
            ttl,
            overwrite,
            ..
        }) => put(reg, t, key, value, *ttl, *overwrite, json).await,
    }
}

/// `--etcd-password`, else `FLANNELD_ETCD_PASSWORD` (as weftd reads it).
fn password(s: &StoreArgs) -> Option<crate::secret::Secret> {
    s.etcd_password.clone().or_else(|| {
        std::env::var("FLANNELD_ETCD_PASSWORD")
            .ok()
            .filter(|p| !p.is_empty())
            .map(crate::secret::Secret::from)
    })
}

/// The store the options name, or the running weftd's.
async fn resolve(s: &StoreArgs) -> Result<Target, CliError> {
    if let Some(dir) = &s.store_path {
        return embedded(dir.clone(), s.net_config_path.clone()).await;
    }
    if let Some(endpoints) = &s.etcd_endpoints {
        let opts = EtcdOptions {
            endpoints: endpoints.clone(),
            prefix: s
                .etcd_prefix
                .clone()
                .unwrap_or_else(|| crate::store::etcd::DEFAULT_PREFIX.into()),
            keyfile: s.etcd_keyfile.clone().unwrap_or_default(),
            certfile: s.etcd_certfile.clone().unwrap_or_default(),
            cafile: s.etcd_cafile.clone().unwrap_or_default(),
            username: s.etcd_username.clone().unwrap_or_default(),
            password: password(s).unwrap_or_default(),
        };
        return etcd(opts).await;
    }
    let named = s.subnet_file.is_some();
    let file = s
        .subnet_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SUBNET_FILE));
    let socket = status_socket(&file);
    let info = tokio::task::spawn_blocking(move || {
        crate::status::server::query_store(&socket, Duration::from_secs(5))
    })
    .await
    .map_err(|e| CliError::failed(e.to_string()))?;
    let info = match info {
        Ok(i) => i,
        Err(e) if named => {
            return Err(CliError::unreachable(format!(
                "cannot ask the weftd of --subnet-file={} which store it uses: {e}",
                file.display()
            )));
        }
        Err(e) => {
            return Err(CliError::usage(format!(
                "no store named, and no weftd answers for {} ({e}): name the store with \
                 --store-path DIR or --etcd-endpoints URLS, or the node with --subnet-file FILE",
                file.display()
            )));
        }
    };
    from_daemon(info, s, &file).await
}

/// The store a running weftd reported.
async fn from_daemon(
    i: StoreInfo,
    s: &StoreArgs,
    file: &std::path::Path,
) -> Result<Target, CliError> {
    let via = format!("the store of the weftd of {}", file.display());
    let t = match i.kind.as_str() {
        "embedded" => {
            let dir = i
                .store_path
                .ok_or_else(|| CliError::failed("weftd named no store directory"))?;
            let mut t = embedded(dir, s.net_config_path.clone()).await?;
            t.daemon_net_config = i.net_config_path;
            t
        }
        "etcd" => {
            if i.etcd_password_set && password(s).is_none() {
                return Err(CliError::usage(format!(
                    "weftd uses etcd at {} as user {}: give the password with FLANNELD_ETCD_PASSWORD \
                     (or --etcd-password)",
                    i.etcd_endpoints.as_deref().unwrap_or("?"),
                    i.etcd_username.as_deref().unwrap_or("?")
                )));
            }
            let opts = EtcdOptions {
                endpoints: i.etcd_endpoints.unwrap_or_default(),
                prefix: i
                    .etcd_prefix
                    .unwrap_or_else(|| crate::store::etcd::DEFAULT_PREFIX.into()),
                keyfile: i.etcd_keyfile.unwrap_or_default(),
                certfile: i.etcd_certfile.unwrap_or_default(),
                cafile: i.etcd_cafile.unwrap_or_default(),
                username: i.etcd_username.unwrap_or_default(),
                password: password(s).unwrap_or_default(),
            };
            etcd(opts).await?
        }
        "kube" => {
            return Err(CliError::failed(
                "this node's weftd uses the Kubernetes API (--kube-subnet-mgr): its leases are the nodes' \
                 podCIDRs and flannel annotations (`kubectl get nodes -o yaml`); weft leases works on the \
                 embedded and etcd stores",
            ));
        }
        other => {
            return Err(CliError::failed(format!(
                "weftd uses an unknown store {other:?}"
            )));
        }
    };
    eprintln!("weft: using {via}: {}", t.name);
    Ok(t)
}

async fn embedded(dir: PathBuf, net_config: Option<PathBuf>) -> Result<Target, CliError> {
    let store = EmbeddedStore::open_existing(&dir).await.map_err(|e| match e {
        StoreError::NotFound => CliError::failed(format!(
            "no embedded store in {} (no leases.db): check --store-path (weftd's --store-path); \
             weft leases never creates a store",
            dir.display()
        )),
        e => store_error(e),
    })?;
    Ok(Target {
        store: Store::Embedded(store),
        name: format!("embedded store {}", dir.display()),
        net_config,
        daemon_net_config: None,
    })
}

async fn etcd(opts: EtcdOptions) -> Result<Target, CliError> {
    let name = format!("etcd {} (prefix {})", opts.endpoints, opts.prefix);
    let store = EtcdStore::connect(&opts).await.map_err(store_error)?;
    Ok(Target {
        store: Store::Etcd(Box::new(store)),
        name,
        net_config: None,
        daemon_net_config: None,
    })
}

fn store_error(e: StoreError) -> CliError {
    match e {
        StoreError::Unavailable(_) => CliError::unreachable(e.to_string()),
        e => CliError::failed(e.to_string()),
    }
}

async fn list<R: Registry>(reg: &R, t: &Target, json: bool) -> Result<(), CliError> {
    let leases = reg.list_leases().await.map_err(store_error)?;
    if json {
        let v: Vec<serde_json::Value> = leases.iter().map(lease_json).collect();
        return print_json(&serde_json::Value::Array(v));
    }
    if leases.is_empty() {
        eprintln!("weft: no leases in {}", t.name);
    }
    print(&to_table(&leases))
}

async fn remove<R: Registry>(
    reg: &R,
    t: &Target,
    key: &SubnetKey,
    json: bool,
) -> Result<(), CliError> {
    let Some(old) = reg.get_lease(key).await.map_err(store_error)? else {
        return Err(CliError::failed(format!(
            "no lease {key} in {} (`weft leases` lists them)",
            t.name
        )));
    };
    reg.delete_lease(key).await.map_err(store_error)?;
    if json {
        return print_json(&serde_json::json!({
            "action": "deleted",
            "key": key.to_string(),
            "previous": lease_json(&old),
            "store": t.name,
        }));
    }
    print(&format!(
        "deleted lease {key} (public IP {}) from {}\n",
        public_ips(&old.attrs),
        t.name
    ))?;
    eprintln!(
        "weft: the weftd holding it (if any) exits, as flanneld does, and takes a lease again when restarted"
    );
    Ok(())
}

async fn put<R: Registry>(
    reg: &R,
    t: &Target,
    key: &SubnetKey,
    value: &str,
    ttl: u64,
    overwrite: bool,
    json: bool,
) -> Result<(), CliError> {
    let attrs = LeaseAttrs::from_json(value.as_bytes())
        .map_err(|e| CliError::usage(format!("invalid lease value: {e}")))?;
    if attrs.public_ip.is_unspecified() && attrs.public_ipv6.is_none() {
        return Err(CliError::usage(
            "invalid lease value: it names no PublicIP (or PublicIPv6): peers would have nowhere to send",
        ));
    }
    let cfg = network_config(reg, t).await?;
    crate::subnet::manual::check_key(&cfg, key)
        .map_err(|e| CliError::usage(format!("refusing {key}: {e}")))?;
    let leases = reg.list_leases().await.map_err(store_error)?;
    let old = leases.iter().find(|l| l.key() == *key);
    if let Some(clash) = leases.iter().find(|l| l.key() != *key && overlaps(l, key)) {
        return Err(CliError::failed(format!(
            "refusing {key}: it overlaps lease {} (public IP {}); remove that one first",
            clash.key(),
            public_ips(&clash.attrs)
        )));
    }
    if let Some(o) = old
        && !overwrite
        && (o.attrs.public_ip != attrs.public_ip || o.attrs.public_ipv6 != attrs.public_ipv6)
    {
        return Err(CliError::failed(format!(
            "refusing {key}: node {} holds it; --overwrite replaces its lease (the subnet's traffic then goes to the new \
             PublicIP, and that node has to be restarted to take another subnet)",
            public_ips(&o.attrs)
        )));
    }
    let ttl_d = (ttl > 0).then(|| Duration::from_secs(ttl));
    let expiration = reg
        .update_lease(key, &attrs, ttl_d)
        .await
        .map_err(store_error)?;
    let written = Lease {
        subnet: key.v4,
        ipv6_subnet: key.v6,
        attrs: attrs.clone(),
        expiration,
    };
    let action = if old.is_some() { "replaced" } else { "created" };
    if json {
        return print_json(&serde_json::json!({
            "action": action,
            "key": key.to_string(),
            "lease": lease_json(&written),
            "previous": old.map(lease_json),
            "store": t.name,
        }));
    }
    let life = match ttl_d {
        Some(d) => format!("expires in {} s", d.as_secs()),
        None => "a reservation, never expires".into(),
    };
    print(&format!(
        "{action} lease {key} (public IP {}, {life}) in {}\n",
        public_ips(&attrs),
        t.name
    ))
}

/// The network config `put` checks against: the store's, else a net-conf.json.
async fn network_config<R: Registry>(reg: &R, t: &Target) -> Result<Config, CliError> {
    let stored = reg.get_network_config().await.map_err(store_error)?;
    let (text, from) = match (&t.store, stored) {
        // weftd on the embedded store reads its file first, then the store's.
        (Store::Embedded(_), stored) => {
            if let Some(file) = &t.net_config {
                let b = std::fs::read(file).map_err(|e| {
                    CliError::usage(format!("--net-config-path={}: {e}", file.display()))
                })?;
                (b, file.display().to_string())
            } else {
                let files = [t.daemon_net_config.clone(), Some(DEFAULT_NET_CONFIG.into())];
                let found = files
                    .into_iter()
                    .flatten()
                    .find_map(|f| std::fs::read(&f).ok().map(|b| (b, f.display().to_string())));
                match (found, stored) {
                    (Some(f), _) => f,
                    (None, Some(text)) => (text.into_bytes(), format!("the config in {}", t.name)),
                    (None, None) => {
                        return Err(CliError::usage(format!(
                            "cannot check the key against the network config: {} holds none and \
                             {DEFAULT_NET_CONFIG} does not exist; give weftd's net-conf.json with \
                             --net-config-path",
                            t.name
                        )));
                    }
                }
            }
        }
        (Store::Etcd(_), Some(text)) => (text.into_bytes(), format!("the config in {}", t.name)),
        (Store::Etcd(_), None) => {
            return Err(CliError::failed(format!(
                "{} holds no network config (<prefix>/config): no weftd can run on it yet",
                t.name
            )));
        }
    };
    let mut cfg =
        crate::config::parse_config(&text).map_err(|e| CliError::failed(format!("{from}: {e}")))?;
    cfg.check_network_config()
        .map_err(|e| CliError::failed(format!("{from}: {e}")))?;
    Ok(cfg)
}

fn overlaps(l: &Lease, key: &SubnetKey) -> bool {
    let v4 = matches!((l.subnet, key.v4), (Some(a), Some(b)) if a.contains(&b.network()) || b.contains(&a.network()));
    let v6 = matches!((l.ipv6_subnet, key.v6), (Some(a), Some(b)) if a.contains(&b.network()) || b.contains(&a.network()));
    v4 || v6
}

fn public_ips(a: &LeaseAttrs) -> String {
    match a.public_ipv6 {
        Some(v6) if a.public_ip.is_unspecified() => v6.to_string(),
        Some(v6) => format!("{} {v6}", a.public_ip),
        None => a.public_ip.to_string(),
    }
}

fn lease_json(l: &Lease) -> serde_json::Value {
    serde_json::json!({
        "key": l.key().to_string(),
        "value": serde_json::from_str::<serde_json::Value>(&l.attrs.to_json()).unwrap_or_default(),
        "expiration": l.expiration
            .and_then(|e| e.duration_since(SystemTime::UNIX_EPOCH).ok())
            .map(|d| d.as_secs()),
    })
}

fn to_table(leases: &[Lease]) -> String {
    let mut out = format!(
        "{:<36} {:<16} {:<10} {}\n",
        "SUBNET", "PUBLIC IP", "BACKEND", "DATA"
    );
    for l in leases {
        let backend = if l.attrs.backend_type.is_empty() {
            "-"
        } else {
            &l.attrs.backend_type
        };
        out.push_str(&format!(
            "{:<36} {:<16} {:<10} {}\n",
            l.key().to_string(),
            public_ips(&l.attrs),
            backend,
            l.attrs.backend_data.as_deref().unwrap_or("-")
        ));
    }
    out
}
