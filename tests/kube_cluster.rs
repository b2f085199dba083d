//! A real control plane for tests/kube.rs: etcd and kube-apiserver v1.20
//! (built by scripts/tools/build-kube-apiserver.sh) inside the underlay
//! namespace of a set of node namespaces, so that weftd in every node
//! reaches the apiserver at https://192.0.2.100:6443 over the underlay, as
//! on real nodes. Nothing listens in the host's namespace.
//!
//! Tokens (static token file, RBAC authorization): `admin-token`
//! (system:masters) and `nostatus-token` (user `weft-nostatus`, bound to
//! whatever the test grants). Everything is removed on drop.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use weft_tests::netns::{Netns, Underlay};
use weft_tests::proc::{Proc, wait_for};

/// Where the apiserver answers, seen from the node namespaces.
pub const APISERVER: &str = "https://192.0.2.100:6443";
const ETCD: &str = "http://127.0.0.1:2379";

/// The cached kube-apiserver, when built; `None` when it is not and the
/// calling test is to skip (under CI the `weft_testenv` guard fails it).
#[track_caller]
pub fn require_apiserver() -> Option<PathBuf> {
    let tools = std::env::var_os("WEFT_TOOLS").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/weft-tools")
        },
        PathBuf::from,
    );
    let bin = tools.join("bin/kube-apiserver");
    let what = format!(
        "kube-apiserver not built ({}): run scripts/tools/build-kube-apiserver.sh",
        bin.display()
    );
    weft_testenv::require(bin.exists(), &what).then_some(bin)
}

/// The control plane and its underlay.
pub struct ControlPlane {
    /// The underlay (bridge `br0` = 192.0.2.100/24) hosting etcd and the apiserver.
    pub ul: Underlay,
    /// Work directory: certs, tokens, kubeconfigs, logs.
    pub dir: tempfile::TempDir,
    bin: PathBuf,
    etcd: Option<Proc>,
    apiserver: Option<Proc>,
    starts: u32,
}

impl ControlPlane {
    /// Starts etcd and the apiserver in a new underlay namespace `<prefix>ul`.
    pub fn start(prefix: &str, bin: PathBuf) -> ControlPlane {
        let ul = Underlay::new(&format!("{prefix}ul"));
        ul.ns
            .exec(&["ip", "addr", "add", "192.0.2.100/24", "dev", "br0"]);
        let dir = tempfile::Builder::new()
            .prefix("weft-kube-")
            .tempdir()
            .expect("tempdir");
        let d = dir.path();
        std::fs::write(
            d.join("tokens.csv"),
            "admin-token,admin,admin,system:masters\nnostatus-token,weft-nostatus,weft-nostatus\n",
        )
        .expect("tokens");
        openssl(d, &["genrsa", "-out", "sa.key", "2048"]);
        openssl(d, &["rsa", "-in", "sa.key", "-pubout", "-out", "sa.pub"]);
        let mut etcd = Command::new("ip");
        etcd.args(["netns", "exec", ul.ns.name(), "etcd", "--name", "kapi"])
            .arg(format!("--data-dir={}", d.join("etcd").display()))
            .args([
                "--listen-client-urls",
                ETCD,
                "--advertise-client-urls",
                ETCD,
            ])
            .args([
                "--listen-peer-urls",
                "http://127.0.0.1:2380",
                "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380",
            ])
            .args(["--initial-cluster", "kapi=http://127.0.0.1:2380"]);
        let etcd = Proc::spawn("etcd", etcd, &d.join("etcd.log"));
        let mut cp = ControlPlane {
            ul,
            dir,
            bin,
            etcd: Some(etcd),
            apiserver: None,
            starts: 0,
        };
        wait_for("etcd health", Duration::from_secs(30), || {
            cp.etcdctl(&["endpoint", "health"])
                .status
                .success()
                .then_some(())
        });
        cp.start_apiserver();
        cp.write_kubeconfig("admin", "admin-token");
        cp
    }

    /// (Re)starts the apiserver and waits until `/readyz` answers.
    pub fn start_apiserver(&mut self) {
        self.starts += 1;
        let d = self.dir.path();
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ul.ns.name()])
            .arg(&self.bin)
            .arg(format!("--etcd-servers={ETCD}"))
            .args([
                "--bind-address=0.0.0.0",
                "--advertise-address=192.0.2.100",
                "--secure-port=6443",
            ])
            .arg(format!("--cert-dir={}", d.join("certs").display()))
            .arg(format!(
                "--token-auth-file={}",
                d.join("tokens.csv").display()
            ))
            .args(["--authorization-mode=RBAC", "--allow-privileged=true"])
            .args(["--service-account-issuer=https://kubernetes.default.svc.cluster.local"])
            .arg(format!(
                "--service-account-key-file={}",
                d.join("sa.pub").display()
            ))
            .arg(format!(
                "--service-account-signing-key-file={}",
                d.join("sa.key").display()
            ))
            .args([
                "--service-cluster-ip-range=10.96.0.0/16",
                "--enable-priority-and-fairness=false",
            ])
            .args(["--endpoint-reconciler-type=none"])
            // Dual stack is alpha in 1.20: without the gate the apiserver
            // keeps only a Node's first podCIDR (tests/kube.rs dual stack).
            .args(["--feature-gates=IPv6DualStack=true"]);
        let log = d.join(format!("apiserver.{}.log", self.starts));
        self.apiserver = Some(Proc::spawn("kube-apiserver", c, &log));
        wait_for("kube-apiserver /readyz", Duration::from_secs(120), || {
            let out = self.ul.ns.try_exec(&[
                "curl",
                "-skf",
                "-H",
                "Authorization: Bearer admin-token",
                &format!("{APISERVER}/readyz"),
            ]);
            if !self.apiserver.as_mut().is_some_and(Proc::running) {
                panic!(
                    "kube-apiserver exited:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            out.status.success().then_some(())
        });
    }

    /// Kills the apiserver (a crash: open watches break without a goodbye;
    /// a graceful stop waits a minute for them), leaving etcd running.
    pub fn stop_apiserver(&mut self) {
        if let Some(mut p) = self.apiserver.take() {
            p.stop(libc::SIGKILL, Duration::from_secs(30));
        }
    }

    /// Writes `<dir>/<name>.kubeconfig` for `token` (TLS verified against
    /// the apiserver's self-signed certificate) and returns its path.
    pub fn write_kubeconfig(&self, name: &str, token: &str) -> PathBuf {
        let ca = self.dir.path().join("certs/apiserver.crt");
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: t\n  cluster:\n    server: {APISERVER}\n    certificate-authority: {}\n\
             users:\n- name: u\n  user:\n    token: {token}\ncontexts:\n- name: c\n  context: {{cluster: t, user: u}}\ncurrent-context: c\n",
            ca.display()
        );
        let p = self.dir.path().join(format!("{name}.kubeconfig"));
        std::fs::write(&p, text).expect("write kubeconfig");
        p
    }

    /// The admin kubeconfig.
    pub fn admin(&self) -> PathBuf {
        self.dir.path().join("admin.kubeconfig")
    }

    /// Runs kubectl as admin (inside the underlay namespace), feeding `stdin`.
    pub fn kubectl_in(&self, args: &[&str], stdin: Option<&str>) -> Output {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ul.ns.name(), "kubectl"])
            .arg(format!("--kubeconfig={}", self.admin().display()));
        c.args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = c.spawn().expect("spawn kubectl");
        if let Some(mut w) = child.stdin.take() {
            use std::io::Write;
            w.write_all(stdin.unwrap_or("").as_bytes())
                .expect("kubectl stdin");
        }
        child.wait_with_output().expect("kubectl")
    }

    /// kubectl that must succeed; returns stdout.
    pub fn kubectl(&self, args: &[&str]) -> String {
        let out = self.kubectl_in(args, None);
        assert!(
            out.status.success(),
            "kubectl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// `kubectl apply -f -` of `yaml`, which must succeed.
    pub fn apply(&self, yaml: &str) -> String {
        let out = self.kubectl_in(&["apply", "-f", "-"], Some(yaml));
        assert!(
            out.status.success(),
            "kubectl apply: {}\n{yaml}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A Node object as JSON.
    pub fn node_json(&self, name: &str) -> serde_json::Value {
        serde_json::from_str(&self.kubectl(&["get", "node", name, "-o", "json"]))
            .expect("node json")
    }

    /// etcdctl against the control plane's etcd.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        let mut full = vec!["etcdctl", "--endpoints", ETCD];
        full.extend_from_slice(args);
        let mut c = Command::new("ip");
        c.args(["netns", "exec", self.ul.ns.name()])
            .args(&full)
            .env("ETCDCTL_API", "3");
        c.output().expect("etcdctl")
    }

    /// Attaches a node namespace at `192.0.2.<i>`.
    pub fn attach(&mut self, ns: &Netns, i: u8) {
        self.ul.attach(ns, &format!("192.0.2.{i}/24"));
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.apiserver.take();
        self.etcd.take();
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

/// A Node object with a podCIDR, as kube-controller-manager would leave it.
pub fn node_yaml(name: &str, pod_cidr: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Node\nmetadata:\n  name: {name}\nspec:\n  podCIDR: {pod_cidr}\n  podCIDRs: [{pod_cidr}]\n"
    )
}
