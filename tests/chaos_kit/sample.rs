//! What is sampled every tick:
//!
//! - daemon exits: a weftd that exits on its own is a violation unless its
//!   lease was just deleted and it exited 0 (flannel's documented exit), or
//!   it was starting while its own lease key held garbage and exited 1 after
//!   flannel's race retries (documented too); it is restarted either way,
//!   as a kubelet would;
//! - convergence ([`node_problems`]): every node's routes to 10.244.0.0/16
//!   /24s equal the store's parsable leases minus its own (phantoms changed
//!   in the last [`CHURN_GRACE`] s are left out of both sides; on WireGuard
//!   and udp, whose one route covers the network, the userspace engine's
//!   peer table instead, and that one route must exist, into the backend's
//!   device), each with the right gateway and device; a kernel vxlan node
//!   has for every remote lease the neighbour and fdb entry of its VTEP MAC,
//!   a userspace one engine peers sending to its public IP on the right
//!   device; on the iptables clusters flannel's chains are non-empty. After each fault the time to the
//!   first converged tick is recorded; a cluster that stays unconverged
//!   [`CONVERGE_BOUND`] s after its last fault ended is a violation;
//! - subnets: no two nodes of a cluster hold the same subnet, and a node's
//!   subnet never changes;
//! - RSS, open fds and threads of every weftd.

use std::collections::{BTreeMap, BTreeSet};

use super::faults::Scheduler;
use super::now;
use super::rig::{ChaosCluster, Rig, StoredLease};
use weft_tests::cluster::NETWORK;

/// Phantom leases changed this recently are not judged.
pub const CHURN_GRACE: f64 = 8.0;
/// A cluster must converge this many seconds after its last fault ended:
/// two reconcile periods (10 s each) plus a weftd start.
pub const CONVERGE_BOUND: f64 = 30.0;

/// One resource sample of one weftd process.
#[derive(Debug, Clone, Copy)]
pub struct Res {
    /// When.
    pub t: f64,
    /// VmRSS in KiB.
    pub rss_kib: u64,
    /// Open fds.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
    /// The dataplane it ran (a live switch changes its fds and threads).
    pub dataplane: &'static str,
}

/// What the sampler accumulates.
#[derive(Debug)]
pub struct Sampler {
    /// Convergence times after faults: (kind, seconds).
    pub converge: Vec<(&'static str, f64)>,
    /// Faults ended but not yet followed by a converged tick: (cluster, kind, end).
    waiting: Vec<(usize, &'static str, f64)>,
    /// Per cluster: the quiet period already reported as unconverged.
    reported: BTreeMap<usize, f64>,
    /// Per (cluster, node, pid): resource samples.
    pub res: BTreeMap<(usize, usize, u32), Vec<Res>>,
    /// First subnet seen per (cluster, node).
    subnets: BTreeMap<(usize, usize), String>,
    /// Violations.
    pub violations: Vec<String>,
    /// Documented exits seen (own lease deleted → exit 0).
    pub documented_exits: u32,
    /// Documented exits seen (started while its own lease key held garbage → exit 1).
    pub garbage_exits: u32,
    /// Last mismatch per cluster (for messages).
    pub last_mismatch: BTreeMap<usize, String>,
    seen_faults: usize,
    /// The convergence bound judged ([`CONVERGE_BOUND`] unless tightened on purpose).
    pub converge_bound: f64,
}

impl Sampler {
    /// A sampler judging convergence by `converge_bound` seconds.
    pub fn new(converge_bound: f64) -> Sampler {
        Sampler {
            converge: Vec::new(),
            waiting: Vec::new(),
            reported: BTreeMap::new(),
            res: BTreeMap::new(),
            subnets: BTreeMap::new(),
            violations: Vec::new(),
            documented_exits: 0,
            garbage_exits: 0,
            last_mismatch: BTreeMap::new(),
            seen_faults: 0,
            converge_bound,
        }
    }

    /// One tick over every cluster.
    pub fn tick(&mut self, rig: &mut Rig, s: &mut Scheduler) {
        for rec in &s.done[self.seen_faults..] {
            self.waiting.push((rec.scope.cluster, rec.kind, rec.end));
        }
        self.seen_faults = s.done.len();
        for ci in 0..rig.clusters.len() {
            self.exits(rig, s, ci);
            let cc = &rig.clusters[ci];
            self.resources(cc, ci);
            self.subnets(cc, ci);
            let active = s.active().any(|f| f.scope.cluster == ci);
            let quiet_since = s
                .done
                .iter()
                .filter(|f| f.scope.cluster == ci)
                .map(|f| f.end)
                .fold(0.0, f64::max);
            match mismatch(cc, ci, s) {
                None => {
                    let t = now();
                    self.waiting.retain(|(c, kind, end)| {
                        if *c == ci {
                            self.converge.push((kind, t - end));
                        }
                        *c != ci
                    });
                    self.last_mismatch.remove(&ci);
                }
                Some(m) => {
                    let t = now();
                    if self.last_mismatch.get(&ci) != Some(&m) {
                        eprintln!("chaos {t:8.1}s {} unconverged: {m}", cc.name);
                    }
                    if !active
                        && t - quiet_since > self.converge_bound
                        && self.reported.get(&ci) != Some(&quiet_since)
                    {
                        self.reported.insert(ci, quiet_since);
                        self.violations.push(format!(
                            "{t:.1}s: {} not converged {:.0} s after its last fault: {m}",
                            cc.name,
                            t - quiet_since
                        ));
                    }
                    self.last_mismatch.insert(ci, m);
                }
            }
        }
    }

    /// Faults still waiting for convergence (end of run: each is a violation).
    pub fn unconverged(&self) -> &[(usize, &'static str, f64)] {
        &self.waiting
    }

    fn exits(&mut self, rig: &mut Rig, s: &mut Scheduler, ci: usize) {
        let cc = &mut rig.clusters[ci];
        for ni in 0..cc.c.nodes.len() {
            let Some(child) = cc.c.nodes[ni].weftd.as_mut() else {
                continue;
            };
            let Ok(Some(st)) = child.try_wait() else {
                continue;
            };
            cc.c.nodes[ni].weftd = None;
            let log = cc.c.log(ni);
            let lease_gone = s.expect_exit.contains(&(ci, ni)) && st.code() == Some(0);
            // Starting while its previous subnet's key holds a non-lease: flannel's
            // 10 race retries, then exit 1 (flannel does the same); restarted.
            // (or within 5 s of its end: the exit may precede the restore by a tick).
            let t = now();
            let garbage = st.code() == Some(1)
                && log.contains("max retries reached trying to acquire a subnet")
                && s.active()
                    .chain(s.done.iter().filter(|f| t - f.end < 5.0))
                    .any(|f| {
                        f.kind == "lease-garbage" && f.scope.cluster == ci && f.scope.nodes == [ni]
                    });
            if lease_gone {
                self.documented_exits += 1;
                s.lease_exit_seen(ci, ni);
            } else if garbage {
                self.garbage_exits += 1;
            } else {
                let tail: Vec<&str> = log.lines().rev().take(8).collect();
                self.violations.push(format!(
                    "{:.1}s: {} n{ni}'s weftd exited on its own ({st}); last lines:\n{}",
                    now(),
                    cc.name,
                    tail.into_iter().rev().collect::<Vec<_>>().join("\n")
                ));
            }
            eprintln!(
                "chaos {:8.1}s {} n{ni} weftd exited ({st}), restarting",
                now(),
                cc.name
            );
            cc.restart(ni);
        }
    }

    fn resources(&mut self, cc: &ChaosCluster, ci: usize) {
        for ni in 0..cc.c.nodes.len() {
            let Some(pid) = cc.pid(ni) else { continue };
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                continue;
            };
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|l| l.strip_prefix(name))
                    .and_then(|v| v.split_whitespace().next())
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            // A stopped process still answers; a zombie has no RSS: skip it.
            let rss_kib = field("VmRSS:");
            if rss_kib == 0 {
                continue;
            }
            let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
            self.res.entry((ci, ni, pid)).or_default().push(Res {
                t: now(),
                rss_kib,
                fds,
                threads: field("Threads:"),
                dataplane: cc.dataplane[ni],
            });
        }
    }

    fn subnets(&mut self, cc: &ChaosCluster, ci: usize) {
        let held: Vec<(usize, String)> = (0..cc.c.nodes.len())
            .filter_map(|ni| cc.subnet(ni).map(|s| (ni, s)))
            .collect();
        for (a, b, sub) in shared_subnets(&held) {
            self.violations.push(format!(
                "{:.1}s: {} n{a} and n{b} both hold {sub}",
                now(),
                cc.name
            ));
        }
        for (ni, sub) in held {
            let first = self.subnets.entry((ci, ni)).or_insert_with(|| sub.clone());
            if *first != sub {
                self.violations.push(format!(
                    "{:.1}s: {} n{ni}'s subnet changed from {first} to {sub}",
                    now(),
                    cc.name
                ));
                *first = sub;
            }
        }
    }
}

/// Pairs of nodes holding the same subnet: (node, node, subnet).
pub fn shared_subnets(held: &[(usize, String)]) -> Vec<(usize, usize, String)> {
    let mut first: BTreeMap<&str, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for (ni, sub) in held {
        if let Some(&other) = first.get(sub.as_str()) {
            out.push((other, *ni, sub.clone()));
        } else {
            first.insert(sub, *ni);
        }
    }
    out
}

/// One peer of a userspace engine, as `weft status` shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EnginePeer {
    /// The peer's subnet (`10.244.5.0/24`).
    pub subnet: String,
    /// The endpoint the engine sends to (the lease's `PublicIP`).
    pub public_ip: String,
    /// The engine device carrying it.
    pub device: String,
}

/// What the sampler read on one node, judged by [`node_problems`].
#[derive(Debug, Default)]
pub struct NodeView {
    /// The node's own subnet (`10.244.5.0/24`).
    pub own: String,
    /// The backend's device (`flannel.1`, `flannel-wg`, `flannel0`).
    pub dev: String,
    /// Whether it runs the kernel dataplane.
    pub kernel: bool,
    /// vxlan: its /24 routes into the pod network (`ip route show` lines,
    /// the pod bridge's left out); one-route backends: empty.
    pub routes: Vec<String>,
    /// The userspace engine's peers (`None` on the kernel dataplane).
    pub engine: Option<Vec<EnginePeer>>,
    /// One-route backends: `ip route show exact <network>`, else `None`.
    pub net_route: Option<String>,
    /// iptables clusters: whether flannel's POSTROUTING and FORWARD chains
    /// have rules, else `None`.
    pub chains: Option<bool>,
    /// Kernel vxlan nodes: `bridge fdb show dev flannel.1`, else `None`.
    pub fdb: Option<String>,
    /// Kernel vxlan nodes: `ip neigh show dev flannel.1`, else `None`.
    pub neigh: Option<String>,
}

/// The subnet's first address (`10.244.5.0/24` → `10.244.5.0`), flannel's
/// vxlan gateway.
fn net_ip(subnet: &str) -> &str {
    subnet.split('/').next().unwrap_or(subnet)
}

/// Why one node does not match the store's `leases` (`fresh`: phantom keys
/// changed too recently to judge). Empty when it matches. Judged: which
/// subnets it forwards to (routes on vxlan, the engine's peers on one-route
/// backends), and for each remote lease how: the route's gateway and device
/// (kernel vxlan: `via <subnet IP> dev flannel.1 onlink`; userspace vxlan:
/// `dev flannel.1 scope link`), the kernel's neighbour (the lease's VTEP MAC)
/// and fdb entry (that MAC to its public IP), or the engine peer's endpoint
/// and device (the engine's VTEP MACs are not in `weft status`); the one
/// network route and its device; flannel's chains.
pub fn node_problems(
    ni: usize,
    v: &NodeView,
    leases: &[StoredLease],
    fresh: &dyn Fn(&str) -> bool,
) -> Vec<String> {
    let mut problems = Vec::new();
    let remote: Vec<(String, &StoredLease)> = leases
        .iter()
        .filter(|l| l.public_ip.is_some() && !fresh(&l.key))
        .map(|l| (l.key.replace('-', "/"), l))
        .filter(|(k, _)| *k != v.own)
        .collect();
    let want: BTreeSet<String> = remote.iter().map(|(k, _)| k.clone()).collect();
    let route_key = |r: &String| r.split_whitespace().next().unwrap_or_default().to_string();
    let have: BTreeSet<String> = match (&v.net_route, &v.engine) {
        (Some(_), Some(peers)) => peers.iter().map(|p| p.subnet.clone()).collect(),
        _ => v.routes.iter().map(route_key).collect(),
    };
    let have: BTreeSet<String> = have
        .into_iter()
        .filter(|k| *k != v.own && !fresh(&k.replace('/', "-")))
        .collect();
    if want != have {
        let what = if v.net_route.is_some() {
            "peers"
        } else {
            "routes"
        };
        let missing: Vec<_> = want.difference(&have).collect();
        let extra: Vec<_> = have.difference(&want).collect();
        problems.push(format!("n{ni} {what} missing {missing:?} extra {extra:?}"));
    }
    if let (None, Some(peers)) = (&v.net_route, &v.engine) {
        let engine: BTreeSet<String> = peers
            .iter()
            .map(|p| p.subnet.clone())
            .filter(|k| *k != v.own && !fresh(&k.replace('/', "-")))
            .collect();
        if engine != want {
            let missing: Vec<_> = want.difference(&engine).collect();
            let extra: Vec<_> = engine.difference(&want).collect();
            problems.push(format!(
                "n{ni} engine peers missing {missing:?} extra {extra:?}"
            ));
        }
    }
    for (net, l) in &remote {
        let ip = l.public_ip.as_deref().unwrap_or_default();
        if v.net_route.is_none() {
            let shape = if v.kernel {
                format!("{net} via {} dev {} onlink", net_ip(net), v.dev)
            } else {
                format!("{net} dev {} scope link", v.dev)
            };
            if let Some(r) = v.routes.iter().find(|r| route_key(r) == *net)
                && r.split_whitespace().collect::<Vec<_>>().join(" ") != shape
            {
                problems.push(format!("n{ni} route {r:?}, want {shape:?}"));
            }
        }
        if let Some(peers) = &v.engine
            && let Some(p) = peers.iter().find(|p| p.subnet == *net)
            && (p.public_ip != ip || p.device != v.dev)
        {
            problems.push(format!(
                "n{ni} engine peer {net} to {} on {}, want {ip} on {}",
                p.public_ip, p.device, v.dev
            ));
        }
        if let (Some(fdb), Some(mac)) = (&v.fdb, &l.vtep_mac)
            && !fdb
                .lines()
                .any(|e| e.starts_with(&format!("{mac} dst {ip} ")))
        {
            problems.push(format!("n{ni} no fdb entry {mac} dst {ip}"));
        }
        if let (Some(neigh), Some(mac)) = (&v.neigh, &l.vtep_mac)
            && !neigh
                .lines()
                .any(|e| e.starts_with(&format!("{} lladdr {mac} ", net_ip(net))))
        {
            problems.push(format!("n{ni} no neighbour {} lladdr {mac}", net_ip(net)));
        }
    }
    if let Some(r) = &v.net_route {
        let shape = format!("{NETWORK} dev {} ", v.dev);
        if !r.lines().any(|l| l.starts_with(&shape)) {
            problems.push(format!(
                "n{ni} no route for {NETWORK} into {}: {:?}",
                v.dev,
                r.trim()
            ));
        }
    }
    if v.chains == Some(false) {
        problems.push(format!("n{ni} iptables chains empty"));
    }
    problems
}

/// Why cluster `ci` is not converged now, or `None` when it is.
pub fn mismatch(cc: &ChaosCluster, ci: usize, s: &Scheduler) -> Option<String> {
    let Some(leases) = cc.leases() else {
        return Some("store unreadable".into());
    };
    let t = now();
    let fresh = |key: &str| {
        s.phantom_changed
            .get(&(ci, key.to_string()))
            .is_some_and(|&c| t - c < CHURN_GRACE)
    };
    let mut problems = Vec::new();
    for ni in 0..cc.c.nodes.len() {
        if cc.pid(ni).is_none() {
            problems.push(format!("n{ni} has no weftd"));
            continue;
        }
        let ns = &cc.c.nodes[ni].ns;
        let stdout = |a: &[&str]| String::from_utf8_lossy(&ns.try_exec(a).stdout).into_owned();
        let kernel = cc.dataplane[ni] == "kernel";
        let dev = cc.device();
        let view = NodeView {
            own: cc.subnet(ni).unwrap_or_default(),
            dev: dev.to_string(),
            kernel,
            routes: if cc.one_route() {
                Vec::new()
            } else {
                routes(ns)
            },
            engine: (!kernel).then(|| engine_peers(cc, ni)),
            net_route: cc
                .one_route()
                .then(|| stdout(&["ip", "route", "show", "exact", NETWORK])),
            chains: cc.iptables.then(|| {
                stdout(&["iptables", "-t", "nat", "-S", "FLANNEL-POSTRTG"])
                    .contains("-A FLANNEL-POSTRTG")
                    && stdout(&["iptables", "-S", "FLANNEL-FWD"]).contains("-A FLANNEL-FWD")
            }),
            fdb: kernel.then(|| stdout(&["bridge", "fdb", "show", "dev", dev])),
            neigh: kernel.then(|| stdout(&["ip", "neigh", "show", "dev", dev])),
        };
        problems.extend(node_problems(ni, &view, &leases, &fresh));
    }
    (!problems.is_empty()).then(|| problems.join("; "))
}

/// A node's /24 routes into the pod network, other than its own bridge's.
fn routes(ns: &weft_tests::netns::Netns) -> Vec<String> {
    let out = ns.try_exec(&["ip", "route", "show"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.starts_with("10.244.") && !l.contains("cni0"))
        .filter(|l| {
            l.split_whitespace()
                .next()
                .is_some_and(|k| k.ends_with("/24"))
        })
        .map(str::to_string)
        .collect()
}

/// A userspace node's engine peers (`weft status`: peers with a device).
/// On one-route backends (WireGuard, udp) one route covers the network, so
/// the peer table is what follows the leases.
fn engine_peers(cc: &ChaosCluster, ni: usize) -> Vec<EnginePeer> {
    let out = std::process::Command::new("timeout")
        .arg("3")
        .arg(weft_tests::bins::path("weft"))
        .args(["status", "--json", "--subnet-file"])
        .arg(cc.subnet_file(ni))
        .output();
    let Ok(out) = out else { return Vec::new() };
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    let s = |f: &serde_json::Value| f.as_str().unwrap_or_default().to_string();
    v["peers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| !p["device"].is_null())
        .filter_map(|p| {
            Some(EnginePeer {
                subnet: p["subnet"].as_str()?.to_string(),
                public_ip: s(&p["public_ip"]),
                device: s(&p["device"]),
            })
        })
        .collect()
}
