//! What a real cluster needs from the machine, found once and checked by
//! the workspace's guard (`weft_testenv`): missing pieces skip the test, or
//! fail it under CI, with one message naming all of them and how to get each.

use std::path::{Path, PathBuf};

/// The programs and files a cluster runs.
#[derive(Debug, Clone)]
pub struct Tools {
    /// kube-apiserver v1.20.2 (scripts/tools/build-kube-apiserver.sh).
    pub kube_apiserver: PathBuf,
    /// kube-controller-manager (scripts/tools/build-kube.sh).
    pub kube_controller_manager: PathBuf,
    /// kube-scheduler (scripts/tools/build-kube.sh).
    pub kube_scheduler: PathBuf,
    /// kubelet (scripts/tools/build-kube.sh).
    pub kubelet: PathBuf,
    /// kube-proxy (scripts/tools/build-kube.sh).
    pub kube_proxy: PathBuf,
    /// kubectl: the one built with the others when present, else `PATH`'s.
    pub kubectl: PathBuf,
    /// containerd (Debian `containerd`).
    pub containerd: PathBuf,
    /// containerd's CLI, for image imports.
    pub ctr: PathBuf,
    /// etcd (Debian `etcd-server`).
    pub etcd: PathBuf,
    /// The standard CNI plugins (Debian `containernetworking-plugins`).
    pub cni_dir: PathBuf,
}

/// `${WEFT_TOOLS:-$HOME/.cache/weft-tools}`, where the tool builds cache
/// their binaries (in `bin/`) and downloads.
pub fn tools_dir() -> PathBuf {
    std::env::var_os("WEFT_TOOLS").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/weft-tools")
        },
        PathBuf::from,
    )
}

fn in_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| executable(p))
}

fn executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// The tools, or `None` when something is missing and the calling test is
/// to return (under `CI` the guard panics instead, naming everything missing).
#[track_caller]
pub fn require() -> Option<Tools> {
    if !weft_testenv::require_root() {
        return None;
    }
    let bin = tools_dir().join("bin");
    let mut missing = Vec::new();
    let mut built = |name: &str, script: &str| {
        let p = bin.join(name);
        if !executable(&p) {
            missing.push(format!("{} (run {script})", p.display()));
        }
        p
    };
    let kube_apiserver = built("kube-apiserver", "scripts/tools/build-kube-apiserver.sh");
    let kube_controller_manager = built("kube-controller-manager", "scripts/tools/build-kube.sh");
    let kube_scheduler = built("kube-scheduler", "scripts/tools/build-kube.sh");
    let kubelet = built("kubelet", "scripts/tools/build-kube.sh");
    let kube_proxy = built("kube-proxy", "scripts/tools/build-kube.sh");
    let kubectl = Some(bin.join("kubectl"))
        .filter(|p| executable(p))
        .or_else(|| in_path("kubectl"));
    if kubectl.is_none() {
        missing.push("kubectl (run scripts/tools/build-kube.sh)".into());
    }
    let mut deb = |path: &str, package: &str| {
        let p = PathBuf::from(path);
        if !executable(&p) {
            missing.push(format!("{path} (apt-get install {package})"));
        }
        p
    };
    let containerd = deb("/usr/bin/containerd", "containerd");
    let ctr = deb("/usr/bin/ctr", "containerd");
    deb("/usr/sbin/runc", "runc");
    deb("/usr/bin/containerd-shim-runc-v2", "containerd");
    let etcd = deb("/usr/bin/etcd", "etcd-server");
    deb("/usr/lib/cni/bridge", "containernetworking-plugins");
    deb("/usr/sbin/conntrack", "conntrack");
    deb("/usr/bin/gcc", "gcc (the static pause image)");
    deb("/usr/bin/python3", "python3 (scripts/image/mkimg.py)");
    deb("/usr/bin/nsenter", "util-linux");
    deb("/usr/bin/strip", "binutils");
    deb("/usr/sbin/iptables", "iptables");
    if !Path::new("/dev/net/tun").exists() {
        missing.push("/dev/net/tun (modprobe tun)".into());
    }
    if !std::fs::read_to_string("/proc/filesystems").is_ok_and(|f| f.contains("overlay")) {
        missing.push("overlayfs (modprobe overlay; containerd's snapshotter)".into());
    }
    if !Path::new("/sys/fs/cgroup/pids/cgroup.procs").exists() {
        missing.push("cgroup v1 hierarchies with pids under /sys/fs/cgroup (kubelet's cgroupfs driver as the kit configures it)".into());
    }
    let what = format!(
        "a real Kubernetes cluster needs: {}",
        if missing.is_empty() {
            "-".to_string()
        } else {
            missing.join(", ")
        }
    );
    weft_testenv::require(missing.is_empty(), &what).then(|| Tools {
        kube_apiserver,
        kube_controller_manager,
        kube_scheduler,
        kubelet,
        kube_proxy,
        kubectl: kubectl.unwrap_or_default(),
        containerd,
        ctr,
        etcd,
        cni_dir: PathBuf::from("/usr/lib/cni"),
    })
}
