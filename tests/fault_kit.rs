//! Shared by the fault and security tests: clusters on either store, an etcd
//! reachable from inside node namespaces, continuous pod-to-pod traffic with
//! loss and gap accounting, and small helpers to act from inside a namespace.
//!
//! Everything here cleans up in `Drop` (proxies stop, ping processes die with
//! the namespaces the cluster deletes).

use std::collections::BTreeMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weft_control::demo::cluster::{Cluster, ClusterSpec, ClusterStore};
use weft_control::demo::netns::Netns;
pub use weft_tests::proxy::TcpProxy;

/// The network every fault test uses.
pub const NETWORK: &str = "10.244.0.0/16";

/// A net-conf.json for `backend` (e.g. `vxlan`, `udp`). Nodes take subnets
/// only up to 10.244.63.0/24, so that the tests' made-up leases and
/// addresses (10.244.64.0 and above) never collide with a real node's.
pub fn net_conf(backend: &str) -> String {
    format!(
        r#"{{"Network":"{NETWORK}","SubnetMax":"10.244.63.0","Backend":{{"Type":"{backend}"}}}}"#
    )
}

/// Starts a cluster of `nodes` nodes; `args` are the weftd arguments.
pub fn cluster(
    tag: &str,
    backend: &str,
    nodes: u8,
    store: ClusterStore,
    args: &[&str],
) -> (tempfile::TempDir, Cluster) {
    let work = tempfile::tempdir().expect("tempdir");
    let c = Cluster::start(ClusterSpec {
        prefix: weft_tests::unique(tag),
        nodes,
        net_conf: net_conf(backend),
        weftd_args: args.iter().map(|s| s.to_string()).collect(),
        bin_dir: weft_tests::bins::dir(),
        work: work.path().to_path_buf(),
        store,
    })
    .unwrap_or_else(|e| panic!("cluster: {e}"));
    (work, c)
}

/// One variable of node `i`'s subnet.env.
pub fn env_var(c: &Cluster, i: usize, var: &str) -> String {
    let env = c
        .subnet_env(i)
        .unwrap_or_else(|| panic!("node {i} has no subnet.env"));
    let prefix = format!("{var}=");
    env.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .unwrap_or_else(|| panic!("no {var} in {env}"))
        .to_string()
}

/// Node `i`'s lease key (`10.244.5.0-24`) from its subnet.env.
pub fn lease_key(c: &Cluster, i: usize) -> String {
    env_var(c, i, "FLANNEL_SUBNET").replace(".1/", ".0-")
}

/// Whether pod `a` reaches pod `b`, trying for up to ~10 s.
pub fn wait_ping(c: &Cluster, a: usize, b: usize) -> bool {
    (0..10).any(|_| c.pods[a].ns.ping(&c.pods[b].ip, 1))
}

/// Waits until node `i`'s weftd exits and returns its exit code (`None`
/// when killed by a signal); panics after `timeout`.
pub fn wait_exit(c: &mut Cluster, i: usize, timeout: Duration) -> Option<i32> {
    let deadline = Instant::now() + timeout;
    loop {
        let child = c.nodes[i].weftd.as_mut().expect("weftd was started");
        if let Ok(Some(st)) = child.try_wait() {
            c.nodes[i].weftd = None;
            return st.code();
        }
        assert!(
            Instant::now() < deadline,
            "node {i}'s weftd still runs after {timeout:?}; log:\n{}",
            c.log(i)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Whether node `i`'s weftd is running.
pub fn running(c: &mut Cluster, i: usize) -> bool {
    c.nodes[i]
        .weftd
        .as_mut()
        .is_some_and(|p| matches!(p.try_wait(), Ok(None)))
}

/// Runs `f` on a thread that has entered network namespace `ns` (by path).
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_string();
    std::thread::spawn(move || {
        let file = std::fs::File::open(&ns).unwrap_or_else(|e| panic!("open {ns}: {e}"));
        nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
            .unwrap_or_else(|e| panic!("setns {ns}: {e}"));
        f()
    })
    .join()
    .expect("netns thread panicked")
}

/// A [`TcpProxy`] from `127.0.0.1:<port>` inside the namespace at `ns` to a
/// port on this process's own loopback: lets daemons in node namespaces
/// reach the test's etcd. Stops on drop.
pub fn ns_proxy(ns: &str, port: u16, upstream: u16) -> TcpProxy {
    let listener = in_netns(ns, move || {
        TcpListener::bind(("127.0.0.1", port)).expect("bind proxy in netns")
    });
    TcpProxy::start(listener, upstream)
}

/// A `ping -D -i 0.01 -c <count>` from one pod to another, its output kept in a file.
pub struct PingFlood {
    child: Child,
    out: PathBuf,
    count: u32,
}

/// What a finished [`PingFlood`] saw.
#[derive(Debug, Clone, Copy)]
pub struct PingReport {
    /// Echo requests sent.
    pub sent: u32,
    /// Distinct replies received.
    pub received: u32,
    /// The longest time between two consecutive replies (the outage, plus
    /// one interval when there was none).
    pub max_gap: Duration,
}

impl PingFlood {
    /// Starts `count` pings at 100/s from pod `a` to pod `b`; output goes to `dir`.
    pub fn start(c: &Cluster, a: usize, b: usize, count: u32, dir: &Path) -> PingFlood {
        let out = dir.join(format!("ping-{a}-{b}-{}.txt", std::process::id()));
        let f = std::fs::File::create(&out).expect("ping output");
        let child = c.pods[a]
            .ns
            .command("ping")
            .args([
                "-D",
                "-n",
                "-i",
                "0.01",
                "-W",
                "2",
                "-c",
                &count.to_string(),
                &c.pods[b].ip,
            ])
            .stdout(Stdio::from(f))
            .stderr(Stdio::null())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn ping");
        PingFlood { child, out, count }
    }

    /// Waits until the pings are done (or `timeout`, then kills it) and
    /// reports what came back.
    pub fn finish(mut self, timeout: Duration) -> PingReport {
        let deadline = Instant::now() + timeout;
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        parse_ping(&text, self.count)
    }
}

impl Drop for PingFlood {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.out);
    }
}

/// Parses `ping -D` output: replies by sequence number and their times.
fn parse_ping(text: &str, count: u32) -> PingReport {
    let mut replies = BTreeMap::new();
    let mut sent = count;
    for line in text.lines() {
        if let Some(rest) = line
            .split(" packets transmitted")
            .next()
            .filter(|_| line.contains(" packets transmitted"))
        {
            sent = rest.trim().parse().unwrap_or(count);
        }
        let (Some(ts), Some(seq)) = (
            line.strip_prefix('[')
                .and_then(|l| l.split(']').next())
                .and_then(|t| t.parse::<f64>().ok()),
            line.split("icmp_seq=")
                .nth(1)
                .and_then(|s| s.split_whitespace().next())
                .and_then(|s| s.parse::<u32>().ok()),
        ) else {
            continue;
        };
        if line.contains("bytes from") {
            replies.entry(seq).or_insert(ts);
        }
    }
    let mut times: Vec<f64> = replies.values().copied().collect();
    times.sort_by(f64::total_cmp);
    let max_gap = times.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    PingReport {
        sent,
        received: u32::try_from(replies.len()).unwrap_or(u32::MAX),
        max_gap: Duration::from_secs_f64(max_gap.max(0.0)),
    }
}

/// A paced iperf3 UDP stream from pod `a` to pod `b`; `finish` returns
/// (datagrams sent, datagrams lost) as the server counted them.
pub struct UdpStream {
    client: Child,
}

impl UdpStream {
    /// Starts `secs` seconds at `rate` (iperf3 `-b`, e.g. `2M`) on `port`.
    pub fn start(c: &Cluster, a: usize, b: usize, secs: u32, rate: &str, port: u16) -> UdpStream {
        let server = &c.pods[b];
        let p = port.to_string();
        server
            .ns
            .exec(&["iperf3", "-s", "-1", "-D", "-B", &server.ip, "-p", &p]);
        std::thread::sleep(Duration::from_millis(300));
        let client = c.pods[a]
            .ns
            .command("iperf3")
            .args([
                "-c",
                &server.ip,
                "-p",
                &p,
                "-u",
                "-b",
                rate,
                "-l",
                "1000",
                "-t",
                &secs.to_string(),
                "-J",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn iperf3");
        UdpStream { client }
    }

    /// Waits for the stream to end; returns (packets, lost) from the server's view.
    pub fn finish(self) -> (u64, u64) {
        let out = self.client.wait_with_output().expect("iperf3");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let sum = &v["end"]["sum"];
        let packets = sum["packets"].as_u64().unwrap_or(0);
        let lost = sum["lost_packets"].as_u64().unwrap_or(u64::MAX);
        assert!(
            packets > 0,
            "iperf3 UDP produced no result: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (packets, lost)
    }
}

/// Bytes moved by a `secs`-second iperf3 TCP transfer from pod `a` to pod `b`.
pub fn tcp_bytes(c: &Cluster, a: usize, b: usize, secs: u32) -> u64 {
    let server = &c.pods[b];
    server
        .ns
        .exec(&["iperf3", "-s", "-1", "-D", "-B", &server.ip]);
    std::thread::sleep(Duration::from_millis(300));
    let out = c.pods[a]
        .ns
        .try_exec(&["iperf3", "-c", &server.ip, "-t", &secs.to_string(), "-J"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0)
}

/// A snapshot of what a node's namespace holds: links, routes, neighbours
/// and firewall rules, one normalised line per item, sorted.
pub fn node_state(ns: &Netns) -> BTreeMap<&'static str, Vec<String>> {
    let sorted = |text: String| {
        let mut v: Vec<String> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    let links: String = ns
        .exec(&["ip", "-o", "link", "show"])
        .lines()
        .filter_map(|l| {
            l.split(':')
                .nth(1)
                .map(|n| n.trim().split('@').next().unwrap_or("").to_string())
        })
        .collect::<Vec<_>>()
        .join("\n");
    // Chains and rules, each prefixed with its table; counters dropped.
    let mut table = String::new();
    let mut rules = Vec::new();
    for l in ns.exec(&["iptables-save"]).lines() {
        if let Some(t) = l.strip_prefix('*') {
            table = t.to_string();
        } else if l.starts_with("-A ") || l.starts_with(':') {
            rules.push(format!("{table} {}", l.split(" [").next().unwrap_or(l)));
        }
    }
    let rules = rules.join("\n");
    BTreeMap::from([
        ("links", sorted(links)),
        ("routes", sorted(ns.exec(&["ip", "route", "show"]))),
        ("rules", sorted(rules)),
    ])
}

/// Lines that occur more than once.
pub fn duplicates(lines: &[String]) -> Vec<String> {
    let mut seen = BTreeMap::new();
    for l in lines {
        *seen.entry(l.clone()).or_insert(0) += 1;
    }
    seen.into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(l, _)| l)
        .collect()
}

/// Runs `cmd` to completion, returning (success, stdout+stderr).
pub fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().expect("spawn");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}
