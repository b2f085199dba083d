//! The fault kinds and the seeded scheduler.
//!
//! Each tick ([`Scheduler::step`]) undoes the faults whose time has come and,
//! with some probability, starts a new one on a random target. At most
//! [`MAX_ACTIVE`] faults run at once, at most one per node and one
//! store-wide per cluster, so faults overlap across nodes and between a
//! node and its store (a weftd restarted while etcd is down or the embedded
//! store's disk is full) but never stack on one target. A fault that cannot
//! run on the chosen target (no kernel vxlan node there, say) is drawn again.
//! The same seed gives the same sequence of draws; timing still varies with
//! the machine, so a replay is close, not identical.

mod churn;

use std::collections::BTreeMap;
use std::process::Command;

use super::rig::{ChaosCluster, Rig, StoreKind};
use super::{FaultRecord, Rng, Scope, now};

/// At most this many faults at once.
pub const MAX_ACTIVE: usize = 3;

/// Every kind, with the name the report uses.
pub const KINDS: &[&str] = &[
    "sigkill",
    "sigstop",
    "etcd-kill",
    "etcd-compact",
    "lease-delete",
    "lease-garbage",
    "route-del",
    "fdb-del",
    "neigh-del",
    "device-del",
    "tun-del",
    "iptables-del",
    "dataplane-switch",
    "cni-readonly",
    "disk-full",
    "underlay-loss",
    "underlay-reorder",
];

/// How a fault of one kind may disturb requests between pods on the nodes
/// it touches: the window a failed request is excused in is from the
/// fault's start (if `during`) to `after` seconds past its end, where a
/// `needs_store` kind's end is pushed to the end of any store-wide fault of
/// its cluster it overlaps (a weftd restarted while etcd is down, or the
/// embedded store's disk full, waits for the store). Each `after` is the
/// recovery measured per kind and stated in the README ("Chaos under
/// load"), with its margin.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Recovery {
    /// Requests may fail while the fault lasts.
    pub during: bool,
    /// Seconds after the fault's end until requests must succeed again.
    pub after: f64,
    /// A restart that needs the store to get its lease.
    pub needs_store: bool,
}

/// The [`Recovery`] of `kind`: the README's "Windows by fault kind", with
/// what each was measured against. A request that started inside a window
/// is excused even when it fails after it (a lost SYN is retried for 3 s),
/// so the effective slack is one request longer.
pub fn recovery(kind: &str) -> Recovery {
    let r = |during, after, needs_store| Recovery {
        during,
        after,
        needs_store,
    };
    match kind {
        // weftd restarts at the fault's end: the engine is back within
        // tests/faults.rs's restart bound (0.5 s), a WireGuard peer's
        // handshake an RTT later; kernel paths lose nothing.
        "sigkill" => r(true, 2.0, true),
        // The engine resumes at SIGCONT.
        "sigstop" => r(true, 2.0, false),
        // weftd exits 0 (the fault ends when it has), the sampler restarts
        // it at its next tick (1 s), the peers learn the new lease.
        "lease-delete" => r(true, 3.0, true),
        // The peers drop the unparsable lease until it is restored.
        "lease-garbage" => r(true, 3.0, true),
        // Restored at the next reconcile tick (weft_tests::RESTORED_WITHIN).
        "route-del" | "fdb-del" | "neigh-del" | "device-del" | "tun-del" => {
            r(true, weft_tests::RESTORED_WITHIN.as_secs_f64(), false)
        }
        // The switch's own gap (tests/kernel_backends.rs: under 0.5 s).
        "dataplane-switch" => r(true, 1.0, false),
        // Lost packets while it lasts; TCP retransmits in a second.
        "underlay-loss" | "underlay-reorder" => r(true, 1.0, false),
        // No packet may be lost: the dataplane does not need the store
        // (tests/faults.rs: an etcd outage loses no ping), flannel's chains
        // do not carry pod-to-pod traffic here (their ACCEPT rules duplicate
        // the default policy), the CNI data dir and the store's disk only
        // matter to new pods and to restarts.
        _ => r(false, 0.0, false),
    }
}

/// Store-wide faults: a restart waits for the store while they last.
pub const STORE_DOWN: &[&str] = &["etcd-kill", "disk-full"];

/// How a running fault is undone.
#[derive(Debug, Clone)]
enum Undo {
    Restart,
    Cont(i32),
    EtcdStart,
    CniWritable(String),
    DiskFree(std::path::PathBuf),
    LossOff(bool),
    RestoreLease(String, String),
    /// The node's own lease was deleted: weftd must exit 0, then restart.
    AwaitExit,
}

#[derive(Debug)]
struct Active {
    rec: FaultRecord,
    until: f64,
    undo: Undo,
}

/// Problems the scheduler saw that break an invariant (or the harness).
pub type Violations = Vec<String>;

/// The scheduler. See the module docs.
pub struct Scheduler {
    rng: Rng,
    /// Mean seconds between fault starts.
    pub mean_gap: f64,
    active: Vec<Active>,
    /// Every fault that has ended.
    pub done: Vec<FaultRecord>,
    /// Kinds that cannot run here, with the reason (logged once).
    pub skipped: BTreeMap<&'static str, String>,
    /// Invariant violations seen while injecting.
    pub violations: Violations,
    netem: bool,
    next_pod: u32,
    /// Phantom leases: (cluster, key, added at).
    pub phantoms: Vec<(usize, String, f64)>,
    /// Last phantom change per cluster and key (convergence ignores fresh ones).
    pub phantom_changed: BTreeMap<(usize, String), f64>,
    /// Phantom churn: operations done and refused by the store.
    pub churn: (u64, u64),
    next_churn: f64,
    /// Nodes whose exit (code 0) is expected now (own lease deleted).
    pub expect_exit: Vec<(usize, usize)>,
    /// Draw the kinds not injected yet first, so that a short run (the CI
    /// variant) injects every kind this machine can.
    pub cover: bool,
}

fn sh(ns: &str, script: &str) -> (bool, String) {
    let out = Command::new("ip")
        .args(["netns", "exec", ns, "sh", "-c", script])
        .output()
        .expect("spawn ip netns exec");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn host_sh(script: &str) -> (bool, String) {
    let out = Command::new("sh")
        .args(["-c", script])
        .output()
        .expect("spawn sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

/// Whether this kernel has sch_netem (tried in a throwaway namespace).
pub fn have_netem() -> bool {
    let ns = weft_tests::netns::Netns::new(&weft_tests::unique("nm"));
    let (ok, _) = sh(
        ns.name(),
        "ip link add nmx type dummy && tc qdisc add dev nmx root netem loss 1%",
    );
    ok
}

impl Scheduler {
    /// A scheduler drawing from `seed`.
    pub fn new(seed: u64, mean_gap: f64, cover: bool) -> Scheduler {
        let netem = have_netem();
        let mut skipped = BTreeMap::new();
        if !netem {
            skipped.insert(
                "underlay-reorder",
                "this kernel has no sch_netem (modprobe sch_netem: not found): reordering is not injected; \
                 underlay-loss uses iptables' statistic match instead of netem"
                    .to_string(),
            );
        }
        skipped.insert(
            "lease-garbage/embedded",
            "the embedded store holds typed leases only (weft leases put parses); garbage goes to etcd".into(),
        );
        Scheduler {
            rng: Rng::new(seed),
            mean_gap,
            active: Vec::new(),
            done: Vec::new(),
            skipped,
            violations: Vec::new(),
            netem,
            next_pod: 0,
            phantoms: Vec::new(),
            phantom_changed: BTreeMap::new(),
            churn: (0, 0),
            next_churn: 0.0,
            expect_exit: Vec::new(),
            cover,
        }
    }

    /// Kinds this machine can inject that no fault has been yet.
    pub fn uncovered(&self) -> Vec<&'static str> {
        KINDS
            .iter()
            .copied()
            .filter(|k| !self.skipped.contains_key(k))
            .filter(|k| {
                !self.done.iter().any(|f| f.kind == *k) && !self.active().any(|f| f.kind == *k)
            })
            .collect()
    }

    /// Faults running now.
    pub fn active(&self) -> impl Iterator<Item = &FaultRecord> {
        self.active.iter().map(|a| &a.rec)
    }

    /// One tick: undo what is due, churn phantoms, maybe start a fault.
    pub fn step(&mut self, rig: &mut Rig, tick: f64) {
        let t = now();
        let due: Vec<usize> = (0..self.active.len())
            .filter(|&k| self.active[k].until <= t)
            .collect();
        for k in due.into_iter().rev() {
            let a = self.active.remove(k);
            self.finish(rig, a);
        }
        if t >= self.next_churn {
            self.churn_phantom(rig);
            self.next_churn = t + self.rng.secs(1.5, 4.5);
        }
        if self.active.len() < MAX_ACTIVE && self.rng.secs(0.0, 1.0) < tick / self.mean_gap {
            for _ in 0..20 {
                if self.try_start(rig) {
                    break;
                }
            }
        }
    }

    /// Undoes every running fault (end of run).
    pub fn drain(&mut self, rig: &mut Rig) {
        while let Some(a) = self.active.pop() {
            self.finish(rig, a);
        }
    }

    fn busy(&self, cl: usize, node: Option<usize>) -> bool {
        self.active.iter().any(|a| {
            a.rec.scope.cluster == cl
                && match node {
                    Some(n) => a.rec.scope.nodes == [n],
                    None => a.rec.scope.nodes.len() > 1,
                }
        })
    }

    fn record(
        &mut self,
        kind: &'static str,
        scope: Scope,
        what: String,
        until: f64,
        undo: Option<Undo>,
    ) {
        let t = now();
        eprintln!("chaos {t:8.1}s start {kind} {what}");
        let rec = FaultRecord {
            kind,
            scope,
            start: t,
            end: t,
            what,
        };
        match undo {
            Some(undo) => self.active.push(Active { rec, until, undo }),
            None => self.done.push(rec),
        }
    }

    fn try_start(&mut self, rig: &mut Rig) -> bool {
        let left = if self.cover {
            self.uncovered()
        } else {
            Vec::new()
        };
        let kind = if left.is_empty() {
            KINDS[self.rng.below(KINDS.len())]
        } else {
            left[self.rng.below(left.len())]
        };
        // The clusters a kind can touch; one of them, at random.
        let fits: Vec<usize> = (0..rig.clusters.len())
            .filter(|&i| {
                let c = &rig.clusters[i];
                match kind {
                    "etcd-kill" | "etcd-compact" | "lease-garbage" => c.store == StoreKind::Etcd,
                    "iptables-del" => c.iptables,
                    "disk-full" => c.store == StoreKind::Embedded,
                    "dataplane-switch" | "fdb-del" | "neigh-del" | "device-del" => {
                        c.backend == "vxlan"
                    }
                    _ => true,
                }
            })
            .collect();
        if fits.is_empty() {
            return false;
        }
        let ci = fits[self.rng.below(fits.len())];
        let c = &rig.clusters[ci];
        let n = c.c.nodes.len();
        // The nodes a kind can touch: kernel-device kinds need a kernel node.
        let eligible: Vec<usize> = (0..n)
            .filter(|&i| match kind {
                "fdb-del" | "neigh-del" | "device-del" => c.dataplane[i] == "kernel",
                "tun-del" => c.dataplane[i] != "kernel",
                "dataplane-switch" => c.switchable[i],
                _ => true,
            })
            .collect();
        if eligible.is_empty() {
            return false;
        }
        let ni = eligible[self.rng.below(eligible.len())];
        let store_wide = matches!(kind, "etcd-kill" | "etcd-compact" | "disk-full");
        if self.busy(ci, (!store_wide).then_some(ni)) {
            return false;
        }
        let all = Scope {
            cluster: ci,
            nodes: (0..n).collect(),
        };
        let one = Scope {
            cluster: ci,
            nodes: vec![ni],
        };
        let dur = self.rng.secs(2.0, 10.0);
        let until = now() + dur;
        let cc = &mut rig.clusters[ci];
        let Some(pid) = cc.pid(ni) else { return false };
        let ns = cc.c.nodes[ni].ns.name().to_string();
        let etcd = cc.store == StoreKind::Etcd;
        let kernel = cc.dataplane[ni] == "kernel";
        match kind {
            "sigkill" => {
                let mut child = cc.c.nodes[ni].weftd.take().expect("weftd");
                let _ = child.kill();
                let _ = child.wait();
                let d = self.rng.secs(0.2, 3.0);
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} pid {pid}, restart in {d:.1}s", cc.name),
                    now() + d,
                    Some(Undo::Restart),
                );
            }
            "sigstop" => {
                let p = i32::try_from(pid).expect("pid");
                // SAFETY: a signal to our own child; no memory is involved.
                unsafe { libc::kill(p, libc::SIGSTOP) };
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} for {dur:.1}s", cc.name),
                    until,
                    Some(Undo::Cont(p)),
                );
            }
            "etcd-kill" if etcd => {
                if let Some(e) = cc.etcd.as_mut() {
                    e.kill();
                }
                for p in &cc.proxies {
                    p.cut();
                }
                self.record(
                    kind,
                    all,
                    format!("{} etcd down for {dur:.1}s", cc.name),
                    until,
                    Some(Undo::EtcdStart),
                );
            }
            "etcd-compact" if etcd => {
                let rev = compact(cc);
                self.record(
                    kind,
                    all,
                    format!("{} etcd compacted at revision {rev:?}", cc.name),
                    0.0,
                    None,
                );
            }
            "lease-delete" => {
                let Some(key) = cc.subnet(ni).map(|s| s.replace('/', "-")) else {
                    return false;
                };
                if let Err(e) = cc.rm_lease(&key) {
                    eprintln!("chaos: lease-delete {key}: {e}");
                    return false;
                }
                self.expect_exit.push((ci, ni));
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} {key}", cc.name),
                    now() + 30.0,
                    Some(Undo::AwaitExit),
                );
            }
            "lease-garbage" if etcd => {
                let Some(key) = cc.subnet(ni).map(|s| s.replace('/', "-")) else {
                    return false;
                };
                let k = format!("{}{key}", super::rig::SUBNETS);
                let Some(e) = cc.etcd.as_ref() else {
                    return false;
                };
                let old = e.etcdctl(&["get", "--print-value-only", &k]);
                let old = String::from_utf8_lossy(&old.stdout).trim().to_string();
                if old.is_empty() || cc.put_lease(&key, "{\"PublicIP\":7,garbage").is_err() {
                    return false;
                }
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} {key} for {dur:.1}s", cc.name),
                    until,
                    Some(Undo::RestoreLease(key, old)),
                );
            }
            "route-del" => {
                // A /24 via flannel.1 (vxlan), or the one network route into
                // the engine's TUN (WireGuard, udp); never the pod bridge's.
                let (_, routes) = sh(
                    &ns,
                    "ip route show | grep '^10\\.244\\.' | grep -v cni0 | head -1",
                );
                let r = routes.split_whitespace().next().unwrap_or("").to_string();
                if r.is_empty() {
                    return false;
                }
                sh(&ns, &format!("ip route del {r}"));
                self.record(kind, one, format!("{} n{ni} {r}", cc.name), 0.0, None);
            }
            "fdb-del" if kernel && cc.backend == "vxlan" => {
                let (_, out) = sh(&ns, "bridge fdb show dev flannel.1 | grep dst | head -1");
                let w: Vec<&str> = out.split_whitespace().collect();
                let (Some(mac), Some(dst)) = (
                    w.first(),
                    w.iter()
                        .position(|x| *x == "dst")
                        .and_then(|p| w.get(p + 1)),
                ) else {
                    return false;
                };
                sh(
                    &ns,
                    &format!("bridge fdb del {mac} dev flannel.1 dst {dst}"),
                );
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} {mac} dst {dst}", cc.name),
                    0.0,
                    None,
                );
            }
            "neigh-del" if kernel && cc.backend == "vxlan" => {
                sh(&ns, "ip neigh flush dev flannel.1 nud permanent");
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} flannel.1 neighbours flushed", cc.name),
                    0.0,
                    None,
                );
            }
            "device-del" if kernel && cc.backend == "vxlan" => {
                sh(&ns, "ip link del flannel.1");
                self.record(kind, one, format!("{} n{ni} flannel.1", cc.name), 0.0, None);
            }
            "tun-del" if !kernel => {
                let (_, out) = sh(&ns, "ip -o tuntap show");
                let Some(tun) = out
                    .split(':')
                    .next()
                    .filter(|s| !s.trim().is_empty())
                    .map(str::to_string)
                else {
                    return false;
                };
                sh(&ns, &format!("ip link del {tun}"));
                self.record(kind, one, format!("{} n{ni} {tun}", cc.name), 0.0, None);
            }
            "iptables-del" if cc.iptables => {
                sh(
                    &ns,
                    "iptables -t nat -F FLANNEL-POSTRTG; iptables -F FLANNEL-FWD",
                );
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} FLANNEL-POSTRTG, FLANNEL-FWD flushed", cc.name),
                    0.0,
                    None,
                );
            }
            "dataplane-switch" if cc.switchable[ni] => {
                let to = if kernel { "userspace" } else { "kernel" };
                let t0 = now();
                let out = Command::new(weft_tests::bins::path("weft"))
                    .args(["dataplane", "set", to, "--subnet-file"])
                    .arg(cc.subnet_file(ni))
                    .output()
                    .expect("spawn weft dataplane set");
                let took = now() - t0;
                if out.status.success() {
                    cc.dataplane[ni] = if kernel { "userspace" } else { "kernel" };
                } else {
                    self.violations.push(format!(
                        "{t0:.1}s: weft dataplane set {to} on {} n{ni} failed: {}{}",
                        cc.name,
                        String::from_utf8_lossy(&out.stdout),
                        String::from_utf8_lossy(&out.stderr)
                    ));
                }
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} → {to} in {took:.1}s", cc.name),
                    0.0,
                    None,
                );
                // The switch began when the command was sent.
                if let Some(r) = self.done.last_mut() {
                    r.start = t0;
                }
            }
            "cni-readonly" => {
                let dir = cc.c.nodes[ni].dir.join("cni-flannel").display().to_string();
                // On the host: `ip netns exec` runs in a mount namespace of its own.
                let (ok, out) = host_sh(&format!(
                    "mount --bind {dir} {dir} && mount -o remount,bind,ro {dir}"
                ));
                if !ok {
                    self.violations.push(format!("cni-readonly: mount: {out}"));
                    return false;
                }
                let name = format!("x{}", self.next_pod);
                self.next_pod += 1;
                if let Ok(p) = cc.c.add_pod(ni, &name) {
                    let _ = cc.c.del_pod(p);
                    self.violations.push(format!(
                        "CNI ADD on {} n{ni} succeeded with a read-only data dir",
                        cc.name
                    ));
                }
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} {dir} for {dur:.1}s", cc.name),
                    until,
                    Some(Undo::CniWritable(dir)),
                );
            }
            "disk-full" if !etcd => {
                let f = cc.c.work().join("store").join("fill");
                let _ = Command::new("dd")
                    .args(["if=/dev/zero", "bs=64k"])
                    .arg(format!("of={}", f.display()))
                    .output();
                self.record(
                    kind,
                    all,
                    format!("{} store tmpfs full for {dur:.1}s", cc.name),
                    until,
                    Some(Undo::DiskFree(f)),
                );
            }
            "underlay-loss" => {
                let cmd = if self.netem {
                    "tc qdisc add dev eth0 root netem loss 10%".to_string()
                } else {
                    "iptables -t raw -I PREROUTING -i eth0 -m statistic --mode random --probability 0.1 -j DROP".to_string()
                };
                let (ok, out) = sh(&ns, &cmd);
                if !ok {
                    self.violations.push(format!("underlay-loss: {out}"));
                    return false;
                }
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} 10% for {dur:.1}s", cc.name),
                    until,
                    Some(Undo::LossOff(self.netem)),
                );
            }
            "underlay-reorder" if self.netem => {
                sh(
                    &ns,
                    "tc qdisc add dev eth0 root netem delay 10ms reorder 25% 50%",
                );
                self.record(
                    kind,
                    one,
                    format!("{} n{ni} for {dur:.1}s", cc.name),
                    until,
                    Some(Undo::LossOff(true)),
                );
            }
            _ => return false,
        }
        true
    }

    fn finish(&mut self, rig: &mut Rig, mut a: Active) {
        let ci = a.rec.scope.cluster;
        let cc = &mut rig.clusters[ci];
        let ni = a.rec.scope.nodes[0];
        let ns = cc.c.nodes[ni].ns.name().to_string();
        match &a.undo {
            Undo::Restart => cc.restart(ni),
            Undo::Cont(p) => {
                // SAFETY: a signal to our own child; no memory is involved.
                unsafe { libc::kill(*p, libc::SIGCONT) };
            }
            Undo::EtcdStart => {
                if let Some(e) = cc.etcd.as_mut() {
                    e.start_again();
                }
            }
            Undo::CniWritable(dir) => {
                let (ok, out) = host_sh(&format!("umount {dir}"));
                if !ok {
                    self.violations
                        .push(format!("cni-readonly: umount {dir}: {out}"));
                }
                let name = format!("x{}", self.next_pod);
                self.next_pod += 1;
                match cc.c.add_pod(ni, &name) {
                    Ok(p) => {
                        if let Err(e) = cc.c.del_pod(p) {
                            self.violations.push(format!("{:.1}s: CNI DEL after read-only: {e}", now()));
                        }
                    }
                    Err(e) => self.violations.push(format!(
                        "{:.1}s: CNI ADD on {} n{ni} fails after its data dir is writable again: {e}",
                        now(),
                        cc.name
                    )),
                }
            }
            Undo::DiskFree(f) => {
                let _ = std::fs::remove_file(f);
            }
            Undo::LossOff(netem) => {
                let cmd = if *netem {
                    "tc qdisc del dev eth0 root"
                } else {
                    "iptables -t raw -D PREROUTING -i eth0 -m statistic --mode random --probability 0.1 -j DROP"
                };
                sh(&ns, cmd);
            }
            Undo::RestoreLease(key, old) => {
                if let Err(e) = cc.put_lease(key, old) {
                    // The store may be down (etcd-kill overlaps); try again next tick.
                    eprintln!("chaos: restoring lease {key}: {e}");
                    a.until = now() + 1.0;
                    self.active.push(a);
                    return;
                }
            }
            Undo::AwaitExit => {
                // The sampler restarts the node when it exits; still running now is a violation.
                if cc.pid(ni).is_some() && self.expect_exit.contains(&(ci, ni)) {
                    self.violations.push(format!(
                        "{:.1}s: {} n{ni}'s lease was deleted 30 s ago and its weftd still runs",
                        now(),
                        cc.name
                    ));
                    self.expect_exit.retain(|x| *x != (ci, ni));
                }
            }
        }
        a.rec.end = now();
        eprintln!(
            "chaos {:8.1}s end   {} {}",
            a.rec.end, a.rec.kind, a.rec.what
        );
        self.done.push(a.rec);
    }

    /// Called by the sampler when node `(ci, ni)` exited with code 0 after
    /// its lease was deleted: ends that fault now.
    pub fn lease_exit_seen(&mut self, ci: usize, ni: usize) {
        self.expect_exit.retain(|x| *x != (ci, ni));
        if let Some(k) = self.active.iter().position(|a| {
            a.rec.kind == "lease-delete" && a.rec.scope.cluster == ci && a.rec.scope.nodes == [ni]
        }) {
            let mut a = self.active.remove(k);
            a.rec.end = now();
            eprintln!(
                "chaos {:8.1}s end   {} {}",
                a.rec.end, a.rec.kind, a.rec.what
            );
            self.done.push(a.rec);
        }
    }
}

fn compact(cc: &ChaosCluster) -> Option<u64> {
    let e = cc.etcd.as_ref()?;
    let out = e.etcdctl(&["endpoint", "status", "-w", "json", "--command-timeout=2s"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let rev = v[0]["Status"]["header"]["revision"].as_u64()?;
    let ok = e
        .etcdctl(&["compact", &rev.to_string(), "--command-timeout=2s"])
        .status
        .success();
    ok.then_some(rev)
}
