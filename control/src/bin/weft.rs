//! `weft`, the operator CLI.
//!
//! - `weft leases [STORE] [--json]`: lists the store's leases;
//! - `weft leases put [STORE] KEY JSON [--ttl S]`: writes one by hand;
//! - `weft leases rm [STORE] KEY`: deletes one (its node's weftd exits, as
//!   flanneld does when its lease is revoked, and is restarted by its supervisor).
//!
//! - `weft dataplane [--subnet-file F]`: shows which dataplane the node's
//!   weftd runs; `weft dataplane set auto|kernel|userspace [--subnet-file F]`
//!   switches it live (override file + SIGHUP, see
//!   `weft_control::backend::dataplane_ctl`).
//!
//! - `weft status [--subnet-file F | --socket S | --http HOST:PORT] [--json]`: what this node's
//!   weftd runs: lease, backend, dataplane and offloads, device counters and
//!   every peer (read from weftd's root-only status socket, see
//!   `weft_control::status`).
//!
//! STORE is `--store-path DIR` (the embedded store, the default) or
//! `--etcd-endpoints URLS [--etcd-prefix P]`.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use weft_control::lease::{Lease, LeaseAttrs, SubnetKey};
use weft_control::logging::error_chain;
use weft_control::store::Registry;
use weft_control::store::embedded::EmbeddedStore;
use weft_control::store::etcd::{EtcdOptions, EtcdStore};

#[derive(Debug, Parser)]
#[command(name = "weft", about = "weft operator CLI", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build a local multi-node cluster in network namespaces, show pod
    /// traffic across nodes, and tear it down (needs root).
    Demo {
        /// Backend type: vxlan, udp, wireguard, ipip, host-gw, alloc.
        #[arg(long, default_value = "vxlan")]
        backend: String,
        /// Number of nodes.
        #[arg(long, default_value_t = 3)]
        nodes: u8,
        /// Pods per node.
        #[arg(long, default_value_t = 2)]
        pods: u8,
        /// iperf3 seconds (0 skips it).
        #[arg(long, default_value_t = 5)]
        iperf: u32,
        /// Dataplane: userspace, kernel or auto. Default: userspace (weft's
        /// engine), auto for host-gw (kernel routes only).
        #[arg(long)]
        dataplane: Option<String>,
        /// Extra weftd arguments (repeatable), e.g. --weftd-arg=--ip-masq.
        #[arg(long = "weftd-arg", allow_hyphen_values = true)]
        weftd_args: Vec<String>,
    },
    /// Show or switch (live) the dataplane of this node's weftd.
    Dataplane {
        #[command(subcommand)]
        action: Option<DataplaneAction>,
        /// weftd's --subnet-file (the control files live next to it).
        #[arg(long, global = true, default_value = "/run/flannel/subnet.env")]
        subnet_file: std::path::PathBuf,
    },
    /// Show this node's weftd: lease, backend, dataplane, counters and peers.
    Status {
        /// weftd's --subnet-file (the status socket lives next to it).
        #[arg(long, default_value = "/run/flannel/subnet.env")]
        subnet_file: std::path::PathBuf,
        /// The status socket (default: weft-status.sock next to --subnet-file).
        #[arg(long, conflicts_with = "http")]
        socket: Option<std::path::PathBuf>,
        /// Read from weftd's HTTP listener instead (`--healthz-ip:--healthz-port`, e.g. 127.0.0.1:8471).
        #[arg(long, value_name = "HOST:PORT")]
        http: Option<String>,
        /// Print JSON instead of text.
        #[arg(long)]
        json: bool,
    },
    /// List (or delete) the leases in a store.
    Leases {
        #[command(subcommand)]
        action: Option<LeaseAction>,
        #[command(flatten)]
        store: StoreArgs,
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
enum DataplaneAction {
    /// Switch to auto, kernel or userspace, keeping the lease; waits until weftd reports it.
    Set {
        /// auto, kernel or userspace.
        mode: String,
        /// Seconds to wait for weftd (a WireGuard switch to the kernel waits
        /// up to 40 s for the peers to accept the kernel's handshakes).
        #[arg(long, default_value_t = 60)]
        timeout: u64,
    },
}

#[derive(Debug, Subcommand)]
enum LeaseAction {
    /// Write a lease by hand: KEY (e.g. 10.244.3.0-24) and flannel's LeaseAttrs JSON.
    Put {
        /// The subnet key.
        key: SubnetKey,
        /// The value, e.g. {"PublicIP":"192.0.2.9","PublicIPv6":null}.
        value: String,
        /// Lease TTL in seconds (0: a reservation that never expires).
        #[arg(long, default_value_t = 86_400)]
        ttl: u64,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Delete the lease with this key (e.g. 10.244.3.0-24).
    Rm {
        /// The subnet key.
        key: SubnetKey,
        #[command(flatten)]
        store: StoreArgs,
    },
}

#[derive(Debug, Clone, Args)]
struct StoreArgs {
    /// The embedded store's directory.
    #[arg(long, default_value = weft_control::store::embedded::DEFAULT_DIR)]
    store_path: std::path::PathBuf,
    /// Use etcd at these endpoints instead of the embedded store.
    #[arg(long)]
    etcd_endpoints: Option<String>,
    /// The etcd key prefix.
    #[arg(long, default_value = "/coreos.com/network")]
    etcd_prefix: String,
}

fn main() {
    let cli = Cli::parse();
    weft_control::logging::init(0, "text");
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("weft: {e}");
            std::process::exit(1);
        }
    };
    if let Cmd::Demo {
        backend,
        nodes,
        pods,
        iperf,
        dataplane,
        weftd_args,
    } = &cli.cmd
    {
        drop(rt);
        let opts = weft_control::demo::DemoOptions {
            backend: backend.clone(),
            nodes: *nodes,
            pods: *pods,
            iperf_secs: *iperf,
            weftd_args: std::iter::once(format!(
                "--dataplane={}",
                dataplane
                    .as_deref()
                    .unwrap_or(weft_control::demo::default_dataplane(backend))
            ))
            .chain(weftd_args.iter().cloned())
            .collect(),
        };
        match weft_control::demo::run(&opts) {
            Ok(true) => std::process::exit(0),
            Ok(false) => {
                eprintln!("weft demo: some pods could not reach each other");
                std::process::exit(1);
            }
            Err(e) => {
                eprintln!("weft demo: {}", error_chain(e.as_ref()));
                std::process::exit(1);
            }
        }
    }
    let res = rt.block_on(async {
        match cli.cmd {
            Cmd::Demo { .. } => Ok(()),
            Cmd::Dataplane {
                action,
                subnet_file,
            } => dataplane(action, &subnet_file),
            Cmd::Status {
                subnet_file,
                socket,
                http,
                json,
            } => status(&subnet_file, socket, http, json),
            Cmd::Leases {
                action: None,
                store,
                json,
            } => list(&store, json).await,
            Cmd::Leases {
                action: Some(LeaseAction::Rm { key, store }),
                ..
            } => remove(&store, &key).await,
            Cmd::Leases {
                action:
                    Some(LeaseAction::Put {
                        key,
                        value,
                        ttl,
                        store,
                    }),
                ..
            } => put(&store, &key, &value, ttl).await,
        }
    });
    if let Err(e) = res {
        eprintln!("weft: {}", error_chain(e.as_ref()));
        std::process::exit(1);
    }
}

fn dataplane(action: Option<DataplaneAction>, subnet_file: &std::path::Path) -> anyhow::Result<()> {
    use weft_control::backend::dataplane_ctl::{Status, request};
    let st = match action {
        None => Status::query(subnet_file, std::time::Duration::from_secs(10))
            .with_context(|| no_daemon(subnet_file))?,
        Some(DataplaneAction::Set { mode, timeout }) => {
            let want = weft_control::backend::DataplaneChoice::parse(&mode)
                .with_context(|| format!("{mode:?}: expected auto, kernel or userspace"))?;
            request(subnet_file, want, std::time::Duration::from_secs(timeout))?
        }
    };
    println!(
        "backend {} runs in the {} (requested: {}, weftd pid {})",
        st.backend, st.dataplane, st.requested, st.pid
    );
    Ok(())
}

/// The context of a failed query of the node's weftd.
fn no_daemon(subnet_file: &std::path::Path) -> String {
    format!(
        "cannot reach weftd (is it running with --subnet-file={}?)",
        subnet_file.display()
    )
}

fn status(
    subnet_file: &std::path::Path,
    socket: Option<std::path::PathBuf>,
    http: Option<String>,
    json: bool,
) -> anyhow::Result<()> {
    use weft_control::status::{render, server};
    let timeout = std::time::Duration::from_secs(10);
    let st = match http {
        Some(addr) => server::query_http(&addr, timeout).with_context(|| {
            format!("cannot reach weftd (is it running with --healthz-port and --healthz-ip for {addr}?)")
        })?,
        None => {
            let socket = socket.unwrap_or_else(|| server::socket_path(subnet_file));
            server::query(&socket, timeout).with_context(|| no_daemon(subnet_file))?
        }
    };
    let out = if json {
        serde_json::to_string_pretty(&st)? + "\n"
    } else {
        render::text(&st)
    };
    use std::io::Write;
    std::io::stdout()
        .write_all(out.as_bytes())
        .context("stdout")
}

async fn list(s: &StoreArgs, json: bool) -> anyhow::Result<()> {
    let leases = match &s.etcd_endpoints {
        Some(ep) => etcd(s, ep).await?.list_leases().await?,
        None => {
            EmbeddedStore::open(&s.store_path)
                .await?
                .list_leases()
                .await?
        }
    };
    let out = if json {
        to_json(&leases)?
    } else {
        to_table(&leases)
    };
    use std::io::Write;
    std::io::stdout()
        .write_all(out.as_bytes())
        .context("stdout")
}

async fn remove(s: &StoreArgs, key: &SubnetKey) -> anyhow::Result<()> {
    match &s.etcd_endpoints {
        Some(ep) => etcd(s, ep).await?.delete_lease(key).await?,
        None => {
            EmbeddedStore::open(&s.store_path)
                .await?
                .delete_lease(key)
                .await?
        }
    }
    Ok(())
}

async fn put(s: &StoreArgs, key: &SubnetKey, value: &str, ttl: u64) -> anyhow::Result<()> {
    let attrs = LeaseAttrs::from_json(value.as_bytes()).context("invalid lease value")?;
    let ttl = (ttl > 0).then(|| std::time::Duration::from_secs(ttl));
    match &s.etcd_endpoints {
        Some(ep) => etcd(s, ep).await?.update_lease(key, &attrs, ttl).await?,
        None => {
            EmbeddedStore::open(&s.store_path)
                .await?
                .update_lease(key, &attrs, ttl)
                .await?
        }
    };
    Ok(())
}

async fn etcd(s: &StoreArgs, endpoints: &str) -> anyhow::Result<EtcdStore> {
    let opts = EtcdOptions {
        endpoints: endpoints.to_string(),
        prefix: s.etcd_prefix.clone(),
        ..Default::default()
    };
    Ok(EtcdStore::connect(&opts).await?)
}

fn to_json(leases: &[Lease]) -> anyhow::Result<String> {
    let v: Vec<serde_json::Value> = leases
        .iter()
        .map(|l| {
            Ok(serde_json::json!({
                "key": l.key().to_string(),
                "value": serde_json::from_str::<serde_json::Value>(&l.attrs.to_json())?,
                "expiration": l.expiration.and_then(|e| e.duration_since(std::time::UNIX_EPOCH).ok()).map(|d| d.as_secs()),
            }))
        })
        .collect::<Result<_, serde_json::Error>>()?;
    Ok(serde_json::to_string_pretty(&v)? + "\n")
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
            l.attrs.public_ip.to_string(),
            backend,
            l.attrs.backend_data.as_deref().unwrap_or("-")
        ));
    }
    out
}
