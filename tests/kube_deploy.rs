//! Offline checks of deploy/: the manifests against the Kubernetes API
//! schema (k8s-openapi's typed objects: a field the schema does not know, or
//! of the wrong type, fails the round trip), their equivalence with
//! flannel's kube-flannel.yml where it matters, and the Dockerfile's paths.
//! No root and no apiserver needed.

use std::collections::BTreeSet;

use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use serde_json::Value;

use super::repo;

fn docs() -> Vec<Value> {
    let text = std::fs::read_to_string(repo().join("deploy/kube-flannel.yml")).expect("manifest");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).expect("YAML");
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

fn doc(kind: &str) -> Value {
    docs()
        .into_iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} in the manifest"))
}

/// Deserializes as `T` and back; the result must equal the input.
fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(v: &Value) {
    let typed: T =
        serde_json::from_value(v.clone()).unwrap_or_else(|e| panic!("{}: {e}", v["kind"]));
    let back = serde_json::to_value(&typed).expect("serialize");
    if let Some(path) = first_difference(v, &back, String::new()) {
        panic!(
            "{} {}: field {path} is not in the schema (or has the wrong type)",
            v["kind"], v["metadata"]["name"]
        );
    }
}

fn first_difference(a: &Value, b: &Value, path: String) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => x.iter().find_map(|(k, v)| {
            first_difference(v, y.get(k).unwrap_or(&Value::Null), format!("{path}.{k}"))
        }),
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => x
            .iter()
            .zip(y)
            .enumerate()
            .find_map(|(i, (v, w))| first_difference(v, w, format!("{path}[{i}]"))),
        _ => (a != b).then_some(path),
    }
}

#[test]
fn manifests_match_the_api_schema() {
    let all = docs();
    let kinds: BTreeSet<&str> = all.iter().filter_map(|d| d["kind"].as_str()).collect();
    let want: BTreeSet<&str> = [
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ServiceAccount",
        "ConfigMap",
        "DaemonSet",
    ]
    .into();
    assert_eq!(kinds, want);
    for d in &all {
        match d["kind"].as_str().unwrap_or("") {
            "Namespace" => round_trip::<Namespace>(d),
            "ClusterRole" => round_trip::<ClusterRole>(d),
            "ClusterRoleBinding" => round_trip::<ClusterRoleBinding>(d),
            "ServiceAccount" => round_trip::<ServiceAccount>(d),
            "ConfigMap" => round_trip::<ConfigMap>(d),
            "DaemonSet" => round_trip::<DaemonSet>(d),
            other => panic!("unexpected kind {other}"),
        }
    }
    // The check itself catches a typo.
    let mut bad = doc("DaemonSet");
    bad["spec"]["template"]["spec"]["hostNetwrok"] = Value::Bool(true);
    let typed: DaemonSet = serde_json::from_value(bad.clone()).expect("still decodes");
    assert!(
        first_difference(
            &bad,
            &serde_json::to_value(typed).expect("ser"),
            String::new()
        )
        .is_some()
    );
}

#[test]
fn manifests_are_a_drop_in_for_flannels() {
    let role = doc("ClusterRole");
    assert_eq!(role["metadata"]["name"], "flannel");
    let rules: Vec<(String, String)> = role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|r| {
            let res: Vec<String> = r["resources"]
                .as_array()
                .expect("resources")
                .iter()
                .map(|x| x.to_string())
                .collect();
            let verbs: Vec<String> = r["verbs"]
                .as_array()
                .expect("verbs")
                .iter()
                .map(|x| x.to_string())
                .collect();
            res.into_iter()
                .flat_map(move |x| verbs.clone().into_iter().map(move |v| (x.clone(), v)))
        })
        .collect();
    let s = |a: &str, b: &str| (format!("\"{a}\""), format!("\"{b}\""));
    assert_eq!(
        rules,
        [
            s("pods", "get"),
            s("nodes", "get"),
            s("nodes", "list"),
            s("nodes", "watch"),
            s("nodes/status", "patch")
        ],
        "exactly flannel's RBAC"
    );
    let b = doc("ClusterRoleBinding");
    assert_eq!(b["subjects"][0]["name"], "flannel");
    assert_eq!(b["subjects"][0]["namespace"], "kube-flannel");

    let cm = doc("ConfigMap");
    assert_eq!(cm["metadata"]["name"], "kube-flannel-cfg");
    let net = cm["data"]["net-conf.json"].as_str().expect("net-conf.json");
    let cfg = weft_control::config::parse_config(net.as_bytes()).expect("net-conf.json parses");
    assert_eq!(
        (
            cfg.network.map(|n| n.to_string()),
            cfg.backend_type.as_str()
        ),
        (Some("10.244.0.0/16".into()), "vxlan")
    );
    let cni: Value =
        serde_json::from_str(cm["data"]["cni-conf.json"].as_str().expect("cni")).expect("cni JSON");
    assert_eq!(cni["plugins"][0]["type"], "flannel");

    let ds = doc("DaemonSet");
    assert_eq!(ds["metadata"]["name"], "kube-flannel-ds");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["serviceAccountName"], "flannel");
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(
        pod["tolerations"]
            .as_array()
            .expect("tolerations")
            .iter()
            .any(|t| t["effect"] == "NoSchedule" && t["operator"] == "Exists")
    );
    let init = pod["initContainers"].as_array().expect("init");
    assert_eq!(init[0]["command"][0], "cp");
    assert_eq!(
        init[0]["args"],
        serde_json::json!(["-f", "/flannel", "/opt/cni/bin/flannel"])
    );
    assert_eq!(init[1]["command"][0], "/opt/bin/install-conf");
    assert_eq!(
        init[1]["args"],
        serde_json::json!([
            "/etc/kube-flannel/cni-conf.json",
            "/etc/cni/net.d/10-flannel.conflist"
        ])
    );
    let c = &pod["containers"][0];
    assert_eq!(c["command"][0], "/opt/bin/flanneld");
    assert_eq!(
        c["args"],
        serde_json::json!(["--ip-masq", "--kube-subnet-mgr", "--healthz-port=8081"])
    );
    let env: BTreeSet<&str> = c["env"]
        .as_array()
        .expect("env")
        .iter()
        .filter_map(|e| e["name"].as_str())
        .collect();
    assert_eq!(
        env,
        [
            "CONT_WHEN_CACHE_NOT_READY",
            "EVENT_QUEUE_DEPTH",
            "POD_NAME",
            "POD_NAMESPACE"
        ]
        .into()
    );
    assert_eq!(
        c["securityContext"]["capabilities"]["add"],
        serde_json::json!(["NET_ADMIN", "NET_RAW"])
    );
    // `weft doctor` in the pod reads the node's CNI directories, read-only.
    let mounts = c["volumeMounts"].as_array().expect("volumeMounts");
    for (vol, path) in [
        ("cni", "/host/etc/cni/net.d"),
        ("cni-plugin", "/host/opt/cni/bin"),
    ] {
        assert!(
            mounts.iter().any(|m| m["name"] == vol
                && m["mountPath"] == path
                && m["readOnly"] == serde_json::json!(true)),
            "kube-flannel lacks the read-only {vol} mount at {path}"
        );
    }
    let tun = pod["volumes"]
        .as_array()
        .expect("volumes")
        .iter()
        .find(|v| v["name"] == "dev-net-tun")
        .expect("tun volume");
    assert_eq!(
        tun["hostPath"],
        serde_json::json!({"path": "/dev/net/tun", "type": "CharDevice"})
    );
}

/// Every binary the Dockerfile builds and copies is a binary of the
/// workspace (and built), every file it copies exists, and the image holds
/// every path the manifest runs.
#[test]
fn dockerfile_copies_what_the_workspace_builds() {
    let text = std::fs::read_to_string(repo().join("deploy/Dockerfile")).expect("Dockerfile");
    let build = text
        .lines()
        .find(|l| l.contains("cargo build"))
        .expect("cargo build line");
    let words: Vec<&str> = build.split_whitespace().collect();
    let bins: BTreeSet<&str> = words
        .windows(2)
        .filter(|w| w[0] == "--bin")
        .map(|w| w[1])
        .collect();
    assert_eq!(bins, ["flannel", "install-conf", "weft", "weftd"].into());
    for b in &bins {
        assert!(
            weft_tests::bins::dir().join(b).exists(),
            "{b} is not a built workspace binary"
        );
    }
    let mut dests = BTreeSet::new();
    for l in text.lines().filter(|l| l.starts_with("COPY ")) {
        let parts: Vec<&str> = l.split_whitespace().collect();
        match parts.as_slice() {
            ["COPY", "--from=build", src, dest] => {
                let b = src.strip_prefix("/out/").expect("binaries come from /out");
                assert!(bins.contains(b), "{l}: {b} is not built");
                dests.insert(dest.to_string());
            }
            ["COPY", ".", "."] => {}
            ["COPY", src, dest] => {
                assert!(repo().join(src).exists(), "{l}: {src} does not exist");
                dests.insert(dest.to_string());
            }
            _ => panic!("unexpected COPY line {l}"),
        }
    }
    for p in [
        "/opt/bin/flanneld",
        "/opt/bin/install-conf",
        "/opt/bin/weft",
        "/flannel",
        "/opt/cni/bin/flannel",
    ] {
        assert!(dests.contains(p), "the image lacks {p}");
    }
    assert!(text.contains("ENTRYPOINT [\"/opt/bin/flanneld\"]"));
    for tool in ["iptables", "nftables", "iproute2"] {
        assert!(text.contains(tool), "the image lacks {tool}");
    }
    let out = std::process::Command::new("sh")
        .arg("-n")
        .arg(repo().join("deploy/iptables-wrapper.sh"))
        .output()
        .expect("sh");
    assert!(
        out.status.success(),
        "iptables-wrapper.sh: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}
