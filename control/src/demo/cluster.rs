//! A local multi-node weft cluster in network namespaces: what `weft demo`
//! shows and what the end-to-end tests drive.
//!
//! Topology (all inside namespaces named `<prefix>-*`, nothing on the host):
//! an underlay namespace with bridge `br0`; per node a namespace with `eth0`
//! on that bridge (`192.0.2.<i>/24`, a documentation range) running one
//! `weftd` with the spec's arguments (the demo's: a shared embedded store);
//! per pod a namespace wired to its node by weft's CNI plugin (`flannel`,
//! delegating to the real bridge and host-local plugins), exactly as a
//! kubelet would.
//!
//! This is what `weft demo` needs and nothing more: the integration tests
//! build their cluster (other stores, per-node arguments, routed pods, pod
//! deletion, restarts) on these pieces in `tests/support/cluster.rs`.
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
    /// The network config (net-conf.json text, written to the work dir and
    /// given as `--net-config-path`).
    pub net_conf: String,
    /// weftd arguments for every node, the lease store's included (see
    /// [`ClusterSpec::embedded_store`]).
    pub weftd_args: Vec<String>,
    /// Directory with `weftd` and `flannel` (the CNI plugin).
    pub bin_dir: PathBuf,
    /// Working directory (store, logs, subnet.env files, CNI state).
    pub work: PathBuf,
}

impl ClusterSpec {
    /// The arguments of an embedded store in `<work>/store` shared by the nodes.
    pub fn embedded_store(work: &Path) -> Vec<String> {
        vec![
            "--store=embedded".into(),
            format!("--store-path={}", work.join("store").display()),
        ]
    }
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
    /// Its container ID (`CNI_CONTAINERID`).
    pub id: String,
    /// The CNI config it was added with.
    pub conf: String,
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
    // Dropped last: the underlay outlives the nodes' veths.
    _underlay: Underlay,
}

impl Cluster {
    /// Builds the underlay and the nodes and starts a weftd on each; waits
    /// until every node has written its subnet.env.
    pub fn start(spec: ClusterSpec) -> Result<Cluster, ClusterError> {
        let mut c = Cluster::create(spec)?;
        c.start_all()?;
        Ok(c)
    }

    /// Builds the underlay and the nodes without starting any weftd (for
    /// callers that need something inside the node namespaces first, e.g. a
    /// proxy to etcd); then [`Cluster::start_all`] or [`Cluster::start_weftd`].
    pub fn create(spec: ClusterSpec) -> Result<Cluster, ClusterError> {
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
        Ok(Cluster {
            nodes,
            pods: Vec::new(),
            spec,
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
        self.start_weftd_with(i, &[])
    }

    /// Starts (or restarts) node `i`'s weftd with `extra` arguments after
    /// the spec's.
    pub fn start_weftd_with(&mut self, i: usize, extra: &[String]) -> Result<(), ClusterError> {
        let n = &self.nodes[i];
        let log = std::fs::File::create(n.dir.join("weftd.log")).map_err(io("create weftd.log"))?;
        let log2 = log.try_clone().map_err(io("dup log"))?;
        let mut cmd =
            n.ns.command(&self.spec.bin_dir.join("weftd").to_string_lossy());
        cmd.arg(format!(
            "--net-config-path={}",
            self.spec.work.join("net-conf.json").display()
        ))
        .arg(format!(
            "--subnet-file={}",
            n.dir.join("subnet.env").display()
        ))
        .args(&self.spec.weftd_args)
        .args(extra)
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

    /// Creates pod `name` on node `i` through the CNI plugin (bridge + host-local
    /// via the delegate); returns its index.
    pub fn add_pod(&mut self, i: usize, name: &str) -> Result<usize, ClusterError> {
        let conf = self.cni_conf(i);
        self.add_pod_with(i, name, conf)
    }

    /// [`Cluster::add_pod`] with the CNI config `conf`.
    pub fn add_pod_with(
        &mut self,
        i: usize,
        name: &str,
        conf: String,
    ) -> Result<usize, ClusterError> {
        let ns = Netns::new(&format!("{}-{name}", self.spec.prefix));
        let id = format!("{}{name}", self.spec.prefix);
        let out = self.cni(i, "ADD", &id, &ns.path(), &conf)?;
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
            conf,
        });
        Ok(self.pods.len() - 1)
    }

    /// The flannel CNI config of node `i`: bridge `cni0` via the delegate,
    /// host-local state kept in the node's directory.
    pub fn cni_conf(&self, i: usize) -> String {
        let d = &self.nodes[i].dir;
        serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "cbr0",
            "type": "flannel",
            "subnetFile": d.join("subnet.env"),
            "dataDir": d.join("cni-flannel"),
            "ipam": { "dataDir": d.join("cni-ipam") },
            "delegate": { "hairpinMode": true, "isDefaultGateway": true }
        })
        .to_string()
    }

    /// Runs the CNI plugin (`verb`: ADD, DEL, ...) on node `i` with `conf`
    /// on stdin; its stdout, or its output as the error when it fails.
    pub fn cni(
        &self,
        i: usize,
        verb: &str,
        id: &str,
        netns: &str,
        conf: &str,
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
                .write_all(conf.as_bytes())
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
