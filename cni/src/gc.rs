//! GC (CNI 1.1): release every attachment this plugin saved that is not in
//! `cni.dev/valid-attachments` (or the older `cni.dev/attachments`; both
//! are read and merged). flannel's GC is a no-op.
//!
//! Contract:
//! - Runs under the data dir's exclusive lock (ADD/DEL hold it shared).
//! - A saved config is valid iff its `(containerID, ifname)` is listed; the
//!   ifname is the one recorded at ADD (`eth0` for configs saved by flannel).
//! - A stale config is replayed with the delegate's DEL (container ID and
//!   ifname of the stale attachment, no netns: the spec lets GC assume it is
//!   gone), which releases the IPAM reservation; then it is removed. A
//!   corrupt config is just removed.
//! - GC is then forwarded to the delegate with the valid list, if the
//!   delegate speaks CNI 1.1 (its own state, e.g. host-local leases without a
//!   saved config). A pre-1.1 delegate cannot take GC and is skipped; its
//!   state was released per attachment above.
//! - Failures do not stop the sweep; all of them are reported together.
//! - Both modes sweep both kinds of attachments (a node that moved between
//!   bridge and routed has both): routed mode also replays stale saved
//!   configs; bridge mode also releases stale routed allocations when
//!   weftd's IPAM answers.

use serde_json::{Value, json};
use weft_compat::subnet_env::plugin as subnet_env;

use crate::command::{self, Request};
use crate::config::{ATTACHMENTS, Attachment, Mode, VALID_ATTACHMENTS};
use crate::error::Error;
use crate::store::Store;
use crate::{delegate, exec, log, routed, version};

/// Runs GC.
pub fn gc(req: &Request) -> Result<(), Error> {
    let valid = req.conf.gc_attachments()?;
    let mut errors = Vec::new();
    let routed = req.conf.mode == Mode::Routed;
    let leftover = match routed {
        true => routed::gc(req),
        false => routed::gc_leftover(req),
    };
    match leftover {
        Err(Error::Gc(e)) => errors.extend(e),
        Err(e) => errors.push(e),
        Ok(()) => {}
    }
    let store = Store::new(&req.conf.data_dir);
    if store.exists() {
        let _lock = store.lock_exclusive()?;
        for id in store.list()? {
            if !command::valid_id(&id) {
                log(&format!(
                    "gc: ignoring {}: not a container ID",
                    store.path(&id).display()
                ));
                continue;
            }
            let ifname = store.ifname(&id);
            if valid
                .iter()
                .any(|a| a.container_id == id && a.ifname == ifname)
            {
                continue;
            }
            match release(&store, &id, &ifname, &req.env.path) {
                Ok(()) => log(&format!("gc: released stale attachment {id}/{ifname}")),
                Err(e) => errors.push(e),
            }
        }
        store.prune_ifnames();
    }
    if !routed && let Err(e) = forward(req, &valid) {
        errors.push(e);
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Gc(errors))
    }
}

/// Replays one stale attachment's saved config with DEL and removes it.
fn release(store: &Store, id: &str, ifname: &str, cni_path: &str) -> Result<(), Error> {
    let Some(bytes) = store.load(id)? else {
        return Ok(());
    };
    match delegate::parse_saved(&bytes) {
        Err(reason) => log(&format!(
            "gc: removing corrupt saved config {}: {reason}",
            store.path(id).display()
        )),
        Ok((_, plugin_type)) => {
            let plugin = exec::find(&plugin_type, cni_path)?;
            let env = [
                ("CNI_CONTAINERID", Some(id)),
                ("CNI_IFNAME", Some(ifname)),
                ("CNI_NETNS", None),
                ("CNI_ARGS", None),
            ];
            exec::run(&plugin, "DEL", &env, &bytes)?;
        }
    }
    store.remove(id)?;
    Ok(())
}

/// Sends GC to the delegate when it speaks CNI 1.1.
fn forward(req: &Request, valid: &[Attachment]) -> Result<(), Error> {
    let conf = &req.conf;
    let plugin = exec::find(conf.delegate_type(), &req.env.path)?;
    let supported = exec::supported_versions(&plugin)?;
    if !supported.iter().any(|v| v == version::CURRENT) {
        return Ok(());
    }
    let env = match subnet_env::load(&conf.subnet_file) {
        Ok(env) => env,
        Err(e) => {
            log(&format!(
                "gc: not forwarding GC to {}: {e}",
                conf.delegate_type()
            ));
            return Ok(());
        }
    };
    let mut config = delegate::build(conf, &env)?;
    let list: Vec<Value> = valid
        .iter()
        .map(|a| json!({"containerID": a.container_id, "ifname": a.ifname}))
        .collect();
    config.insert(VALID_ATTACHMENTS.into(), Value::Array(list.clone()));
    config.insert(ATTACHMENTS.into(), Value::Array(list));
    exec::run(&plugin, "GC", &[], &delegate::to_bytes(&config))?;
    Ok(())
}
