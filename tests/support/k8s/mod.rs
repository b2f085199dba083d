//! A real Kubernetes v1.20 cluster on this machine, for the tests that run
//! weft as a DaemonSet on real kubelets (tests/k8s_*.rs).
//!
//! - **Control plane** ([`control`]): etcd, kube-apiserver,
//!   kube-controller-manager (`--allocate-node-cidrs
//!   --cluster-cidr=10.244.0.0/16`) and kube-scheduler in one network
//!   namespace that also holds the underlay bridge (192.0.2.1/24).
//! - **Nodes** ([`node`]): N nodes, each with its own network namespace
//!   (192.0.2.1N), mount namespace and cgroup tree, running containerd + runc,
//!   kubelet and kube-proxy (iptables mode, so Services work).
//! - **Images**, offline: `scripts/image.sh` builds weft's image from the
//!   workspace binaries of this test build and Debian packages, plus a pause
//!   and a busybox image; every node imports them with `ctr`. Nothing is
//!   pulled: deploy/kube-flannel.yml runs unchanged on the imported image.
//! - **Teardown** in `Drop`, on success and on panic: every process of a
//!   node found through its cgroups, then its cgroups, mount namespace and
//!   network namespace, then the control plane and the work directory.
//!   [`shared`] keeps one cluster for all tests of a test binary (each test
//!   holds it alone while it runs) and tears it down when the process exits.
//!
//! Tools come from `scripts/tools/build-kube-apiserver.sh` and
//! `scripts/tools/build-kube.sh` (cached in `${WEFT_TOOLS:-~/.cache/weft-tools}/bin`)
//! and Debian (containerd, runc, etcd-server, containernetworking-plugins,
//! conntrack); [`require`] checks them with the workspace's guard.
//!
//! Figures (cluster up time, readiness times, RSS) are printed as
//! `k8s figure: <name>: <value>` on stderr and appended to the file named by
//! `WEFT_K8S_FIGURES` when set. With `WEFT_K8S_LOGS=<dir>` every daemon's log
//! is copied there before the work directory is removed.

pub mod control;
pub mod node;
pub mod tools;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use serde_json::Value;

pub use control::{APISERVER, CLUSTER_CIDR, ControlPlane, SERVICE_CIDR};
pub use node::{Node, PAUSE_IMAGE};
pub use tools::{Tools, require, tools_dir};

/// weft's image as deploy/kube-flannel.yml names it.
pub const WEFT_IMAGE: &str = "ghcr.io/weft-project/weft:v0.1.0";
/// The busybox image for test pods.
pub const BUSYBOX_IMAGE: &str = "weft.local/busybox:1";
/// The DaemonSet's namespace and name.
pub const WEFT_NS: &str = "kube-flannel";
/// The DaemonSet's name.
pub const WEFT_DS: &str = "kube-flannel-ds";

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// Prints a measured figure (`k8s figure: <name>: <value>`) and appends it to
/// `$WEFT_K8S_FIGURES` when set.
pub fn figure(name: &str, value: impl std::fmt::Display) {
    let line = format!("k8s figure: {name}: {value}\n");
    eprint!("{line}");
    if let Some(f) = std::env::var_os("WEFT_K8S_FIGURES").filter(|v| !v.is_empty()) {
        let _ = weft_testenv::append_line(Path::new(&f), &line);
    }
}

/// Seconds with one decimal, for figures.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

/// The last `lines` lines of every `*.log` file in `dir`.
pub fn logs_tail(dir: &Path, lines: usize) -> String {
    let mut out = String::new();
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap_or_default();
        let all: Vec<&str> = text.lines().collect();
        out += &format!("--- {} (last {lines} lines)\n", f.display());
        for l in &all[all.len().saturating_sub(lines)..] {
            out += l;
            out.push('\n');
        }
    }
    out
}

/// Polls `f` every `every` until it returns `Some`, or panics with `what`
/// (and `context()`, e.g. logs) after `timeout`.
pub fn poll<T>(
    what: &str,
    timeout: Duration,
    every: Duration,
    mut f: impl FnMut() -> Option<T>,
    context: impl FnOnce() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        if Instant::now() > deadline {
            panic!(
                "timed out after {timeout:?} waiting for {what}\n{}",
                context()
            );
        }
        std::thread::sleep(every);
    }
}

/// The three image tarballs every node imports.
#[derive(Debug, Clone)]
pub struct Images {
    /// `weft.local/pause:1`, the sandbox image.
    pub pause: PathBuf,
    /// `weft.local/busybox:1`.
    pub busybox: PathBuf,
    /// weft's image ([`WEFT_IMAGE`]) from this build's binaries.
    pub weft: PathBuf,
}

impl Images {
    /// Builds them into `dir` with scripts/image.sh: weft's from the
    /// workspace binaries next to the running test (`--bin-dir`), so the
    /// image always holds the code under test.
    pub fn build(dir: &Path) -> Images {
        std::fs::create_dir_all(dir).expect("image dir");
        let script = repo().join("scripts/image.sh");
        let run = |args: &[&str]| {
            let out = Command::new("bash")
                .arg(&script)
                .args(args)
                .output()
                .expect("scripts/image.sh");
            assert!(
                out.status.success(),
                "scripts/image.sh {args:?} failed:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        let d = dir.to_str().expect("utf-8 dir");
        run(&["--test-images", d]);
        let weft = dir.join("weft.tar");
        let bins = crate::bins::dir();
        for b in ["weftd", "install-conf", "flannel"] {
            crate::bins::path(b);
        }
        run(&[
            "--ref",
            WEFT_IMAGE,
            "--bin-dir",
            bins.to_str().expect("utf-8 dir"),
            "--out",
            weft.to_str().expect("utf-8 path"),
        ]);
        Images {
            pause: dir.join("pause.tar"),
            busybox: dir.join("busybox.tar"),
            weft,
        }
    }

    fn all(&self) -> Vec<PathBuf> {
        vec![self.pause.clone(), self.busybox.clone(), self.weft.clone()]
    }
}

/// The cluster's work directory: removed last (after every mount below it is
/// gone), its logs copied to `$WEFT_K8S_LOGS` first when set.
struct WorkDir(PathBuf);

impl Drop for WorkDir {
    fn drop(&mut self) {
        if let Some(keep) = std::env::var_os("WEFT_K8S_LOGS").filter(|v| !v.is_empty()) {
            let dest = Path::new(&keep).join(self.0.file_name().unwrap_or_default());
            let _ = std::fs::create_dir_all(&dest);
            let _ = Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "cd '{}' && find . \\( -path '*/logs/*.log' -o -path '*/var_log/u/pods/*.log' \\) \
                     -exec cp --parents {{}} '{}' \\;",
                    self.0.display(),
                    dest.display()
                ))
                .status();
        }
        let prefix = format!("{}/", self.0.display());
        let mounted = |p: &str| {
            std::fs::read_to_string("/proc/self/mountinfo")
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
                .filter(|m| m.starts_with(p))
                .collect::<Vec<_>>()
        };
        for m in mounted(&prefix).iter().rev() {
            let _ = Command::new("umount").args(["-l", m]).output();
        }
        let left = mounted(&prefix);
        if left.is_empty() {
            let _ = std::fs::remove_dir_all(&self.0);
        } else {
            eprintln!(
                "k8s: not removing {}: still mounted: {left:?}",
                self.0.display()
            );
        }
    }
}

/// A running cluster. Dropping it tears everything down.
pub struct Cluster {
    /// Unique prefix of this cluster's namespaces and cgroups.
    pub prefix: String,
    /// The tools it runs.
    pub tools: Tools,
    /// The image tarballs the nodes imported.
    pub images: Images,
    /// The nodes, `node1`.. in order (stopped first on drop).
    pub nodes: Vec<Node>,
    /// The control plane (stopped after the nodes).
    pub ctl: ControlPlane,
    /// The (net-conf.json, WEFT_DATAPLANE) weft last rolled out with, when deployed.
    weft: Option<(String, String)>,
    rolls: u32,
    dir: WorkDir,
}

impl Cluster {
    /// Starts a control plane and `nodes` nodes and waits until every node
    /// has registered and been given a podCIDR. Nodes are NotReady until a
    /// CNI config appears (weft's DaemonSet writes it: [`Cluster::deploy_weft`]).
    pub fn start(tools: Tools, nodes: usize) -> Cluster {
        let t0 = Instant::now();
        let prefix = crate::unique("k");
        let dir = PathBuf::from(format!("/var/tmp/weft-k8s-{prefix}"));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("cluster dir");
        let workdir = WorkDir(dir.clone());
        // The images build while the control plane starts.
        let (images, ctl) = std::thread::scope(|s| {
            let images = s.spawn(|| {
                let t = Instant::now();
                let i = Images::build(&dir.join("images"));
                figure("images built (pause, busybox, weft)", secs(t.elapsed()));
                i
            });
            let t = Instant::now();
            let ctl = ControlPlane::start(&prefix, &dir.join("ctl"), &tools);
            figure("control plane up", secs(t.elapsed()));
            let images = match images.join() {
                Ok(i) => i,
                Err(e) => std::panic::resume_unwind(e),
            };
            (images, ctl)
        });
        let mut c = Cluster {
            prefix,
            tools,
            images,
            nodes: Vec::new(),
            ctl,
            weft: None,
            rolls: 0,
            dir: workdir,
        };
        for _ in 0..nodes {
            c.start_node();
        }
        c.finish_nodes();
        figure(
            &format!("cluster up ({nodes} nodes registered with podCIDRs, kube-proxy synced)"),
            secs(t0.elapsed()),
        );
        c
    }

    /// Starts one more node (`node<N+1>`), waits until it has registered
    /// with a podCIDR and its kube-proxy serves the `kubernetes` Service, and
    /// returns its index in `nodes`. weft's DaemonSet, when deployed, lands on it.
    pub fn add_node(&mut self) -> usize {
        let i = self.start_node();
        self.finish_nodes();
        i
    }

    /// Starts containerd and kubelet of one more node.
    fn start_node(&mut self) -> usize {
        let index = self.nodes.len() + 1;
        let t = Instant::now();
        let kubelet = self
            .ctl
            .kubeconfig(&format!("node{index}"), &format!("node{index}-token"));
        let proxy = self
            .ctl
            .kubeconfig(&format!("node{index}-proxy"), "kube-proxy-token");
        let node = Node::start_with(
            &self.prefix,
            index,
            &self.dir.0,
            &mut self.ctl.ul,
            (&kubelet, &proxy),
            &self.tools,
            &self.images.all(),
        );
        figure(
            &format!("node{index} started (containerd up, images imported)"),
            secs(t.elapsed()),
        );
        self.nodes.push(node);
        index - 1
    }

    /// Waits until every node has registered with a podCIDR, then starts the
    /// kube-proxies not yet running and waits until they serve the
    /// `kubernetes` Service.
    fn finish_nodes(&mut self) {
        self.wait_nodes_registered();
        let tools = self.tools.clone();
        for n in &mut self.nodes {
            if !n.kube_proxy_started() {
                n.start_kube_proxy(&tools);
            }
        }
        poll(
            "kube-proxy serving the kubernetes Service on every node",
            Duration::from_secs(60),
            Duration::from_millis(200),
            || self.nodes.iter().all(Node::kube_proxy_synced).then_some(()),
            || self.logs_tail(15),
        );
    }

    /// Stops the last node (everything of it) and deletes its Node object.
    pub fn remove_last_node(&mut self) {
        if let Some(mut n) = self.nodes.pop() {
            n.stop();
            let _ = self.kubectl_with(&["delete", "node", &n.name, "--wait=false"], None);
        }
    }

    fn wait_nodes_registered(&mut self) {
        let want = self.nodes.len();
        poll(
            "every node registered with a podCIDR",
            Duration::from_secs(120),
            Duration::from_millis(500),
            || {
                let nodes = self.try_json(&["get", "nodes"])?;
                let items = nodes["items"].as_array()?;
                (items.len() == want && items.iter().all(|n| n["spec"]["podCIDR"].is_string()))
                    .then_some(())
            },
            || self.logs_tail(15),
        );
    }

    /// The last `lines` lines of every daemon's log (control plane and nodes).
    pub fn logs_tail(&self, lines: usize) -> String {
        let mut s = self.ctl.logs_tail(lines);
        for n in &self.nodes {
            s += &n.logs_tail(lines);
        }
        s
    }

    /// The node named `name`.
    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|n| n.name == name)
            .unwrap_or_else(|| panic!("no node {name}"))
    }

    /// A kubectl `Command` as admin (in the control plane's namespace), its
    /// stdin, stdout and stderr piped, for a test to spawn in the background.
    pub fn kubectl_command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ctl.ul.ns.path()))
            .arg("--")
            .arg(&self.tools.kubectl)
            .arg(format!("--kubeconfig={}", self.ctl.admin().display()))
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        c
    }

    /// Runs kubectl as admin (in the control plane's namespace), feeding `stdin`.
    pub fn kubectl_with(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut child = self.kubectl_command(args).spawn().expect("spawn kubectl");
        if let Some(mut w) = child.stdin.take() {
            use std::io::Write;
            let _ = w.write_all(stdin.unwrap_or("").as_bytes());
        }
        child.wait_with_output().expect("kubectl")
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_with(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) -> String {
        let out = self.kubectl_with(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl <args> -o json`, parsed; `None` when kubectl fails.
    pub fn try_json(&self, args: &[&str]) -> Option<Value> {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        let out = self.kubectl_with(&a, None);
        out.status
            .success()
            .then(|| serde_json::from_slice(&out.stdout).ok())
            .flatten()
    }

    /// `kubectl <args> -o json`, parsed; panics when kubectl fails.
    pub fn json(&self, args: &[&str]) -> Value {
        let mut a = args.to_vec();
        a.extend(["-o", "json"]);
        serde_json::from_str(&self.kubectl(&a)).expect("kubectl json")
    }

    /// Applies deploy/kube-flannel.yml unchanged and waits until weft runs
    /// on every node and every node is Ready; returns how long that took.
    pub fn deploy_weft(&mut self) -> Duration {
        let t = Instant::now();
        let manifest = repo().join("deploy/kube-flannel.yml");
        self.kubectl(&["apply", "-f", manifest.to_str().expect("utf-8")]);
        self.wait_weft_rollout();
        self.weft = Some((self.net_conf(), String::new()));
        self.wait_nodes_ready();
        t.elapsed()
    }

    /// A strategic-merge `patch` of weft's DaemonSet.
    pub fn patch_weft_ds(&self, patch: &str) {
        self.kubectl(&[
            "-n",
            WEFT_NS,
            "patch",
            "daemonset",
            WEFT_DS,
            "--type=strategic",
            "-p",
            patch,
        ]);
    }

    /// Waits until the DaemonSet's rollout is complete on every node.
    pub fn wait_weft_rollout(&self) {
        let out = self.kubectl_with(
            &[
                "-n",
                WEFT_NS,
                "rollout",
                "status",
                &format!("ds/{WEFT_DS}"),
                "--timeout=240s",
            ],
            None,
        );
        if !out.status.success() {
            let pods = self.kubectl_with(&["-n", WEFT_NS, "get", "pods", "-o", "wide"], None);
            let describe = self.kubectl_with(&["-n", WEFT_NS, "describe", "pods"], None);
            let logs = self.kubectl_with(
                &[
                    "-n",
                    WEFT_NS,
                    "logs",
                    "-l",
                    "app=flannel",
                    "--tail=30",
                    "--prefix",
                ],
                None,
            );
            panic!(
                "weft's DaemonSet did not roll out: {}\n{}\n{}\n{}\n{}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&pods.stdout),
                String::from_utf8_lossy(&describe.stdout),
                String::from_utf8_lossy(&logs.stdout),
                self.logs_tail(20)
            );
        }
    }

    /// Waits until every node is Ready.
    pub fn wait_nodes_ready(&self) {
        poll(
            "every node Ready",
            Duration::from_secs(120),
            Duration::from_millis(500),
            || {
                let nodes = self.try_json(&["get", "nodes"])?;
                let items = nodes["items"].as_array()?;
                (items.len() == self.nodes.len()
                    && items.iter().all(|n| condition(n, "Ready") == Some("True")))
                .then_some(())
            },
            || self.kubectl(&["describe", "nodes"]),
        );
    }

    /// The ConfigMap's current net-conf.json.
    pub fn net_conf(&self) -> String {
        let cm = self.json(&["-n", WEFT_NS, "get", "configmap", "kube-flannel-cfg"]);
        cm["data"]["net-conf.json"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }

    /// Makes weft run with `net_conf` (the ConfigMap's net-conf.json) and
    /// `WEFT_DATAPLANE=dataplane` (empty: unset, weftd's default `auto`),
    /// rolling the DaemonSet (on every node at once) only when either differs
    /// from what runs. Returns whether it rolled.
    pub fn ensure_weft(&mut self, net_conf: &str, dataplane: &str) -> bool {
        assert!(self.weft.is_some(), "deploy_weft first");
        if self.weft.as_ref() == Some(&(net_conf.to_string(), dataplane.to_string())) {
            return false;
        }
        let patch = serde_json::json!({"data": {"net-conf.json": net_conf}}).to_string();
        self.kubectl(&[
            "-n",
            WEFT_NS,
            "patch",
            "configmap",
            "kube-flannel-cfg",
            "--type=merge",
            "-p",
            &patch,
        ]);
        // One patch, one rollout: the env var (strategic merge by name) and
        // an annotation that changes the template even when only the
        // ConfigMap did.
        self.rolls += 1;
        let env = if dataplane.is_empty() {
            serde_json::json!({"name": "WEFT_DATAPLANE", "$patch": "delete"})
        } else {
            serde_json::json!({"name": "WEFT_DATAPLANE", "value": dataplane})
        };
        // Every node at once (the manifest's default rolls one node at a
        // time): a backend switch is not what these rollouts test.
        let patch = serde_json::json!({"spec": {
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {
                "metadata": {"annotations": {"weft.test/roll": self.rolls.to_string()}},
                "spec": {"containers": [{"name": "kube-flannel", "env": [env]}]},
            },
        }})
        .to_string();
        self.patch_weft_ds(&patch);
        self.wait_weft_rollout();
        self.weft = Some((net_conf.to_string(), dataplane.to_string()));
        true
    }

    /// weft's pods: (pod name, node name).
    pub fn weft_pods(&self) -> Vec<(String, String)> {
        let pods = self.json(&["-n", WEFT_NS, "get", "pods", "-l", "app=flannel"]);
        pods["items"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter(|p| p["metadata"]["deletionTimestamp"].is_null())
                    .map(|p| {
                        (
                            p["metadata"]["name"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                            p["spec"]["nodeName"]
                                .as_str()
                                .unwrap_or_default()
                                .to_string(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A namespace for one test's objects, deleted (with its pods) when dropped.
    pub fn namespace(&self, name: &str) -> TestNs<'_> {
        let _ = self.kubectl_with(&["delete", "namespace", name, "--wait=true"], None);
        self.kubectl(&["create", "namespace", name]);
        // Pods need the namespace's default ServiceAccount (the controller-manager makes it).
        poll(
            "the namespace's default ServiceAccount",
            Duration::from_secs(30),
            Duration::from_millis(200),
            || {
                self.kubectl_with(&["-n", name, "get", "serviceaccount", "default"], None)
                    .status
                    .success()
                    .then_some(())
            },
            String::new,
        );
        TestNs {
            cluster: self,
            name: name.to_string(),
        }
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let t = Instant::now();
        // Nodes first (their pods, shims and mounts), then the control plane
        // and the work directory (field order).
        while let Some(n) = self.nodes.pop() {
            drop(n);
        }
        figure("cluster teardown (nodes)", secs(t.elapsed()));
    }
}

/// The `status` of condition `kind` of a Node or Pod object.
pub fn condition<'a>(obj: &'a Value, kind: &str) -> Option<&'a str> {
    obj["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)?["status"]
        .as_str()
}

/// A pod made by [`TestNs::pods`].
#[derive(Debug, Clone)]
pub struct Pod {
    /// Its name.
    pub name: String,
    /// The node it runs on.
    pub node: String,
    /// Its IP address.
    pub ip: String,
}

/// A test's namespace; see [`Cluster::namespace`].
pub struct TestNs<'a> {
    /// The cluster.
    pub cluster: &'a Cluster,
    /// The namespace's name.
    pub name: String,
}

impl TestNs<'_> {
    /// Creates busybox pods `(name, node, shell script)` (pinned to their node
    /// by nodeSelector, scheduled by the scheduler) and waits until all are
    /// Ready; returns them with their IPs, and how long they took to be Ready.
    pub fn pods(&self, specs: &[(&str, &str, &str)]) -> (Vec<Pod>, Duration) {
        let t = Instant::now();
        let mut items = Vec::new();
        for (name, node, script) in specs {
            let pod = serde_json::json!({
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": name, "namespace": self.name, "labels": {"app": name}},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 0,
                    "automountServiceAccountToken": false,
                    "enableServiceLinks": false,
                    "containers": [{
                        "name": "c",
                        "image": BUSYBOX_IMAGE,
                        "imagePullPolicy": "Never",
                        "command": ["sh", "-c", script],
                    }],
                },
            });
            items.push(pod);
        }
        let list = serde_json::json!({"apiVersion": "v1", "kind": "List", "items": items});
        self.cluster.apply(&list.to_string());
        let pods = specs
            .iter()
            .map(|(name, node, _)| {
                let ip = poll(
                    &format!("pod {}/{name} Ready", self.name),
                    Duration::from_secs(120),
                    Duration::from_millis(200),
                    || {
                        let p = self
                            .cluster
                            .try_json(&["-n", &self.name, "get", "pod", name])?;
                        (condition(&p, "Ready") == Some("True"))
                            .then(|| p["status"]["podIP"].as_str().map(str::to_string))
                            .flatten()
                    },
                    || {
                        String::from_utf8_lossy(
                            &self
                                .cluster
                                .kubectl_with(&["-n", &self.name, "describe", "pod", name], None)
                                .stdout,
                        )
                        .into_owned()
                    },
                );
                Pod {
                    name: name.to_string(),
                    node: node.to_string(),
                    ip,
                }
            })
            .collect();
        (pods, t.elapsed())
    }

    /// `kubectl exec` of `cmd` in `pod`; the output, success or not.
    pub fn exec(&self, pod: &str, cmd: &[&str]) -> Output {
        let mut args = vec!["-n", &self.name, "exec", pod, "--"];
        args.extend_from_slice(cmd);
        self.cluster.kubectl_with(&args, None)
    }

    /// A shell snippet in `pod` that must succeed; returns its stdout.
    pub fn sh(&self, pod: &str, script: &str) -> String {
        let out = self.exec(pod, &["sh", "-c", script]);
        assert!(
            out.status.success(),
            "{}/{pod}: `{script}` failed: {}{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Whether `pod` pings `ip` (one echo, one second).
    pub fn ping(&self, pod: &str, ip: &str) -> bool {
        self.exec(pod, &["ping", "-c", "1", "-W", "1", ip])
            .status
            .success()
    }

    /// Waits until `pod` pings `ip`, up to `timeout`; returns how long it took.
    pub fn wait_ping(&self, pod: &str, ip: &str, timeout: Duration) -> Duration {
        let t = Instant::now();
        poll(
            &format!("{pod} pinging {ip}"),
            timeout,
            Duration::from_millis(200),
            || self.ping(pod, ip).then_some(()),
            || self.cluster.weft_logs(30),
        );
        t.elapsed()
    }
}

impl Drop for TestNs<'_> {
    fn drop(&mut self) {
        let _ = self.cluster.kubectl_with(
            &[
                "delete",
                "namespace",
                &self.name,
                "--wait=true",
                "--timeout=90s",
            ],
            None,
        );
    }
}

impl Cluster {
    /// The last `lines` lines of every weft pod's log.
    pub fn weft_logs(&self, lines: usize) -> String {
        let out = self.kubectl_with(
            &[
                "-n",
                WEFT_NS,
                "logs",
                "-l",
                "app=flannel",
                "--prefix",
                &format!("--tail={lines}"),
            ],
            None,
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// The cluster [`shared`] hands out.
enum Shared {
    Unstarted,
    Failed(String),
    Up(Box<Cluster>),
}

static SHARED: Mutex<Shared> = Mutex::new(Shared::Unstarted);

/// The test's hold on the shared cluster: derefs to it; other tests of the
/// binary wait until it is dropped.
pub struct SharedCluster(MutexGuard<'static, Shared>);

impl std::ops::Deref for SharedCluster {
    type Target = Cluster;
    fn deref(&self) -> &Cluster {
        match &*self.0 {
            Shared::Up(c) => c,
            _ => unreachable!("SharedCluster holds a running cluster"),
        }
    }
}

impl std::ops::DerefMut for SharedCluster {
    fn deref_mut(&mut self) -> &mut Cluster {
        match &mut *self.0 {
            Shared::Up(c) => c,
            _ => unreachable!("SharedCluster holds a running cluster"),
        }
    }
}

extern "C" fn teardown_shared() {
    let taken = {
        let mut g = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
        std::mem::replace(&mut *g, Shared::Unstarted)
    };
    // A panic must not unwind into libc's exit().
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || drop(taken)));
}

/// One cluster of `nodes` nodes with weft deployed (deploy/kube-flannel.yml
/// unchanged), shared by every test of this test binary: started by the
/// first caller, held by one test at a time, torn down when the process
/// exits (libtest returns from main or exits; an `atexit` handler drops
/// it). `None` when the tools are missing and the test is to return (under
/// `CI` the guard fails it instead). A cluster that failed to start fails
/// every later caller with the first failure's message.
#[track_caller]
pub fn shared(nodes: usize) -> Option<SharedCluster> {
    let tools = require()?;
    let mut g = SHARED.lock().unwrap_or_else(PoisonError::into_inner);
    match &*g {
        Shared::Up(c) => assert_eq!(c.nodes.len(), nodes, "the shared cluster's size"),
        Shared::Failed(why) => panic!("the shared cluster failed to start: {why}"),
        Shared::Unstarted => {
            let started = std::panic::catch_unwind(|| {
                let mut c = Cluster::start(tools, nodes);
                let d = c.deploy_weft();
                figure("weft DaemonSet rolled out and nodes Ready", secs(d));
                c
            });
            match started {
                Ok(c) => {
                    *g = Shared::Up(Box::new(c));
                    // SAFETY: atexit(3) registers a plain extern "C" function
                    // that takes no arguments and never unwinds.
                    unsafe { libc::atexit(teardown_shared) };
                }
                Err(e) => {
                    let why = e
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default();
                    *g = Shared::Failed(why.lines().next().unwrap_or_default().to_string());
                    std::panic::resume_unwind(e);
                }
            }
        }
    }
    Some(SharedCluster(g))
}

/// The resident set size of process `pid` in KiB (`VmRSS`).
pub fn rss_kib(pid: i32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// The longest run of missing replies, in echo requests, in `ping`'s output
/// (busybox: `seq=N` per reply) for `sent` requests numbered from 0.
pub fn longest_ping_gap(output: &str, sent: u64) -> u64 {
    let mut got: Vec<u64> = output
        .lines()
        .filter_map(|l| {
            l.split("seq=")
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse()
                .ok()
        })
        .collect();
    got.sort_unstable();
    got.dedup();
    let mut longest = 0;
    let mut prev: Option<u64> = None;
    for s in got.iter().copied().chain(std::iter::once(sent)) {
        let gap = match prev {
            None => s,
            Some(p) => s.saturating_sub(p + 1),
        };
        longest = longest.max(gap);
        prev = Some(s);
    }
    longest
}
