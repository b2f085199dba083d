//! One node: its own network namespace on the underlay (`eth0`,
//! 192.0.2.1N), its own mount namespace and its own cgroup tree, running
//! containerd (with runc), kubelet and kube-proxy (iptables mode).
//!
//! The mount namespace is persistent (bound to `<dir>/ns/mnt`, as `ip netns`
//! binds network namespaces) and overlays `/etc`, `/opt`, `/var/lib` and
//! `/var/log` with per-node upper directories and mounts a tmpfs on `/run`,
//! so the node's host paths (`/opt/cni/bin`, `/etc/cni/net.d`,
//! `/run/flannel`, `/var/lib/cni`, `/var/log/pods`, `/run/xtables.lock`)
//! belong to the node and vanish with it; hostPath volumes of its pods land
//! there. Every process of the node (its daemons, containerd's shims, every
//! container) lives in cgroup `<prefix>-nodeN` (the kubelet's
//! `cgroupRoot`), which is how teardown finds and kills them all.
//!
//! Facts this rests on (found the hard way, see
//! /work/shared/recipes/k8s-node/README.md): runc cannot lower
//! `oom_score_adj` without CAP_SYS_RESOURCE, so containerd runs with
//! `restrict_oom_score_adj = true` and the daemons with `--oom-score-adj=0`;
//! namespaces are entered with `nsenter` (`ip netns exec` remounts `/sys`
//! and loses the cgroup mounts); the apiserver reaches kubelets by
//! InternalIP.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::netns::{Netns, Underlay};
use crate::proc::{Proc, wait_for};

use super::control::{APISERVER_IP, CLUSTER_CIDR, ControlPlane};
use super::tools::Tools;

/// The CRI sandbox image every node imports (scripts/image.sh --test-images).
pub const PAUSE_IMAGE: &str = "weft.local/pause:1";

/// A running node; everything is stopped and removed on drop.
pub struct Node {
    /// The Kubernetes node name, `node<N>`.
    pub name: String,
    /// The node's address on the underlay (its InternalIP).
    pub ip: String,
    /// The node's network namespace.
    pub ns: Netns,
    dir: PathBuf,
    cgroup: String,
    mounted: bool,
    procs: Vec<Proc>,
    proxy_kubeconfig: PathBuf,
    proxy_started: bool,
}

impl Node {
    /// Starts node `index` (1-based): namespaces, cgroups, containerd with
    /// `images` imported, and kubelet. Returns once containerd answers and
    /// the images are in; the node registers itself a moment later. Start
    /// kube-proxy ([`Node::start_kube_proxy`]) once it has: before that
    /// kube-proxy only retries, with a growing back-off, to find its node.
    pub fn start(
        prefix: &str,
        index: usize,
        cluster_dir: &Path,
        ul: &mut Underlay,
        ctl: &ControlPlane,
        tools: &Tools,
        images: &[PathBuf],
    ) -> Node {
        let kubelet_kc = ctl.kubeconfig(&format!("node{index}"), &format!("node{index}-token"));
        let proxy_kc = ctl.kubeconfig(&format!("node{index}-proxy"), "kube-proxy-token");
        Self::start_with(
            prefix,
            index,
            cluster_dir,
            ul,
            (&kubelet_kc, &proxy_kc),
            tools,
            images,
        )
    }

    /// [`Node::start`] with the kubelet's and kube-proxy's kubeconfigs given
    /// (for a cluster that lends its underlay mutably while it starts the node).
    pub fn start_with(
        prefix: &str,
        index: usize,
        cluster_dir: &Path,
        ul: &mut Underlay,
        kubeconfigs: (&Path, &Path),
        tools: &Tools,
        images: &[PathBuf],
    ) -> Node {
        assert!(
            (1..=super::control::MAX_NODES).contains(&index),
            "node index {index}"
        );
        let name = format!("node{index}");
        let ip = format!("192.0.2.{}", 10 + index);
        let ns = Netns::new(&format!("{prefix}n{index}"));
        ul.attach(&ns, &format!("{ip}/24"));
        ns.exec(&["ip", "route", "add", "default", "via", APISERVER_IP]);
        ns.exec(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        let dir = cluster_dir.join(&name);
        for d in [
            "logs",
            "ns",
            "containerd",
            "kubelet",
            "pki",
            "volume-plugins",
        ] {
            std::fs::create_dir_all(dir.join(d)).expect("node dir");
        }
        let mut node = Node {
            name,
            ip,
            ns,
            dir,
            cgroup: format!("{prefix}-node{index}"),
            mounted: false,
            procs: Vec::new(),
            proxy_kubeconfig: kubeconfigs.1.to_path_buf(),
            proxy_started: false,
        };
        node.make_mount_ns(tools);
        node.make_cgroups();
        node.start_containerd(tools);
        for image in images {
            node.import(image);
        }
        node.start_kubelet(kubeconfigs.0, tools);
        node
    }

    fn make_mount_ns(&mut self, tools: &Tools) {
        let d = self.dir.display();
        crate::netns::sh(&format!(
            "mount --bind {d}/ns {d}/ns && mount --make-private {d}/ns && touch {d}/ns/mnt"
        ));
        self.mounted = true;
        let inner = format!(
            "for p in etc opt var/lib var/log; do k=$(echo $p | tr / _); mkdir -p {d}/ov/$k/u {d}/ov/$k/w; \
             mount -t overlay overlay -o lowerdir=/$p,upperdir={d}/ov/$k/u,workdir={d}/ov/$k/w /$p; done; \
             mount -t tmpfs -o mode=755 tmpfs /run; \
             rm -rf /etc/cni/net.d /opt/cni/bin /var/lib/cni /var/log/pods /var/log/containers; \
             mkdir -p /opt/cni/bin /etc/cni/net.d /run/flannel; cp -f {}/* /opt/cni/bin/",
            tools.cni_dir.display()
        );
        let out = Command::new("nsenter")
            .arg(format!("--net={}", self.ns.path()))
            .args([
                "unshare",
                &format!("--mount={d}/ns/mnt"),
                "--propagation",
                "slave",
                "sh",
                "-ec",
                &inner,
            ])
            .output()
            .expect("unshare");
        assert!(
            out.status.success(),
            "{}: mount namespace: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The mounted cgroup hierarchies: the v1 ones the kubelet's cgroupfs
    /// driver uses, plus (`with_unified`) the hybrid layout's cgroup2 one,
    /// where runc makes the containers' cgroups too (teardown looks there).
    fn hierarchies_with(with_unified: bool) -> Vec<PathBuf> {
        let mut v: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
        v.retain(|p| {
            p.join("cgroup.procs").exists()
                && (with_unified || !p.ends_with("unified"))
                && !std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
        });
        v.sort();
        v
    }

    fn hierarchies() -> Vec<PathBuf> {
        Self::hierarchies_with(false)
    }

    fn make_cgroups(&self) {
        for h in Self::hierarchies() {
            let cg = h.join(&self.cgroup);
            std::fs::create_dir_all(&cg).unwrap_or_else(|e| panic!("mkdir {}: {e}", cg.display()));
            if h.ends_with("cpuset") {
                for f in ["cpuset.cpus", "cpuset.mems"] {
                    let v = std::fs::read_to_string(h.join(f)).expect("cpuset");
                    std::fs::write(cg.join(f), v.trim()).expect("cpuset");
                }
            }
        }
        std::fs::create_dir_all(self.daemons_cgroup()).expect("daemons cgroup");
    }

    fn daemons_cgroup(&self) -> PathBuf {
        Path::new("/sys/fs/cgroup/pids")
            .join(&self.cgroup)
            .join("daemons")
    }

    /// A `Command` running `program` inside the node's network and mount namespaces.
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ns.path()))
            .arg(format!("--mount={}/ns/mnt", self.dir.display()))
            .arg("--")
            .arg(program);
        c
    }

    /// Runs a shell snippet on the node (its network and mount namespaces) and
    /// returns its output, success or not.
    pub fn try_sh(&self, script: &str) -> Output {
        self.command("sh")
            .args(["-ec", script])
            .output()
            .expect("nsenter")
    }

    /// Runs a shell snippet on the node; panics with its stderr on failure.
    pub fn sh(&self, script: &str) -> String {
        let out = self.try_sh(script);
        assert!(
            out.status.success(),
            "{}: `{script}` failed: {}{}",
            self.name,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn spawn(&mut self, name: &str, bin: &Path, args: &[String]) {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ns.path()))
            .arg(format!("--mount={}/ns/mnt", self.dir.display()))
            .arg("--")
            .arg("nice")
            .arg("-n5")
            .arg(bin)
            .args(args);
        let log = self.dir.join(format!("logs/{name}.log"));
        let p = Proc::spawn(name, c, &log);
        // Into the node's cgroup before it starts anything (shims, containers).
        let procs = self.daemons_cgroup().join("cgroup.procs");
        std::fs::write(&procs, p.pid().to_string())
            .unwrap_or_else(|e| panic!("{}: {}: {e}", self.name, procs.display()));
        self.procs.push(p);
    }

    fn sock(&self) -> PathBuf {
        self.dir.join("containerd/containerd.sock")
    }

    fn start_containerd(&mut self, tools: &Tools) {
        let c = self.dir.join("containerd");
        let c = c.display();
        let config = format!(
            r#"version = 2
root = "{c}/root"
state = "{c}/state"
[grpc]
  address = "{c}/containerd.sock"
[ttrpc]
  address = "{c}/containerd.sock.ttrpc"
[debug]
  address = ""
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "{c}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  restrict_oom_score_adj = true
  enable_selinux = false
  stream_server_address = "127.0.0.1"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/opt/cni/bin"
    conf_dir = "/etc/cni/net.d"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
"#
        );
        let path = self.dir.join("containerd.toml");
        std::fs::write(&path, config).expect("containerd.toml");
        self.spawn(
            "containerd",
            &tools.containerd,
            &[format!("--config={}", path.display())],
        );
        let ctr = tools.ctr.clone();
        let sock = self.sock();
        wait_for("containerd", Duration::from_secs(30), || {
            assert!(
                self.procs.iter_mut().all(Proc::running),
                "{}: containerd exited:\n{}",
                self.name,
                self.logs_tail(20)
            );
            Command::new(&ctr)
                .arg("-a")
                .arg(&sock)
                .arg("version")
                .output()
                .is_ok_and(|o| o.status.success())
                .then_some(())
        });
    }

    /// `ctr -n k8s.io ARGS` against the node's containerd; panics on failure.
    pub fn ctr(&self, args: &[&str]) -> String {
        let out = Command::new("ctr")
            .arg("-a")
            .arg(self.sock())
            .args(["-n", "k8s.io"])
            .args(args)
            .output()
            .expect("ctr");
        assert!(
            out.status.success(),
            "{}: ctr {args:?}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Imports an image tarball (OCI or docker-archive) into the CRI's namespace.
    pub fn import(&self, tar: &Path) {
        let t = tar.to_str().expect("utf-8 path");
        self.ctr(&["images", "import", t]);
    }

    fn start_kubelet(&mut self, kubeconfig: &Path, tools: &Tools) {
        let d = self.dir.display();
        let config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             address: {ip}\nport: 10250\nreadOnlyPort: 0\nhealthzBindAddress: 127.0.0.1\nhealthzPort: 10248\n\
             authentication: {{anonymous: {{enabled: true}}, webhook: {{enabled: false}}, x509: {{}}}}\n\
             authorization: {{mode: AlwaysAllow}}\n\
             cgroupDriver: cgroupfs\ncgroupRoot: /{cg}\ncgroupsPerQOS: true\nfailSwapOn: false\n\
             clusterDomain: cluster.local\nclusterDNS: [10.96.0.10]\nresolvConf: \"\"\n\
             volumePluginDir: {d}/volume-plugins\n\
             evictionHard: {{memory.available: \"50Mi\", nodefs.available: \"1%\", imagefs.available: \"1%\", nodefs.inodesFree: \"1%\"}}\n\
             imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
             serializeImagePulls: false\nruntimeRequestTimeout: 2m\nvolumeStatsAggPeriod: 1m\n\
             nodeStatusUpdateFrequency: 4s\nnodeStatusReportFrequency: 1m\nsyncFrequency: 2s\n\
             containerLogMaxSize: 1Mi\n",
            ip = self.ip,
            cg = self.cgroup,
        );
        let path = self.dir.join("kubelet.yaml");
        std::fs::write(&path, config).expect("kubelet.yaml");
        let args = vec![
            format!("--config={}", path.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--container-runtime=remote".into(),
            format!(
                "--container-runtime-endpoint=unix://{}",
                self.sock().display()
            ),
            format!("--pod-infra-container-image={PAUSE_IMAGE}"),
            format!("--root-dir={d}/kubelet"),
            format!("--cert-dir={d}/pki"),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={}", self.ip),
            "--oom-score-adj=0".into(),
            "--v=1".into(),
        ];
        self.spawn("kubelet", &tools.kubelet, &args);
    }

    /// Starts kube-proxy (iptables mode); see [`Node::kube_proxy_synced`].
    pub fn start_kube_proxy(&mut self, tools: &Tools) {
        let args = vec![
            format!("--kubeconfig={}", self.proxy_kubeconfig.display()),
            format!("--hostname-override={}", self.name),
            "--proxy-mode=iptables".into(),
            format!("--cluster-cidr={CLUSTER_CIDR}"),
            "--healthz-bind-address=127.0.0.1:10256".into(),
            "--metrics-bind-address=127.0.0.1:10249".into(),
            // Leave the host-wide conntrack table size and timeouts alone.
            "--conntrack-max-per-core=0".into(),
            "--conntrack-tcp-timeout-established=0s".into(),
            "--conntrack-tcp-timeout-close-wait=0s".into(),
            "--oom-score-adj=0".into(),
            "--v=1".into(),
        ];
        self.spawn("kube-proxy", &tools.kube_proxy, &args);
        self.proxy_started = true;
    }

    /// Whether [`Node::start_kube_proxy`] ran.
    pub fn kube_proxy_started(&self) -> bool {
        self.proxy_started
    }

    /// Whether kube-proxy has programmed the `kubernetes` Service
    /// (10.96.0.1:443) in the node's nat table: what the in-cluster clients
    /// of hostNetwork pods (weftd) need. A connection tried before that keeps
    /// its un-NATed conntrack entry and hangs until the client gives up.
    pub fn kube_proxy_synced(&self) -> bool {
        self.try_sh("iptables -t nat -S KUBE-SERVICES 2>/dev/null")
            .stdout
            .windows(b"10.96.0.1/32".len())
            .any(|w| w == b"10.96.0.1/32")
    }

    /// The pids of processes named `comm` (as in `/proc/<pid>/comm`) in the
    /// node's network namespace: its own daemons and its hostNetwork pods'
    /// processes (weftd runs as `flanneld`).
    pub fn pids_named(&self, comm: &str) -> Vec<i32> {
        netns_pids_named(self.ns.name(), comm)
    }

    /// Whether the node's daemons (containerd, kubelet, kube-proxy) all still run.
    pub fn running(&mut self) -> bool {
        self.procs.iter_mut().all(Proc::running)
    }

    /// The last `lines` lines of each of the node's daemon logs.
    pub fn logs_tail(&self, lines: usize) -> String {
        super::logs_tail(&self.dir.join("logs"), lines)
    }

    /// The pids of every process in the node's cgroup tree (all hierarchies).
    fn cgroup_pids(&self) -> Vec<i32> {
        let mut pids = Vec::new();
        for h in Self::hierarchies_with(true) {
            walk(&h.join(&self.cgroup), &mut |dir| {
                if let Ok(s) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    pids.extend(s.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
                }
            });
        }
        pids.sort_unstable();
        pids.dedup();
        pids
    }

    /// Stops everything of the node: daemons, shims, containers (by cgroup),
    /// then removes its cgroups and mount namespace. Idempotent.
    pub fn stop(&mut self) {
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let pids = self.cgroup_pids();
            if pids.is_empty() {
                break;
            }
            for pid in &pids {
                // SAFETY: kill(2) on a pid read from the node's own cgroup; no memory involved.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            if Instant::now() > deadline {
                eprintln!("{}: processes left in its cgroups: {pids:?}", self.name);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        for h in Self::hierarchies_with(true) {
            let root = h.join(&self.cgroup);
            let mut dirs = Vec::new();
            walk(&root, &mut |d| dirs.push(d.to_path_buf()));
            // Children before parents.
            dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
            for d in dirs {
                for _ in 0..50 {
                    if std::fs::remove_dir(&d).is_ok() || !d.exists() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
        if self.mounted {
            let d = self.dir.display();
            for m in [format!("{d}/ns/mnt"), format!("{d}/ns")] {
                let ok = Command::new("umount")
                    .arg(&m)
                    .output()
                    .is_ok_and(|o| o.status.success());
                if !ok {
                    let _ = Command::new("umount").args(["-l", &m]).output();
                }
            }
            self.mounted = false;
        }
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.stop();
        // self.ns is deleted after this (field drop), killing whatever is left in it.
    }
}

/// Calls `f` on `dir` and every directory below it.
fn walk(dir: &Path, f: &mut dyn FnMut(&Path)) {
    if !dir.is_dir() {
        return;
    }
    f(dir);
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&e.path(), f);
            }
        }
    }
}

/// The pids of the processes named `comm` in network namespace `netns`
/// (for threads that watch a node without holding it).
pub fn netns_pids_named(netns: &str, comm: &str) -> Vec<i32> {
    let out = Command::new("ip")
        .args(["netns", "pids", netns])
        .output()
        .expect("ip netns pids");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|p| p.parse::<i32>().ok())
        .filter(|p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == comm)
        })
        .collect()
}
