//! [`KubeManager`]: the [`SubnetManager`] on Node objects. See the module
//! docs of [`crate::kube`] for the contracts.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use tokio::sync::mpsc;

use super::client::{self, NodeNameSource};
use super::watch::{self, State, lock};
use super::{Annotations, KubeError, node};
use crate::config::Config;
use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs, LeaseEvent};
use crate::store::StoreError;
use crate::subnet::{SubnetError, SubnetManager};

/// flannel's `nodeControllerSyncTimeout`.
pub const SYNC_TIMEOUT: Duration = Duration::from_secs(600);
/// flannel's default `EVENT_QUEUE_DEPTH`.
pub const DEFAULT_EVENT_QUEUE_DEPTH: usize = 5000;
/// How long acquisition waits for the own node and retries a failing patch
/// (flannel: poll every 3 s, up to 30 s).
const NODE_WAIT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_secs(3);

/// How to reach the apiserver and behave there.
#[derive(Debug, Clone)]
pub struct KubeOptions {
    /// `--kube-api-url`.
    pub api_url: String,
    /// `--kubeconfig-file`.
    pub kubeconfig: String,
    /// `--kube-annotation-prefix`.
    pub annotation_prefix: String,
    /// `--set-node-network-unavailable`.
    pub set_node_network_unavailable: bool,
    /// `NODE_NAME`, `POD_NAME`, `POD_NAMESPACE`.
    pub node: NodeNameSource,
    /// `EVENT_QUEUE_DEPTH`: capacity of the lease event channel.
    pub event_queue_depth: usize,
    /// `CONT_WHEN_CACHE_NOT_READY=true`: start even if the first list times out.
    pub cont_when_cache_not_ready: bool,
    /// How long to wait for the first node list (flannel: 10 min).
    pub sync_timeout: Duration,
}

impl KubeOptions {
    /// Options from flanneld's flags plus its environment variables
    /// (`NODE_NAME`, `POD_NAME`, `POD_NAMESPACE`, `EVENT_QUEUE_DEPTH`,
    /// `CONT_WHEN_CACHE_NOT_READY`; `WEFT_KUBE_SYNC_TIMEOUT` seconds, for tests).
    pub fn from_env(
        api_url: &str,
        kubeconfig: &str,
        annotation_prefix: &str,
        set_node_network_unavailable: bool,
    ) -> Result<KubeOptions, KubeError> {
        let depth = std::env::var("EVENT_QUEUE_DEPTH")
            .ok()
            .filter(|v| !v.is_empty());
        let timeout = std::env::var("WEFT_KUBE_SYNC_TIMEOUT")
            .ok()
            .filter(|v| !v.is_empty());
        let sync_timeout = match timeout {
            Some(t) => Duration::from_secs(t.parse().map_err(|e| {
                KubeError::Env(format!("env WEFT_KUBE_SYNC_TIMEOUT={t} format error: {e}"))
            })?),
            None => SYNC_TIMEOUT,
        };
        Ok(KubeOptions {
            api_url: api_url.to_string(),
            kubeconfig: kubeconfig.to_string(),
            annotation_prefix: annotation_prefix.to_string(),
            set_node_network_unavailable,
            node: NodeNameSource::from_env(),
            event_queue_depth: parse_queue_depth(depth.as_deref())?,
            cont_when_cache_not_ready: std::env::var("CONT_WHEN_CACHE_NOT_READY").as_deref()
                == Ok("true"),
            sync_timeout,
        })
    }
}

/// flannel's `EVENT_QUEUE_DEPTH` rule: Go `strconv.Atoi`; values ≤ 0 keep 5000.
pub fn parse_queue_depth(v: Option<&str>) -> Result<usize, KubeError> {
    let Some(v) = v else {
        return Ok(DEFAULT_EVENT_QUEUE_DEPTH);
    };
    let n: i64 = v
        .parse()
        .map_err(|e| KubeError::Env(format!("env EVENT_QUEUE_DEPTH={v} format error: {e}")))?;
    Ok(usize::try_from(n)
        .ok()
        .filter(|n| *n > 0)
        .unwrap_or(DEFAULT_EVENT_QUEUE_DEPTH))
}

/// Aborts the watcher task when the manager goes away.
#[derive(Debug)]
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The Kubernetes subnet manager.
#[derive(Debug)]
pub struct KubeManager {
    nodes: Api<Node>,
    name: String,
    cfg: Config,
    ann: Annotations,
    opts: KubeOptions,
    state: Arc<Mutex<State>>,
    informer: bool,
    _watcher: Option<AbortOnDrop>,
}

impl KubeManager {
    /// Connects, finds the node name, starts the node watcher and waits for
    /// its first list (flanneld's `NewSubnetManager`). With the `alloc`
    /// backend there is no watcher (flannel: nobody routes by peers then).
    pub async fn start(opts: KubeOptions, cfg: Config) -> Result<KubeManager, KubeError> {
        let ann = Annotations::new(&opts.annotation_prefix)?;
        let client: Client = client::connect(&opts.api_url, &opts.kubeconfig).await?;
        let name = client::node_name(&client, &opts.node).await?;
        let nodes: Api<Node> = Api::all(client);
        let state = Arc::new(Mutex::new(State::new(
            ann.clone(),
            name.clone(),
            cfg.enable_ipv4,
            cfg.enable_ipv6,
        )));
        let informer = cfg.backend_type != "alloc";
        let mut mgr = KubeManager {
            nodes,
            name,
            cfg,
            ann,
            opts,
            state,
            informer,
            _watcher: None,
        };
        if !informer {
            tracing::info!("Node controller skips sync");
            return Ok(mgr);
        }
        tracing::info!(
            "Waiting {} for node controller to sync",
            go_duration(mgr.opts.sync_timeout)
        );
        let (tx, mut synced) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(watch::run(mgr.nodes.clone(), mgr.state.clone(), tx));
        mgr._watcher = Some(AbortOnDrop(task));
        match tokio::time::timeout(mgr.opts.sync_timeout, synced.wait_for(|s| *s)).await {
            Ok(_) => tracing::info!("Node controller sync successful"),
            Err(_) if mgr.opts.cont_when_cache_not_ready => {
                tracing::error!(
                    "{}; continuing (CONT_WHEN_CACHE_NOT_READY=true)",
                    KubeError::SyncTimeout
                );
            }
            Err(_) => return Err(KubeError::SyncTimeout),
        }
        Ok(mgr)
    }

    /// The node this daemon runs on.
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// The user's `node-public-ip(v6)` annotations on the own node, read
    /// from the apiserver (flannel's `GetStoredPublicIP`).
    pub async fn stored_public_ips(&self) -> (Option<Ipv4Addr>, Option<Ipv6Addr>) {
        match self.nodes.get(&self.name).await {
            Ok(n) => node::stored_public_ips(&n, &self.ann),
            Err(e) => {
                tracing::error!("Failed to get node for backend data: {e}");
                (None, None)
            }
        }
    }

    /// The own node: from the watcher's cache (waiting up to 30 s for it),
    /// else read directly.
    async fn own_node(&self) -> Result<Node, KubeError> {
        let deadline = Instant::now() + NODE_WAIT;
        while self.informer && Instant::now() < deadline {
            if let Some(n) = lock(&self.state).own_node.clone() {
                return Ok(n);
            }
            tokio::time::sleep(POLL.min(Duration::from_millis(500))).await;
        }
        self.nodes
            .get(&self.name)
            .await
            .map_err(|e| KubeError::api(format!("failed to get node {:?}", self.name), &e))
    }

    /// A strategic-merge PATCH on `nodes/<name>/status`, retried for up to
    /// 30 s while the apiserver is unavailable.
    async fn patch_status(&self, what: &str, patch: serde_json::Value) -> Result<Node, KubeError> {
        let deadline = Instant::now() + NODE_WAIT;
        loop {
            let res = self
                .nodes
                .patch_status(
                    &self.name,
                    &PatchParams::default(),
                    &Patch::Strategic(&patch),
                )
                .await;
            match res {
                Ok(n) => return Ok(n),
                Err(e) => {
                    let err = KubeError::api(
                        format!(
                            "failed to patch {what} of node {:?} (nodes/status)",
                            self.name
                        ),
                        &e,
                    );
                    if !err.is_retryable() || Instant::now() >= deadline {
                        return Err(err);
                    }
                    tracing::warn!("{err}; retrying");
                    tokio::time::sleep(POLL).await;
                }
            }
        }
    }

    async fn acquire(&self, attrs: &LeaseAttrs) -> Result<Lease, KubeError> {
        let mut n = self.own_node().await?;
        node::pod_cidrs(&n)?;
        let current = node::annotations(&n);
        let updates = node::annotation_updates(current, &self.ann, attrs);
        let weft = node::weft_updates(current, &self.ann, attrs);
        if !updates.is_empty() || !weft.is_empty() {
            for (key, over) in [
                (
                    &self.ann.backend_public_ip,
                    &self.ann.backend_public_ip_overwrite,
                ),
                (
                    &self.ann.backend_public_ipv6,
                    &self.ann.backend_public_ipv6_overwrite,
                ),
            ] {
                if let (Some(v), Some(o)) = (updates.get(key), current.get(over))
                    && v == o
                {
                    tracing::info!("Overriding public ip with '{o}' from node annotation '{over}'");
                }
            }
            n = self
                .patch_status("annotations", node::node_patch(&updates, &weft))
                .await?;
        }
        let lease = node::own_lease(&n, &self.cfg, attrs)?;
        let mut st = lock(&self.state);
        st.own_node = Some(n);
        st.own_lease = Some(lease.clone());
        Ok(lease)
    }

    /// Brings the own node's weft annotations (`weft-nat`, `weft-gso`) in
    /// line with `lease` (the daemon "renews" a kube lease only when its
    /// `WeftNAT` endpoint changed: node leases do not expire).
    async fn publish_nat(&self, lease: &Lease) -> Result<(), KubeError> {
        let n = self.own_node().await?;
        let weft = node::weft_updates(node::annotations(&n), &self.ann, &lease.attrs);
        if weft.is_empty() {
            return Ok(());
        }
        let patch = node::node_patch(&Default::default(), &weft);
        let n = self.patch_status("annotations", patch).await?;
        let mut st = lock(&self.state);
        st.own_node = Some(n);
        st.own_lease = Some(lease.clone());
        Ok(())
    }
}

impl SubnetManager for KubeManager {
    fn name(&self) -> String {
        format!("Kubernetes Subnet Manager - {}", self.name)
    }

    async fn previous_own_lease(&self, _ext: &ExternalInterface) -> Option<Lease> {
        let n = self.own_node().await.ok()?;
        node::node_to_lease(&n, &self.ann, self.cfg.enable_ipv4, self.cfg.enable_ipv6)
            .ok()
            .flatten()
    }

    async fn acquire_lease(&self, attrs: &LeaseAttrs) -> Result<Lease, SubnetError> {
        self.acquire(attrs)
            .await
            .map_err(|e| SubnetError::Store(e.into()))
    }

    async fn renew_lease(&self, lease: &Lease) -> Result<Lease, SubnetError> {
        // Node leases do not expire (flannel: RenewLease is unimplemented);
        // what may change is weft's `WeftNAT`, published as an annotation.
        self.publish_nat(lease)
            .await
            .map_err(|e| SubnetError::Store(e.into()))?;
        Ok(lease.clone())
    }

    async fn complete_lease(&self, _lease: &Lease) -> Result<(), SubnetError> {
        if !self.opts.set_node_network_unavailable {
            return Ok(());
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        self.patch_status(
            "condition NetworkUnavailable",
            node::network_available_patch(now),
        )
        .await
        .map_err(|e| SubnetError::Store(e.into()))?;
        Ok(())
    }

    async fn report_peers(&self, unreachable: &[String]) -> Result<(), SubnetError> {
        if !self.opts.set_node_network_unavailable {
            return Ok(());
        }
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        self.patch_status(
            "condition WeftPeersReachable",
            node::peers_reachable_patch(now, unreachable),
        )
        .await
        .map_err(|e| SubnetError::Store(e.into()))?;
        Ok(())
    }

    async fn watch_leases(&self) -> Result<mpsc::Receiver<LeaseEvent>, StoreError> {
        Ok(lock(&self.state).subscribe(self.opts.event_queue_depth))
    }
}

/// Go's `time.Duration.String()` for whole seconds (`10m0s`).
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s}s"),
        (h, m, s) => format!("{h}h{m}m{s}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_depth_follows_flannel() {
        assert_eq!(parse_queue_depth(None).expect("unset"), 5000);
        assert_eq!(parse_queue_depth(Some("7")).expect("7"), 7);
        assert_eq!(parse_queue_depth(Some("0")).expect("0"), 5000);
        assert_eq!(parse_queue_depth(Some("-3")).expect("-3"), 5000);
        let e = parse_queue_depth(Some("x1")).expect_err("not a number");
        assert!(
            e.to_string()
                .starts_with("env EVENT_QUEUE_DEPTH=x1 format error"),
            "{e}"
        );
    }

    #[test]
    fn durations_print_as_go() {
        assert_eq!(go_duration(SYNC_TIMEOUT), "10m0s");
        assert_eq!(go_duration(Duration::from_secs(5)), "5s");
        assert_eq!(go_duration(Duration::from_secs(3725)), "1h2m5s");
    }
}
