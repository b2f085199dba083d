//! The Kubernetes subnet manager (flannel's `--kube-subnet-mgr`,
//! fl:pkg/subnet/kube/kube.go), on Node objects of a kube-apiserver.
//!
//! Contracts (flannel-compat spec §6.2):
//! - **Leases are Node objects.** A node's subnet is its `spec.podCIDR(s)`
//!   (allocated by kube-controller-manager, never by weft). Its lease
//!   attributes are flannel's node annotations ([`annotations`]), written by
//!   each daemon on its own node through a strategic-merge PATCH on
//!   `nodes/<name>/status`, byte-identical to flanneld's for the same
//!   backend ([`node::annotation_updates`]).
//! - **Peers** are the nodes annotated `kube-subnet-manager: "true"` whose
//!   public IP(s) and podCIDR parse and whose backend type equals ours; any
//!   other node is skipped (logged). A watcher over all nodes
//!   (the `watch` module, kube-runtime's watcher: relists after 410 Gone, resumes
//!   after apiserver restarts) feeds [`LeaseEvent`](crate::lease::LeaseEvent)s:
//!   a `Snapshot` after every (re)list, then `Added`/`Removed` only when a
//!   peer's subnet or attributes change. Events keep their order; the channel
//!   holds `EVENT_QUEUE_DEPTH` events (default 5000) and the watcher waits
//!   when it is full.
//! - **The own node** never appears as `Removed` and is always part of a
//!   snapshot once acquired: in kube mode the daemon does not exit when its
//!   Node changes (as flanneld, which does not monitor its lease there).
//!   Leases have no expiration and are never renewed.
//! - **Start-up**: the node name comes from `NODE_NAME`, else from the pod
//!   `POD_NAMESPACE/POD_NAME`; the first list must finish within 10 min
//!   (fatal unless `CONT_WHEN_CACHE_NOT_READY=true`). Acquisition refuses a
//!   node without podCIDR (`node "<name>" pod cidr not assigned`) or with a
//!   podCIDR outside `Network`. After setup the node condition
//!   `NetworkUnavailable=False` (reason `FlannelIsUp`) is patched unless
//!   `--set-node-network-unavailable=false`.
//! - **RBAC**: exactly flannel's ClusterRole: `pods: get`,
//!   `nodes: get, list, watch`, `nodes/status: patch`.
//!
//! Where weft differs from flanneld, on purpose: a v6 podCIDR is ignored when
//! `EnableIPv6` is off (flannel fails), a peer error names the peer (flannel
//! names itself), and a full event queue delays the watcher instead of
//! queueing sends that can reorder events.

pub mod annotations;
pub mod client;
pub mod manager;
pub mod node;
mod watch;

pub use annotations::Annotations;
pub use manager::{KubeManager, KubeOptions};

/// Errors of the Kubernetes subnet manager.
#[derive(Debug, thiserror::Error)]
pub enum KubeError {
    /// `--kube-annotation-prefix` is not acceptable (flannel's texts).
    #[error("{0}")]
    Prefix(&'static str),
    /// No usable client configuration (kubeconfig, in-cluster, URL).
    #[error("fail to create kubernetes config: {0}")]
    Config(String),
    /// An environment variable is malformed or missing.
    #[error("{0}")]
    Env(String),
    /// The node name could not be found.
    #[error("{0}")]
    NodeName(String),
    /// A node's podCIDR(s) or annotations are unusable (flannel's texts).
    #[error("{0}")]
    Node(String),
    /// The first node list did not finish in time.
    #[error("error waiting for nodeController to sync state: timed out waiting for the condition")]
    SyncTimeout,
    /// The apiserver refused or failed a request (`detail` is the
    /// apiserver's message); `retryable` when a later attempt may succeed
    /// (connection errors, 5xx, 429, conflicts).
    #[error("{what}: {detail}")]
    Api {
        /// What was being done.
        what: String,
        /// The apiserver's status message, or the client error.
        detail: String,
        /// The HTTP status code, when the apiserver answered.
        code: Option<u16>,
        /// Whether a retry may succeed.
        retryable: bool,
    },
}

impl KubeError {
    /// Wraps a client error, classifying it.
    pub(crate) fn api(what: impl Into<String>, source: &::kube::Error) -> KubeError {
        let (detail, code, retryable) = match source {
            ::kube::Error::Api(s) => (
                s.to_string(),
                Some(s.code),
                matches!(s.code, 409 | 429) || s.code >= 500,
            ),
            ::kube::Error::HyperError(_)
            | ::kube::Error::Service(_)
            | ::kube::Error::ReadEvents(_) => (source.to_string(), None, true),
            other => (other.to_string(), None, false),
        };
        KubeError::Api {
            what: what.into(),
            detail,
            code,
            retryable,
        }
    }

    /// Whether a retry may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            KubeError::Api {
                retryable: true,
                ..
            }
        )
    }
}

impl From<KubeError> for crate::store::StoreError {
    fn from(e: KubeError) -> Self {
        if e.is_retryable() {
            crate::store::StoreError::Unavailable(e.to_string())
        } else {
            crate::store::StoreError::Other(e.to_string())
        }
    }
}
