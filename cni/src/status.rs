//! STATUS (CNI 1.1): succeed only when an ADD could succeed now (flannel's
//! STATUS is a no-op).
//!
//! Contract:
//! - subnet.env must exist and parse, else code 50 with flannel's subnet.env
//!   message (flanneld writes it once the node's lease and rules are set).
//! - The network config must yield a delegate config (config errors keep
//!   their own codes), and the delegate and its IPAM plugin must be in
//!   `CNI_PATH`, else code 50.
//! - STATUS is forwarded to the delegate when it speaks CNI 1.1; its error
//!   (50/51) is passed through. Pre-1.1 delegates have no STATUS.

use serde_json::Value;
use weft_compat::subnet_env::plugin as subnet_env;

use crate::command::Request;
use crate::config::Mode;
use crate::error::Error;
use crate::{delegate, exec, routed, version};

/// Runs STATUS.
pub fn status(req: &Request) -> Result<(), Error> {
    if req.conf.mode == Mode::Routed {
        return routed::status(req);
    }
    let conf = &req.conf;
    let not_ready = |e: Error| Error::NotReady(Box::new(e));
    let env = subnet_env::load(&conf.subnet_file).map_err(|e| not_ready(Error::SubnetEnv(e)))?;
    let config = delegate::build(conf, &env)?;
    let plugin_type = config
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("bridge");
    let ipam_type = config
        .get("ipam")
        .and_then(|i| i.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("host-local");
    let plugin = exec::find(plugin_type, &req.env.path).map_err(|e| not_ready(e.into()))?;
    exec::find(ipam_type, &req.env.path).map_err(|e| not_ready(e.into()))?;
    let supported = exec::supported_versions(&plugin).map_err(|e| not_ready(e.into()))?;
    if supported.iter().any(|v| v == version::CURRENT) {
        exec::run(&plugin, "STATUS", &[], &delegate::to_bytes(&config))?;
    }
    Ok(())
}
