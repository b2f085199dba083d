//! Root netns test harness: nodes on a shared underlay bridge, one pod per node.
//!
//! Every object lives in namespaces named `wt-<test>-<pid>-*`, created here and
//! deleted by `Drop` (also on panic). Nothing touches the host namespace.
#![allow(dead_code)]

use std::fs::File;
use std::net::IpAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weft_engine::{Encap, Engine, EngineConfig, Peer};

/// Whether we can run root netns tests (root and `/dev/net/tun`); skips or,
/// under CI, fails the test otherwise (see `weft_testenv`).
#[track_caller]
pub fn require_root_and_tun() -> bool {
    weft_testenv::require_root()
        && weft_testenv::require(
            std::path::Path::new("/dev/net/tun").exists(),
            "/dev/net/tun missing: load the tun module (modprobe tun)",
        )
}

/// Runs a command, panicking with its output on failure.
pub fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("spawn");
    assert!(
        out.status.success(),
        "{args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Runs a command, returning whether it succeeded.
pub fn try_sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Runs `f` inside network namespace `ns` on a fresh thread (so the caller's
/// namespace is untouched) and returns its result.
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let path = format!("/var/run/netns/{ns}");
    std::thread::spawn(move || {
        let fd = File::open(&path).expect("open netns");
        nix::sched::setns(&fd, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
        f()
    })
    .join()
    .expect("netns thread")
}

/// Node `n`'s flannel-UDP engine: `flannel0`, 10.244.n.0, underlay 192.0.2.n, two workers.
pub fn udp_cfg(n: usize) -> EngineConfig {
    EngineConfig {
        tun_name: "flannel0".into(),
        encap: Encap::FlannelUdp { port: 8285 },
        local_addr: IpAddr::from([192, 0, 2, u8::try_from(n).expect("small")]),
        tun_addr: Some(IpAddr::from([10, 244, u8::try_from(n).expect("small"), 0])),
        mtu: 1472,
        workers: 2,
        offload: true,
        anti_spoof: true,
        tunnel_tap: None,
    }
}

/// Starts an engine inside `ns` (TUN and sockets are created there).
pub fn start_engine(ns: &str, cfg: EngineConfig) -> Engine {
    in_netns(ns, move || Engine::start(cfg).expect("engine start"))
}

/// Polls `f` until it is true or `secs` elapse.
pub fn wait_for(secs: u64, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + Duration::from_secs(secs);
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// A test topology; deletes all its namespaces and kills its processes on drop.
pub struct Topo {
    pub prefix: String,
    pub nodes: usize,
    netns: Vec<String>,
    children: Vec<Child>,
}

impl Topo {
    /// Creates `nodes` nodes `192.0.2.<n>/24` on bridge `br0` in `<prefix>-sw`, each
    /// with `cni0` = `10.244.<n>.1/24` and a pod `<prefix>-p<n>` = `10.244.<n>.2/24`.
    pub fn new(test: &str, nodes: usize) -> Topo {
        let prefix = format!("wt-{test}-{}", std::process::id());
        let mut t = Topo {
            prefix: prefix.clone(),
            nodes,
            netns: Vec::new(),
            children: Vec::new(),
        };
        let sw = t.add_ns("sw");
        sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"]);
        sh(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        for n in 1..=nodes {
            let node = t.add_ns(&format!("n{n}"));
            let pod = t.add_ns(&format!("p{n}"));
            let port = format!("n{n}");
            sh(&[
                "ip", "link", "add", "eth0", "netns", &node, "type", "veth", "peer", "name", &port,
                "netns", &sw,
            ]);
            sh(&["ip", "-n", &sw, "link", "set", &port, "master", "br0", "up"]);
            sh(&[
                "ip",
                "-n",
                &node,
                "addr",
                "add",
                &format!("192.0.2.{n}/24"),
                "dev",
                "eth0",
            ]);
            sh(&["ip", "-n", &node, "link", "set", "eth0", "up"]);
            sh(&["ip", "-n", &node, "link", "set", "lo", "up"]);
            sh(&[
                "ip",
                "netns",
                "exec",
                &node,
                "sysctl",
                "-qw",
                "net.ipv4.ip_forward=1",
            ]);
            sh(&["ip", "-n", &node, "link", "add", "cni0", "type", "bridge"]);
            sh(&[
                "ip",
                "-n",
                &node,
                "addr",
                "add",
                &format!("10.244.{n}.1/24"),
                "dev",
                "cni0",
            ]);
            sh(&["ip", "-n", &node, "link", "set", "cni0", "up"]);
            sh(&[
                "ip", "link", "add", "eth0", "netns", &pod, "type", "veth", "peer", "name",
                "veth0", "netns", &node,
            ]);
            sh(&[
                "ip", "-n", &node, "link", "set", "veth0", "master", "cni0", "up",
            ]);
            sh(&[
                "ip",
                "-n",
                &pod,
                "addr",
                "add",
                &format!("10.244.{n}.2/24"),
                "dev",
                "eth0",
            ]);
            sh(&["ip", "-n", &pod, "link", "set", "eth0", "up"]);
            sh(&["ip", "-n", &pod, "link", "set", "lo", "up"]);
            sh(&[
                "ip",
                "-n",
                &pod,
                "route",
                "add",
                "default",
                "via",
                &format!("10.244.{n}.1"),
            ]);
        }
        t
    }

    /// Creates and records namespace `<prefix>-<name>`.
    pub fn add_ns(&mut self, name: &str) -> String {
        let ns = format!("{}-{name}", self.prefix);
        let _ = try_sh(&["ip", "netns", "del", &ns]);
        sh(&["ip", "netns", "add", &ns]);
        self.netns.push(ns.clone());
        ns
    }

    /// Node namespace name.
    pub fn node(&self, n: usize) -> String {
        format!("{}-n{n}", self.prefix)
    }

    /// Pod namespace name.
    pub fn pod(&self, n: usize) -> String {
        format!("{}-p{n}", self.prefix)
    }

    /// Runs `ip ...` inside node `n`.
    pub fn ip(&self, n: usize, args: &[&str]) {
        let ns = self.node(n);
        let mut a = vec!["ip", "-n", ns.as_str()];
        a.extend_from_slice(args);
        sh(&a);
    }

    /// Waits up to 5 s for device `dev` on node `n` to be gone: a stopped
    /// engine's TUN goes when its last descriptor closes, and a child that
    /// another test's thread forked before its exec (O_CLOEXEC) can hold a
    /// copy a moment longer on a loaded machine.
    pub fn link_gone(&self, n: usize, dev: &str) -> bool {
        let ns = self.node(n);
        wait_for(5, || !try_sh(&["ip", "-n", &ns, "link", "show", dev]))
    }

    /// Configures a flannel-UDP TUN the way flannel does.
    pub fn configure_udp_tun(&self, n: usize, dev: &str, mtu: u16) {
        self.ip(n, &["addr", "add", &format!("10.244.{n}.0/32"), "dev", dev]);
        self.ip(n, &["link", "set", dev, "mtu", &mtu.to_string(), "up"]);
        self.ip(n, &["route", "add", "10.244.0.0/16", "dev", dev]);
    }

    /// Configures a VXLAN TUN like flannel's vxlan device: /32 address and a route per peer.
    pub fn configure_vxlan_tun(&self, n: usize, dev: &str, mtu: u16, peers: &[usize]) {
        self.ip(n, &["addr", "add", &format!("10.244.{n}.0/32"), "dev", dev]);
        self.ip(n, &["link", "set", dev, "mtu", &mtu.to_string(), "up"]);
        for m in peers {
            self.ip(
                n,
                &[
                    "route",
                    "add",
                    &format!("10.244.{m}.0/24"),
                    "via",
                    &format!("10.244.{m}.0"),
                    "dev",
                    dev,
                    "onlink",
                ],
            );
        }
    }

    /// Sets up a kernel vxlan device exactly as flannel's vxlan backend would on node `n`.
    pub fn kernel_vxlan(&self, n: usize, mac: &str, peers: &[(usize, &str)]) {
        let local = format!("192.0.2.{n}");
        self.ip(
            n,
            &[
                "link",
                "add",
                "flannel.1",
                "address",
                mac,
                "type",
                "vxlan",
                "id",
                "1",
                "local",
                &local,
                "dev",
                "eth0",
                "dstport",
                "8472",
                "nolearning",
            ],
        );
        self.ip(n, &["link", "set", "flannel.1", "mtu", "1450"]);
        self.ip(
            n,
            &[
                "addr",
                "add",
                &format!("10.244.{n}.0/32"),
                "dev",
                "flannel.1",
            ],
        );
        self.ip(n, &["link", "set", "flannel.1", "up"]);
        for (m, pmac) in peers {
            let gw = format!("10.244.{m}.0");
            self.ip(
                n,
                &[
                    "neigh",
                    "replace",
                    &gw,
                    "lladdr",
                    pmac,
                    "dev",
                    "flannel.1",
                    "nud",
                    "permanent",
                ],
            );
            let ns = self.node(n);
            sh(&[
                "bridge",
                "-n",
                &ns,
                "fdb",
                "replace",
                pmac,
                "dev",
                "flannel.1",
                "dst",
                &format!("192.0.2.{m}"),
                "self",
                "permanent",
            ]);
            self.ip(
                n,
                &[
                    "route",
                    "replace",
                    &format!("10.244.{m}.0/24"),
                    "via",
                    &gw,
                    "dev",
                    "flannel.1",
                    "onlink",
                ],
            );
        }
    }

    /// `ping` from pod `from` to `dst`; true when all replies arrive.
    pub fn ping(&self, from: usize, dst: &str, extra: &[&str]) -> bool {
        let pod = self.pod(from);
        let mut a = vec![
            "ip",
            "netns",
            "exec",
            pod.as_str(),
            "ping",
            "-c",
            "2",
            "-i",
            "0.2",
            "-W",
            "2",
        ];
        a.extend_from_slice(extra);
        a.push(dst);
        try_sh(&a)
    }

    /// Pings until success (the first packets may race with route setup).
    pub fn ping_eventually(&self, from: usize, dst: &str, extra: &[&str]) -> bool {
        wait_for(20, || self.ping(from, dst, extra))
    }

    /// iperf3 TCP bulk transfer from pod `from` to pod `to` (reverse: data flows to -> from).
    /// Returns the client's text output; panics if the transfer fails.
    pub fn iperf(&mut self, from: usize, to: usize, reverse: bool) -> String {
        let dst = format!("10.244.{to}.2");
        let server = Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.pod(to),
                "iperf3",
                "-s",
                "-1",
                "-B",
                &dst,
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("iperf3 server");
        self.children.push(server);
        let pod = self.pod(from);
        let mut out = String::new();
        let ok = wait_for(30, || {
            let mut a = vec![
                "netns",
                "exec",
                pod.as_str(),
                "iperf3",
                "-c",
                dst.as_str(),
                "-t",
                "2",
                "--connect-timeout",
                "2000",
            ];
            if reverse {
                a.push("-R");
            }
            match Command::new("ip").args(&a).output() {
                Ok(o) if o.status.success() => {
                    out = String::from_utf8_lossy(&o.stdout).into_owned();
                    true
                }
                _ => false,
            }
        });
        assert!(ok, "iperf3 {from} -> {to} (reverse {reverse}) failed");
        assert!(out.contains("receiver"), "no iperf3 summary: {out}");
        out
    }

    /// Spawns a long-running process and kills it on drop.
    pub fn spawn(&mut self, args: &[&str]) {
        let c = Command::new(args[0])
            .args(&args[1..])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        self.children.push(c);
    }
}

impl Drop for Topo {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        for ns in self.netns.iter().rev() {
            let _ = try_sh(&["ip", "netns", "del", ns]);
        }
    }
}

/// Peers for node `n` among `1..=nodes` (excluding `skip`).
pub fn peers_for(n: usize, nodes: usize, skip: &[usize], vxlan: bool) -> Vec<Peer> {
    (1..=nodes)
        .filter(|m| *m != n && !skip.contains(m))
        .map(|m| Peer {
            subnet: format!("10.244.{m}.0/24").parse().expect("cidr"),
            endpoint: IpAddr::from([192, 0, 2, u8::try_from(m).expect("small")]),
            vtep_mac: vxlan.then_some(mac_of(m)),
            nat: None,
            wireguard: None,
            tunnel_gso: false,
        })
        .collect()
}

/// VTEP MAC of node `n`.
pub fn mac_of(n: usize) -> [u8; 6] {
    [0x02, 0, 0, 0, u8::try_from(n).expect("small"), 1]
}

/// Colon form of [`mac_of`].
pub fn mac_str(n: usize) -> String {
    mac_of(n)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
