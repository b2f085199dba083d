//! Tier 1 of the test kit: a weft cluster in network namespaces on this
//! machine's real CPU, built on the pieces `weft demo` uses
//! ([`weft_control::demo::cluster`]: namespaces, the underlay, weftd per
//! node, pods through the real CNI plugin, its [`ClusterSpec`]), with what
//! only the tests need:
//! the etcd store ([`ClusterStore`]), per-node weftd arguments, routed pods
//! ([`CniMode`]) and their deletion, restarts with the same arguments, and
//! the checks the host tests share (pings, iperf3, subnet.env, leases,
//! `weft status`, daemon exits).
//!
//! [`Cluster`] dereferences to the demo's cluster: its `nodes`, `pods`,
//! `log`, `subnet_env`, `stop_weftd`, `wait_ready` and `work` are those.
//! Dropping it stops the daemons and deletes every namespace.

use std::ops::{Deref, DerefMut};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use weft_control::demo::cluster as demo;
pub use weft_control::demo::cluster::{CNI_PLUGIN_DIR, ClusterError, ClusterSpec, Node, Pod};
use weft_control::status::model::Status;

use crate::netns::Netns;

/// The pod network of every host test.
pub const NETWORK: &str = "10.244.0.0/16";

/// A net-conf.json with `backend` (JSON, e.g. `{"Type":"vxlan"}`) on [`NETWORK`].
pub fn net_conf(backend: &str) -> String {
    format!(r#"{{"Network":"{NETWORK}","Backend":{backend}}}"#)
}

/// [`net_conf`] of backend type `ty` where nodes take subnets only up to
/// 10.244.63.0/24, so that a test's made-up leases and addresses (10.244.64.0
/// and above) never collide with a real node's.
pub fn net_conf_below_64(ty: &str) -> String {
    format!(r#"{{"Network":"{NETWORK}","SubnetMax":"10.244.63.0","Backend":{{"Type":"{ty}"}}}}"#)
}

/// The lease store the nodes of a [`Cluster`] share.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ClusterStore {
    /// The embedded store in `<work>/store`.
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

/// The weftd arguments of `store` for a cluster working in `work`.
fn store_args(store: &ClusterStore, work: &Path) -> Vec<String> {
    match store {
        ClusterStore::Embedded => ClusterSpec::embedded_store(work),
        ClusterStore::Etcd(endpoints) => vec![
            "--store=etcd".into(),
            format!("--etcd-endpoints={endpoints}"),
        ],
    }
}

/// The spec of `nodes` nodes working in `work`, with weftd arguments
/// `args` (the store's are added by [`Cluster::create`]) and the
/// workspace's binaries.
pub fn spec(tag: &str, net_conf: &str, nodes: u8, args: &[&str], work: &Path) -> ClusterSpec {
    ClusterSpec {
        prefix: crate::unique(tag),
        nodes,
        net_conf: net_conf.to_string(),
        weftd_args: args.iter().map(|a| a.to_string()).collect(),
        bin_dir: crate::bins::dir(),
        work: work.to_path_buf(),
    }
}

/// A started cluster of `nodes` nodes on the embedded store in a new work
/// dir (returned with it: dropped after the cluster); panics on failure.
pub fn start(tag: &str, net_conf: &str, nodes: u8, args: &[&str]) -> (tempfile::TempDir, Cluster) {
    let work = tempfile::tempdir().expect("tempdir");
    let c = Cluster::start(spec(tag, net_conf, nodes, args, work.path()))
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    (work, c)
}

/// [`start`] with one node per entry of `node_args`, each given those weftd
/// arguments after `args`.
pub fn start_nodes(
    tag: &str,
    net_conf: &str,
    node_args: &[&[&str]],
    args: &[&str],
) -> (tempfile::TempDir, Cluster) {
    let work = tempfile::tempdir().expect("tempdir");
    let n = u8::try_from(node_args.len()).expect("nodes");
    let per = node_args
        .iter()
        .map(|a| a.iter().map(|s| s.to_string()).collect())
        .collect();
    let c = Cluster::start_with_node_args(spec(tag, net_conf, n, args, work.path()), per)
        .unwrap_or_else(|e| panic!("cluster: {e}"));
    (work, c)
}

/// The running cluster. See the module docs.
#[derive(Debug)]
pub struct Cluster {
    c: demo::Cluster,
    node_args: Vec<Vec<String>>,
    modes: Vec<CniMode>,
}

impl Deref for Cluster {
    type Target = demo::Cluster;
    fn deref(&self) -> &demo::Cluster {
        &self.c
    }
}

impl DerefMut for Cluster {
    fn deref_mut(&mut self) -> &mut demo::Cluster {
        &mut self.c
    }
}

impl Cluster {
    /// Builds the underlay and the nodes on the embedded store and starts a
    /// weftd on each; waits until every node has written its subnet.env.
    pub fn start(spec: ClusterSpec) -> Result<Cluster, ClusterError> {
        Cluster::start_with_node_args(spec, Vec::new())
    }

    /// [`Cluster::start`] with extra weftd arguments for node `i` in
    /// `node_args[i]` (e.g. a per-node `--dataplane`), kept for restarts.
    pub fn start_with_node_args(
        spec: ClusterSpec,
        node_args: Vec<Vec<String>>,
    ) -> Result<Cluster, ClusterError> {
        let mut c = Cluster::create(spec, &ClusterStore::Embedded, node_args)?;
        c.start_all()?;
        Ok(c)
    }

    /// Builds the underlay and the nodes on `store` without starting any
    /// weftd (for callers that need something inside the node namespaces
    /// first, e.g. a proxy to etcd); then [`Cluster::start_all`] or
    /// [`Cluster::start_weftd`].
    pub fn create(
        mut spec: ClusterSpec,
        store: &ClusterStore,
        node_args: Vec<Vec<String>>,
    ) -> Result<Cluster, ClusterError> {
        let mut args = store_args(store, &spec.work);
        args.append(&mut spec.weftd_args);
        spec.weftd_args = args;
        let c = demo::Cluster::create(spec)?;
        let modes = vec![CniMode::Bridge; c.nodes.len()];
        Ok(Cluster {
            c,
            node_args,
            modes,
        })
    }

    /// Starts every node's weftd and waits until each has written its subnet.env.
    pub fn start_all(&mut self) -> Result<(), ClusterError> {
        for i in 0..self.c.nodes.len() {
            self.start_weftd(i)?;
        }
        for i in 0..self.c.nodes.len() {
            self.c.wait_ready(i, Duration::from_secs(60))?;
        }
        Ok(())
    }

    /// Starts (or restarts) node `i`'s weftd, with its own arguments.
    pub fn start_weftd(&mut self, i: usize) -> Result<(), ClusterError> {
        let extra = self.node_args.get(i).cloned().unwrap_or_default();
        self.c.start_weftd_with(i, &extra)
    }

    /// Makes node `i`'s CNI plugin attach pods added from now on in `mode`
    /// (every node starts in bridge mode). Each pod keeps the mode it was added with.
    pub fn set_cni_mode(&mut self, i: usize, mode: CniMode) {
        self.modes[i] = mode;
    }

    /// Node `i`'s CNI config in `mode` (routed: the plugin finds weftd's
    /// IPAM socket next to the node's subnet.env).
    pub fn cni_conf(&self, i: usize, mode: CniMode) -> String {
        let conf = self.c.cni_conf(i);
        match mode {
            CniMode::Bridge => conf,
            CniMode::Routed => {
                let mut v: serde_json::Value = serde_json::from_str(&conf).expect("CNI config");
                v["mode"] = "routed".into();
                v.to_string()
            }
        }
    }

    /// Creates pod `name` on node `i` through the CNI plugin, in the node's
    /// mode; returns its index.
    pub fn add_pod(&mut self, i: usize, name: &str) -> Result<usize, ClusterError> {
        let conf = self.cni_conf(i, self.modes[i]);
        self.c.add_pod_with(i, name, conf)
    }

    /// Removes pod `p` through the CNI plugin (DEL, with the config it was
    /// added with) and deletes its namespace.
    pub fn del_pod(&mut self, p: usize) -> Result<(), ClusterError> {
        let conf = self.c.pods[p].conf.clone();
        self.del_pod_with(p, conf)
    }

    /// [`Cluster::del_pod`] with the plugin configured in `mode` (a node
    /// moved between bridge and routed since the pod was added).
    pub fn del_pod_in(&mut self, p: usize, mode: CniMode) -> Result<(), ClusterError> {
        let conf = self.cni_conf(self.c.pods[p].node, mode);
        self.del_pod_with(p, conf)
    }

    fn del_pod_with(&mut self, p: usize, conf: String) -> Result<(), ClusterError> {
        let pod = self.c.pods.remove(p);
        self.c
            .cni(pod.node, "DEL", &pod.id, &pod.ns.path(), &conf)
            .map(|_| ())
    }

    /// Runs the CNI plugin on node `i` in `mode`; (exit code 0 or 1, its
    /// stdout, or its stdout and stderr when it failed).
    pub fn cni_raw(
        &self,
        i: usize,
        mode: CniMode,
        verb: &str,
        id: &str,
        netns: &str,
    ) -> (i32, String) {
        match self.c.cni(i, verb, id, netns, &self.cni_conf(i, mode)) {
            Ok(out) => (0, out),
            Err(e) => (1, e.to_string()),
        }
    }

    /// Node `i`'s subnet.env path.
    pub fn subnet_file(&self, i: usize) -> PathBuf {
        self.c.nodes[i].dir.join("subnet.env")
    }

    /// One variable of node `i`'s subnet.env.
    #[track_caller]
    pub fn env_var(&self, i: usize, var: &str) -> String {
        let env = self
            .c
            .subnet_env(i)
            .unwrap_or_else(|| panic!("node {i} has no subnet.env"));
        let prefix = format!("{var}=");
        env.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .unwrap_or_else(|| panic!("no {var} in {env}"))
            .to_string()
    }

    /// Node `i`'s pod subnet, `10.244.5.0/24` (subnet.env gives `.1/24`).
    pub fn subnet(&self, i: usize) -> String {
        self.env_var(i, "FLANNEL_SUBNET").replace(".1/", ".0/")
    }

    /// Node `i`'s lease key, `10.244.5.0-24`.
    pub fn lease_key(&self, i: usize) -> String {
        self.subnet(i).replace('/', "-")
    }

    /// Node `i`'s `weft status` (its status socket).
    #[track_caller]
    pub fn status(&self, i: usize) -> Status {
        crate::weftd::status(&self.subnet_file(i))
    }

    /// `weft dataplane set <to>` on node `i`, asserting that it succeeded
    /// and that weftd reports the new dataplane; the time it took.
    #[track_caller]
    pub fn switch_dataplane(&self, i: usize, to: &str) -> Duration {
        let t0 = Instant::now();
        let out = std::process::Command::new(crate::bins::path("weft"))
            .args(["dataplane", "set", to, "--subnet-file"])
            .arg(self.subnet_file(i))
            .output()
            .expect("weft dataplane set");
        assert!(
            out.status.success(),
            "weft dataplane set {to} failed: {}{}\nlog:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            self.log(i)
        );
        assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("runs in the {to}")));
        t0.elapsed()
    }

    /// `weft leases <args>` on the embedded store (`put` checks its key
    /// against the cluster's network config): stdout, or the error text.
    pub fn weft_leases(&self, args: &[&str]) -> Result<String, String> {
        let work = self.c.work();
        let out = std::process::Command::new(crate::bins::path("weft"))
            .arg("leases")
            .args(args)
            .arg(format!("--store-path={}", work.join("store").display()))
            .arg(format!(
                "--net-config-path={}",
                work.join("net-conf.json").display()
            ))
            .output()
            .map_err(|e| format!("spawn weft: {e}"))?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    /// `weft leases --json` of the embedded store: every lease as
    /// `{"key": ..., "value": {...}}`.
    pub fn leases(&self) -> Vec<serde_json::Value> {
        let out = self
            .weft_leases(&["--json"])
            .unwrap_or_else(|e| panic!("weft leases --json: {e}"));
        let v: serde_json::Value =
            serde_json::from_str(&out).unwrap_or_else(|e| panic!("weft leases --json: {e}: {out}"));
        v.as_array().expect("array").clone()
    }

    /// The lease whose `PublicIP` is `public_ip`.
    #[track_caller]
    pub fn lease_of(&self, public_ip: &str) -> serde_json::Value {
        self.leases()
            .into_iter()
            .find(|l| l["value"]["PublicIP"] == public_ip)
            .unwrap_or_else(|| panic!("no lease of {public_ip}"))
    }

    /// Whether pod `a` reaches pod `b`, trying once a second for up to ~15 s.
    pub fn wait_ping(&self, a: usize, b: usize) -> bool {
        wait_ping(&self.c.pods[a].ns, &self.c.pods[b].ip)
    }

    /// Asserts that every pod reaches every pod on the other nodes.
    #[track_caller]
    pub fn assert_mesh(&self) {
        let pods = &self.c.pods;
        for a in 0..pods.len() {
            for b in 0..pods.len() {
                if pods[a].node != pods[b].node {
                    assert!(
                        self.wait_ping(a, b),
                        "pod {a} cannot reach pod {b}; logs:\n{}\n{}",
                        self.c.log(pods[a].node),
                        self.c.log(pods[b].node)
                    );
                }
            }
        }
    }

    /// Asserts that a ping of exactly `mtu` bytes with DF set gets from pod
    /// `a` to pod `b` (nothing on the path is smaller) and, with `over`,
    /// that one byte more does not.
    #[track_caller]
    pub fn assert_df_ping(&self, a: usize, b: usize, mtu: u32, over: bool) {
        let df = |size: u32| {
            self.c.pods[a].ns.try_exec(&[
                "ping",
                "-c",
                "2",
                "-W",
                "2",
                "-M",
                "do",
                "-s",
                &(size - 28).to_string(),
                &self.c.pods[b].ip,
            ])
        };
        let out = df(mtu);
        assert!(
            out.status.success(),
            "a {mtu}-byte ping with DF from pod {a} to pod {b} failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        if over {
            assert!(
                !df(mtu + 1).status.success(),
                "a {}-byte ping with DF from pod {a} to pod {b} passed",
                mtu + 1
            );
        }
    }

    /// A pod made by hand on node `i` (not by weft's CNI plugin: a node that
    /// is not weft's, as flannel or wireguard-go would serve it): a veth
    /// from a new namespace into the node's `cni0`, with `addr` (CIDR) and a
    /// default route via `gw`.
    pub fn hand_made_pod(&self, i: usize, addr: &str, gw: &str) -> Netns {
        let node = &self.c.nodes[i].ns;
        let pod = Netns::new(&format!("{}k", node.name()));
        crate::netns::run(
            "ip",
            &[
                "link",
                "add",
                "eth0",
                "netns",
                pod.name(),
                "type",
                "veth",
                "peer",
                "name",
                "vk",
                "netns",
                node.name(),
            ],
        );
        node.sh("ip link set vk master cni0 up");
        pod.sh(&format!(
            "ip addr add {addr} dev eth0; ip link set eth0 up; ip route add default via {gw}"
        ));
        pod
    }

    /// Bytes moved by a `secs`-second iperf3 TCP transfer from pod `a` to pod `b`.
    pub fn iperf_bytes(&self, a: usize, b: usize, secs: u32) -> u64 {
        iperf_bytes(
            &self.c.pods[a].ns,
            &self.c.pods[b].ns,
            &self.c.pods[b].ip,
            secs,
        )
    }

    /// The CPU time node `i`'s weftd has used (user + system, from
    /// /proc/PID/stat; zero when it does not run).
    pub fn weftd_cpu(&self, i: usize) -> Duration {
        let Some(pid) = self.c.nodes[i].weftd.as_ref().map(|p| p.id()) else {
            return Duration::ZERO;
        };
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        // Fields after the command name (which may hold spaces): utime and
        // stime are fields 14 and 15 of the line, 12 and 13 after `)`.
        let after = stat.rsplit_once(')').map_or("", |(_, r)| r);
        let f: Vec<u64> = after
            .split_whitespace()
            .map(|x| x.parse().unwrap_or(0))
            .collect();
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        let ticks = f.get(11).copied().unwrap_or(0) + f.get(12).copied().unwrap_or(0);
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// Whether node `i`'s weftd is running.
    pub fn running(&mut self, i: usize) -> bool {
        self.c.nodes[i]
            .weftd
            .as_mut()
            .is_some_and(|p| matches!(p.try_wait(), Ok(None)))
    }

    /// Waits until node `i`'s weftd exits and returns its exit code (`None`
    /// when killed by a signal); panics after `timeout`.
    pub fn wait_exit(&mut self, i: usize, timeout: Duration) -> Option<i32> {
        let deadline = Instant::now() + timeout;
        loop {
            let child = self.c.nodes[i].weftd.as_mut().expect("weftd was started");
            if let Ok(Some(st)) = child.try_wait() {
                self.c.nodes[i].weftd = None;
                return st.code();
            }
            assert!(
                Instant::now() < deadline,
                "node {i}'s weftd still runs after {timeout:?}; log:\n{}",
                self.c.log(i)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs node `i`'s weftd and reaps it.
    pub fn kill_weftd(&mut self, i: usize) {
        let mut child = self.c.nodes[i].weftd.take().expect("weftd");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
    }
}

/// Whether `ip` answers a ping from `from`, trying once a second for up to ~15 s.
pub fn wait_ping(from: &Netns, ip: &str) -> bool {
    (0..15).any(|_| from.ping(ip, 1))
}

/// Bytes moved by a `secs`-second iperf3 TCP transfer from `client` to the
/// server started in `server` on `ip` (0 when it failed).
pub fn iperf_bytes(client: &Netns, server: &Netns, ip: &str, secs: u32) -> u64 {
    server.exec(&["iperf3", "-s", "-1", "-D", "-B", ip]);
    std::thread::sleep(Duration::from_millis(300));
    let out = client.try_exec(&["iperf3", "-c", ip, "-t", &secs.to_string(), "-J"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0)
}
