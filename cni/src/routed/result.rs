//! The ADD result in the network's `cniVersion`: 1.x (1.1.0 adds the
//! interfaces' MTU), 0.3.x/0.4.0 (`ips[].version`), or the legacy 0.1/0.2
//! `ip4`/`ip6` shape. Addresses are /32 and /128, the gateway is the
//! link-local one, and the routes are the default routes via it.

use std::net::IpAddr;

use serde_json::{Map, Value, json};

use super::datapath::{Attached, gateway};
use super::nl::{fmt_mac, max_prefix};
use crate::version;

/// The result bytes for `cni_version`.
pub fn build(
    cni_version: &str,
    a: &Attached,
    ifname: &str,
    netns: &str,
    ips: &[IpAddr],
    mtu: u32,
) -> Vec<u8> {
    let v = version::effective(cni_version);
    let default = |ip: &IpAddr| if ip.is_ipv4() { "0.0.0.0/0" } else { "::/0" };
    let value = if v == "0.1.0" || v == "0.2.0" {
        let mut obj = Map::new();
        obj.insert("cniVersion".into(), json!(v));
        for ip in ips {
            let key = if ip.is_ipv4() { "ip4" } else { "ip6" };
            obj.insert(
                key.into(),
                json!({"ip": format!("{ip}/{}", max_prefix(*ip)), "gateway": gateway(*ip).to_string(),
                       "routes": [{"dst": default(ip), "gw": gateway(*ip).to_string()}]}),
            );
        }
        obj.insert("dns".into(), json!({}));
        Value::Object(obj)
    } else {
        let pre_1 = v.starts_with("0.");
        let mut host = json!({"name": a.host_name, "mac": fmt_mac(&a.host_mac)});
        let mut pod = json!({"name": ifname, "mac": fmt_mac(&a.pod_mac), "sandbox": netns});
        if v == version::CURRENT {
            host["mtu"] = json!(mtu);
            pod["mtu"] = json!(mtu);
        }
        let addrs: Vec<Value> = ips
            .iter()
            .map(|ip| {
                let mut e = json!({"interface": 1, "address": format!("{ip}/{}", max_prefix(*ip)), "gateway": gateway(*ip).to_string()});
                if pre_1 {
                    e["version"] = json!(if ip.is_ipv4() { "4" } else { "6" });
                }
                e
            })
            .collect();
        let routes: Vec<Value> = ips
            .iter()
            .map(|ip| json!({"dst": default(ip), "gw": gateway(*ip).to_string()}))
            .collect();
        json!({"cniVersion": v, "interfaces": [host, pod], "ips": addrs, "routes": routes, "dns": {}})
    };
    let mut out = serde_json::to_vec(&value).unwrap_or_default();
    out.push(b'\n');
    out
}

/// The addresses listed in a result (`prevResult`), any version.
pub fn addresses(result: &Map<String, Value>) -> Vec<IpAddr> {
    let mut out = Vec::new();
    let mut push = |s: Option<&str>| {
        if let Some(ip) = s
            .and_then(|s| s.split('/').next())
            .and_then(|s| s.parse().ok())
        {
            out.push(ip);
        }
    };
    if let Some(Value::Array(ips)) = result.get("ips") {
        for e in ips {
            push(e.get("address").and_then(Value::as_str));
        }
    }
    for key in ["ip4", "ip6"] {
        push(
            result
                .get(key)
                .and_then(|o| o.get("ip"))
                .and_then(Value::as_str),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attached() -> Attached {
        Attached {
            host_name: "weft0123456789a".into(),
            host_mac: vec![2, 0, 0, 0, 0, 1],
            pod_mac: vec![2, 0, 0, 0, 0, 2],
        }
    }

    #[test]
    fn results_per_version() {
        let ips: Vec<IpAddr> = vec![
            "10.244.1.5".parse().expect("ip"),
            "fd00::5".parse().expect("ip"),
        ];
        let r: Value = serde_json::from_slice(&build(
            "1.0.0",
            &attached(),
            "eth0",
            "/var/run/netns/p",
            &ips,
            1450,
        ))
        .expect("json");
        assert_eq!(
            r,
            json!({"cniVersion": "1.0.0",
                   "interfaces": [{"name": "weft0123456789a", "mac": "02:00:00:00:00:01"},
                                  {"name": "eth0", "mac": "02:00:00:00:00:02", "sandbox": "/var/run/netns/p"}],
                   "ips": [{"interface": 1, "address": "10.244.1.5/32", "gateway": "169.254.1.1"},
                           {"interface": 1, "address": "fd00::5/128", "gateway": "fe80::1"}],
                   "routes": [{"dst": "0.0.0.0/0", "gw": "169.254.1.1"}, {"dst": "::/0", "gw": "fe80::1"}],
                   "dns": {}})
        );
        let r: Value =
            serde_json::from_slice(&build("0.3.1", &attached(), "eth0", "/p", &ips[..1], 1450))
                .expect("json");
        assert_eq!(r["ips"][0]["version"], "4");
        assert_eq!(r["cniVersion"], "0.3.1");
        let r: Value =
            serde_json::from_slice(&build("1.1.0", &attached(), "eth0", "/p", &ips[..1], 1450))
                .expect("json");
        assert_eq!(r["interfaces"][1]["mtu"], 1450);
        let r: Value = serde_json::from_slice(&build("", &attached(), "eth0", "/p", &ips, 1450))
            .expect("json");
        assert_eq!(r["cniVersion"], "0.1.0");
        assert_eq!(r["ip4"]["ip"], "10.244.1.5/32");
        assert_eq!(r["ip6"]["gateway"], "fe80::1");
        let back = addresses(r.as_object().expect("object"));
        assert_eq!(back, ips);
    }
}
