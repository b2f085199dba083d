//! The plugin driven by the real CNI runtime client (`cnitool`, libcni 1.1.2)
//! with the real bridge, host-local and portmap plugins, in throwaway
//! namespaces (root only). See `common` for the isolation.

mod common;

use common::{Netns, World, in_subnet, result_ip};

/// ADD gives the pod an address in FLANNEL_SUBNET, a route to the flannel
/// network and a reachable gateway; CHECK passes (and fails once the route
/// is gone); DEL removes everything and a second DEL succeeds.
#[test]
fn lifecycle_add_check_del_with_cnitool() {
    if !common::root_or_skip() {
        return;
    }
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

/// kube-flannel's own conflist version (0.3.1): results are converted by the
/// delegate to the network's version, and DEL cleans up.
#[test]
fn kube_flannel_conflist_0_3_1() {
    if !common::root_or_skip() {
        return;
    }
    let w = World::new("v031", 32);
    w.write_subnet_env();
    w.write_conflist("0.3.1");
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let result = w.cnitool(&["add", "cbr0", &pod.path()]).ok();
    assert_eq!(result["cniVersion"], "0.3.1", "{result}");
    assert!(in_subnet(&result_ip(&result), w.n));
    let saved = std::fs::read_to_string(w.path("flannel").join(&w.saved()[0])).expect("saved");
    assert!(
        saved.starts_with(
            r#"{"cniVersion":"0.3.1","hairpinMode":true,"ipMasq":false,"ipam":{"dataDir":"#
        ),
        "{saved}"
    );
    w.cnitool(&["del", "cbr0", &pod.path()]).ok();
    assert!(w.leases().is_empty() && w.saved().is_empty());
}

/// 64 parallel ADDs give 64 distinct addresses; 64 parallel DELs free them all.
#[test]
fn parallel_64_add_then_64_del() {
    if !common::root_or_skip() {
        return;
    }
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
