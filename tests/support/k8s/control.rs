//! The control plane: etcd, kube-apiserver, kube-controller-manager
//! (allocating node pod CIDRs from 10.244.0.0/16) and kube-scheduler, all in
//! one network namespace that also holds the underlay bridge (`br0`,
//! 192.0.2.1/24) the nodes attach to. Nothing listens in the host's
//! namespace. Authentication is a static token file: `admin` (system:masters,
//! used by the controllers and the tests), `system:node:nodeN` (group
//! system:nodes, the Node authorizer) and `system:kube-proxy` (the built-in
//! system:node-proxier binding).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::netns::Underlay;
use crate::proc::{Proc, wait_for};

use super::tools::Tools;

/// The apiserver's address on the underlay.
pub const APISERVER_IP: &str = "192.0.2.1";
/// The apiserver's URL, seen from the nodes.
pub const APISERVER: &str = "https://192.0.2.1:6443";
/// The pod network kube-controller-manager carves node subnets from.
pub const CLUSTER_CIDR: &str = "10.244.0.0/16";
/// The Service network (10.96.0.1 is the `kubernetes` Service).
pub const SERVICE_CIDR: &str = "10.96.0.0/12";
/// Node tokens written to the token file (node1..nodeN).
pub const MAX_NODES: usize = 9;
const ETCD: &str = "http://127.0.0.1:2379";

/// etcd and the three control-plane daemons; killed on drop.
pub struct ControlPlane {
    /// The namespace (and bridge) the nodes attach to.
    pub ul: Underlay,
    dir: PathBuf,
    procs: Vec<Proc>,
}

impl ControlPlane {
    /// Starts everything in a new namespace `<prefix>c` with its files under
    /// `dir`, and waits until the apiserver is ready.
    pub fn start(prefix: &str, dir: &Path, tools: &Tools) -> ControlPlane {
        let ul = Underlay::new(&format!("{prefix}c"));
        ul.ns.exec(&[
            "ip",
            "addr",
            "add",
            &format!("{APISERVER_IP}/24"),
            "dev",
            "br0",
        ]);
        std::fs::create_dir_all(dir.join("logs")).expect("control plane dir");
        let mut tokens = String::from("admin-token,admin,admin,system:masters\n");
        tokens += "kube-proxy-token,system:kube-proxy,kube-proxy\n";
        for n in 1..=MAX_NODES {
            tokens += &format!("node{n}-token,system:node:node{n},node{n},system:nodes\n");
        }
        std::fs::write(dir.join("tokens.csv"), tokens).expect("tokens");
        openssl(dir, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(dir, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        let mut cp = ControlPlane {
            ul,
            dir: dir.to_path_buf(),
            procs: Vec::new(),
        };
        let d = dir.display();
        cp.spawn(
            "etcd",
            &tools.etcd,
            &[
                "--name=k8s",
                &format!("--data-dir={d}/etcd"),
                &format!("--listen-client-urls={ETCD}"),
                &format!("--advertise-client-urls={ETCD}"),
                "--listen-peer-urls=http://127.0.0.1:2380",
                "--initial-advertise-peer-urls=http://127.0.0.1:2380",
                "--initial-cluster=k8s=http://127.0.0.1:2380",
                "--log-level=warn",
            ],
        );
        wait_for("etcd health", Duration::from_secs(30), || {
            cp.curl(&format!("{ETCD}/health")).then_some(())
        });
        cp.spawn(
            "kube-apiserver",
            &tools.kube_apiserver,
            &[
                &format!("--etcd-servers={ETCD}"),
                "--bind-address=0.0.0.0",
                &format!("--advertise-address={APISERVER_IP}"),
                "--secure-port=6443",
                &format!("--cert-dir={d}/certs"),
                &format!("--token-auth-file={d}/tokens.csv"),
                "--authorization-mode=Node,RBAC",
                "--allow-privileged=true",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                &format!("--service-account-key-file={d}/sa.pub"),
                &format!("--service-account-signing-key-file={d}/sa.key"),
                &format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--enable-priority-and-fairness=false",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--profiling=false",
            ],
        );
        wait_for("kube-apiserver /readyz", Duration::from_secs(120), || {
            assert!(
                cp.procs.iter_mut().all(Proc::running),
                "a control-plane process exited:\n{}",
                cp.logs_tail(30)
            );
            cp.curl_admin(&format!("{APISERVER}/readyz")).then_some(())
        });
        let admin = cp.kubeconfig("admin", "admin-token");
        let admin = admin.display();
        cp.spawn(
            "kube-controller-manager",
            &tools.kube_controller_manager,
            &[
                &format!("--kubeconfig={admin}"),
                "--leader-elect=false",
                &format!("--service-account-private-key-file={d}/sa.key"),
                &format!("--root-ca-file={d}/certs/apiserver.crt"),
                "--allocate-node-cidrs=true",
                &format!("--cluster-cidr={CLUSTER_CIDR}"),
                "--node-cidr-mask-size=24",
                &format!("--service-cluster-ip-range={SERVICE_CIDR}"),
                "--bind-address=127.0.0.1",
                "--port=0",
                "--controllers=*,-cloud-node-lifecycle",
                "--profiling=false",
            ],
        );
        cp.spawn(
            "kube-scheduler",
            &tools.kube_scheduler,
            &[
                &format!("--kubeconfig={admin}"),
                "--leader-elect=false",
                "--bind-address=127.0.0.1",
                "--port=0",
                "--profiling=false",
            ],
        );
        cp
    }

    fn spawn(&mut self, name: &str, bin: &Path, args: &[&str]) {
        let mut c = Command::new("nsenter");
        c.arg(format!("--net={}", self.ul.ns.path()))
            .arg("--")
            .arg(bin)
            .args(args);
        let log = self.dir.join(format!("logs/{name}.log"));
        self.procs.push(Proc::spawn(name, c, &log));
    }

    fn curl(&self, url: &str) -> bool {
        self.ul
            .ns
            .try_exec(&["curl", "-sf", "-m", "2", url])
            .status
            .success()
    }

    fn curl_admin(&self, url: &str) -> bool {
        self.ul
            .ns
            .try_exec(&[
                "curl",
                "-skf",
                "-m",
                "2",
                "-H",
                "Authorization: Bearer admin-token",
                url,
            ])
            .status
            .success()
    }

    /// Writes `<dir>/<name>.kubeconfig` for `token` (TLS verified against the
    /// apiserver's self-signed certificate) and returns its path.
    pub fn kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let ca = self.dir.join("certs/apiserver.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: k\n  cluster:\n    server: {APISERVER}\n    certificate-authority: {}\n\
             users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: k, user: u}}\ncurrent-context: c\n",
            ca.display()
        );
        let p = self.dir.join(format!("{name}.kubeconfig"));
        std::fs::write(&p, text).expect("write kubeconfig");
        p
    }

    /// The admin kubeconfig.
    pub fn admin(&self) -> PathBuf {
        self.dir.join("admin.kubeconfig")
    }

    /// The last `lines` lines of every control-plane log.
    pub fn logs_tail(&self, lines: usize) -> String {
        super::logs_tail(&self.dir.join("logs"), lines)
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        // Controllers first, etcd last.
        while let Some(p) = self.procs.pop() {
            drop(p);
        }
    }
}
