//! DEL: replay the saved delegate config with the delegate's DEL, then
//! remove it.
//!
//! Contract (best effort and idempotent, CNI spec and flannel):
//! - No data dir, no saved config: success (already deleted, or never added).
//! - A saved config that is not a JSON object with a plugin `type`: logged,
//!   removed, success (nothing can be replayed; flannel also succeeds).
//! - `CNI_NETNS` may be empty or point to a vanished namespace: the delegate
//!   still runs (bridge then only releases the IPAM reservation).
//! - A failing delegate DEL is an error and the config is kept, so the
//!   runtime's retry can replay it.
//! - The pod may have been added in the other mode (the node moved between
//!   bridge and routed): a saved delegate config means a bridge pod, whatever
//!   the mode now; in bridge mode, no saved config means it may be a routed
//!   pod, which [`routed::del_leftover`] removes.

use crate::command::Request;
use crate::config::Mode;
use crate::error::Error;
use crate::store::Store;
use crate::{delegate, exec, log, routed};

/// Runs DEL.
pub fn del(req: &Request) -> Result<(), Error> {
    let store = Store::new(&req.conf.data_dir);
    let routed = req.conf.mode == Mode::Routed;
    if !store.exists() {
        return if routed {
            routed::del(req)
        } else {
            routed::del_leftover(req)
        };
    }
    let _lock = store.lock_shared()?;
    let id = &req.env.container_id;
    let Some(bytes) = store.load(id)? else {
        return if routed {
            routed::del(req)
        } else {
            routed::del_leftover(req)
        };
    };
    if routed {
        log(&format!(
            "{id}: added in bridge mode (saved delegate config); deleting it as such"
        ));
    }
    let plugin_type = match delegate::parse_saved(&bytes) {
        Ok((_, t)) => t,
        Err(reason) => {
            log(&format!(
                "ignoring corrupt saved config {}: {reason}",
                store.path(id).display()
            ));
            store.remove(id)?;
            return Ok(());
        }
    };
    let plugin = exec::find(&plugin_type, &req.env.path)?;
    exec::run(&plugin, "DEL", &[], &bytes)?;
    store.remove(id)?;
    Ok(())
}
