//! The apiserver client and the node name, as flanneld finds them.
//!
//! Client config (client-go's `BuildConfigFromFlags(--kube-api-url,
//! --kubeconfig-file)`): both empty → in-cluster config (service account
//! token and CA); a kubeconfig file → its current context, with the server
//! replaced by `--kube-api-url` when given; only a URL → that server without
//! credentials. TLS is rustls with the ring provider.
//!
//! Node name: `NODE_NAME`, else `spec.nodeName` of the pod
//! `POD_NAMESPACE/POD_NAME` (flannel's error texts).

use k8s_openapi::api::core::v1::Pod;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

use super::KubeError;

/// Builds the client from `--kube-api-url` and `--kubeconfig-file`.
pub async fn connect(api_url: &str, kubeconfig: &str) -> Result<Client, KubeError> {
    // The tree has only ring; installing it explicitly keeps rustls from
    // panicking should another provider ever join the build.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let cfg = config(api_url, kubeconfig).await?;
    Client::try_from(cfg)
        .map_err(|e| KubeError::Config(format!("unable to initialize client: {e}")))
}

async fn config(api_url: &str, kubeconfig: &str) -> Result<Config, KubeError> {
    let bad_url = |e: &dyn std::fmt::Display| {
        KubeError::Config(format!("invalid --kube-api-url {api_url:?}: {e}"))
    };
    match (api_url.is_empty(), kubeconfig.is_empty()) {
        (true, true) => Config::incluster().map_err(|e| KubeError::Config(e.to_string())),
        (false, true) => Ok(Config::new(api_url.parse().map_err(|e| bad_url(&e))?)),
        (_, false) => {
            let kc =
                Kubeconfig::read_from(kubeconfig).map_err(|e| KubeError::Config(e.to_string()))?;
            let mut cfg = Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
                .await
                .map_err(|e| KubeError::Config(e.to_string()))?;
            if !api_url.is_empty() {
                cfg.cluster_url = api_url.parse().map_err(|e| bad_url(&e))?;
            }
            Ok(cfg)
        }
    }
}

/// Where the node name comes from (the process environment in weftd).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeNameSource {
    /// `NODE_NAME`.
    pub node_name: Option<String>,
    /// `POD_NAME`.
    pub pod_name: Option<String>,
    /// `POD_NAMESPACE`.
    pub pod_namespace: Option<String>,
}

impl NodeNameSource {
    /// Reads `NODE_NAME`, `POD_NAME` and `POD_NAMESPACE` (empty = unset).
    pub fn from_env() -> NodeNameSource {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
        NodeNameSource {
            node_name: var("NODE_NAME"),
            pod_name: var("POD_NAME"),
            pod_namespace: var("POD_NAMESPACE"),
        }
    }
}

/// The node this daemon runs on.
pub async fn node_name(client: &Client, src: &NodeNameSource) -> Result<String, KubeError> {
    if let Some(n) = &src.node_name {
        return Ok(n.clone());
    }
    let (Some(pod), Some(ns)) = (&src.pod_name, &src.pod_namespace) else {
        return Err(KubeError::NodeName(
            "env variables POD_NAME and POD_NAMESPACE must be set".into(),
        ));
    };
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let p = api
        .get(pod)
        .await
        .map_err(|e| KubeError::api(format!("error retrieving pod spec for '{ns}/{pod}'"), &e))?;
    match p.spec.and_then(|s| s.node_name).filter(|n| !n.is_empty()) {
        Some(n) => Ok(n),
        None => Err(KubeError::NodeName(format!(
            "node name not present in pod spec '{ns}/{pod}'"
        ))),
    }
}
