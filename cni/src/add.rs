//! ADD: build the delegate config from the network config and subnet.env,
//! save it as `<dataDir>/<containerID>`, run the delegate's ADD with it and
//! print the delegate's result.
//!
//! Contract:
//! - Errors come in flannel's order: config, subnet.env (flannel's wrapped
//!   text), delegate dictionary checks, IPAM assembly, delegate lookup.
//! - The config is saved before the delegate runs, so a DEL after a failed or
//!   interrupted ADD can still undo whatever the delegate did.
//! - The saved config's fsync overlaps the delegate's run and is awaited
//!   before the result is printed.
//! - If the delegate's ADD succeeds but the saved config cannot be synced or
//!   its result cannot be used or printed, the delegate's DEL runs and the saved config is removed; the
//!   first error is the one reported.
//! - Network `cniVersion` 1.1.0 with a delegate that only speaks up to
//!   1.0.x (Debian's plugins 1.1.1): the delegate gets the highest 1.0.x it
//!   supports, and its result is relabelled 1.1.0 (a 1.0.0 result is a valid
//!   1.1.0 result). flannel would fail here with "incompatible CNI versions".

use std::cmp::Ordering;
use std::io::Write;
use std::path::Path;

use serde_json::{Map, Value};
use weft_compat::subnet_env::plugin as subnet_env;

use crate::command::Request;
use crate::config::Mode;
use crate::error::Error;
use crate::exec::{self, ExecError};
use crate::store::Store;
use crate::{delegate, log, routed, version};

/// Runs ADD; the result goes to `out`.
pub fn add(req: &Request, out: &mut dyn Write) -> Result<(), Error> {
    if req.conf.mode == Mode::Routed {
        return routed::add(req, out);
    }
    let conf = &req.conf;
    let env = subnet_env::load(&conf.subnet_file).map_err(Error::SubnetEnv)?;
    let mut config = delegate::build(conf, &env)?;
    let plugin_type = config
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("bridge")
        .to_string();
    let plugin = exec::find(&plugin_type, &req.env.path)?;
    let relabel = negotiate(&mut config, &plugin, &conf.cni_version)?;
    let bytes = delegate::to_bytes(&config);

    let store = Store::new(&conf.data_dir);
    let _lock = store.lock_shared()?;
    let sync = store.save(&req.env.container_id, &req.env.ifname, &bytes)?;
    let result = exec::run(&plugin, "ADD", &[], &bytes).inspect_err(|e| {
        log(&format!(
            "delegate {plugin_type} ADD failed for {}: {e}",
            req.env.container_id
        ));
    });
    let synced = sync.wait();
    let result = result?;
    if let Err(e) = synced
        .map_err(Error::from)
        .and_then(|()| emit(&plugin, &result, relabel.as_deref(), out))
    {
        // Undo the delegate's work; keep reporting the original error.
        match exec::run(&plugin, "DEL", &[], &bytes) {
            Ok(_) => {
                if let Err(re) = store.remove(&req.env.container_id) {
                    log(&format!("rollback: {re}"));
                }
            }
            Err(de) => log(&format!(
                "rollback: delegate {plugin_type} DEL failed: {de}"
            )),
        }
        return Err(e);
    }
    Ok(())
}

/// Picks the delegate's `cniVersion` for a 1.1.0 network; returns the
/// version to relabel the result with, if the delegate got an older one.
fn negotiate(
    config: &mut Map<String, Value>,
    plugin: &Path,
    cni_version: &str,
) -> Result<Option<String>, Error> {
    if cni_version != version::CURRENT {
        return Ok(None);
    }
    let supported = exec::supported_versions(plugin)?;
    if supported.iter().any(|v| v == version::CURRENT) {
        return Ok(None);
    }
    let in_major_1 = |v: &&String| {
        version::compare(v, "1.0.0").is_ok_and(|o| o != Ordering::Less)
            && version::compare(v, version::CURRENT).is_ok_and(|o| o == Ordering::Less)
    };
    let best = supported
        .iter()
        .filter(in_major_1)
        .max_by(|a, b| version::compare(a, b).unwrap_or(Ordering::Equal));
    let Some(best) = best else { return Ok(None) };
    config.insert("cniVersion".into(), Value::String(best.clone()));
    Ok(Some(version::CURRENT.to_string()))
}

/// Checks the delegate's result and prints it (relabelled if asked).
fn emit(
    plugin: &Path,
    result: &[u8],
    relabel: Option<&str>,
    out: &mut dyn Write,
) -> Result<(), Error> {
    let bad = |reason: String| {
        Error::Exec(ExecError::BadOutput {
            path: plugin.to_path_buf(),
            reason,
        })
    };
    let mut value: Value = serde_json::from_slice(result).map_err(|e| bad(e.to_string()))?;
    let Value::Object(obj) = &mut value else {
        return Err(bad("the result is not a JSON object".to_string()));
    };
    let bytes = match relabel {
        Some(v) => {
            obj.insert("cniVersion".into(), Value::String(v.to_string()));
            serde_json::to_vec(&value).map_err(|e| bad(e.to_string()))?
        }
        None => result.to_vec(),
    };
    out.write_all(&bytes)
        .and_then(|()| out.flush())
        .map_err(Error::Output)
}
