//! The plugin run directly, as a runtime's exec would (root only): the CNI
//! 1.1 verbs cnitool 1.1.2 lacks (GC, STATUS, a 1.1.0 network), flannel's
//! error texts and malformed input. Real bridge + host-local delegates.

mod common;

use common::{Netns, World, in_subnet, result_ip};
use serde_json::{Value, json};
use weft_testenv::require_root;

fn bytes(v: &Value) -> Vec<u8> {
    serde_json::to_vec(v).expect("json")
}

/// GC releases exactly the attachments that are not listed as valid, under
/// either key, and leaves the valid pods working.
#[test]
fn gc_removes_only_stale_attachments() {
    require_root!();
    let w = World::new("gc", 41);
    w.write_subnet_env();
    let conf = w.net_conf("1.1.0");
    let pods: Vec<Netns> = (0..4)
        .map(|i| Netns::new(&format!("{}-p{i}", w.tag)))
        .collect();
    let ids = ["gc-a", "gc-b", "gc-c", "gc-d"];
    let ifnames = ["eth0", "eth0", "net1", "eth0"];
    let mut ips = Vec::new();
    for ((id, ifname), pod) in ids.iter().zip(ifnames).zip(&pods) {
        let path = pod.path();
        let r = w
            .plugin("ADD", &World::attach_vars(id, ifname, &path), &bytes(&conf))
            .ok();
        assert_eq!(
            r["cniVersion"], "1.1.0",
            "result relabelled to the network's version: {r}"
        );
        ips.push(result_ip(&r));
    }
    assert_eq!(w.saved(), ids.to_vec());
    assert_eq!(w.leases().len(), 4);

    // 1: valid-attachments lists a, b and c (c with its real ifname), but d
    //    only under a different ifname: d is stale.
    let mut gc = conf.clone();
    gc["cni.dev/valid-attachments"] = json!([
        {"containerID": "gc-a", "ifname": "eth0"}, {"containerID": "gc-b", "ifname": "eth0"},
        {"containerID": "gc-c", "ifname": "net1"}, {"containerID": "gc-d", "ifname": "eth9"}
    ]);
    let out = w.plugin("GC", &[], &bytes(&gc));
    assert_eq!(out.ok(), Value::Null, "GC prints nothing on success");
    assert_eq!(w.saved(), vec!["gc-a", "gc-b", "gc-c"]);
    let mut expect: Vec<String> = ips[..3].to_vec();
    expect.sort();
    assert_eq!(w.leases(), expect, "d's address released");

    // 2: the older key alone (spec-v1.1.0 text) lists only a.
    let mut gc = conf.clone();
    gc["cni.dev/attachments"] = json!([{"containerID": "gc-a", "ifname": "eth0"}]);
    w.plugin("GC", &[], &bytes(&gc)).ok();
    assert_eq!(w.saved(), vec!["gc-a"]);
    assert_eq!(w.leases(), vec![ips[0].clone()]);

    // The valid pod still works and can still be deleted normally.
    assert!(pods[0].try_sh(&format!("ping -c 1 -W 5 {}", w.gateway())));
    let path = pods[0].path();
    w.plugin(
        "DEL",
        &World::attach_vars("gc-a", "eth0", &path),
        &bytes(&conf),
    )
    .ok();
    assert!(w.saved().is_empty() && w.leases().is_empty());
    // GC on an empty node, and with a malformed list.
    w.plugin("GC", &[], &bytes(&conf)).ok();
    let mut bad = conf.clone();
    bad["cni.dev/valid-attachments"] = json!({"containerID": "x"});
    assert_eq!(w.plugin("GC", &[], &bytes(&bad)).cni_error()["code"], 6);
    // GC needs a 1.1.0 network.
    let e = w
        .plugin("GC", &[], &bytes(&w.net_conf("1.0.0")))
        .cni_error();
    assert_eq!(
        (e["code"].as_u64(), e["msg"].as_str()),
        (Some(1), Some("config version does not allow GC"))
    );
}

/// STATUS fails with code 50 until subnet.env exists and parses, and while
/// the delegate is not installed; then it succeeds.
#[test]
fn status_before_and_after_subnet_env() {
    require_root!();
    let w = World::new("status", 42);
    let conf = bytes(&w.net_conf("1.1.0"));
    let e = w.plugin("STATUS", &[], &conf).cni_error();
    assert_eq!(e["code"], 50);
    let msg = e["msg"].as_str().unwrap_or_default();
    assert!(
        msg.contains("failed to load flannel 'subnet.env' file: open ")
            && msg.contains("no such file or directory"),
        "{msg}"
    );
    assert_eq!(e["cniVersion"], "1.1.0");

    std::fs::write(w.path("subnet.env"), "FLANNEL_NETWORK=10.244.0.0/16\n").expect("write");
    let e = w.plugin("STATUS", &[], &conf).cni_error();
    assert_eq!(e["code"], 50);
    assert!(
        e["msg"].as_str().unwrap_or_default().contains(
            "is missing FLANNEL_SUBNET, FLANNEL_IPV6_SUBNET, FLANNEL_MTU, FLANNEL_IPMASQ"
        ),
        "{e}"
    );

    w.write_subnet_env();
    assert_eq!(w.plugin("STATUS", &[], &conf).ok(), Value::Null);

    // A delegate that is not installed is "not ready" too.
    let mut other = w.net_conf("1.1.0");
    other["delegate"]["type"] = json!("no-such-plugin");
    let e = w.plugin("STATUS", &[], &bytes(&other)).cni_error();
    assert_eq!(e["code"], 50);
    assert!(
        e["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("failed to find plugin \"no-such-plugin\""),
        "{e}"
    );
}

/// A 1.1.0 network works end to end with pre-1.1 delegates: ADD (result
/// relabelled 1.1.0), CHECK with the 1.1.0 prevResult, DEL.
#[test]
fn cni_1_1_network_add_check_del() {
    require_root!();
    let w = World::new("v110", 43);
    w.write_subnet_env();
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let path = pod.path();
    let vars = World::attach_vars("v110-a", "eth0", &path);
    let mut conf = w.net_conf("1.1.0");
    let result = w.plugin("ADD", &vars, &bytes(&conf)).ok();
    assert_eq!(result["cniVersion"], "1.1.0");
    assert!(in_subnet(&result_ip(&result), w.n));
    let saved: Value =
        serde_json::from_slice(&std::fs::read(w.path("flannel/v110-a")).expect("saved"))
            .expect("json");
    assert_eq!(
        saved["cniVersion"], "1.0.0",
        "the delegate got the newest version it speaks"
    );

    conf["prevResult"] = result;
    w.plugin("CHECK", &vars, &bytes(&conf)).ok();
    // A second ADD of the same interface fails (bridge: already exists).
    let again = w
        .plugin("ADD", &vars, &bytes(&w.net_conf("1.1.0")))
        .cni_error();
    assert!(
        again["msg"]
            .as_str()
            .unwrap_or_default()
            .contains("already exists"),
        "{again}"
    );
    w.plugin("DEL", &vars, &bytes(&w.net_conf("1.1.0"))).ok();
    assert!(w.saved().is_empty() && w.leases().is_empty());
    // CHECK after the state is gone reports it.
    let e = w.plugin("CHECK", &vars, &bytes(&conf)).cni_error();
    assert_eq!(e["code"], 100);
}

/// Dual stack: one host-local range set per family, a route to each
/// flannel network, both gateways reachable; CHECK and DEL work.
#[test]
fn dual_stack_add_check_del() {
    require_root!();
    let w = World::new("dual", 49);
    w.write_subnet_env_dual();
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let path = pod.path();
    let vars = World::attach_vars("dual-a", "eth0", &path);
    let mut conf = w.net_conf("1.0.0");
    let result = w.plugin("ADD", &vars, &bytes(&conf)).ok();
    let addrs: Vec<&str> = result["ips"]
        .as_array()
        .expect("ips")
        .iter()
        .filter_map(|i| i["address"].as_str())
        .collect();
    assert_eq!(addrs.len(), 2, "{result}");
    assert!(
        in_subnet(addrs[0].split('/').next().unwrap_or_default(), w.n),
        "{addrs:?}"
    );
    assert!(
        addrs[1].starts_with("fd00:10:244:49::") && addrs[1].ends_with("/64"),
        "{addrs:?}"
    );
    let saved: Value =
        serde_json::from_slice(&std::fs::read(w.path("flannel/dual-a")).expect("saved"))
            .expect("json");
    assert_eq!(
        saved["ipam"]["ranges"],
        json!([[{"subnet": "10.244.49.0/24"}], [{"subnet": "fd00:10:244:49::/64"}]])
    );
    let routes6 = pod.sh("ip -6 route show");
    assert!(
        routes6.contains("fd00:10:244::/56 via fd00:10:244:49::1 dev eth0"),
        "{routes6}"
    );
    assert!(
        pod.sh("ip -4 route show")
            .contains("10.244.0.0/16 via 10.244.49.1 dev eth0")
    );
    assert!(pod.try_sh("ping -c 1 -W 5 10.244.49.1"));
    // cni0's IPv6 address may still be tentative (DAD) for a moment.
    assert!(
        pod.try_sh("ping -6 -c 1 -W 10 fd00:10:244:49::1"),
        "IPv6 gateway does not answer"
    );

    conf["prevResult"] = result;
    w.plugin("CHECK", &vars, &bytes(&conf)).ok();
    w.plugin("DEL", &vars, &bytes(&w.net_conf("1.0.0"))).ok();
    assert!(
        w.saved().is_empty() && w.leases().is_empty(),
        "{:?}",
        w.leases()
    );
    assert!(!pod.try_sh("ip link show dev eth0"));
}

/// DEL is idempotent: without a netns, with the netns gone, with a corrupt
/// or missing saved config.
#[test]
fn del_is_idempotent() {
    require_root!();
    let w = World::new("del", 44);
    w.write_subnet_env();
    let conf = bytes(&w.net_conf("1.0.0"));
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let path = pod.path();
    w.plugin("ADD", &World::attach_vars("del-a", "eth0", &path), &conf)
        .ok();
    drop(pod);
    // The netns is gone and the runtime sends no CNI_NETNS.
    w.plugin(
        "DEL",
        &[("CNI_CONTAINERID", "del-a"), ("CNI_IFNAME", "eth0")],
        &conf,
    )
    .ok();
    assert!(w.leases().is_empty() && w.saved().is_empty());
    w.plugin("DEL", &World::attach_vars("del-a", "eth0", &path), &conf)
        .ok();
    // A corrupt saved config is dropped.
    std::fs::write(w.path("flannel/del-b"), b"{not json").expect("write");
    w.plugin(
        "DEL",
        &[("CNI_CONTAINERID", "del-b"), ("CNI_IFNAME", "eth0")],
        &conf,
    )
    .ok();
    assert!(w.saved().is_empty());
    // No data dir at all.
    let mut elsewhere = w.net_conf("1.0.0");
    elsewhere["dataDir"] = json!(w.path("never-created"));
    w.plugin(
        "DEL",
        &[("CNI_CONTAINERID", "del-c"), ("CNI_IFNAME", "eth0")],
        &bytes(&elsewhere),
    )
    .ok();
    assert!(
        !w.path("never-created").exists(),
        "DEL must not create the data dir"
    );
}

/// ADD without subnet.env fails with flannel's text, and nothing is left.
#[test]
fn missing_subnet_env_gives_flannel_error() {
    require_root!();
    let w = World::new("nosub", 45);
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let path = pod.path();
    let e = w
        .plugin(
            "ADD",
            &World::attach_vars("nosub-a", "eth0", &path),
            &bytes(&w.net_conf("0.3.1")),
        )
        .cni_error();
    let file = w.path("subnet.env");
    assert_eq!(
        e["msg"],
        format!(
            "failed to load flannel 'subnet.env' file: open {}: no such file or directory. Check the flannel pod log for this node.",
            file.display()
        )
    );
    assert_eq!(e["code"], 11);
    assert_eq!(e["cniVersion"], "0.3.1");
    std::fs::write(
        &file,
        "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.45.1/24\n",
    )
    .expect("write");
    let e = w
        .plugin(
            "ADD",
            &World::attach_vars("nosub-a", "eth0", &path),
            &bytes(&w.net_conf("0.3.1")),
        )
        .cni_error();
    assert_eq!(
        e["msg"],
        format!(
            "failed to load flannel 'subnet.env' file: {} is missing FLANNEL_MTU, FLANNEL_IPMASQ. Check the flannel pod log for this node.",
            file.display()
        )
    );
    assert!(w.saved().is_empty() && w.leases().is_empty());
    assert!(!pod.try_sh("ip link show dev eth0"));
}

/// Malformed stdin and env give a CNI error (exit 1, JSON on stdout), never
/// a panic, for every verb.
#[test]
fn malformed_input_gives_cni_errors() {
    require_root!();
    let w = World::new("bad", 46);
    w.write_subnet_env();
    let deep = "[".repeat(100_000);
    let inputs: Vec<(&[u8], u64)> = vec![
        (b"", 6),
        (b"{", 6),
        (b"[]", 6),
        (b"null", 6),
        (b"\xff\xfe\x00garbage", 6),
        (deep.as_bytes(), 6),
        (br#"{"name":5}"#, 6),
        (br#"{"cniVersion":"1.1.0"}"#, 7),
        (br#"{"name":"bad name!","cniVersion":"1.1.0"}"#, 7),
        (br#"{"name":"n","cniVersion":"42.0.0"}"#, 1),
    ];
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let path = pod.path();
    let vars = World::attach_vars("bad-a", "eth0", &path);
    for verb in ["ADD", "DEL", "CHECK", "GC", "STATUS"] {
        for (input, code) in &inputs {
            let e = w.plugin(verb, &vars, input).cni_error();
            let expected = match (verb, *code) {
                // Version checks of CHECK/GC/STATUS compare against a minimum first.
                ("CHECK" | "GC" | "STATUS", 1) => 1,
                (_, c) => c,
            };
            assert_eq!(
                e["code"],
                expected,
                "{verb} {:?}: {e}",
                String::from_utf8_lossy(&input[..input.len().min(40)])
            );
        }
    }
    // flannel's own config checks.
    let mut c = w.net_conf("1.0.0");
    c["delegate"]["name"] = json!("x");
    let e = w.plugin("ADD", &vars, &bytes(&c)).cni_error();
    assert_eq!(
        (e["code"].as_u64(), e["msg"].as_str()),
        (
            Some(2),
            Some("'delegate' dictionary must not have 'name' field, it'll be set by flannel")
        )
    );
    let mut c = w.net_conf("1.0.0");
    c["delegate"]["ipam"] = json!({});
    let e = w.plugin("ADD", &vars, &bytes(&c)).cni_error();
    assert_eq!(
        e["msg"],
        "'delegate' dictionary must not have 'ipam' field, it'll be set by flannel"
    );
    // Env problems.
    let conf = bytes(&w.net_conf("1.0.0"));
    let e = w.plugin("ADD", &[], &conf).cni_error();
    assert_eq!(
        (e["code"].as_u64(), e["msg"].as_str()),
        (
            Some(4),
            Some("required env variables [CNI_CONTAINERID,CNI_NETNS,CNI_IFNAME] missing")
        )
    );
    let e = w
        .plugin("ADD", &World::attach_vars("../etc", "eth0", &path), &conf)
        .cni_error();
    assert_eq!(e["msg"], "invalid characters in containerID");
    let e = w
        .plugin(
            "ADD",
            &World::attach_vars("ok", "a-very-long-ifname", &path),
            &conf,
        )
        .cni_error();
    assert_eq!(e["msg"], "interface name is too long");
    let e = w.plugin("FROB", &[], &conf).cni_error();
    assert_eq!(
        (e["code"].as_u64(), e["msg"].as_str()),
        (Some(4), Some("unknown CNI_COMMAND: FROB"))
    );
    assert!(
        w.saved().is_empty() && w.leases().is_empty(),
        "nothing allocated by bad input"
    );
}

/// VERSION lists 0.1.0 through 1.1.0 and echoes a supported request.
#[test]
fn version_reply() {
    require_root!();
    let w = World::new("ver", 47);
    let v = w.plugin("VERSION", &[], br#"{"cniVersion":"0.4.0"}"#).ok();
    assert_eq!(
        v,
        json!({"cniVersion": "0.4.0", "supportedVersions": ["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"]})
    );
    assert_eq!(w.plugin("VERSION", &[], b"").ok()["cniVersion"], "1.1.0");
}
