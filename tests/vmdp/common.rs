//! Shared steps of the dataplane guest tests (tests/vm_mixed.rs,
//! tests/vm_switch.rs, tests/vm_ipv6.rs) on the VM kit (tests/support/vm.rs):
//! a lab with etcd on node 1 and weftd per node with per-node arguments,
//! pods that may be IPv4-only, dual-stack or IPv6-only, the raw lease values
//! in etcd (for byte-for-byte comparisons), `weft status --json`, the links
//! and routes of a node as iproute2's JSON, a timestamped 10 ms ping stream
//! with its longest gap, and 1 MiB TCP downloads checked byte for byte.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::{Duration, Instant};

use weft_tests::vm::{Daemon, Etcd, Kit, Lab, LabSpec, Node, SUBNET_ENV, quote};

/// The lab, etcd on node 1 and one weftd per node.
pub struct Net {
    pub lab: Lab,
    pub etcd: Etcd,
    pub weftd: Vec<Daemon>,
    pub envs: Vec<BTreeMap<String, String>>,
    /// When the weftds were started.
    pub started: Instant,
    /// From `started` until every subnet.env was written.
    pub ready_after: Duration,
    /// When the test began (before booting).
    pub t0: Instant,
}

/// Boots `spec`, puts `conf` into etcd and starts weftd on every node with
/// `--etcd-endpoints`, `--iface=eth0`, `common` and `per_node[i]`; waits
/// for every subnet.env.
pub fn net(kit: &Kit, spec: &LabSpec, conf: &str, common: &[&str], per_node: &[&[&str]]) -> Net {
    let t0 = Instant::now();
    let lab = Lab::start(kit, spec);
    // The guests run no udev or systemd, so nothing creates /dev/net/tun
    // (kmod's static nodes) before the tun module is loaded.
    for n in lab.nodes() {
        n.ok("modprobe tun && test -c /dev/net/tun");
    }
    let etcd = lab.start_etcd(0, conf);
    let started = Instant::now();
    let weftd: Vec<Daemon> = lab
        .nodes()
        .iter()
        .map(|n| {
            let flag = etcd.flag();
            let mut a = vec![flag.as_str(), "--iface=eth0"];
            a.extend_from_slice(common);
            a.extend_from_slice(per_node.get(n.index()).copied().unwrap_or_default());
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
    }
}

impl Net {
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

    /// One pod per node (`p<i>`), attached on all nodes at once.
    pub fn pods(&self) -> Vec<P> {
        std::thread::scope(|s| {
            let hs: Vec<_> = self
                .lab
                .nodes()
                .iter()
                .map(|n| s.spawn(move || add_pod(n, &format!("p{}", n.index() + 1))))
                .collect();
            hs.into_iter().map(|h| h.join().expect("add_pod")).collect()
        })
    }

    /// Every weftd log, for failure messages.
    pub fn logs(&self) -> String {
        self.weftd
            .iter()
            .map(|d| format!("==== {} weftd:\n{}\n", d.node().name(), d.log()))
            .collect()
    }
}

/// `weft status --json` on `n`.
pub fn status(n: &Node) -> serde_json::Value {
    let weft = weft_tests::bins::path("weft");
    let out = n.ok(&format!(
        "{} status --json --subnet-file {SUBNET_ENV}",
        quote(&weft.to_string_lossy())
    ));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("weft status --json: {e}: {out}"))
}

/// `weft dataplane set <to>` on `n`; returns how long the command took
/// (it returns once weftd reports the new dataplane).
pub fn switch(n: &Node, to: &str) -> Duration {
    let weft = weft_tests::bins::path("weft");
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

/// A pod: a namespace attached by weft's CNI plugin, with whichever
/// families its node's subnet.env gives.
#[derive(Debug, Clone)]
pub struct P {
    pub node: Node,
    pub ns: String,
    pub ip4: Option<Ipv4Addr>,
    pub ip6: Option<Ipv6Addr>,
}

/// Creates pod `name` on `n` through weft's CNI plugin (`CNI_COMMAND=ADD`,
/// delegating to bridge + host-local), as a kubelet would.
pub fn add_pod(n: &Node, name: &str) -> P {
    let ns = format!("{}-{name}", n.name());
    let bins = weft_tests::bins::dir();
    let script = format!(
        "set -e\nip netns add {ns}\nip -n {ns} link set lo up\nprintf '%s' {conf} | CNI_COMMAND=ADD CNI_CONTAINERID={ns} CNI_NETNS=/run/netns/{ns} CNI_IFNAME=eth0 CNI_PATH={path} {plugin}\n",
        conf = quote(&n.cni_conf()),
        path = quote(&format!(
            "{}:{}",
            bins.display(),
            weft_tests::vm::CNI_PLUGIN_DIR
        )),
        plugin = quote(&bins.join("flannel").to_string_lossy()),
    );
    let out = n.sh(&script);
    assert!(out.success(), "{}: CNI ADD {ns}: {out}", n.name());
    let v: serde_json::Value = serde_json::from_str(&out.stdout)
        .unwrap_or_else(|e| panic!("CNI ADD {ns} returned no JSON ({e}): {out}"));
    let (mut ip4, mut ip6) = (None, None);
    for a in v["ips"].as_array().into_iter().flatten() {
        match a["address"]
            .as_str()
            .and_then(|s| s.split('/').next())
            .and_then(|s| s.parse::<IpAddr>().ok())
        {
            Some(IpAddr::V4(x)) => ip4 = ip4.or(Some(x)),
            Some(IpAddr::V6(x)) => ip6 = ip6.or(Some(x)),
            None => {}
        }
    }
    assert!(
        ip4.is_some() || ip6.is_some(),
        "CNI ADD {ns}: no address: {out}"
    );
    P {
        node: n.clone(),
        ns,
        ip4,
        ip6,
    }
}

impl P {
    /// Runs `script` in the pod's namespace.
    pub fn sh(&self, script: &str) -> weft_tests::vm::Output {
        self.node.sh(&format!(
            "ip netns exec {} bash -c {}",
            self.ns,
            quote(script)
        ))
    }

    /// The pod's address of the family of `v6`.
    pub fn ip(&self, v6: bool) -> String {
        if v6 {
            self.ip6.expect("pod has no IPv6 address").to_string()
        } else {
            self.ip4.expect("pod has no IPv4 address").to_string()
        }
    }

    /// Pings `dst` once a second until a reply or `timeout`.
    pub fn ping_within(&self, dst: &str, timeout: Duration) -> bool {
        let n = timeout.as_secs().max(1);
        self.sh(&format!(
            "for i in $(seq {n}); do ping -c1 -W1 -n {dst} >/dev/null && exit 0; done; exit 1"
        ))
        .success()
    }

    /// Asserts that `dst` answers within 30 s; returns how long it took.
    #[track_caller]
    pub fn must_reach(&self, dst: &str) -> Duration {
        let t = Instant::now();
        assert!(
            self.ping_within(dst, Duration::from_secs(30)),
            "pod {} cannot reach {dst} within 30 s",
            self.ns
        );
        t.elapsed()
    }
}

/// A 1 MiB download over TCP by `client` from `server` at `dst` (one of
/// `server`'s addresses; busybox httpd and wget, as the kit's tests do);
/// asserts that every byte arrived unchanged (sha256). Returns how long the
/// download took.
pub fn tcp(client: &P, server: &P, dst: &str) -> Duration {
    static PORT: AtomicU16 = AtomicU16::new(8180);
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

/// The MTU of `dev` on `n`.
pub fn mtu(n: &Node, dev: &str) -> u32 {
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

/// Every route of `n` through a device named like `prefix` uses the device
/// `dev` (of the current dataplane); returns those routes.
#[track_caller]
pub fn routes_via(n: &Node, v6: bool, dev: &str) -> Vec<String> {
    routes(n, v6)
        .into_iter()
        .filter(|r| r.contains(&format!(" dev {dev}")))
        .collect()
}

/// A ping every 10 ms from a pod, each reply timestamped (`ping -D`).
pub struct PingStream {
    d: Daemon,
    dst: String,
}

/// What a [`PingStream`] saw.
#[derive(Debug, Clone, Copy)]
pub struct Gap {
    /// Echo requests sent.
    pub sent: u64,
    /// Replies.
    pub replies: u64,
    /// The longest time between two consecutive replies.
    pub longest: Duration,
    /// Guest wall-clock time of the reply before the longest gap.
    pub at: f64,
}

impl std::fmt::Display for Gap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "longest gap {} ms, {} of {} pings lost",
            self.longest.as_millis(),
            self.sent - self.replies,
            self.sent
        )
    }
}

impl PingStream {
    /// Starts pinging `dst` from `pod` every 10 ms and waits for 50 replies.
    pub fn start(pod: &P, dst: &str) -> PingStream {
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
        self.d
            .log()
            .lines()
            .filter(|l| l.contains("bytes from"))
            .count() as u64
    }

    /// Waits until `more` replies came after the first `after`.
    #[track_caller]
    pub fn wait_more(&self, after: u64, more: u64, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let n = self.replies();
            if n >= after + more {
                return;
            }
            assert!(
                Instant::now() < deadline && self.d.running(),
                "ping stream to {}: only {} replies after {timeout:?} (wanted {more} after {after}); tail:\n{}",
                self.dst,
                n.saturating_sub(after),
                tail(&self.d.log(), 15)
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Stops the stream; its longest gap and losses.
    pub fn finish(self) -> Gap {
        self.d.stop(libc::SIGINT, Duration::from_secs(10));
        let log = self.d.log();
        gap_of(&log)
    }
}

/// Parses `ping -D` output: replies' timestamps and the summary line.
pub fn gap_of(log: &str) -> Gap {
    let stamps: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("bytes from"))
        .filter_map(|l| l.strip_prefix('[')?.split(']').next()?.parse().ok())
        .collect();
    let (mut longest, mut at) = (0.0f64, 0.0);
    for w in stamps.windows(2) {
        if w[1] - w[0] > longest {
            longest = w[1] - w[0];
            at = w[0];
        }
    }
    let sent = log
        .lines()
        .find(|l| l.contains("packets transmitted"))
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .unwrap_or(stamps.len() as u64);
    Gap {
        sent,
        replies: stamps.len() as u64,
        longest: Duration::from_secs_f64(longest),
        at,
    }
}

pub fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    #[test]
    fn gaps_of_ping_output() {
        let log = "PING 10.244.1.2 (10.244.1.2) 56(84) bytes of data.\n\
            [100.000] 64 bytes from 10.244.1.2: icmp_seq=1 ttl=62 time=1 ms\n\
            [100.010] 64 bytes from 10.244.1.2: icmp_seq=2 ttl=62 time=1 ms\n\
            [100.530] 64 bytes from 10.244.1.2: icmp_seq=54 ttl=62 time=1 ms\n\
            [100.540] 64 bytes from 10.244.1.2: icmp_seq=55 ttl=62 time=1 ms\n\
            \n--- 10.244.1.2 ping statistics ---\n\
            56 packets transmitted, 4 received, 92.8571% packet loss, time 560ms\n";
        let g = super::gap_of(log);
        assert_eq!((g.sent, g.replies), (56, 4));
        assert_eq!(g.longest.as_millis(), 520);
        assert!((g.at - 100.010).abs() < 1e-9);
    }
}
