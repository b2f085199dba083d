//! CHECK: run the delegate's CHECK with the saved delegate config and the
//! runtime's `prevResult` (flannel's CHECK does nothing).
//!
//! Contract:
//! - The saved config must exist and be usable, else code 100: CHECK is
//!   never sent before ADD, so a missing config means lost state.
//! - `prevResult` (the final ADD result) is added to the saved config, as
//!   bridge's CHECK requires it. When the saved config was downgraded to
//!   1.0.x for a 1.1.0 network (see ADD), `prevResult` is relabelled to the
//!   saved version so the delegate can decode it.
//! - Routes in `prevResult` without a `gw` get the gateway of the result's
//!   address of the same family: that is the route the delegate installed
//!   (`ipam.ConfigureIface`), and bridge's CHECK up to plugins 1.1.x filters
//!   routes by gateway, so flannel's gateway-less network routes would
//!   otherwise never be found.
//! - bridge's CHECK also runs host-local's CHECK (the IP is still reserved
//!   for this container) and verifies the interface, addresses and routes.

use std::cmp::Ordering;
use std::net::IpAddr;

use serde_json::{Map, Value};

use crate::command::Request;
use crate::config::Mode;
use crate::error::Error;
use crate::store::Store;
use crate::{delegate, exec, routed, version};

/// Runs CHECK.
pub fn check(req: &Request) -> Result<(), Error> {
    if req.conf.mode == Mode::Routed {
        return routed::check(req);
    }
    let store = Store::new(&req.conf.data_dir);
    let id = &req.env.container_id;
    let path = store.path(id).display().to_string();
    let bytes = store.load(id)?.ok_or_else(|| Error::NoSavedConfig {
        container_id: id.clone(),
        path: path.clone(),
    })?;
    let (mut config, plugin_type) = delegate::parse_saved(&bytes)
        .map_err(|reason| Error::CorruptSavedConfig { path, reason })?;
    if let Some(prev) = &req.conf.prev_result {
        let mut prev = prev.clone();
        let saved_version = config
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let prev_version = prev
            .get("cniVersion")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_string();
        let major_1 = |v: &str| version::compare(v, "1.0.0").is_ok_and(|o| o != Ordering::Less);
        if saved_version != prev_version && major_1(&saved_version) && major_1(&prev_version) {
            prev.insert("cniVersion".into(), Value::String(saved_version));
        }
        fill_route_gateways(&mut prev);
        config.insert("prevResult".into(), Value::Object(prev));
    }
    let plugin = exec::find(&plugin_type, &req.env.path)?;
    exec::run(&plugin, "CHECK", &[], &delegate::to_bytes(&config))?;
    Ok(())
}

/// Gives every gateway-less route the gateway of the first address of its
/// family, as `ipam.ConfigureIface` does when it installs the route.
fn fill_route_gateways(result: &mut Map<String, Value>) {
    let gateway = |v4: bool| -> Option<String> {
        result.get("ips")?.as_array()?.iter().find_map(|ip| {
            let gw = ip.get("gateway")?.as_str()?;
            (gw.parse::<IpAddr>().ok()?.is_ipv4() == v4).then(|| gw.to_string())
        })
    };
    let (gw4, gw6) = (gateway(true), gateway(false));
    let Some(Value::Array(routes)) = result.get_mut("routes") else {
        return;
    };
    for route in routes.iter_mut().filter_map(Value::as_object_mut) {
        if route
            .get("gw")
            .and_then(Value::as_str)
            .is_some_and(|g| !g.is_empty())
        {
            continue;
        }
        let Some(dst) = route.get("dst").and_then(Value::as_str) else {
            continue;
        };
        let v4 = !dst.contains(':');
        if let Some(gw) = if v4 { &gw4 } else { &gw6 } {
            route.insert("gw".into(), Value::String(gw.clone()));
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn gateway_less_routes_get_their_family_gateway() {
        let mut r = json!({"ips": [{"address": "10.244.7.2/24", "gateway": "10.244.7.1"}, {"address": "fd00::2/64", "gateway": "fd00::1"}],
                           "routes": [{"dst": "10.244.0.0/16"}, {"dst": "fd00::/48"}, {"dst": "0.0.0.0/0", "gw": "10.244.7.254"}]});
        let obj = r.as_object_mut().expect("object");
        fill_route_gateways(obj);
        assert_eq!(
            obj["routes"],
            json!([{"dst": "10.244.0.0/16", "gw": "10.244.7.1"}, {"dst": "fd00::/48", "gw": "fd00::1"}, {"dst": "0.0.0.0/0", "gw": "10.244.7.254"}])
        );
        let mut none = json!({"routes": [{"dst": "10.0.0.0/8"}]});
        fill_route_gateways(none.as_object_mut().expect("object"));
        assert_eq!(none, json!({"routes": [{"dst": "10.0.0.0/8"}]}));
    }
}
