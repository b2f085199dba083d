//! Routed mode (`"mode": "routed"`) driven by cnitool and by direct exec
//! (root only). weftd's IPAM API is played by a small in-test server that
//! speaks the same line protocol (the real daemon is exercised end to end in
//! the workspace's tests/routed.rs); here the point is the plugin: the
//! netlink datapath, CHECK after tampering, DEL idempotency, rollback,
//! GC and STATUS.

mod common;

use common::fake_ipam::FakeIpam;
use common::{Netns, World};
use serde_json::{Value, json};
use weft_testenv::require_root;

fn routed_conf(w: &World, cni_version: &str) -> Value {
    let mut c = w.net_conf(cni_version);
    c["mode"] = json!("routed");
    c
}

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("json")
}

/// The host-side weft veths in the node namespace.
fn host_veths(w: &World) -> Vec<String> {
    w.host
        .sh("ip -o link show")
        .lines()
        .filter_map(|l| l.split(": ").nth(1))
        .map(|n| n.split('@').next().unwrap_or(n).to_string())
        .filter(|n| n.starts_with("weft"))
        .collect()
}

/// cnitool ADD → CHECK → tamper → CHECK fails → DEL ×2, with portmap chained.
#[test]
fn cnitool_add_check_del() {
    require_root!();
    let w = World::new("rt", 61);
    w.write_subnet_env();
    let ipam = FakeIpam::start(&w);
    let mut list = json!({"name": "cbr0", "cniVersion": "1.0.0",
        "plugins": [w.plugin_conf(), {"type": "portmap", "capabilities": {"portMappings": true}}]});
    list["plugins"][0]["mode"] = json!("routed");
    std::fs::write(w.path("net.d/10-flannel.conflist"), bytes(&list)).expect("conflist");
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let r = w.cnitool(&["add", "cbr0", &pod.path()]).ok();
    assert_eq!(r["cniVersion"], "1.0.0");
    assert_eq!(r["ips"][0]["address"], "10.244.61.2/32", "{r}");
    assert_eq!(r["ips"][0]["gateway"], "169.254.1.1");
    assert_eq!(r["interfaces"][1]["sandbox"], pod.path());
    let host = r["interfaces"][0]["name"]
        .as_str()
        .expect("host veth")
        .to_string();
    assert_eq!(host_veths(&w), vec![host.clone()]);
    assert!(
        pod.sh("ip -4 -o addr show dev eth0")
            .contains("10.244.61.2/32")
    );
    assert!(pod.sh("ip neigh show 169.254.1.1").contains("PERMANENT"));
    let mtu = pod.sh("cat /sys/class/net/eth0/mtu");
    assert_eq!(mtu.trim(), "1450", "MTU from subnet.env");
    assert_eq!(
        w.host.sh("ip route show 10.244.61.2").trim(),
        format!("10.244.61.2 dev {host} scope link")
    );
    assert_eq!(
        w.host.sh("cat /proc/sys/net/ipv4/ip_forward").trim(),
        "1",
        "forwarding on in the node"
    );
    // The pod reaches an address of the node through the link-local gateway
    // (and the reply finds the pod by its /32 route).
    w.host.sh("ip addr add 192.0.2.77/32 dev lo");
    assert!(pod.try_sh("ping -c 1 -W 5 192.0.2.77"));
    w.host.sh("ip addr del 192.0.2.77/32 dev lo");

    w.cnitool(&["check", "cbr0", &pod.path()]).ok();
    w.host.sh("ip route del 10.244.61.2");
    let e = w.cnitool(&["check", "cbr0", &pod.path()]);
    assert_ne!(e.code, 0);
    assert!(
        e.stdout.contains("host has no route 10.244.61.2/32")
            || e.stderr.contains("host has no route"),
        "{e:?}"
    );

    w.cnitool(&["del", "cbr0", &pod.path()]).ok();
    w.cnitool(&["del", "cbr0", &pod.path()]).ok();
    assert!(host_veths(&w).is_empty());
    assert!(ipam.held().is_empty());
    assert!(!pod.try_sh("ip link show eth0"));
}

/// STATUS 50 until the API answers; a failed ADD rolls back and reports the
/// failure; DEL without a netns; GC; DEL with the API down fails with 11.
#[test]
fn status_rollback_gc_and_del_errors() {
    require_root!();
    let w = World::new("rs", 62);
    w.write_subnet_env();
    let conf = bytes(&routed_conf(&w, "1.1.0"));
    let e = w.plugin("STATUS", &[], &conf).cni_error();
    assert_eq!(e["code"], 50);
    assert!(e["msg"].as_str().unwrap_or("").contains("weft.sock"), "{e}");
    let ipam = FakeIpam::start(&w);
    assert_eq!(w.plugin("STATUS", &[], &conf).ok(), Value::Null);

    // eth0 already exists in the pod: error 103, nothing left behind.
    let busy = Netns::new(&format!("{}-busy", w.tag));
    busy.sh("ip link add eth0 type veth peer name other");
    let path = busy.path();
    let e = w
        .plugin("ADD", &World::attach_vars("rb-1", "eth0", &path), &conf)
        .cni_error();
    assert_eq!(e["code"], 103, "{e}");
    assert_eq!(
        e["msg"],
        "container veth name provided (eth0) already exists"
    );
    assert!(
        ipam.held().is_empty(),
        "the address was released: {:?}",
        ipam.held()
    );
    assert!(host_veths(&w).is_empty());
    // A netns that does not exist: error, nothing allocated.
    let e = w
        .plugin(
            "ADD",
            &World::attach_vars("rb-2", "eth0", "/var/run/netns/wt-nope-x"),
            &conf,
        )
        .cni_error();
    assert_eq!(e["code"], 5, "{e}");
    assert!(ipam.held().is_empty());

    // Three pods; GC keeps only the listed one.
    let pods: Vec<Netns> = (0..3)
        .map(|i| Netns::new(&format!("{}-p{i}", w.tag)))
        .collect();
    for (i, p) in pods.iter().enumerate() {
        let path = p.path();
        let r = w
            .plugin(
                "ADD",
                &World::attach_vars(&format!("g{i}"), "eth0", &path),
                &conf,
            )
            .ok();
        assert_eq!(r["cniVersion"], "1.1.0");
        assert_eq!(r["interfaces"][1]["mtu"], 1450);
    }
    assert_eq!(host_veths(&w).len(), 3);
    let mut gc = routed_conf(&w, "1.1.0");
    gc["cni.dev/valid-attachments"] = json!([{"containerID": "g1", "ifname": "eth0"}]);
    assert_eq!(w.plugin("GC", &[], &bytes(&gc)).ok(), Value::Null);
    assert_eq!(
        ipam.held()
            .into_iter()
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        vec!["g1"]
    );
    assert_eq!(host_veths(&w).len(), 1);
    assert!(
        !pods[0].try_sh("ip link show eth0"),
        "stale pod's interface removed"
    );
    let p1 = pods[1].path();
    w.plugin("CHECK", &World::attach_vars("g1", "eth0", &p1), &conf)
        .ok();

    // DEL with an empty CNI_NETNS still cleans up.
    let vars = [("CNI_CONTAINERID", "g1"), ("CNI_IFNAME", "eth0")];
    w.plugin("DEL", &vars, &conf).ok();
    assert!(ipam.held().is_empty() && host_veths(&w).is_empty());

    // The API is down: DEL reports "try again later" rather than leaking.
    drop(ipam);
    let e = w.plugin("DEL", &vars, &conf).cni_error();
    assert_eq!(e["code"], 11, "{e}");
    let e = w
        .plugin("ADD", &World::attach_vars("g9", "eth0", &p1), &conf)
        .cni_error();
    assert_eq!(e["code"], 11, "{e}");
    assert!(host_veths(&w).is_empty());
}
