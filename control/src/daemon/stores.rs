//! Building the etcd store from flanneld's `--etcd-*` flags.

use super::flags::Flags;
use crate::store::etcd::{EtcdOptions, EtcdStore};

/// Connects to etcd as flanneld would (TLS only with both key and cert).
pub async fn etcd(flags: &Flags) -> anyhow::Result<EtcdStore> {
    let opts = EtcdOptions {
        endpoints: flags.etcd_endpoints.clone(),
        prefix: flags.etcd_prefix.clone(),
        keyfile: flags.etcd_keyfile.clone(),
        certfile: flags.etcd_certfile.clone(),
        cafile: flags.etcd_cafile.clone(),
        username: flags.etcd_username.clone(),
        password: flags.etcd_password.clone(),
    };
    Ok(EtcdStore::connect(&opts).await?)
}

/// What the status socket tells `weft leases` about the store (no secrets).
pub fn info(flags: &Flags, kind: super::flags::StoreKind) -> crate::store::StoreInfo {
    use super::flags::StoreKind;
    let some = |s: &str| (!s.is_empty()).then(|| s.to_string());
    match kind {
        StoreKind::Embedded => crate::store::StoreInfo {
            kind: "embedded".into(),
            store_path: Some(flags.store_path.clone()),
            net_config_path: Some(flags.net_config_path.clone()),
            ..Default::default()
        },
        StoreKind::Etcd => crate::store::StoreInfo {
            kind: "etcd".into(),
            etcd_endpoints: Some(flags.etcd_endpoints.clone()),
            etcd_prefix: Some(flags.etcd_prefix.clone()),
            etcd_keyfile: some(&flags.etcd_keyfile),
            etcd_certfile: some(&flags.etcd_certfile),
            etcd_cafile: some(&flags.etcd_cafile),
            etcd_username: some(&flags.etcd_username),
            etcd_password_set: !flags.etcd_password.is_empty(),
            ..Default::default()
        },
        StoreKind::Kube => crate::store::StoreInfo {
            kind: "kube".into(),
            ..Default::default()
        },
    }
}
