//! The daemon's start-up and main loop; see the module docs of `daemon`.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use weft_compat::subnet_env::SubnetEnv;

use super::backend_task::BackendTask;
use super::blackhole;
use super::flags::{AntiSpoofingMode, Dataplane, Flags, StoreKind, TrafficManagerKind};
use super::healthz;
use super::main_loop::{self, LoopCx};
use super::stop::Stop;
use crate::backend;
use crate::config::{Config, parse_config};
use crate::iface::{self, ExternalInterface, IfaceOptions};
use crate::lease::Lease;
use crate::metrics::DaemonMetrics;
use crate::netlink::{Client, Netlink};
use crate::store::Registry;
use crate::store::embedded::EmbeddedStore;
use crate::subnet::{LocalManager, Previous, SubnetManager};
use crate::traffic;
use crate::view::Publisher;

/// What the daemon publishes and counts, shared with its readers.
pub struct Shown {
    /// Snapshots for status, metrics and health.
    pub publisher: Publisher,
    /// The daemon's own metrics.
    pub metrics: Arc<DaemonMetrics>,
}

/// Runs weftd until a signal or the loss of its lease; returns the exit code.
pub async fn run(flags: Flags, etcd_explicit: bool) -> anyhow::Result<i32> {
    flags.validate().map_err(anyhow::Error::msg)?;
    // One weftd per subnet file, before any socket, route, device or store.
    let _lock = super::node_lock::lock_subnet_file(&flags.subnet_file)?;
    tracing::info!("CLI flags config: {flags:?}");
    let mut stop = Stop::install()?;
    tracing::info!("Installing signal handlers");
    let shown = Shown {
        publisher: Publisher::new(),
        metrics: Arc::new(DaemonMetrics::new()),
    };
    if flags.healthz_port != 0 {
        let addr = std::net::SocketAddr::new(flags.healthz_ip, flags.healthz_port);
        healthz::serve(addr, shown.publisher.observer(), shown.metrics.clone())
            .await
            .with_context(|| format!("failed to listen on {addr}"))?;
    }
    let kind = flags.store_kind(etcd_explicit);
    match kind {
        StoreKind::Embedded => {
            let store = EmbeddedStore::open(&flags.store_path)
                .await
                .with_context(|| {
                    format!(
                        "Failed to create SubnetManager: embedded store {}",
                        flags.store_path.display()
                    )
                })?;
            let Some(cfg) = stop.until(network_config(&flags, &store, kind)).await else {
                return Ok(0);
            };
            let cfg = cfg?;
            let mgr = local_manager(&flags, store, &cfg);
            run_with(&flags, kind, cfg, mgr, &mut stop, &shown).await
        }
        StoreKind::Etcd => {
            let store = super::stores::etcd(&flags).await?;
            let Some(cfg) = stop.until(network_config(&flags, &store, kind)).await else {
                return Ok(0);
            };
            let cfg = cfg?;
            let mgr = local_manager(&flags, store, &cfg);
            run_with(&flags, kind, cfg, mgr, &mut stop, &shown).await
        }
        StoreKind::Kube => {
            let (mgr, cfg, flags) = match stop.until(kube_manager(&flags)).await {
                None => return Ok(0),
                Some(r) => r.context("Failed to create SubnetManager")?,
            };
            run_with(&flags, kind, cfg, mgr, &mut stop, &shown).await
        }
    }
}

/// The Kubernetes subnet manager, as flanneld builds it: net-conf.json is only
/// parsed (no `CheckNetworkConfig`), and the node's `node-public-ip(v6)`
/// annotations replace `--public-ip(v6)`.
async fn kube_manager(flags: &Flags) -> anyhow::Result<(crate::kube::KubeManager, Config, Flags)> {
    let path = &flags.net_config_path;
    let text = std::fs::read(path)
        .with_context(|| format!("failed to read net conf {}", path.display()))?;
    let cfg = parse_config(&text).context("error parsing subnet config")?;
    let opts = crate::kube::KubeOptions::from_env(
        &flags.kube_api_url,
        &flags.kubeconfig_file,
        &flags.kube_annotation_prefix,
        flags.set_node_network_unavailable,
    )?;
    let mgr = crate::kube::KubeManager::start(opts, cfg.clone()).await?;
    let mut flags = flags.clone();
    let (ip, ip6) = mgr.stored_public_ips().await;
    flags.public_ip = ip.or(flags.public_ip);
    flags.public_ipv6 = ip6.or(flags.public_ipv6);
    Ok((mgr, cfg, flags))
}

/// The allocator on a registry, seeded with the previous subnet.env.
fn local_manager<R: Registry + Clone>(flags: &Flags, reg: R, cfg: &Config) -> LocalManager<R> {
    let prev_env = read_prev_env(flags);
    let prev = Previous {
        subnet: prev_env.as_ref().and_then(|e| e.subnet),
        ipv6_subnet: prev_env.as_ref().and_then(|e| e.ipv6_subnet),
    };
    LocalManager::new(
        reg,
        cfg.clone(),
        prev,
        Some(Duration::from_secs(flags.lease_ttl)),
    )
}

fn read_prev_env(flags: &Flags) -> Option<SubnetEnv> {
    SubnetEnv::read(&flags.subnet_file).unwrap_or_else(|e| {
        tracing::warn!("ignoring previous {}: {e}", flags.subnet_file.display());
        None
    })
}

/// Everything after the config and the subnet manager exist: interface,
/// backend, lease, host rules, subnet.env, then the main loop.
pub async fn run_with<M: SubnetManager>(
    flags: &Flags,
    kind: StoreKind,
    cfg: Config,
    mgr: M,
    stop: &mut Stop,
    shown: &Shown,
) -> anyhow::Result<i32> {
    tracing::info!("Created subnet manager: {}", mgr.name());
    tracing::info!("Found network config - Backend type: {}", cfg.backend_type);
    // One weftd per device in this network namespace, before any is touched.
    let _devices = super::node_lock::lock_devices(&backend::config_device_names(&cfg))?;
    let nl = Netlink::connect()?;
    let ext = select_iface(&nl, flags, &cfg).await?;
    let tuning = backend::EngineTuning {
        workers: flags.engine_workers,
        offload: true,
        anti_spoof: flags.anti_spoofing.engine(),
        nat: flags.nat_traversal || cfg.weft_nat_traversal || flags.nat_relay,
        relay: flags.nat_relay.then_some(crate::backend::RelayTuning {
            port: flags.nat_relay_port,
            mbit: (flags.nat_relay_limit > 0).then_some(flags.nat_relay_limit),
        }),
        tunnel_gso: flags.tunnel_gso,
    };
    let dataplane = match flags.dataplane {
        Dataplane::Auto => backend::DataplaneChoice::Auto,
        Dataplane::Kernel => backend::DataplaneChoice::Kernel,
        Dataplane::Userspace => backend::DataplaneChoice::Userspace,
    };
    // A choice persisted by `weft dataplane set`, if it still applies, else the flag.
    let (mut ctl, backend) = backend::dataplane_ctl::DataplaneControl::start(
        &flags.subnet_file,
        &cfg.backend_type,
        dataplane,
        |choice| backend::new(&cfg, choice, tuning, flags.vxlan_tx_checksum_offload, &nl),
    )
    .await
    .context("Error fetching backend")?;
    let own_prev = mgr.previous_own_lease(&ext).await;
    // The backend's stages: as built, prepared (lease attributes), running.
    let backend::Prepared {
        attrs,
        backend: prepared,
    } = backend
        .lease_attrs(&ext, own_prev.as_ref())
        .await
        .context("Error registering network")?;
    let prev_env = read_prev_env(flags);

    if flags.traffic_manager == TrafficManagerKind::Auto && !cfg.enable_nftables {
        // flannel only checks; weftd loads the module if it can (see traffic::br_netfilter
        // for why a missing module stays fatal whatever the backend).
        let proc_root = std::path::Path::new("/proc");
        let loaded = traffic::ensure_br_netfilter(
            proc_root,
            cfg.enable_ipv6,
            &mut traffic::modprobe_br_netfilter,
        )
        .map_err(|e| anyhow::anyhow!("Failed to check br_netfilter: {e}"))?;
        if loaded {
            tracing::info!("Loaded the br_netfilter module (bridge-nf-call-iptables was missing)");
        }
    }

    let Some(lease) = stop.until(acquire(&mgr, &attrs)).await else {
        return Ok(0);
    };
    let mut lease = lease.context("Error registering network")?;
    shown.metrics.lease_acquired();
    shown.publisher.daemon(|d| d.lease = Some(lease.clone()));
    let backend = prepared
        .setup(&lease)
        .await
        .context("Error registering network")?;
    let mtu = backend.mtu();
    for w in config_warnings(
        flags,
        backend.name(),
        backend::Dataplane::name(backend.dataplane()),
    ) {
        tracing::warn!("{w}");
    }
    let _resync = host_rules(flags, &cfg, &lease, prev_env.as_ref()).await?;
    let _blackhole = blackhole_routes(flags, &nl, &lease, prev_env.as_ref()).await?;
    let _ipam = crate::ipam::start(
        &flags.subnet_file,
        flags.ipam_socket.as_deref(),
        flags.ipam_state.as_deref(),
        &lease,
    )
    .await;
    let extras = crate::status::server::Extras {
        store: Some(super::stores::info(flags, kind)),
        commands: Some(ctl.commands()),
    };
    // From here on the backend has its own task; the loop only sends it work.
    let delay = Duration::from_millis(flags.test_apply_delay_ms);
    let mut task = BackendTask::spawn(backend, shown.publisher.backend(), delay);
    let observer = shown.publisher.observer();
    let _status = crate::status::server::start(&flags.subnet_file, observer, extras);
    let _probes = crate::probe::spawn(
        flags.probe_port,
        mtu,
        flags.probe_route_mtu,
        shown.publisher.observer(),
        shown.publisher.probes(),
    );

    let env = SubnetEnv {
        network: cfg.network.filter(|_| cfg.enable_ipv4),
        subnet: lease.subnet,
        ipv6_network: cfg.ipv6_network.filter(|_| cfg.enable_ipv6),
        ipv6_subnet: lease.ipv6_subnet,
        mtu,
        ipmasq: flags.ip_masq,
    };
    match env.write(&flags.subnet_file) {
        Ok(()) => {
            tracing::info!("Wrote subnet file to {}", flags.subnet_file.display());
            shown.publisher.daemon(|d| d.subnet_env = true);
            tracing::info!("flannel is ready");
        }
        Err(e) => tracing::warn!("Failed to write subnet file: {e}"),
    }
    if let Err(e) = mgr.complete_lease(&lease).await {
        tracing::error!("failed to complete lease: {e}");
    }
    tracing::info!("Running backend.");

    let cx = LoopCx {
        flags,
        mgr: &mgr,
        ctl: &mut ctl,
        publisher: &shown.publisher,
        metrics: &shown.metrics,
    };
    let code = main_loop::run(cx, &mut task, &mut lease, stop).await;
    tracing::info!("Waiting for all goroutines to exit");
    task.finish().await;
    tracing::info!("Exiting cleanly...");
    code
}

/// `--ip-blackhole-route`: the own subnet's blackhole routes, installed
/// before subnet.env is written and re-checked every `--iptables-resync`
/// seconds (see [`super::blackhole`]); first drops the blackhole of a
/// previous subnet this node no longer holds, with or without the flag.
async fn blackhole_routes(
    flags: &Flags,
    nl: &Netlink,
    lease: &Lease,
    prev: Option<&SubnetEnv>,
) -> anyhow::Result<Option<blackhole::Keeper>> {
    let client: Arc<dyn Client> = Arc::new(nl.clone());
    match blackhole::remove_stale(&*client, prev, lease).await {
        Ok(gone) => {
            for n in gone {
                tracing::info!("removed the blackhole route of previous subnet {n}");
            }
        }
        Err(e) => tracing::warn!("failed to remove a stale blackhole route: {e}"),
    }
    if !flags.ip_blackhole_route {
        return Ok(None);
    }
    let nets = blackhole::wanted(lease);
    blackhole::ensure(&*client, &nets)
        .await
        .context("Failed to add blackhole route")?;
    tracing::info!("blackhole route for {nets:?} in place");
    let period = Duration::from_secs(flags.iptables_resync);
    Ok(Some(blackhole::Keeper::spawn(client, nets, period)))
}

/// Installs flannel's masquerade and forward rules (before subnet.env is
/// written) and starts their periodic re-check; `None` with `--traffic-manager=none`.
async fn host_rules(
    flags: &Flags,
    cfg: &Config,
    lease: &Lease,
    prev: Option<&SubnetEnv>,
) -> anyhow::Result<Option<traffic::ResyncHandle>> {
    if flags.traffic_manager == TrafficManagerKind::None {
        tracing::info!("host traffic rules disabled (--traffic-manager=none)");
        return Ok(None);
    }
    let kind = traffic::Kind::from_config(cfg.enable_nftables);
    let mgr = traffic::new_manager(
        kind,
        flags.ip_masq_fully_random_disable,
        traffic::Runner::new(),
    );
    let tflags = traffic::Flags {
        ip_masq: flags.ip_masq,
        random_fully_disable: flags.ip_masq_fully_random_disable,
        forward_rules: flags.iptables_forward_rules,
        resync: Duration::from_secs(flags.iptables_resync),
        accept_in: (flags.tunnel_gso != crate::backend::tunnel::gso::TunnelGso::Off
            && matches!(cfg.backend_type.as_str(), "vxlan" | "udp"))
        .then_some(crate::backend::tunnel::gso::TAP),
    };
    let network = traffic::Networks {
        v4: cfg.network.filter(|_| cfg.enable_ipv4),
        v6: cfg.ipv6_network.filter(|_| cfg.enable_ipv6),
    };
    let subnet = traffic::Networks {
        v4: lease.subnet,
        v6: lease.ipv6_subnet,
    };
    let prev = prev.map(|p| traffic::Previous {
        network: traffic::Networks {
            v4: p.network,
            v6: p.ipv6_network,
        },
        subnet: traffic::Networks {
            v4: p.subnet,
            v6: p.ipv6_subnet,
        },
    });
    let m = mgr.clone();
    let random_fully_disable = flags.ip_masq_fully_random_disable;
    tokio::task::spawn_blocking(move || -> anyhow::Result<()> {
        tracing::info!("Cleaning-up unused traffic manager rules");
        if let Err(e) = traffic::cleanup_other(kind, random_fully_disable, traffic::Runner::new()) {
            tracing::warn!("failed to clean up the other traffic manager's rules: {e}");
        }
        match kind {
            traffic::Kind::Nftables => tracing::info!("Starting flannel in nftables mode..."),
            _ => tracing::info!("Starting flannel in iptables mode..."),
        }
        m.init().context("Failed to setup masq rules")?;
        tracing::info!("Setting up masking rules");
        traffic::install(&*m, &tflags, &network, &subnet, prev.as_ref())
            .context("Failed to setup masq rules")?;
        tracing::info!("bootstrap done");
        Ok(())
    })
    .await
    .context("traffic rules task")??;
    Ok(Some(traffic::spawn_resync(mgr, tflags.resync)?))
}

/// Flag combinations that start but do not do what a user expects, each as
/// one warning with the fix.
fn config_warnings(flags: &Flags, backend: &str, dataplane: &str) -> Vec<String> {
    let mut out = Vec::new();
    if flags.anti_spoofing != AntiSpoofingMode::Subnet && dataplane != "userspace" {
        out.push(format!(
            "--anti-spoofing={} applies to the userspace engine only; the {dataplane} dataplane of the {backend} backend checks no sources (as flannel's)",
            flags.anti_spoofing.engine(),
        ));
    }
    // Without --ip-masq, subnet.env says FLANNEL_IPMASQ=false and the CNI
    // plugin asks the bridge plugin to masquerade pod traffic leaving the
    // node's subnet, so it leaves with the node's address: no XFRM policy
    // (pod subnet -> pod subnet) matches and it is never encrypted or carried.
    // flannel behaves the same (its DaemonSet always passes --ip-masq); weft
    // says so once instead of dropping pod traffic silently.
    if backend == "ipsec" && !flags.ip_masq {
        out.push(
            "ipsec without --ip-masq: the CNI bridge plugin then masquerades pod-to-pod traffic to the node's address, \
             which no IPsec policy matches, so pods on different nodes cannot reach each other; start weftd with --ip-masq \
             (as kube-flannel.yml does)"
                .to_string(),
        );
    }
    out
}

/// Reads and checks the network config: the file for the embedded store
/// (falling back to the store's config key), the `<prefix>/config` key for
/// etcd (retried every second until it exists, as flanneld does).
async fn network_config<R: Registry>(
    flags: &Flags,
    reg: &R,
    kind: StoreKind,
) -> anyhow::Result<Config> {
    let text = loop {
        if kind == StoreKind::Embedded && flags.net_config_path.exists() {
            break std::fs::read(&flags.net_config_path).with_context(|| {
                format!(
                    "failed to read net conf {}",
                    flags.net_config_path.display()
                )
            })?;
        }
        match reg.get_network_config().await {
            Ok(Some(t)) => break t.into_bytes(),
            Ok(None) if kind == StoreKind::Etcd => {
                tracing::error!(
                    "Couldn't fetch network config: flannel config not found in etcd store. Did you create your config using etcdv3 API?"
                );
            }
            Ok(None) => bail!(
                "no network config: neither {} nor the embedded store has one",
                flags.net_config_path.display()
            ),
            Err(e) if e.is_retryable() => tracing::error!("Couldn't fetch network config: {e}"),
            Err(e) => return Err(e).context("Couldn't fetch network config"),
        }
        tracing::info!("timed out");
        tokio::time::sleep(Duration::from_secs(1)).await;
    };
    let mut cfg = parse_config(&text).context("error parsing subnet config")?;
    cfg.check_network_config()
        .context("invalid network config")?;
    Ok(cfg)
}

async fn select_iface(
    nl: &Netlink,
    flags: &Flags,
    cfg: &Config,
) -> anyhow::Result<ExternalInterface> {
    if flags.iface.is_empty() && flags.iface_regex.is_empty() {
        tracing::info!("Determining IP address of default interface");
    }
    let opts = IfaceOptions {
        ifaces: flags.iface.clone(),
        regexes: flags.iface_regex.clone(),
        can_reach: flags.iface_can_reach,
        public_ip: flags.public_ip,
        public_ipv6: flags.public_ipv6,
        v4: cfg.enable_ipv4,
        v6: cfg.enable_ipv6,
    };
    let ext = iface::select(nl, &opts).await?;
    let shown = ext
        .iface_addr
        .map(|a| a.to_string())
        .or(ext.iface_v6_addr.map(|a| a.to_string()))
        .unwrap_or_default();
    tracing::info!(
        "Using interface with name {} and address {}",
        ext.iface.name,
        shown
    );
    match (flags.public_ip, ext.ext_addr) {
        (Some(ip), _) => tracing::info!("Using {ip} as external address"),
        (None, Some(ip)) => {
            tracing::info!("Defaulting external address to interface address ({ip})")
        }
        (None, None) => {}
    }
    Ok(ext)
}

/// Acquires the lease, retrying while the store is unreachable.
async fn acquire<M: SubnetManager>(
    mgr: &M,
    attrs: &crate::lease::LeaseAttrs,
) -> anyhow::Result<Lease> {
    let mut backoff = Duration::from_millis(200);
    loop {
        match mgr.acquire_lease(attrs).await {
            Ok(l) => return Ok(l),
            Err(crate::subnet::SubnetError::Store(e)) if e.is_retryable() => {
                tracing::error!("failed to acquire lease: {e}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
            Err(e) => return Err(e).context("failed to acquire lease"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn flags(args: &[&str]) -> Flags {
        Flags::try_parse_from(std::iter::once("weftd").chain(args.iter().copied())).expect("flags")
    }

    #[test]
    fn ipsec_without_ip_masq_is_warned_about_with_the_fix() {
        let w = config_warnings(&flags(&[]), "ipsec", "kernel");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(
            w[0].contains("--ip-masq") && w[0].contains("masquerades"),
            "{}",
            w[0]
        );
        assert!(config_warnings(&flags(&["--ip-masq"]), "ipsec", "kernel").is_empty());
        assert!(config_warnings(&flags(&[]), "vxlan", "kernel").is_empty());
    }

    #[test]
    fn a_non_default_anti_spoofing_mode_on_a_kernel_dataplane_is_warned_about() {
        let w = config_warnings(
            &flags(&["--anti-spoofing=strict", "--ip-masq"]),
            "vxlan",
            "kernel",
        );
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("userspace engine only"), "{}", w[0]);
        assert!(
            config_warnings(&flags(&["--anti-spoofing=strict"]), "vxlan", "userspace").is_empty()
        );
    }
}
