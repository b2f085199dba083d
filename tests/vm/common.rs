//! Shared steps of the guest tests (tests/vm_*.rs): a cluster of guests
//! with etcd on node 1 and weftd on every node, one pod per node through the
//! CNI plugin, and the traffic checks every backend gets (pings, a TCP
//! transfer, full-MTU pings with DF set).

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use weft_tests::vm::{Daemon, Etcd, Kit, Lab, LabSpec, Pod, quote};

/// Guests, etcd on node 1, weftd everywhere.
pub struct Cluster {
    pub lab: Lab,
    pub etcd: Etcd,
    pub weftd: Vec<Daemon>,
    pub envs: Vec<BTreeMap<String, String>>,
    /// When the weftds were started.
    pub started: Instant,
    /// From `started` until every node had written subnet.env.
    pub ready_after: Duration,
    /// When the test began (before booting).
    pub t0: Instant,
    /// (since `started`, CNI ADD time) of the last [`Cluster::pods`].
    pub pods_after: std::sync::Mutex<Option<(Duration, Duration)>>,
}

/// Boots `spec`, puts `net_conf` into etcd on node 1 and starts weftd with
/// `--etcd-endpoints`, `--iface=eth0`, `--ip-masq` and `args` (plus
/// `node_args[i]` on node `i`, when given) on every node; waits for every
/// subnet.env. `--ip-masq` as in flannel's DaemonSet: weftd's own rules
/// (the default traffic manager) leave pod-to-pod traffic alone, where
/// without it the bridge plugin masquerades it to the node's address (which
/// no ipsec policy matches).
pub fn cluster(
    kit: &Kit,
    spec: &LabSpec,
    net_conf: &str,
    args: &[&str],
    node_args: &[&[&str]],
) -> Cluster {
    cluster_with(kit, spec, net_conf, args, node_args, |_| {})
}

/// [`cluster`], running `prepare` on the booted lab before etcd and weftd start.
pub fn cluster_with(
    kit: &Kit,
    spec: &LabSpec,
    net_conf: &str,
    args: &[&str],
    node_args: &[&[&str]],
    prepare: impl FnOnce(&Lab),
) -> Cluster {
    let t0 = Instant::now();
    let lab = Lab::start(kit, spec);
    prepare(&lab);
    let etcd = lab.start_etcd(0, net_conf);
    let flag = etcd.flag();
    let started = Instant::now();
    let weftd: Vec<Daemon> = lab
        .nodes()
        .iter()
        .map(|n| {
            let mut a = vec![flag.as_str(), "--iface=eth0", "--ip-masq"];
            a.extend_from_slice(args);
            a.extend_from_slice(node_args.get(n.index()).copied().unwrap_or_default());
            n.start_weftd(&a)
        })
        .collect();
    let envs = lab
        .nodes()
        .iter()
        .zip(&weftd)
        .map(|(n, d)| n.wait_subnet_env(d, Duration::from_secs(90)))
        .collect();
    let ready_after = started.elapsed();
    Cluster {
        lab,
        etcd,
        weftd,
        envs,
        started,
        ready_after,
        t0,
        pods_after: std::sync::Mutex::new(None),
    }
}

impl Cluster {
    /// One pod per node (`p<i>`), added on all nodes at once.
    pub fn pods(&self) -> Vec<Pod> {
        let t = Instant::now();
        let pods = std::thread::scope(|s| {
            let hs: Vec<_> = self
                .lab
                .nodes()
                .iter()
                .map(|n| s.spawn(move || n.add_pod(&format!("p{}", n.index() + 1))))
                .collect();
            hs.into_iter().map(|h| h.join().expect("add_pod")).collect()
        });
        *self.pods_after.lock().expect("lock") = Some((self.started.elapsed(), t.elapsed()));
        pods
    }

    /// Waits for the first reply from `b` to `a`'s pings; returns the time
    /// since the weftds started.
    pub fn first_packet(&self, a: &Pod, b: &Pod) -> Duration {
        assert!(
            a.ping_within(&b.ip.to_string(), Duration::from_secs(30)),
            "pod {} cannot reach pod {} ({}) within 30 s",
            a.ns,
            b.ns,
            b.ip
        );
        self.started.elapsed()
    }

    /// The leases in etcd: subnet key → value.
    pub fn leases(&self) -> BTreeMap<String, serde_json::Value> {
        let out = self.lab.node(0).ok(&format!(
            "etcdctl --endpoints={} get --prefix /coreos.com/network/subnets/",
            self.etcd.endpoint
        ));
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| {
                let v = serde_json::from_str(c[1])
                    .unwrap_or_else(|e| panic!("lease {}: {e}: {}", c[0], c[1]));
                (c[0].to_string(), v)
            })
            .collect()
    }

    /// The lease whose PublicIP is node `i`'s address.
    pub fn lease_of(&self, i: usize) -> serde_json::Value {
        let ip = self.lab.node(i).addr().to_string();
        self.leases()
            .into_values()
            .find(|v| v["PublicIP"] == ip.as_str())
            .unwrap_or_else(|| panic!("no lease for {ip}"))
    }

    /// `FLANNEL_MTU` of node `i`.
    pub fn mtu(&self, i: usize) -> u32 {
        self.envs[i]["FLANNEL_MTU"].parse().expect("FLANNEL_MTU")
    }

    /// Prints the figures of one test: ready and first-packet times, wall time.
    pub fn report(&self, what: &str, first_packet: Duration) {
        let pods = self.pods_after.lock().expect("lock").unwrap_or_default();
        println!(
            "figures {what}: boot {:.1?}, from weftd start: all subnet.env {:.1?}, pods attached {:.1?} (CNI ADD {:.1?}), first pod packet across nodes {:.1?}; test wall time {:.1?} (plus {:.1?} waiting for another lab)",
            self.lab.boot_time(),
            self.ready_after,
            pods.0,
            pods.1,
            first_packet,
            self.t0.elapsed().saturating_sub(self.lab.lock_wait()),
            self.lab.lock_wait()
        );
    }
}

/// Every pod pings every other (v4, and v6 where both have an address).
pub fn mesh_ping(pods: &[Pod]) {
    for a in pods {
        for b in pods {
            if a.ns == b.ns {
                continue;
            }
            assert!(
                a.ping_within(&b.ip.to_string(), Duration::from_secs(20)),
                "{} cannot ping {} ({})",
                a.ns,
                b.ns,
                b.ip
            );
            if let (Some(_), Some(b6)) = (a.ip6, b.ip6) {
                assert!(
                    a.ping_within(&b6.to_string(), Duration::from_secs(20)),
                    "{} cannot ping {} ({b6})",
                    a.ns,
                    b.ns
                );
            }
        }
    }
}

/// A 1 MiB HTTP download over TCP by `a` from `b` at `dst` (busybox httpd
/// and wget); asserts that every byte arrived unchanged (sha256). Returns
/// how long the download took.
pub fn tcp_transfer(kit: &Kit, a: &Pod, b: &Pod, dst: &str) -> Duration {
    static PORT: AtomicU16 = AtomicU16::new(8080);
    let port = PORT.fetch_add(1, Ordering::Relaxed);
    let bb = kit.busybox().display().to_string();
    let www = format!("/tmp/www-{}", b.ns);
    let sum = b.node.ok(&format!(
        "mkdir -p {www} && head -c 1048576 /dev/urandom > {www}/blob && sha256sum < {www}/blob"
    ));
    let server = b.node.spawn(
        "httpd",
        &format!(
            "exec ip netns exec {} {bb} httpd -f -p {port} -h {www}",
            b.ns
        ),
    );
    let host = if dst.contains(':') {
        format!("[{dst}]")
    } else {
        dst.to_string()
    };
    let t = Instant::now();
    let out = a.sh(&format!(
        "for i in $(seq 50); do {bb} wget -q -O /tmp/rx-{ns} http://{host}:{port}/blob && break; sleep 0.2; done; sha256sum < /tmp/rx-{ns}; stat -c %s /tmp/rx-{ns}",
        ns = a.ns
    ));
    let took = t.elapsed();
    assert!(
        out.success(),
        "download {} <- {dst}: {out}\nserver: {}",
        a.ns,
        server.log()
    );
    assert_eq!(
        out.stdout,
        format!("{sum}1048576\n"),
        "download {} <- {dst}: the bytes differ or are missing",
        a.ns
    );
    server.stop(libc::SIGTERM, Duration::from_secs(10));
    took
}

/// A ping of exactly `mtu` bytes with DF set gets through from `a` to `b`
/// (so nothing on the path is smaller), and one byte more is refused by
/// `a`'s own interface (so the pod MTU is exactly `mtu`).
pub fn df_ping(a: &Pod, dst: &str, mtu: u32) {
    let v6 = dst.contains(':');
    let hdr = if v6 { 48 } else { 28 };
    let fits = a.sh(&format!("ping -c1 -W3 -n -M do -s {} {dst}", mtu - hdr));
    // Retried once: the very first full-size packet may meet a path still
    // being set up (a WireGuard handshake, an IKE exchange).
    let fits = if fits.success() {
        fits
    } else {
        a.sh(&format!("ping -c2 -W3 -n -M do -s {} {dst}", mtu - hdr))
    };
    assert!(
        fits.success(),
        "{}: full-MTU ({mtu}) ping with DF to {dst} failed: {fits}",
        a.ns
    );
    let over = a.sh(&format!("ping -c1 -W2 -n -M do -s {} {dst}", mtu - hdr + 1));
    let text = format!("{}{}", over.stdout, over.stderr);
    assert!(
        !over.success() && (text.contains("message too long") || text.contains("mtu")),
        "{}: a ping of {} bytes with DF to {dst} was not refused: {over}",
        a.ns,
        mtu + 1
    );
}

/// `quote` re-exported for the test files.
pub fn q(s: &str) -> String {
    quote(s)
}
