//! weftd's Kubernetes subnet manager against a real kube-apiserver v1.20 on
//! a real etcd (see kube_cluster.rs), and the deploy/ manifests and image.
//!
//! Without root or the cached kube-apiserver (build it with
//! `scripts/tools/build-kube-apiserver.sh`) the root tests skip, logged, or
//! fail under CI (see `weft_testenv`).
//! Every daemon runs the userspace vxlan backend in its own namespace on
//! the underlay 192.0.2.0/24, pods in 10.244.0.0/16.

#[path = "kube_cluster.rs"]
mod kube_cluster;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use kube_cluster::{ControlPlane, node_yaml, require_apiserver};
use serde_json::Value;
use weft_tests::netns::Netns;
use weft_tests::proc::{Proc, wait_for, wait_for_or_show};
use weft_tests::weftd::read_env;

const NET_CONF: &str = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"vxlan"}}"#;
const WAIT: Duration = Duration::from_secs(90);
const P: &str = "flannel.alpha.coreos.com/";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// Root, etcd and a built kube-apiserver (its path), else the test returns:
/// skipped, or failed under CI (see `weft_testenv`).
macro_rules! require_apiserver {
    () => {{
        weft_testenv::require_root!();
        weft_tests::require_etcd!();
        let Some(bin) = require_apiserver() else {
            return;
        };
        bin
    }};
}

/// One weftd in its node namespace.
struct Node {
    name: String,
    ns: Netns,
    proc: Option<Proc>,
    env: PathBuf,
    log: PathBuf,
}

impl Node {
    /// A node namespace attached to the underlay at 192.0.2.<i>.
    fn new(cp: &mut ControlPlane, prefix: &str, name: &str, i: u8) -> Node {
        let ns = Netns::new(&format!("{prefix}{name}"));
        cp.attach(&ns, i);
        let d = cp.dir.path();
        Node {
            name: name.into(),
            ns,
            proc: None,
            env: d.join(format!("{name}.env")),
            log: d.join(format!("{name}.log")),
        }
    }

    /// Starts weftd with `kubeconfig` and extra environment.
    fn start(&mut self, cp: &ControlPlane, kubeconfig: &Path, env: &[(&str, &str)]) {
        self.start_with(cp, kubeconfig, env, NET_CONF);
    }

    /// [`Node::start`] with net-conf.json `net_conf`.
    fn start_with(
        &mut self,
        cp: &ControlPlane,
        kubeconfig: &Path,
        env: &[(&str, &str)],
        net_conf: &str,
    ) {
        let conf = cp.dir.path().join("net-conf.json");
        std::fs::write(&conf, net_conf).expect("net-conf");
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ns.name(), "env"]);
        for (k, v) in env {
            c.arg(format!("{k}={v}"));
        }
        c.arg(weft_tests::bins::path("weftd"))
            .args([
                "--kube-subnet-mgr",
                "--iface=eth0",
                "--traffic-manager=none",
            ])
            .arg(format!("--kubeconfig-file={}", kubeconfig.display()))
            .arg(format!("--net-config-path={}", conf.display()))
            .arg(format!("--subnet-file={}", self.env.display()));
        self.proc = Some(Proc::spawn(&self.name, c, &self.log));
    }

    /// Starts weftd as admin, the node name from NODE_NAME.
    fn start_admin(&mut self, cp: &ControlPlane) {
        let name = self.name.clone();
        self.start(cp, &cp.admin(), &[("NODE_NAME", &name)]);
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Proc::running)
    }

    fn wait_ready(&mut self) -> BTreeMap<String, String> {
        wait_for(&format!("{} subnet.env", self.name), WAIT, || {
            assert!(self.running(), "{} exited; log:\n{}", self.name, self.log());
            read_env(&self.env)
        })
    }

    fn wait_log(&mut self, needle: &str) {
        wait_for(&format!("{needle:?} in {}'s log", self.name), WAIT, || {
            assert!(self.running(), "{} exited; log:\n{}", self.name, self.log());
            self.log().contains(needle).then_some(())
        });
    }

    /// The VTEP MAC of the own vxlan device.
    fn vtep_mac(&self) -> String {
        self.mac_of("flannel.1")
    }

    fn mac_of(&self, dev: &str) -> String {
        let out = self.ns.exec(&["ip", "-j", "link", "show", dev]);
        let v: Value = serde_json::from_str(&out).expect("ip -j link");
        v[0]["address"].as_str().expect("address").to_string()
    }
}

fn flannel_annotations(node: &Value) -> BTreeMap<String, String> {
    node["metadata"]["annotations"]
        .as_object()
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| {
                    Some((k.strip_prefix(P)?.to_string(), v.as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn condition(node: &Value, ty: &str) -> Option<Value> {
    node["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == ty)
        .cloned()
}

/// Two, then three weftd on Node objects: podCIDRs become subnets, the
/// annotations are flannel's bytes, NetworkUnavailable is cleared, peers
/// come and go with their Node objects and pods' vxlan traffic flows.
#[test]
fn nodes_take_pod_cidrs_and_see_peers() {
    let bin = require_apiserver!();
    let pfx = weft_tests::unique("kn");
    let mut cp = ControlPlane::start(&pfx, bin);
    for i in 1..=3 {
        cp.apply(&node_yaml(&format!("n{i}"), &format!("10.244.{i}.0/24")));
    }
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| Node::new(&mut cp, &pfx, &format!("n{i}"), i))
        .collect();
    for n in &mut nodes[..2] {
        n.start_admin(&cp);
    }
    for (i, n) in nodes[..2].iter_mut().enumerate() {
        let env = n.wait_ready();
        assert_eq!(
            env["FLANNEL_SUBNET"],
            format!("10.244.{}.1/24", i + 1),
            "the podCIDR is the subnet"
        );
        assert_eq!(env["FLANNEL_NETWORK"], "10.244.0.0/16");
    }
    // flannel's annotations, byte for byte, and nothing else of flannel's.
    for (i, n) in nodes[..2].iter().enumerate() {
        let obj = cp.node_json(&n.name);
        let want: BTreeMap<String, String> = [
            (
                "backend-data",
                format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, n.vtep_mac()),
            ),
            ("backend-type", "vxlan".to_string()),
            ("kube-subnet-manager", "true".to_string()),
            ("public-ip", format!("192.0.2.{}", i + 1)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
        assert_eq!(flannel_annotations(&obj), want, "{} annotations", n.name);
        let c = condition(&obj, "NetworkUnavailable").expect("NetworkUnavailable condition");
        assert_eq!(
            (c["status"].as_str(), c["reason"].as_str()),
            (Some("False"), Some("FlannelIsUp"))
        );
        assert_eq!(c["message"], "Flannel is running on this node");
    }
    nodes[0].wait_log("Subnet added: 10.244.2.0-24");
    nodes[1].wait_log("Subnet added: 10.244.1.0-24");
    let ok = (0..20).any(|_| nodes[0].ns.ping("10.244.2.0", 1));
    assert!(
        ok,
        "n1 cannot reach n2's vxlan address; logs:\n{}\n{}",
        nodes[0].log(),
        nodes[1].log()
    );
    // weft's own condition from its overlay probes: every peer reachable.
    for n in &nodes[..2] {
        weft_tests::proc::wait_for(
            &format!("{}'s WeftPeersReachable condition", n.name),
            Duration::from_secs(30),
            || {
                let c = condition(&cp.node_json(&n.name), "WeftPeersReachable")?;
                assert_eq!(c["reason"], "AllPeersReachable", "{c}");
                (c["status"] == "True").then_some(())
            },
        );
    }

    // A third node joins, with the user annotations: node-public-ip picks
    // the external address, public-ip-overwrite is what gets published.
    nodes[2]
        .ns
        .exec(&["ip", "addr", "add", "192.0.2.33/24", "dev", "eth0"]);
    cp.kubectl(&[
        "annotate",
        "node",
        "n3",
        &format!("{P}node-public-ip=192.0.2.33"),
        &format!("{P}public-ip-overwrite=198.51.100.3"),
    ]);
    nodes[2].start_admin(&cp);
    nodes[2].wait_ready();
    nodes[2].wait_log("Using 192.0.2.33 as external address");
    let a3 = flannel_annotations(&cp.node_json("n3"));
    assert_eq!(
        a3["public-ip"], "198.51.100.3",
        "public-ip-overwrite is published"
    );
    nodes[0].wait_log("Subnet added: 10.244.3.0-24");
    cp.kubectl(&["delete", "node", "n3"]);
    nodes[0].wait_log("Subnet removed: 10.244.3.0-24");
    nodes[1].wait_log("Subnet removed: 10.244.3.0-24");
    let routes = nodes[0].ns.exec(&["ip", "route", "show", "10.244.3.0/24"]);
    assert!(
        routes.trim().is_empty(),
        "route to the removed peer must go: {routes}"
    );
    assert!(
        nodes[2].running(),
        "a daemon whose Node is deleted keeps running, as flanneld"
    );
    // A restarted daemon keeps its subnet and its VTEP MAC (read back from
    // its node's backend-data).
    let before = flannel_annotations(&cp.node_json("n1"));
    let p = nodes[0].proc.as_mut().expect("proc");
    assert_eq!(p.stop(libc::SIGTERM, WAIT), Some(0), "clean exit");
    std::fs::remove_file(&nodes[0].env).expect("rm subnet.env");
    let peer_log = nodes[1].log().len();
    nodes[0].start_admin(&cp);
    assert_eq!(nodes[0].wait_ready()["FLANNEL_SUBNET"], "10.244.1.1/24");
    assert_eq!(
        flannel_annotations(&cp.node_json("n1")),
        before,
        "annotations (MAC) kept"
    );
    assert!(
        !nodes[1].log()[peer_log..].contains("Subnet removed"),
        "the peer saw no change"
    );
    assert_eq!(
        nodes[0]
            .log()
            .matches("Subnet added: 10.244.2.0-24")
            .count(),
        1,
        "{}",
        nodes[0].log()
    );
}

/// Dual stack through the Kubernetes subnet manager: Node objects with an
/// IPv4 and an IPv6 podCIDR, nodes with an IPv6 underlay address too. The
/// v6 podCIDR is the v6 subnet (subnet.env), flannel's v6 annotations
/// (`public-ipv6`, `backend-v6-data`) are published byte for byte beside
/// the v4 ones, each node sees the other's v6 subnet and their
/// `flannel-v6.1` devices reach each other over the IPv6 underlay.
#[test]
fn dual_stack_nodes_publish_flannels_ipv6_annotations() {
    let bin = require_apiserver!();
    let pfx = weft_tests::unique("k6");
    let mut cp = ControlPlane::start(&pfx, bin);
    let conf = r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10:244::/56","Backend":{"Type":"vxlan"}}"#;
    for i in 1..=2 {
        cp.apply(&format!(
            "apiVersion: v1\nkind: Node\nmetadata:\n  name: n{i}\nspec:\n  podCIDR: 10.244.{i}.0/24\n  podCIDRs: [10.244.{i}.0/24, \"fd00:10:244:{i}::/64\"]\n"
        ));
    }
    let mut nodes: Vec<Node> = (1..=2)
        .map(|i| Node::new(&mut cp, &pfx, &format!("n{i}"), i))
        .collect();
    for (i, n) in nodes.iter_mut().enumerate() {
        n.ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("fd00::{}/64", i + 1),
            "dev",
            "eth0",
            "nodad",
        ]);
        let name = n.name.clone();
        n.start_with(&cp, &cp.admin(), &[("NODE_NAME", &name)], conf);
    }
    for (i, n) in nodes.iter_mut().enumerate() {
        let env = n.wait_ready();
        let i = i + 1;
        assert_eq!(env["FLANNEL_SUBNET"], format!("10.244.{i}.1/24"));
        assert_eq!(env["FLANNEL_IPV6_NETWORK"], "fd00:10:244::/56");
        assert_eq!(
            env["FLANNEL_IPV6_SUBNET"],
            format!("fd00:10:244:{i}::1/64"),
            "the v6 podCIDR is the v6 subnet"
        );
        // Room for the IPv6 outer header (see control/src/backend/vxlan/mod.rs).
        assert_eq!(env["FLANNEL_MTU"], "1430");
    }
    for (i, n) in nodes.iter().enumerate() {
        let a = flannel_annotations(&cp.node_json(&n.name));
        assert_eq!(a["public-ip"], format!("192.0.2.{}", i + 1), "{a:?}");
        assert_eq!(a["public-ipv6"], format!("fd00::{}", i + 1), "{a:?}");
        assert_eq!(
            a["backend-v6-data"],
            format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, n.mac_of("flannel-v6.1")),
            "{a:?}"
        );
        assert_eq!(
            a["backend-data"],
            format!(r#"{{"VNI":1,"VtepMAC":"{}"}}"#, n.vtep_mac()),
            "{a:?}"
        );
    }
    nodes[0].wait_log("Subnet added: 10.244.2.0-24&fd00:10:244:2::-64");
    nodes[1].wait_log("Subnet added: 10.244.1.0-24&fd00:10:244:1::-64");
    let route = nodes[0]
        .ns
        .exec(&["ip", "-6", "route", "show", "fd00:10:244:2::/64"]);
    assert!(route.contains("flannel-v6.1"), "n1's v6 route: {route}");
    let ok = (0..20).any(|_| {
        nodes[0]
            .ns
            .try_exec(&["ping", "-6", "-c", "1", "-W", "1", "fd00:10:244:2::"])
            .status
            .success()
    });
    assert!(
        ok,
        "n1 cannot reach n2's flannel-v6.1 over IPv6; logs:\n{}\n{}",
        nodes[0].log(),
        nodes[1].log()
    );
}

/// A service-account token limited to flannel's ClusterRole (from
/// deploy/kube-flannel.yml) runs a node found through its pod; a token
/// without `nodes/status: patch` fails with the apiserver's reason.
#[test]
fn flannel_rbac_is_enough_and_needed() {
    let bin = require_apiserver!();
    let pfx = weft_tests::unique("kr");
    let mut cp = ControlPlane::start(&pfx, bin);
    let manifest =
        std::fs::read_to_string(repo().join("deploy/kube-flannel.yml")).expect("manifest");
    cp.apply(&manifest);
    cp.apply(&node_yaml("n1", "10.244.1.0/24"));
    cp.apply(&node_yaml("n2", "10.244.2.0/24"));
    // The DaemonSet's pod as the scheduler would have placed it on n1.
    cp.apply(
        "apiVersion: v1\nkind: Pod\nmetadata: {name: kube-flannel-ds-x, namespace: kube-flannel}\n\
         spec:\n  nodeName: n1\n  serviceAccountName: flannel\n  automountServiceAccountToken: false\n\
         \x20 containers: [{name: c, image: weft}]\n",
    );
    let token = cp.kubectl(&["create", "token", "flannel", "-n", "kube-flannel"]);
    let sa = cp.write_kubeconfig("flannel-sa", token.trim());
    let mut n1 = Node::new(&mut cp, &pfx, "n1", 1);
    n1.start(
        &cp,
        &sa,
        &[
            ("POD_NAME", "kube-flannel-ds-x"),
            ("POD_NAMESPACE", "kube-flannel"),
        ],
    );
    assert_eq!(n1.wait_ready()["FLANNEL_SUBNET"], "10.244.1.1/24");
    let obj = cp.node_json("n1");
    assert_eq!(
        flannel_annotations(&obj)
            .get("kube-subnet-manager")
            .map(String::as_str),
        Some("true")
    );
    assert!(
        condition(&obj, "NetworkUnavailable").is_some(),
        "condition patched with flannel's RBAC"
    );

    // No rights at all yet: the first node list cannot finish.
    let nostatus = cp.write_kubeconfig("nostatus", "nostatus-token");
    let mut n2 = Node::new(&mut cp, &pfx, "n2", 2);
    let exit = |n: &mut Node| {
        wait_for(&format!("{} to exit", n.name), WAIT, || {
            let p = n.proc.as_mut().expect("proc");
            (!p.running()).then(|| p.stop(libc::SIGKILL, Duration::from_secs(1)))
        })
    };
    n2.start(
        &cp,
        &nostatus,
        &[("NODE_NAME", "n2"), ("WEFT_KUBE_SYNC_TIMEOUT", "3")],
    );
    assert_ne!(exit(&mut n2), Some(0));
    assert!(
        n2.log()
            .contains("error waiting for nodeController to sync state"),
        "{}",
        n2.log()
    );
    n2.start(
        &cp,
        &nostatus,
        &[
            ("NODE_NAME", "n2"),
            ("WEFT_KUBE_SYNC_TIMEOUT", "3"),
            ("CONT_WHEN_CACHE_NOT_READY", "true"),
        ],
    );
    n2.wait_log("continuing (CONT_WHEN_CACHE_NOT_READY=true)");
    n2.proc.take();

    // Everything but nodes/status.
    cp.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRole\nmetadata: {name: weft-nostatus}\nrules:\n\
         - {apiGroups: [\"\"], resources: [pods], verbs: [get]}\n\
         - {apiGroups: [\"\"], resources: [nodes], verbs: [get, list, watch]}\n---\n\
         apiVersion: rbac.authorization.k8s.io/v1\nkind: ClusterRoleBinding\nmetadata: {name: weft-nostatus}\n\
         roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: weft-nostatus}\n\
         subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: weft-nostatus}]\n",
    );
    n2.start(&cp, &nostatus, &[("NODE_NAME", "n2")]);
    assert_ne!(exit(&mut n2), Some(0), "must fail; log:\n{}", n2.log());
    let log = n2.log();
    assert!(
        log.contains(r#"failed to patch annotations of node "n2" (nodes/status)"#)
            && log.contains(r#"cannot patch resource "nodes/status""#),
        "the error must name what is missing; log:\n{log}"
    );
    assert!(read_env(&n2.env).is_none(), "no subnet.env without a lease");

    // A node without podCIDR: flanneld's refusal.
    cp.apply("apiVersion: v1\nkind: Node\nmetadata: {name: n5}\n");
    let mut n5 = Node::new(&mut cp, &pfx, "n5", 5);
    n5.start_admin(&cp);
    assert_ne!(exit(&mut n5), Some(0));
    let log = n5.log();
    assert!(log.contains(r#"node "n5" pod cidr not assigned"#), "{log}");
}

/// The apiserver restarts while a node is deleted behind its back (directly
/// in etcd, then compacted, so the watches cannot resume and must relist):
/// every daemon keeps its peers, none is lost or duplicated, the deleted one
/// goes, and watches deliver new changes afterwards.
#[test]
fn apiserver_restart_keeps_peers() {
    let bin = require_apiserver!();
    let pfx = weft_tests::unique("ka");
    let mut cp = ControlPlane::start(&pfx, bin);
    for i in 1..=3 {
        cp.apply(&node_yaml(&format!("n{i}"), &format!("10.244.{i}.0/24")));
    }
    let mut nodes: Vec<Node> = (1..=3)
        .map(|i| Node::new(&mut cp, &pfx, &format!("n{i}"), i))
        .collect();
    for n in &mut nodes {
        n.start_admin(&cp);
    }
    for n in &mut nodes {
        n.wait_ready();
    }
    nodes[0].wait_log("Subnet added: 10.244.2.0-24");
    nodes[0].wait_log("Subnet added: 10.244.3.0-24");
    nodes[1].wait_log("Subnet added: 10.244.3.0-24");

    cp.stop_apiserver();
    let out = cp.etcdctl(&["del", "/registry/minions/n3"]);
    assert!(
        String::from_utf8_lossy(&out.stdout).trim() == "1",
        "delete n3 in etcd: {out:?}"
    );
    let status = cp.etcdctl(&["endpoint", "status", "-w", "json"]);
    let v: Value = serde_json::from_slice(&status.stdout).expect("endpoint status json");
    let rev = v[0]["Status"]["header"]["revision"]
        .as_u64()
        .expect("revision")
        .to_string();
    assert!(cp.etcdctl(&["compact", &rev]).status.success(), "compact");
    cp.start_apiserver();

    nodes[0].wait_log("Subnet removed: 10.244.3.0-24");
    nodes[1].wait_log("Subnet removed: 10.244.3.0-24");
    // The watch works again: a new flannel node (real flannel's annotations).
    cp.apply(&format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: n4\n  annotations:\n    {P}kube-subnet-manager: \"true\"\n    \
         {P}backend-type: vxlan\n    {P}public-ip: 192.0.2.4\n    \
         {P}backend-data: '{{\"VNI\":1,\"VtepMAC\":\"6a:3c:00:11:22:33\"}}'\nspec:\n  podCIDR: 10.244.4.0/24\n"
    ));
    nodes[0].wait_log("Subnet added: 10.244.4.0-24");
    let fdb = nodes[0].ns.exec(&["ip", "route", "show", "10.244.4.0/24"]);
    assert!(fdb.contains("flannel.1"), "route to the new peer: {fdb}");
    for (i, n) in nodes[..2].iter().enumerate() {
        let log = n.log();
        let other = format!("10.244.{}.0-24", 2 - i);
        assert_eq!(
            log.matches(&format!("Subnet added: {other}")).count(),
            1,
            "{} duplicated a peer:\n{log}",
            n.name
        );
        assert_eq!(
            log.matches(&format!("Subnet removed: {other}")).count(),
            0,
            "{} lost a peer:\n{log}",
            n.name
        );
    }
    let r = nodes[0].ns.exec(&["ip", "route", "show", "10.244.2.0/24"]);
    assert!(r.contains("flannel.1"), "route to n2 kept: {r}");
}

/// deploy/kube-flannel.yml passes the apiserver's own validation and
/// admission (server-side dry run).
#[test]
fn deploy_manifests_pass_server_dry_run() {
    let bin = require_apiserver!();
    let pfx = weft_tests::unique("kd");
    let cp = ControlPlane::start(&pfx, bin);
    // Namespaced objects of a dry run need their namespace to exist.
    cp.kubectl(&["create", "namespace", "kube-flannel"]);
    let manifest =
        std::fs::read_to_string(repo().join("deploy/kube-flannel.yml")).expect("manifest");
    let out = cp.kubectl_in(&["apply", "--dry-run=server", "-f", "-"], Some(&manifest));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "dry run failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    for obj in [
        "clusterrole.rbac.authorization.k8s.io/flannel",
        "clusterrolebinding.rbac.authorization.k8s.io/flannel",
        "serviceaccount/flannel",
        "configmap/kube-flannel-cfg",
        "daemonset.apps/kube-flannel-ds",
    ] {
        assert!(
            text.contains(&format!("{obj} created (server dry run)")),
            "{obj} missing:\n{text}"
        );
    }
    let ds = cp.kubectl(&["get", "daemonset", "-n", "kube-flannel", "-o", "name"]);
    assert!(
        ds.trim().is_empty(),
        "a dry run must not create anything: {ds}"
    );
}

#[path = "kube_deploy.rs"]
mod deploy;

/// NAT traversal on the Kubernetes subnet manager (docs/nat.md): two public
/// nodes on userspace WireGuard with `WEFT_NAT_TRAVERSAL=true` (the
/// `--nat-traversal` flag's variable) answer each other's discovery; each
/// publishes the endpoint it is seen from in weft's `weft-nat` annotation
/// beside flannel's, and a restart with the feature off removes it.
#[test]
fn nat_traversal_publishes_weft_nat_annotation() {
    let bin = require_apiserver!();
    let pfx = weft_tests::unique("kt");
    let mut cp = ControlPlane::start(&pfx, bin);
    let conf = r#"{"Network":"10.244.0.0/16","Backend":{"Type":"wireguard"}}"#;
    for i in 1..=2 {
        cp.apply(&node_yaml(&format!("n{i}"), &format!("10.244.{i}.0/24")));
    }
    let mut nodes: Vec<Node> = (1..=2)
        .map(|i| Node::new(&mut cp, &pfx, &format!("n{i}"), i))
        .collect();
    let start = |n: &mut Node, cp: &ControlPlane, nat: &str| {
        let name = n.name.clone();
        let key = cp.dir.path().join(format!("{name}.wgkey"));
        let key = key.display().to_string();
        n.start_with(
            cp,
            &cp.admin(),
            &[
                ("NODE_NAME", &name),
                ("WEFT_DATAPLANE", "userspace"),
                ("WEFT_NAT_TRAVERSAL", nat),
                ("WIREGUARD_KEY_FILE", &key),
            ],
            conf,
        );
    };
    let t0 = std::time::Instant::now();
    for n in &mut nodes {
        start(n, &cp, "true");
    }
    let key = format!("{P}weft-nat");
    for (i, n) in nodes.iter_mut().enumerate() {
        n.wait_ready();
        let want = format!(r#"{{"Endpoint":"192.0.2.{}:51820"}}"#, i + 1);
        let name = n.name.clone();
        wait_for_or_show(
            &format!("{name}'s {key}"),
            WAIT,
            || {
                let obj = cp.node_json(&name);
                (obj["metadata"]["annotations"][&key] == want.as_str()).then_some(())
            },
            || {
                format!(
                    " (annotations: {}); weftd's log:\n{}",
                    cp.node_json(&name)["metadata"]["annotations"],
                    n.log()
                )
            },
        );
        let a = flannel_annotations(&cp.node_json(&name));
        assert_eq!(a["backend-type"], "wireguard", "{a:?}");
        assert_eq!(a["public-ip"], format!("192.0.2.{}", i + 1), "{a:?}");
        assert!(!a["backend-data"].contains("WeftNAT"), "{a:?}");
    }
    println!(
        "kube: weftd start -> both nodes' weft-nat annotations carry their endpoints: {:?}",
        t0.elapsed()
    );
    nodes[0].wait_log("NAT: this node is seen from 192.0.2.1:51820");
    // The feature off: the annotation goes at the next acquisition.
    nodes[0].proc = None;
    start(&mut nodes[0], &cp, "false");
    let name = nodes[0].name.clone();
    wait_for(&format!("{name}'s {key} removed"), WAIT, || {
        let obj = cp.node_json(&name);
        obj["metadata"]["annotations"]
            .get(&key)
            .is_none()
            .then_some(())
    });
    nodes[0].wait_ready();
}
