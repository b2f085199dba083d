//! The plugin driven by the real CNI runtime client (`cnitool`, libcni 1.1.2)
//! with the real bridge, host-local and portmap plugins, in throwaway
//! namespaces (root only). See `common` for the isolation. The version
//! table runs every CNI version the plugin claims, in both modes; 1.1.0 goes
//! to the plugin directly, as libcni 1.1.2 cannot read 1.1.0 results.

mod common;

use common::fake_ipam::FakeIpam;
use common::{Netns, Run, World, in_subnet, result_ip};
use serde_json::{Value, json};
use weft_testenv::require_root;

/// ADD gives the pod an address in FLANNEL_SUBNET, a route to the flannel
/// network and a reachable gateway; CHECK passes (and fails once the route
/// is gone); DEL removes everything and a second DEL succeeds.
#[test]
fn lifecycle_add_check_del_with_cnitool() {
    require_root!();
    let w = World::new("life", 31);
    w.write_subnet_env();
    w.write_conflist("1.0.0");
    let pod = Netns::new(&format!("{}-pod", w.tag));

    let result = w.cnitool(&["add", "cbr0", &pod.path()]).ok();
    assert_eq!(result["cniVersion"], "1.0.0", "{result}");
    let ip = result_ip(&result);
    assert!(in_subnet(&ip, w.n), "{ip} not in {}", w.subnet());
    assert_eq!(result["ips"][0]["gateway"], w.gateway().as_str());

    // The pod side: address, MTU from subnet.env, routes to the flannel
    // network and default via cni0.
    let addrs = pod.sh("ip -4 -o addr show dev eth0");
    assert!(addrs.contains(&format!("{ip}/24")), "{addrs}");
    assert!(pod.sh("ip -o link show dev eth0").contains("mtu 1450"));
    let routes = pod.sh("ip -4 route show");
    assert!(
        routes.contains(&format!("10.244.0.0/16 via {} dev eth0", w.gateway())),
        "{routes}"
    );
    assert!(
        routes.contains(&format!("default via {} dev eth0", w.gateway())),
        "{routes}"
    );
    // The host side: cni0 owns the gateway address and answers ping.
    assert!(
        w.host
            .sh("ip -4 -o addr show dev cni0")
            .contains(&format!("{}/24", w.gateway()))
    );
    assert!(
        pod.try_sh(&format!("ping -c 1 -W 5 {}", w.gateway())),
        "gateway does not answer ping"
    );
    assert_eq!(w.leases(), vec![ip.clone()]);
    let saved = w.saved();
    assert_eq!(saved.len(), 1, "{saved:?}");
    let delegate: serde_json::Value = serde_json::from_slice(
        &std::fs::read(w.path("flannel").join(&saved[0])).expect("read saved"),
    )
    .expect("json");
    assert_eq!(delegate["type"], "bridge");
    assert_eq!(
        delegate["ipam"]["ranges"][0][0]["subnet"],
        w.subnet().as_str()
    );

    // libcni cached the result in the private /var/lib, not the machine's.
    let cached: Vec<_> = std::fs::read_dir(w.path("varlib/cni/results"))
        .expect("cache dir")
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(cached.len(), 1);
    let machine_cache = std::path::Path::new("/var/lib/cni/results").join(&cached[0]);
    assert!(!machine_cache.exists(), "cnitool wrote the machine's cache");

    w.cnitool(&["check", "cbr0", &pod.path()]).ok();

    // CHECK must notice a missing route.
    pod.sh("ip route del 10.244.0.0/16");
    let broken = w.cnitool(&["check", "cbr0", &pod.path()]);
    assert_ne!(
        broken.code, 0,
        "CHECK passed with the flannel route gone: {}",
        broken.stdout
    );
    pod.sh(&format!(
        "ip route add 10.244.0.0/16 via {} dev eth0",
        w.gateway()
    ));
    w.cnitool(&["check", "cbr0", &pod.path()]).ok();

    w.cnitool(&["del", "cbr0", &pod.path()]).ok();
    assert!(
        !pod.try_sh("ip link show dev eth0"),
        "eth0 still in the pod"
    );
    assert!(w.leases().is_empty(), "lease left: {:?}", w.leases());
    assert!(w.saved().is_empty(), "saved config left: {:?}", w.saved());
    let host_links = w.host.sh("ip -o link show type veth");
    assert!(
        host_links.trim().is_empty(),
        "veth left on the host: {host_links}"
    );
    assert_eq!(
        std::fs::read_dir(w.path("varlib/cni/results"))
            .expect("cache dir")
            .count(),
        0
    );

    w.cnitool(&["del", "cbr0", &pod.path()]).ok();
    // DEL after the namespace is gone succeeds as well.
    let path = pod.path();
    drop(pod);
    w.cnitool(&["del", "cbr0", &path]).ok();
}

/// How a row's network reaches the plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Driver {
    /// cnitool with kube-flannel's conflist (flannel, then portmap).
    Conflist,
    /// cnitool with a single-plugin `.conf`: before 0.3.0 there is no
    /// chaining (portmap needs a prevResult), so old configs are single files.
    Conf,
    /// The plugin run directly, as a runtime would: cnitool's libcni 1.1.2
    /// has no 1.1.0 result type ("unsupported CNI result version").
    Exec,
}

/// One row per version the plugin claims (`weft_cni::version::SUPPORTED`,
/// plus a config without `cniVersion`, which CNI reads as 0.1.0).
struct Case {
    /// The network's `cniVersion` (`""`: the key is left out).
    version: &'static str,
    driver: Driver,
}

const CASES: &[Case] = &[
    Case {
        version: "",
        driver: Driver::Conf,
    },
    Case {
        version: "0.1.0",
        driver: Driver::Conf,
    },
    Case {
        version: "0.2.0",
        driver: Driver::Conf,
    },
    Case {
        version: "0.3.0",
        driver: Driver::Conflist,
    },
    Case {
        version: "0.3.1",
        driver: Driver::Conflist,
    },
    Case {
        version: "0.4.0",
        driver: Driver::Conflist,
    },
    Case {
        version: "1.0.0",
        driver: Driver::Conflist,
    },
    Case {
        version: "1.1.0",
        driver: Driver::Exec,
    },
];

/// The plugin's two modes: flannel's bridge delegation, and routed (a /32
/// on a veth, addresses from weftd's IPAM API, played by [`FakeIpam`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    Bridge,
    Routed,
}

/// The result shapes of the CNI versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    /// 0.1.0/0.2.0: `ip4`/`ip6` objects with `ip`, `gateway`, `routes`.
    Legacy,
    /// 0.3.x/0.4.0: `interfaces`, and `ips` with a `version` field.
    Ips03,
    /// 1.x: `interfaces`, and `ips` without `version`.
    Ips1,
}

// === impl Case ===

impl Case {
    fn label(&self) -> &'static str {
        if self.version.is_empty() {
            "no cniVersion"
        } else {
            self.version
        }
    }

    fn shape(&self) -> Shape {
        match self.version {
            "" | "0.1.0" | "0.2.0" => Shape::Legacy,
            "0.3.0" | "0.3.1" | "0.4.0" => Shape::Ips03,
            _ => Shape::Ips1,
        }
    }

    /// The `cniVersion` the result carries: the network's (CNI reads a
    /// missing one as 0.1.0, and so does the delegate).
    fn result_version(&self) -> &'static str {
        if self.version.is_empty() {
            "0.1.0"
        } else {
            self.version
        }
    }

    /// CHECK exists from 0.4.0 on.
    fn has_check(&self) -> bool {
        matches!(self.version, "0.4.0" | "1.0.0" | "1.1.0")
    }

    /// The flannel plugin's entry for `mode`.
    fn plugin_conf(&self, w: &World, mode: Mode) -> Value {
        let mut c = w.plugin_conf();
        if mode == Mode::Routed {
            c["mode"] = json!("routed");
        }
        c
    }

    /// The network config as the plugin receives it (or a `.conf` holds it).
    fn net_conf(&self, w: &World, mode: Mode) -> Value {
        let mut c = self.plugin_conf(w, mode);
        c["name"] = json!("cbr0");
        if !self.version.is_empty() {
            c["cniVersion"] = json!(self.version);
        }
        c
    }

    /// Writes the network config cnitool reads (nothing for [`Driver::Exec`]).
    fn write(&self, w: &World, mode: Mode) {
        let (file, conf) = match self.driver {
            Driver::Exec => return,
            Driver::Conf => ("10-flannel.conf", self.net_conf(w, mode)),
            Driver::Conflist => (
                "10-flannel.conflist",
                json!({"name": "cbr0", "cniVersion": self.version, "plugins": [
                    self.plugin_conf(w, mode),
                    {"type": "portmap", "capabilities": {"portMappings": true}}]}),
            ),
        };
        let bytes = serde_json::to_vec_pretty(&conf).expect("json");
        std::fs::write(w.path("net.d").join(file), bytes).expect("write config");
    }

    /// Runs `verb` (add, check, del) for the pod at `netns`; `prev` is the
    /// ADD result (a runtime sends it on CHECK, and on DEL from 0.4.0 on).
    fn run(&self, w: &World, mode: Mode, verb: &str, netns: &str, prev: Option<&Value>) -> Run {
        if self.driver != Driver::Exec {
            return w.cnitool(&[verb, "cbr0", netns]);
        }
        let mut conf = self.net_conf(w, mode);
        if let Some(prev) = prev.filter(|_| verb != "add") {
            conf["prevResult"] = prev.clone();
        }
        let vars = World::attach_vars("exec-pod", "eth0", netns);
        let bytes = serde_json::to_vec(&conf).expect("json");
        w.plugin(&verb.to_uppercase(), &vars, &bytes)
    }
}

/// Runs every row in `mode` (one after another, each on its own node
/// subnet) and reports every failing version, not only the first.
fn every_version(mode: Mode, first_n: u8) {
    let failed: Vec<&str> = CASES
        .iter()
        .zip(first_n..)
        .filter(|(case, n)| {
            std::panic::catch_unwind(|| version_round_trip(case, mode, *n)).is_err()
        })
        .map(|(case, _)| case.label())
        .collect();
    assert!(
        failed.is_empty(),
        "{mode:?} mode fails at {failed:?} (see the panics above)"
    );
}

/// Every claimed version end to end in bridge mode (the delegate's result
/// passed through): ADD gives a result of that version's shape with
/// `cniVersion` echoed and the pod its address, CHECK (0.4.0 on) passes,
/// DEL frees the address, the saved config and the veth, and a second DEL
/// succeeds.
#[test]
fn every_cni_version_bridge() {
    require_root!();
    every_version(Mode::Bridge, 40);
}

/// The same in routed mode, where the plugin builds the result itself.
#[test]
fn every_cni_version_routed() {
    require_root!();
    every_version(Mode::Routed, 50);
}

fn version_round_trip(case: &Case, mode: Mode, n: u8) {
    let v = case.label();
    let w = World::new(&format!("v{n}"), n);
    w.write_subnet_env();
    let ipam = (mode == Mode::Routed).then(|| FakeIpam::start(&w));
    case.write(&w, mode);
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let netns = pod.path();
    // Bridge: host-local's address under cni0 and a route to the flannel
    // network; routed: a /32 with the link-local gateway as default route.
    let (prefix, gateway, route) = match mode {
        Mode::Bridge => (24, w.gateway(), "10.244.0.0/16".to_string()),
        Mode::Routed => (32, "169.254.1.1".to_string(), "0.0.0.0/0".to_string()),
    };

    let result = case.run(&w, mode, "add", &netns, None).ok();
    assert_eq!(result["cniVersion"], case.result_version(), "{v}: {result}");
    let has_route = |routes: &Value| {
        routes
            .as_array()
            .is_some_and(|rs| rs.iter().any(|r| r["dst"] == route.as_str()))
    };
    let (cidr, gw) = match case.shape() {
        Shape::Legacy => {
            for key in ["ips", "interfaces", "ip6"] {
                assert!(result.get(key).is_none(), "{v}: {key} in {result}");
            }
            let ip4 = &result["ip4"];
            assert!(has_route(&ip4["routes"]), "{v}: no {route} in {result}");
            (ip4["ip"].clone(), ip4["gateway"].clone())
        }
        shape @ (Shape::Ips03 | Shape::Ips1) => {
            assert!(result.get("ip4").is_none(), "{v}: ip4 in {result}");
            let ips = result["ips"].as_array().expect("ips");
            assert_eq!(ips.len(), 1, "{v}: {result}");
            let ip = &ips[0];
            if shape == Shape::Ips03 {
                assert_eq!(ip["version"], "4", "{v}: {result}");
            } else {
                assert!(ip.get("version").is_none(), "{v}: {result}");
            }
            // `interface` indexes the pod's eth0 in `interfaces`.
            let idx = ip["interface"].as_u64().expect("ips[0].interface");
            let iface = &result["interfaces"][idx as usize];
            assert_eq!(iface["name"], "eth0", "{v}: {result}");
            assert_eq!(iface["sandbox"], netns.as_str(), "{v}: {result}");
            assert!(has_route(&result["routes"]), "{v}: no {route} in {result}");
            (ip["address"].clone(), ip["gateway"].clone())
        }
    };
    assert_eq!(gw, gateway.as_str(), "{v}: {result}");
    let cidr = cidr.as_str().expect("address");
    let ip = cidr.strip_suffix(&format!("/{prefix}")).unwrap_or_else(|| {
        panic!("{v}: {cidr} is not a /{prefix}");
    });
    assert!(in_subnet(ip, w.n), "{v}: {ip} not in {}", w.subnet());
    let addrs = pod.sh("ip -4 -o addr show dev eth0");
    assert!(addrs.contains(cidr), "{v}: the pod has no {cidr}: {addrs}");
    match &ipam {
        None => {
            assert_eq!(w.leases(), vec![ip.to_string()], "{v}");
            // The delegate got the network's version (a 1.1.0 network:
            // the newest its delegate speaks).
            let saved = w.saved();
            assert_eq!(saved.len(), 1, "{v}: {saved:?}");
            let delegate: Value = serde_json::from_slice(
                &std::fs::read(w.path("flannel").join(&saved[0])).expect("read saved"),
            )
            .expect("json");
            let delegate_version = match case.version {
                "" => None,
                "1.1.0" => Some("1.0.0"),
                other => Some(other),
            };
            assert_eq!(
                delegate.get("cniVersion").and_then(Value::as_str),
                delegate_version,
                "{v}: {delegate}"
            );
        }
        Some(ipam) => {
            let held: Vec<String> = ipam.held().into_iter().map(|(_, ip)| ip).collect();
            assert_eq!(held, vec![ip.to_string()], "{v}");
        }
    }

    if case.has_check() {
        case.run(&w, mode, "check", &netns, Some(&result)).ok();
    }

    case.run(&w, mode, "del", &netns, Some(&result)).ok();
    assert!(
        !pod.try_sh("ip link show dev eth0"),
        "{v}: eth0 still in the pod"
    );
    assert!(w.leases().is_empty(), "{v}: lease left: {:?}", w.leases());
    assert!(
        w.saved().is_empty(),
        "{v}: saved config left: {:?}",
        w.saved()
    );
    if let Some(ipam) = &ipam {
        assert!(
            ipam.held().is_empty(),
            "{v}: allocation left: {:?}",
            ipam.held()
        );
    }
    let veths = w.host.sh("ip -o link show type veth");
    assert!(
        veths.trim().is_empty(),
        "{v}: veth left on the host: {veths}"
    );
    case.run(&w, mode, "del", &netns, Some(&result)).ok();
}

/// 64 parallel ADDs give 64 distinct addresses; 64 parallel DELs free them all.
#[test]
fn parallel_64_add_then_64_del() {
    require_root!();
    const N: usize = 64;
    let w = World::new("par", 33);
    w.write_subnet_env();
    w.write_conflist("1.0.0");
    let pods: Vec<Netns> = (0..N)
        .map(|i| Netns::new(&format!("{}-p{i}", w.tag)))
        .collect();

    let results: Vec<common::Run> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| s.spawn(|| w.cnitool(&["add", "cbr0", &p.path()])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    let mut ips: Vec<String> = results.iter().map(|r| result_ip(&r.ok())).collect();
    for ip in &ips {
        assert!(in_subnet(ip, w.n), "{ip}");
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), N, "addresses are not distinct");
    assert_eq!(w.leases().len(), N);
    assert_eq!(w.saved().len(), N);
    // Each pod really has its address.
    for (pod, r) in pods.iter().zip(&results) {
        let ip = result_ip(&r.ok());
        assert!(
            pod.sh("ip -4 -o addr show dev eth0")
                .contains(&format!("{ip}/24"))
        );
    }

    let dels: Vec<common::Run> = std::thread::scope(|s| {
        let handles: Vec<_> = pods
            .iter()
            .map(|p| s.spawn(|| w.cnitool(&["del", "cbr0", &p.path()])))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    });
    for d in &dels {
        d.ok();
    }
    assert!(w.leases().is_empty(), "leases left: {:?}", w.leases());
    assert!(w.saved().is_empty(), "saved configs left: {:?}", w.saved());
    let veths = w.host.sh("ip -o link show type veth");
    assert!(veths.trim().is_empty(), "veths left: {veths}");
}
