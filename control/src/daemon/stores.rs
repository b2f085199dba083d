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
