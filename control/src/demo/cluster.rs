//! A local multi-node weft cluster in network namespaces: what `weft demo`
//! shows and what the end-to-end tests drive.
//!
//! Topology (all inside namespaces named `<prefix>-*`, nothing on the host):
//! an underlay namespace with bridge `br0`; per node a namespace with `eth0`
//! on that bridge (`192.0.2.<i>/24`, a documentation range) running one
//! `weftd` on a shared embedded store (or on etcd, see [`ClusterStore`]);
//! per pod a namespace wired to its node by weft's CNI plugin (`flannel`,
//! delegating to the real bridge and host-local plugins), exactly as a
//! kubelet would.
//!
//! Dropping the cluster stops the daemons and deletes every namespace.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::netns::{Netns, Underlay};

/// Where the standard CNI plugins live on Debian.
pub const CNI_PLUGIN_DIR: &str = "/usr/lib/cni";

/// What to build.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    /// Name prefix for namespaces (keep it short: ≤ 8 characters).
    pub prefix: String,
    /// Number of nodes.
    pub nodes: u8,
    /// The network config (net-conf.json text).
    pub net_conf: String,
    /// Extra weftd arguments for every node.
    pub weftd_args: Vec<String>,
    /// Directory with `weftd` and `flannel` (the CNI plugin).
    pub bin_dir: PathBuf,
    /// Working directory (store, logs, subnet.env files, CNI state).
    pub work: PathBuf,
    /// Where the nodes keep their leases.
    pub store: ClusterStore,
}

/// The lease store the nodes of a [`Cluster`] share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClusterStore {
    /// The embedded store in `<work>/store`, with net-conf.json from the work dir.
    #[default]
    Embedded,
    /// etcd at these endpoints (`--etcd-endpoints`, as seen from inside each
    /// node's namespace); the network config must already be in etcd.
    Etcd(String),
}

/// How the CNI plugin attaches a node's pods (see [`Cluster::set_cni_mode`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CniMode {
    /// flannel's delegation to bridge + host-local (`cni0`).
    #[default]
    Bridge,
    /// weft's routed datapath: /32 per pod, addresses from weftd's IPAM API.
    Routed,
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    /// The node's namespace.
    pub ns: Netns,
    /// Its underlay address.
    pub addr: String,
    /// Its weftd.
    pub weftd: Option<Child>,
    /// Its directory under the work dir.
    pub dir: PathBuf,
}

/// A pod: a namespace with `eth0` from the CNI plugin.
#[derive(Debug)]
pub struct Pod {
    /// The pod's namespace.
    pub ns: Netns,
    /// Its IPv4 address.
    pub ip: String,
    /// Index of its node in [`Cluster::nodes`].
    pub node: usize,
    id: String,
    mode: CniMode,
}

/// Errors building the cluster.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// A step failed; the message says which and why.
    #[error("{0}")]
    Step(String),
    /// File or process I/O failed.
    #[error("{0}: {1}")]
    Io(String, #[source] std::io::Error),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> ClusterError {
    let what = what.into();
    move |e| ClusterError::Io(what, e)
}

/// The running cluster. See the module docs.
#[derive(Debug)]
pub struct Cluster {
    /// The nodes, in order (node `i` has address `192.0.2.<i+1>`).
    pub nodes: Vec<Node>,
    /// The pods created so far.
    pub pods: Vec<Pod>,
    spec: ClusterSpec,
    cni_modes: Vec<CniMode>,
    /// Extra weftd arguments per node (after the spec's), see [`Cluster::start_with_node_args`].
    node_args: Vec<Vec<String>>,
    // Dropped last: the underlay outlives the nodes' veths.
    _underlay: Underlay,
}

impl Cluster {
    /// Builds the underlay and the nodes and starts a weftd on each; waits
    /// until every node has written its subnet.env.
    pub fn start(spec: ClusterSpec) -> Result<Cluster, ClusterError> {
        Cluster::start_with_node_args(spec, Vec::new())
    }

    /// [`Cluster::start`] with extra weftd arguments for node `i` in
    /// `node_args[i]` (e.g. a per-node `--dataplane`).
    pub fn start_with_node_args(
        spec: ClusterSpec,
        node_args: Vec<Vec<String>>,
    ) -> Result<Cluster, ClusterError> {
        let mut c = Cluster::create(spec, node_args)?;
        c.start_all()?;
        Ok(c)
    }

    /// Builds the underlay and the nodes without starting any weftd (for
    /// callers that need something inside the node namespaces first, e.g. a
    /// proxy to etcd); then [`Cluster::start_all`] or [`Cluster::start_weftd`].
    pub fn create(spec: ClusterSpec, node_args: Vec<Vec<String>>) -> Result<Cluster, ClusterError> {
        std::fs::create_dir_all(&spec.work).map_err(io("create work dir"))?;
        let conf = spec.work.join("net-conf.json");
        std::fs::write(&conf, &spec.net_conf).map_err(io("write net-conf.json"))?;
        let mut underlay = Underlay::new(&format!("{}-ul", spec.prefix));
        let mut nodes = Vec::new();
        for i in 1..=spec.nodes {
            let ns = Netns::new(&format!("{}-n{i}", spec.prefix));
            let addr = format!("192.0.2.{i}");
            underlay.attach(&ns, &format!("{addr}/24"));
            // A default route, so that weftd finds its interface as on a real node.
            ns.exec(&[
                "ip",
                "route",
                "add",
                "default",
                "via",
                "192.0.2.254",
                "dev",
                "eth0",
                "onlink",
            ]);
            let dir = spec.work.join(format!("n{i}"));
            std::fs::create_dir_all(&dir).map_err(io("create node dir"))?;
            nodes.push(Node {
                ns,
                addr,
                weftd: None,
                dir,
            });
        }
        let cni_modes = vec![CniMode::Bridge; nodes.len()];
        Ok(Cluster {
            nodes,
            pods: Vec::new(),
            spec,
            cni_modes,
            node_args,
            _underlay: underlay,
        })
    }

    /// Starts every node's weftd and waits until each has written its subnet.env.
    pub fn start_all(&mut self) -> Result<(), ClusterError> {
        for i in 0..self.nodes.len() {
            self.start_weftd(i)?;
        }
        for i in 0..self.nodes.len() {
            self.wait_ready(i, Duration::from_secs(60))?;
        }
        Ok(())
    }

    /// Starts (or restarts) node `i`'s weftd.
    pub fn start_weftd(&mut self, i: usize) -> Result<(), ClusterError> {
        let n = &self.nodes[i];
        let log = std::fs::File::create(n.dir.join("weftd.log")).map_err(io("create weftd.log"))?;
        let log2 = log.try_clone().map_err(io("dup log"))?;
        let mut cmd =
            n.ns.command(&self.spec.bin_dir.join("weftd").to_string_lossy());
        match &self.spec.store {
            ClusterStore::Embedded => cmd.arg("--store=embedded").arg(format!(
                "--store-path={}",
                self.spec.work.join("store").display()
            )),
            ClusterStore::Etcd(endpoints) => cmd
                .arg("--store=etcd")
                .arg(format!("--etcd-endpoints={endpoints}")),
        };
        cmd.arg(format!(
            "--net-config-path={}",
            self.spec.work.join("net-conf.json").display()
        ))
        .arg(format!(
            "--subnet-file={}",
            n.dir.join("subnet.env").display()
        ))
        .args(&self.spec.weftd_args)
        .args(self.node_args.get(i).into_iter().flatten())
        // Each node keeps its own WireGuard key (the default /run/flannel/wgkey is host-wide).
        .env("WIREGUARD_KEY_FILE", n.dir.join("wgkey"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
        let child = cmd.spawn().map_err(io("start weftd"))?;
        self.nodes[i].weftd = Some(child);
        Ok(())
    }

    /// Stops node `i`'s weftd with SIGTERM (SIGKILL after 10 s).
    pub fn stop_weftd(&mut self, i: usize) {
        if let Some(mut c) = self.nodes[i].weftd.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(c.id().to_string())
                .status();
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Waits until node `i` has written its subnet.env.
    pub fn wait_ready(&mut self, i: usize, timeout: Duration) -> Result<(), ClusterError> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.subnet_env(i).is_some() {
                return Ok(());
            }
            let exited = self.nodes[i]
                .weftd
                .as_mut()
                .is_none_or(|c| !matches!(c.try_wait(), Ok(None)));
            if exited || Instant::now() > deadline {
                return Err(ClusterError::Step(format!(
                    "node {} did not become ready; weftd log:\n{}",
                    i + 1,
                    self.log(i)
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Node `i`'s subnet.env, if written.
    pub fn subnet_env(&self, i: usize) -> Option<String> {
        std::fs::read_to_string(self.nodes[i].dir.join("subnet.env"))
            .ok()
            .filter(|s| !s.is_empty())
    }

    /// Node `i`'s weftd log.
    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.nodes[i].dir.join("weftd.log")).unwrap_or_default()
    }

    /// The work directory.
    pub fn work(&self) -> &Path {
        &self.spec.work
    }

    /// Makes node `i`'s CNI plugin attach pods added from now on in `mode`
    /// (every node starts in bridge mode). Each pod keeps the mode it was added with.
    pub fn set_cni_mode(&mut self, i: usize, mode: CniMode) {
        self.cni_modes[i] = mode;
    }

    /// Creates pod `name` on node `i` through the CNI plugin; returns its index.
    pub fn add_pod(&mut self, i: usize, name: &str) -> Result<usize, ClusterError> {
        let ns = Netns::new(&format!("{}-{name}", self.spec.prefix));
        let id = format!("{}{name}", self.spec.prefix);
        let mode = self.cni_modes[i];
        let out = self.cni(i, "ADD", &id, &ns.path(), mode)?;
        let v: serde_json::Value = serde_json::from_str(&out)
            .map_err(|e| ClusterError::Step(format!("CNI ADD returned no JSON ({e}): {out}")))?;
        let ip = v["ips"][0]["address"]
            .as_str()
            .and_then(|a| a.split('/').next())
            .ok_or_else(|| ClusterError::Step(format!("CNI ADD result has no address: {out}")))?
            .to_string();
        self.pods.push(Pod {
            ns,
            ip,
            node: i,
            id,
            mode,
        });
        Ok(self.pods.len() - 1)
    }

    /// Removes pod `p` through the CNI plugin (DEL) and deletes its namespace.
    pub fn del_pod(&mut self, p: usize) -> Result<(), ClusterError> {
        let mode = self.pods[p].mode;
        self.del_pod_in(p, mode)
    }

    /// [`Cluster::del_pod`] with the plugin configured in `mode` (a node
    /// moved between bridge and routed since the pod was added).
    pub fn del_pod_in(&mut self, p: usize, mode: CniMode) -> Result<(), ClusterError> {
        let pod = self.pods.remove(p);
        let path = pod.ns.path();
        self.cni(pod.node, "DEL", &pod.id, &path, mode).map(|_| ())
    }

    /// The flannel CNI config of node `i` (bridge `cni0` via the delegate,
    /// host-local state kept in the node's directory; in routed mode the
    /// plugin finds weftd's IPAM socket next to the node's subnet.env).
    pub fn cni_conf(&self, i: usize, mode: CniMode) -> String {
        let d = &self.nodes[i].dir;
        let mut conf = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "cbr0",
            "type": "flannel",
            "subnetFile": d.join("subnet.env"),
            "dataDir": d.join("cni-flannel"),
            "ipam": { "dataDir": d.join("cni-ipam") },
            "delegate": { "hairpinMode": true, "isDefaultGateway": true }
        });
        if mode == CniMode::Routed {
            conf["mode"] = "routed".into();
        }
        conf.to_string()
    }

    fn cni(
        &self,
        i: usize,
        verb: &str,
        id: &str,
        netns: &str,
        mode: CniMode,
    ) -> Result<String, ClusterError> {
        use std::io::Write;
        let node = &self.nodes[i];
        let plugin = self.spec.bin_dir.join("flannel");
        let mut child = node
            .ns
            .command(&plugin.to_string_lossy())
            .env("CNI_COMMAND", verb)
            .env("CNI_CONTAINERID", id)
            .env("CNI_NETNS", netns)
            .env("CNI_IFNAME", "eth0")
            .env(
                "CNI_PATH",
                format!("{}:{}", self.spec.bin_dir.display(), CNI_PLUGIN_DIR),
            )
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(io("run the CNI plugin"))?;
        if let Some(mut stdin) = child.stdin.take() {
            stdin
                .write_all(self.cni_conf(i, mode).as_bytes())
                .map_err(io("write CNI config"))?;
        }
        let out = child
            .wait_with_output()
            .map_err(io("wait for the CNI plugin"))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(ClusterError::Step(format!(
                "CNI {verb} on node {} failed: {stdout}{}",
                i + 1,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        Ok(stdout)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            self.stop_weftd(i);
        }
        // Pods, nodes, then the underlay (field order) are deleted by their Drop.
        self.pods.clear();
        self.nodes.clear();
    }
}
