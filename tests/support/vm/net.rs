//! A weft network in guests, the tier every `tests/vm_*.rs` builds on: a
//! lab ([`super::Lab`]) with etcd on node 1 and one weftd per node, one pod
//! per node through weft's CNI plugin, and the checks the guest tests share
//! (pings, 1 MiB TCP downloads checked byte for byte, full-MTU pings with DF
//! set, `weft status`, live switches, links and routes as iproute2's JSON,
//! what a dataplane may leave behind, a timestamped 10 ms ping stream).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use super::{Daemon, Etcd, Kit, Lab, LabSpec, Node, Pod, SUBNET_ENV, quote};
use crate::ping::Gap;

/// The lab, etcd on node 1 and one weftd per node.
pub struct Net {
    /// The guests.
    pub lab: Lab,
    /// etcd on node 1.
    pub etcd: Etcd,
    /// One weftd per node.
    pub weftd: Vec<Daemon>,
    /// Each node's subnet.env as written at start.
    pub envs: Vec<BTreeMap<String, String>>,
    /// When the weftds were started.
    pub started: Instant,
    /// From `started` until every subnet.env was written.
    pub ready_after: Duration,
    /// When the test began (before booting).
    pub t0: Instant,
    /// (since `started`, CNI ADD time) of the last [`Net::pods`].
    pub pods_after: Mutex<Option<(Duration, Duration)>>,
}

/// Boots `spec`, puts `conf` into etcd on node 1 and starts weftd with
/// `--etcd-endpoints`, `--iface=eth0`, `args` and `node_args[i]` on node
/// `i`; waits for every subnet.env.
pub fn net(kit: &Kit, spec: &LabSpec, conf: &str, args: &[&str], node_args: &[&[&str]]) -> Net {
    net_with(kit, spec, conf, args, node_args, |_| {})
}

/// [`net`], running `prepare` on the booted lab before etcd and weftd start.
pub fn net_with(
    kit: &Kit,
    spec: &LabSpec,
    conf: &str,
    args: &[&str],
    node_args: &[&[&str]],
    prepare: impl FnOnce(&Lab),
) -> Net {
    let t0 = Instant::now();
    let lab = Lab::start(kit, spec);
    // The guests run no udev or systemd, so nothing creates /dev/net/tun
    // (kmod's static nodes) before the tun module is loaded.
    for n in lab.nodes() {
        n.ok("modprobe tun && test -c /dev/net/tun");
    }
    prepare(&lab);
    let etcd = lab.start_etcd(0, conf);
    let flag = etcd.flag();
    let started = Instant::now();
    let weftd: Vec<Daemon> = lab
        .nodes()
        .iter()
        .map(|n| {
            let mut a = vec![flag.as_str(), "--iface=eth0"];
            a.extend_from_slice(args);
            a.extend_from_slice(node_args.get(n.index()).copied().unwrap_or_default());
            n.start_weftd(&a)
        })
        .collect();
    let envs = lab
        .nodes()
        .iter()
        .zip(&weftd)
        .map(|(n, d)| n.wait_subnet_env(d, Duration::from_secs(120)))
        .collect();
    Net {
        ready_after: started.elapsed(),
        lab,
        etcd,
        weftd,
        envs,
        started,
        t0,
        pods_after: Mutex::new(None),
    }
}

impl Net {
    /// Node `i`.
    pub fn node(&self, i: usize) -> &Node {
        self.lab.node(i)
    }

    /// Every lease in etcd: key → the value exactly as stored.
    pub fn leases_raw(&self) -> BTreeMap<String, String> {
        let out = self.node(0).ok(&format!(
            "etcdctl --endpoints={} get --prefix /coreos.com/network/subnets/",
            self.etcd.endpoint
        ));
        let lines: Vec<&str> = out.lines().collect();
        lines
            .chunks(2)
            .filter(|c| c.len() == 2)
            .map(|c| (c[0].to_string(), c[1].to_string()))
            .collect()
    }

    /// Node `i`'s lease (key, raw value), found by its PublicIP (or
    /// PublicIPv6 in an IPv6-only network).
    pub fn lease_raw(&self, i: usize) -> (String, String) {
        let n = self.node(i);
        let v4 = format!("\"PublicIP\":\"{}\"", n.addr());
        let v6 = n.addr6().map(|a| format!("\"PublicIPv6\":\"{a}\""));
        let all = self.leases_raw();
        let found: Vec<_> = all
            .iter()
            .filter(|(_, v)| v.contains(&v4) || v6.as_ref().is_some_and(|s| v.contains(s)))
            .collect();
        assert_eq!(found.len(), 1, "node {i}: leases {all:#?}");
        (found[0].0.clone(), found[0].1.clone())
    }

    /// Node `i`'s lease value, parsed.
    pub fn lease(&self, i: usize) -> serde_json::Value {
        let (k, v) = self.lease_raw(i);
        serde_json::from_str(&v).unwrap_or_else(|e| panic!("lease {k}: {e}: {v}"))
    }

    /// `weft status --json` on node `i`.
    pub fn status(&self, i: usize) -> serde_json::Value {
        status(self.node(i))
    }

    /// A variable of node `i`'s subnet.env as written at start.
    pub fn env(&self, i: usize, key: &str) -> String {
        self.envs[i]
            .get(key)
            .unwrap_or_else(|| panic!("node {i}: no {key} in {:?}", self.envs[i]))
            .clone()
    }

    /// `FLANNEL_MTU` of node `i`.
    pub fn mtu(&self, i: usize) -> u32 {
        self.env(i, "FLANNEL_MTU").parse().expect("FLANNEL_MTU")
    }

    /// One pod per node (`p<i>`), attached on all nodes at once.
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

    /// Waits for the first reply from `b` to `a`'s pings (v4); returns the
    /// time since the weftds started.
    pub fn first_packet(&self, a: &Pod, b: &Pod) -> Duration {
        a.must_reach(&b.ip(false));
        self.started.elapsed()
    }

    /// Every weftd log, for failure messages.
    pub fn logs(&self) -> String {
        self.weftd
            .iter()
            .map(|d| format!("==== {} weftd:\n{}\n", d.node().name(), d.log()))
            .collect()
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

/// `weft status --json` on `n`.
pub fn status(n: &Node) -> serde_json::Value {
    let weft = crate::bins::path("weft");
    let out = n.ok(&format!(
        "{} status --json --subnet-file {SUBNET_ENV}",
        quote(&weft.to_string_lossy())
    ));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("weft status --json: {e}: {out}"))
}

/// `weft dataplane set <to>` on `n`; returns how long the command took
/// (it returns once weftd reports the new dataplane).
pub fn switch(n: &Node, to: &str) -> Duration {
    let weft = crate::bins::path("weft");
    let t = Instant::now();
    let out = n.sh(&format!(
        "{} dataplane set {to} --timeout 90 --subnet-file {SUBNET_ENV}",
        quote(&weft.to_string_lossy())
    ));
    let took = t.elapsed();
    assert!(
        out.success() && out.stdout.contains(&format!("runs in the {to}")),
        "{}: weft dataplane set {to}: {out}",
        n.name()
    );
    took
}

/// Every pod pings every other (v4 where both have an address, v6 where
/// both have one).
pub fn mesh_ping(pods: &[Pod]) {
    for a in pods {
        for b in pods {
            if a.ns == b.ns {
                continue;
            }
            for v6 in [false, true] {
                let both = if v6 {
                    a.ip6.is_some() && b.ip6.is_some()
                } else {
                    a.ip4.is_some() && b.ip4.is_some()
                };
                if both {
                    a.must_reach(&b.ip(v6));
                }
            }
        }
    }
}

/// A 1 MiB download over TCP by `client` from `server` at `dst` (one of
/// `server`'s addresses; busybox httpd and wget); asserts that every byte
/// arrived unchanged (sha256). Returns how long the download took.
pub fn tcp(client: &Pod, server: &Pod, dst: &str) -> Duration {
    static PORT: AtomicU16 = AtomicU16::new(8080);
    let port = PORT.fetch_add(1, Ordering::Relaxed);
    let bb = Kit::find().expect("kit").busybox().display().to_string();
    let www = format!("/tmp/www-{}-{port}", server.ns);
    let sum = server.node.ok(&format!(
        "mkdir -p {www} && head -c 1048576 /dev/urandom > {www}/blob && sha256sum < {www}/blob"
    ));
    let httpd = server.node.spawn(
        "httpd",
        &format!(
            "exec ip netns exec {} {bb} httpd -f -p {port} -h {www}",
            server.ns
        ),
    );
    let host = if dst.contains(':') {
        format!("[{dst}]")
    } else {
        dst.to_string()
    };
    let rx = format!("/tmp/rx-{}-{port}", client.ns);
    let t = Instant::now();
    let out = client.sh(&format!(
        "for i in $(seq 50); do {bb} wget -q -O {rx} http://{host}:{port}/blob && break; sleep 0.2; done; sha256sum < {rx}; stat -c %s {rx}"
    ));
    let took = t.elapsed();
    httpd.stop(libc::SIGTERM, Duration::from_secs(10));
    assert!(
        out.success() && out.stdout == format!("{sum}1048576\n"),
        "download {} <- {dst}: bytes missing or changed: {out}\nhttpd: {}",
        client.ns,
        httpd.log()
    );
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

/// The MTU of `dev` on `n`.
pub fn dev_mtu(n: &Node, dev: &str) -> u32 {
    let v: serde_json::Value =
        serde_json::from_str(&n.ok(&format!("ip -j link show {dev}"))).expect("ip -j link");
    v[0]["mtu"]
        .as_u64()
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or_else(|| panic!("{dev}: no MTU in {v}"))
}

/// The links of `n`: name → kind (`ip -d -j link`: `tun`, `vxlan`,
/// `wireguard`, `ipip`, `veth`, `bridge`; `""` for plain devices).
pub fn links(n: &Node) -> BTreeMap<String, String> {
    let out = n.ok("ip -d -j link show");
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j link");
    v.as_array()
        .expect("array")
        .iter()
        .map(|l| {
            (
                l["ifname"].as_str().unwrap_or_default().to_string(),
                l["linkinfo"]["info_kind"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string(),
            )
        })
        .collect()
}

/// One route of `ip -j route`, as text: `dst [via gw] dev D [onlink]`.
pub fn routes(n: &Node, v6: bool) -> Vec<String> {
    let fam = if v6 { "-6" } else { "-4" };
    let out = n.ok(&format!("ip {fam} -j route show table main"));
    let v: serde_json::Value = serde_json::from_str(&out).expect("ip -j route");
    v.as_array()
        .expect("array")
        .iter()
        .map(|r| {
            let mut s = r["dst"].as_str().unwrap_or_default().to_string();
            if let Some(g) = r["gateway"].as_str() {
                s += &format!(" via {g}");
            }
            s += &format!(" dev {}", r["dev"].as_str().unwrap_or_default());
            if r["flags"]
                .as_array()
                .is_some_and(|f| f.iter().any(|x| x == "onlink"))
            {
                s += " onlink";
            }
            s
        })
        .collect()
}

/// Every route of `n` through `dev`.
pub fn routes_via(n: &Node, v6: bool, dev: &str) -> Vec<String> {
    routes(n, v6)
        .into_iter()
        .filter(|r| r.contains(&format!(" dev {dev}")))
        .collect()
}

/// What must hold of a node whatever ran before: no link of a kind weft's
/// other dataplanes create (other than `keep`), no probe link, no XFRM state
/// or policy, and only the default policy rules.
#[track_caller]
pub fn nothing_else(n: &Node, keep: &[(&str, &str)]) {
    let l = links(n);
    for (name, kind) in &l {
        if name.starts_with("weftprobe") {
            panic!("{}: probe link {name} left: {l:?}", n.name());
        }
        let ours = ["tun", "vxlan", "wireguard", "ipip"].contains(&kind.as_str());
        // tunl0 is the ipip module's own fallback device (it comes with the
        // module and cannot be deleted); weft never configures it.
        let fallback = name == "tunl0" && kind == "ipip";
        if ours && !fallback && !keep.contains(&(name.as_str(), kind.as_str())) {
            panic!("{}: {name} ({kind}) left behind: {l:?}", n.name());
        }
    }
    for (name, kind) in keep {
        assert_eq!(
            l.get(*name).map(String::as_str),
            Some(*kind),
            "{}: {name} should be a {kind} device: {l:?}",
            n.name()
        );
    }
    let x = n.ok("ip xfrm state; ip xfrm policy");
    assert!(x.trim().is_empty(), "{}: XFRM left: {x}", n.name());
    // Only the kernel's default rules (IPv6 may lack the `default` one).
    let rules = n.ok("ip -4 rule; ip -6 rule");
    let defaults = [
        "0:\tfrom all lookup local",
        "32766:\tfrom all lookup main",
        "32767:\tfrom all lookup default",
    ];
    assert!(
        rules.lines().all(|l| defaults.contains(&l)),
        "{}: policy rules other than the defaults:\n{rules}",
        n.name()
    );
}

/// A ping every 10 ms from a pod in a guest, each reply timestamped
/// (`ping -D`); judged by [`crate::ping::parse`].
pub struct PingStream {
    d: Daemon,
    dst: String,
}

impl PingStream {
    /// Starts pinging `dst` from `pod` every 10 ms and waits for 50 replies.
    pub fn start(pod: &Pod, dst: &str) -> PingStream {
        let d = pod.node.spawn(
            "ping-stream",
            &format!(
                "exec ip netns exec {} ping -D -n -i 0.01 -W 2 {dst}",
                pod.ns
            ),
        );
        let s = PingStream {
            d,
            dst: dst.to_string(),
        };
        s.wait_more(0, 50, Duration::from_secs(30));
        s
    }

    /// Replies so far.
    pub fn replies(&self) -> u64 {
        crate::ping::parse(&self.d.log()).replies
    }

    /// Waits until `more` replies came after the first `after`.
    #[track_caller]
    pub fn wait_more(&self, after: u64, more: u64, timeout: Duration) {
        crate::ping::wait_replies(&self.dst, after, more, timeout, || {
            let log = self.d.log();
            (crate::ping::parse(&log).replies, self.d.running(), log)
        });
    }

    /// Stops the stream; its longest gap and losses.
    pub fn finish(self) -> Gap {
        self.d.stop(libc::SIGINT, Duration::from_secs(10));
        crate::ping::parse(&self.d.log())
    }
}
