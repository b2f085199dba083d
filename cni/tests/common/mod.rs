//! Test support for the plugin's root integration tests.
//!
//! A [`World`] is one throwaway node: a "host" network namespace (bridge
//! `cni0`, veth host ends and any iptables state live there and vanish with
//! it), pod namespaces, and a temp dir holding subnet.env, the plugin's
//! dataDir, host-local's dataDir, the CNI config dir and libcni's cache.
//! Plugins run inside the host namespace through `ip netns exec`; cnitool
//! additionally runs with a private bind mount over `/var/lib` (its cache is
//! hard-wired to `/var/lib/cni`). Nothing touches the machine's own
//! `/var/lib/cni`, `/run/flannel` or `/etc/cni`. Everything is removed on
//! drop, also when a test panics.

#![allow(dead_code)]

pub mod fake_ipam;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Once;

use serde_json::{Value, json};

/// The plugin under test.
pub const FLANNEL: &str = env!("CARGO_BIN_EXE_flannel");
/// The real reference plugins (Debian's containernetworking-plugins).
pub const SYSTEM_PLUGINS: &str = "/usr/lib/cni";
/// A PATH for plugins (bridge may call iptables).
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A short name unique to this process and `tag`.
pub fn unique(tag: &str) -> String {
    format!("wt-{tag}-{}", std::process::id())
}

/// The result of one plugin or tool run.
#[derive(Debug)]
pub struct Run {
    /// Exit code (-1 if killed by a signal).
    pub code: i32,
    /// stdout.
    pub stdout: String,
    /// stderr.
    pub stderr: String,
}

impl Run {
    fn from(out: Output) -> Run {
        Run {
            code: out.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    /// Panics unless the run succeeded; returns stdout as JSON (Null if empty).
    pub fn ok(&self) -> Value {
        assert_eq!(
            self.code, 0,
            "expected success\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        if self.stdout.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&self.stdout).expect("stdout is JSON")
        }
    }

    /// Panics unless the run failed with a CNI error object on stdout; returns it.
    pub fn cni_error(&self) -> Value {
        assert_eq!(
            self.code, 1,
            "expected exit 1 with a CNI error\nstdout: {}\nstderr: {}",
            self.stdout, self.stderr
        );
        let v: Value = serde_json::from_str(&self.stdout)
            .unwrap_or_else(|e| panic!("stdout is not JSON ({e}): {}", self.stdout));
        assert!(
            v["code"].as_u64().is_some() && v["msg"].is_string(),
            "not a CNI error: {v}"
        );
        v
    }
}

/// A named network namespace, deleted on drop.
#[derive(Debug)]
pub struct Netns {
    /// Its name.
    pub name: String,
}

impl Netns {
    /// Creates `name` (removing a leftover of a crashed run first) with `lo` up.
    pub fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh(&format!("ip netns add {name}"));
        let ns = Netns {
            name: name.to_string(),
        };
        ns.sh("ip link set lo up");
        ns
    }

    /// Its path, for CNI_NETNS.
    pub fn path(&self) -> String {
        format!("/var/run/netns/{}", self.name)
    }

    /// Runs a shell snippet inside; panics on failure; returns stdout.
    pub fn sh(&self, script: &str) -> String {
        sh(&format!(
            "ip netns exec {} sh -ec '{}'",
            self.name,
            script.replace('\'', r"'\''")
        ))
    }

    /// Runs a shell snippet inside; returns whether it succeeded.
    pub fn try_sh(&self, script: &str) -> bool {
        Command::new("ip")
            .args(["netns", "exec", &self.name, "sh", "-ec", script])
            .output()
            .is_ok_and(|o| o.status.success())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .output();
    }
}

/// Runs a shell snippet on the host; panics on failure; returns stdout.
pub fn sh(script: &str) -> String {
    let out = Command::new("sh")
        .args(["-ec", script])
        .output()
        .expect("spawn sh");
    assert!(
        out.status.success(),
        "`{script}` failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The path of cnitool, built by scripts/tools/build-cnitool.sh on first use.
pub fn cnitool() -> PathBuf {
    static BUILD: Once = Once::new();
    let tools = std::env::var("WEFT_TOOLS")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/weft-tools")
        });
    let bin = tools.join("bin/cnitool");
    BUILD.call_once(|| {
        if !bin.exists() {
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/tools/build-cnitool.sh");
            let status = Command::new("bash")
                .arg(&script)
                .stdout(Stdio::null())
                .status()
                .expect("run build-cnitool.sh");
            assert!(status.success(), "{} failed", script.display());
        }
    });
    assert!(
        bin.exists(),
        "{} missing after build-cnitool.sh",
        bin.display()
    );
    bin
}

/// One throwaway node.
pub struct World {
    /// The unique name prefix.
    pub tag: String,
    /// The temp dir with all of the node's files.
    pub dir: tempfile::TempDir,
    /// The "host" namespace the plugins run in.
    pub host: Netns,
    /// This node's pod subnet's third octet: FLANNEL_SUBNET=10.244.<n>.1/24.
    pub n: u8,
}

impl World {
    /// A node named after `tag` with pod subnet 10.244.`n`.0/24 (no
    /// subnet.env yet).
    pub fn new(tag: &str, n: u8) -> World {
        let tag = unique(tag);
        let dir = tempfile::Builder::new()
            .prefix(&format!("{tag}-"))
            .tempdir()
            .expect("tempdir");
        for sub in ["bin", "net.d", "varlib", "flannel", "ipam"] {
            std::fs::create_dir_all(dir.path().join(sub)).expect("mkdir");
        }
        std::os::unix::fs::symlink(FLANNEL, dir.path().join("bin/flannel"))
            .expect("symlink flannel");
        let host = Netns::new(&format!("{tag}-host"));
        World { tag, dir, host, n }
    }

    /// A path inside the temp dir.
    pub fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `CNI_PATH`: our `flannel`, then the system plugins.
    pub fn cni_path(&self) -> String {
        format!("{}:{SYSTEM_PLUGINS}", self.path("bin").display())
    }

    /// This node's pod subnet.
    pub fn subnet(&self) -> String {
        format!("10.244.{}.0/24", self.n)
    }

    /// The pod gateway (cni0's address).
    pub fn gateway(&self) -> String {
        format!("10.244.{}.1", self.n)
    }

    /// Writes subnet.env as flanneld does (vxlan MTU, flanneld masquerades).
    pub fn write_subnet_env(&self) {
        let text = format!(
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.{}.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n",
            self.n
        );
        std::fs::write(self.path("subnet.env"), text).expect("write subnet.env");
    }

    /// Writes a dual-stack subnet.env (IPv6 subnet fd00:10:244:<n>::/64).
    pub fn write_subnet_env_dual(&self) {
        let n = self.n;
        let text = format!(
            "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.{n}.1/24\n\
             FLANNEL_IPV6_NETWORK=fd00:10:244::/56\nFLANNEL_IPV6_SUBNET=fd00:10:244:{n}::1/64\n\
             FLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
        );
        std::fs::write(self.path("subnet.env"), text).expect("write subnet.env");
    }

    /// The flannel plugin's config object (as inside kube-flannel's conflist,
    /// with every path redirected into the temp dir).
    pub fn plugin_conf(&self) -> Value {
        json!({
            "type": "flannel",
            "subnetFile": self.path("subnet.env"),
            "dataDir": self.path("flannel"),
            "ipam": { "dataDir": self.path("ipam") },
            "delegate": { "hairpinMode": true, "isDefaultGateway": true }
        })
    }

    /// The network config a runtime sends to the plugin directly.
    pub fn net_conf(&self, cni_version: &str) -> Value {
        let mut c = self.plugin_conf();
        c["cniVersion"] = json!(cni_version);
        c["name"] = json!("cbr0");
        c
    }

    /// Writes kube-flannel's conflist (flannel, then portmap) for cnitool.
    pub fn write_conflist(&self, cni_version: &str) {
        let list = json!({
            "name": "cbr0",
            "cniVersion": cni_version,
            "plugins": [self.plugin_conf(), { "type": "portmap", "capabilities": { "portMappings": true } }]
        });
        std::fs::write(
            self.path("net.d/10-flannel.conflist"),
            serde_json::to_vec_pretty(&list).expect("json"),
        )
        .expect("write conflist");
    }

    /// Runs the plugin in the host namespace with `CNI_COMMAND=cmd`, the
    /// given `CNI_*` variables and `CNI_PATH`, feeding `stdin`.
    pub fn plugin(&self, cmd: &str, vars: &[(&str, &str)], stdin: &[u8]) -> Run {
        self.exec(FLANNEL, cmd, vars, stdin)
    }

    /// Runs any plugin binary like [`World::plugin`].
    pub fn exec(&self, binary: &str, cmd: &str, vars: &[(&str, &str)], stdin: &[u8]) -> Run {
        use std::io::Write;
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.host.name, binary])
            .env_clear()
            .env("PATH", PATH)
            .env("CNI_COMMAND", cmd);
        c.env("CNI_PATH", self.cni_path());
        for (k, v) in vars {
            c.env(k, v);
        }
        let mut child = c
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn plugin");
        let mut pipe = child.stdin.take().expect("stdin");
        let data = stdin.to_vec();
        let writer = std::thread::spawn(move || {
            let _ = pipe.write_all(&data);
        });
        let out = child.wait_with_output().expect("wait plugin");
        let _ = writer.join();
        Run::from(out)
    }

    /// ADD/CHECK/DEL variables for attachment `id`/`ifname` in `netns`.
    pub fn attach_vars<'a>(
        id: &'a str,
        ifname: &'a str,
        netns: &'a str,
    ) -> Vec<(&'static str, &'a str)> {
        vec![
            ("CNI_CONTAINERID", id),
            ("CNI_IFNAME", ifname),
            ("CNI_NETNS", netns),
            (
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=p",
            ),
        ]
    }

    /// Runs `cnitool <args>` in the host namespace with a private `/var/lib`.
    pub fn cnitool(&self, args: &[&str]) -> Run {
        let tool = cnitool();
        let script = format!(
            "mount --bind {} /var/lib && exec {} \"$@\"",
            self.path("varlib").display(),
            tool.display()
        );
        let out = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.host.name,
                "sh",
                "-ec",
                &script,
                "cnitool",
            ])
            .args(args)
            .env_clear()
            .env("PATH", PATH)
            .env("NETCONFPATH", self.path("net.d"))
            .env("CNI_PATH", self.cni_path())
            .env("CNI_IFNAME", "eth0")
            .env(
                "CNI_ARGS",
                "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=pod",
            )
            .output()
            .expect("spawn cnitool");
        Run::from(out)
    }

    /// The host-local lease files (one per allocated address).
    pub fn leases(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.path("ipam/cbr0"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        out.retain(|n| n.parse::<std::net::IpAddr>().is_ok());
        out.sort();
        out
    }

    /// The saved delegate configs (container IDs).
    pub fn saved(&self) -> Vec<String> {
        let mut out: Vec<String> = std::fs::read_dir(self.path("flannel"))
            .map(|d| {
                d.flatten()
                    .filter_map(|e| e.file_name().into_string().ok())
                    .collect()
            })
            .unwrap_or_default();
        out.retain(|n| !n.starts_with('.'));
        out.sort();
        out
    }
}

/// The IPv4 address (without prefix) of the first `ips` entry of a result.
pub fn result_ip(result: &Value) -> String {
    let addr = result["ips"][0]["address"]
        .as_str()
        .unwrap_or_else(|| panic!("no ips in {result}"));
    addr.split('/').next().unwrap_or_default().to_string()
}

/// Whether `ip` lies in 10.244.`n`.0/24, above the gateway.
pub fn in_subnet(ip: &str, n: u8) -> bool {
    let prefix = format!("10.244.{n}.");
    ip.strip_prefix(&prefix)
        .and_then(|h| h.parse::<u8>().ok())
        .is_some_and(|h| (2..255).contains(&h))
}
