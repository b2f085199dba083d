//! weft as the DaemonSet of a real Kubernetes v1.20 cluster: real kubelets,
//! real containerd and runc, real pods (tests/support/k8s). One 2-node
//! cluster is shared by the tests of this binary (each holds it alone while
//! it runs); deploy/kube-flannel.yml is applied unchanged, on weft's image
//! built offline from this build's binaries. Tests that need another backend
//! switch net-conf.json in the ConfigMap (and `WEFT_DATAPLANE` on the
//! DaemonSet for kernel vs userspace VXLAN) and roll the DaemonSet; each
//! test's pods live in its own namespace, removed when it ends.
//!
//! Needs root, scripts/tools/build-kube-apiserver.sh and
//! scripts/tools/build-kube.sh (cached), and the Debian packages containerd,
//! runc, etcd-server, containernetworking-plugins, conntrack.

use std::time::{Duration, Instant};

use weft_tests::k8s::{
    self, Cluster, SharedCluster, TestNs, WEFT_DS, WEFT_NS, condition, figure, secs,
};

const NODES: usize = 2;

/// The shared cluster, or return from the test (skip; under CI: fail).
macro_rules! cluster {
    () => {
        match k8s::shared(NODES) {
            Some(c) => c,
            None => return,
        }
    };
}

/// net-conf.json for `backend`, formatted as deploy/kube-flannel.yml has it.
fn net_conf(backend: &str) -> String {
    format!(
        "{{\n  \"Network\": \"10.244.0.0/16\",\n  \"EnableNFTables\": false,\n  \"Backend\": {{\n    \"Type\": \"{backend}\"\n  }}\n}}\n"
    )
}

/// A busybox HTTP server with a 1 MiB random file and its md5 next to it.
const SERVER: &str = "mkdir -p /www && dd if=/dev/urandom of=/www/big bs=1k count=1024 2>/dev/null \
     && md5sum /www/big | cut -c1-32 > /www/sum && echo hi-from-$(hostname) > /www/index.html \
     && exec httpd -f -p 8080 -h /www";
const IDLE: &str = "exec sleep 100000";

/// Fetches `/big` from `ip:port` in `pod` and compares it with `sum`.
fn fetch_big(ns: &TestNs<'_>, pod: &str, ip: &str, port: u16, sum: &str) {
    let got = ns.sh(
        pod,
        &format!(
            "printf 'GET /big HTTP/1.0\\r\\n\\r\\n' | nc -w 10 {ip} {port} | tail -c 1048576 | md5sum | cut -c1-32"
        ),
    );
    assert_eq!(
        got.trim(),
        sum.trim(),
        "1 MiB over TCP from {pod} to {ip}:{port} arrived damaged or not at all"
    );
}

/// Two pods, one per node; the second serves HTTP. Returns the namespace,
/// the pods and the server's file checksum.
fn two_pods<'a>(c: &'a Cluster, name: &str) -> (TestNs<'a>, Vec<k8s::Pod>, String) {
    let ns = c.namespace(name);
    let (pods, took) = ns.pods(&[("a", "node1", IDLE), ("b", "node2", SERVER)]);
    figure(&format!("{name}: 2 pods Ready (weft CNI)"), secs(took));
    let sum = ns.sh("b", "cat /www/sum");
    (ns, pods, sum)
}

/// The link `dev` on `node`, with details (`ip -d link show`).
fn link(c: &Cluster, node: &str, dev: &str) -> String {
    c.node(node)
        .sh(&format!("ip -d link show {dev} 2>&1 || true"))
}

/// weftd on `node` runs without privileged mode: NET_ADMIN but not
/// SYS_ADMIN in its effective capabilities, and a device cgroup that allows
/// the TUN device (`c 10:200`) but not every device (`a *:* rwm`, what
/// privileged containers get). Returns the capability names.
fn weftd_unprivileged(c: &Cluster, node: &str) -> String {
    const NAMES: [&str; 41] = [
        "CHOWN",
        "DAC_OVERRIDE",
        "DAC_READ_SEARCH",
        "FOWNER",
        "FSETID",
        "KILL",
        "SETGID",
        "SETUID",
        "SETPCAP",
        "LINUX_IMMUTABLE",
        "NET_BIND_SERVICE",
        "NET_BROADCAST",
        "NET_ADMIN",
        "NET_RAW",
        "IPC_LOCK",
        "IPC_OWNER",
        "SYS_MODULE",
        "SYS_RAWIO",
        "SYS_CHROOT",
        "SYS_PTRACE",
        "SYS_PACCT",
        "SYS_ADMIN",
        "SYS_BOOT",
        "SYS_NICE",
        "SYS_RESOURCE",
        "SYS_TIME",
        "SYS_TTY_CONFIG",
        "MKNOD",
        "LEASE",
        "AUDIT_WRITE",
        "AUDIT_CONTROL",
        "SETFCAP",
        "MAC_OVERRIDE",
        "MAC_ADMIN",
        "SYSLOG",
        "WAKE_ALARM",
        "BLOCK_SUSPEND",
        "AUDIT_READ",
        "PERFMON",
        "BPF",
        "CHECKPOINT_RESTORE",
    ];
    let pid = weftd_pid(c, node);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|h| u64::from_str_radix(h.trim(), 16).ok())
        .expect("CapEff");
    let caps: Vec<&str> = (0..NAMES.len())
        .filter(|b| eff & (1 << b) != 0)
        .map(|b| NAMES[b])
        .collect();
    assert!(
        caps.contains(&"NET_ADMIN"),
        "{node}: weftd lacks NET_ADMIN: {caps:?}"
    );
    assert!(
        !caps.contains(&"SYS_ADMIN"),
        "{node}: weftd runs privileged: {caps:?}"
    );
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).expect("cgroup");
    let devices = cgroup
        .lines()
        .find_map(|l| l.split_once(":devices:").map(|(_, p)| p.to_string()))
        .expect("devices cgroup");
    let list = std::fs::read_to_string(format!("/sys/fs/cgroup/devices{devices}/devices.list"))
        .expect("devices.list");
    assert!(
        list.lines().any(|l| l == "c 10:200 rwm"),
        "{node}: weftd's device cgroup does not allow /dev/net/tun:\n{list}"
    );
    assert!(
        !list.lines().any(|l| l == "a *:* rwm"),
        "{node}: weftd's device cgroup allows every device (privileged):\n{list}"
    );
    caps.join(",")
}

fn backend_case(c: &mut SharedCluster, backend: &str, dataplane: &str, dev: &str, kind: &str) {
    let t0 = Instant::now();
    let tag = if dataplane.is_empty() {
        backend.to_string()
    } else {
        format!("{backend}-{dataplane}")
    };
    let t = Instant::now();
    if c.ensure_weft(&net_conf(backend), dataplane) {
        figure(
            &format!("{tag}: DaemonSet rolled to the backend"),
            secs(t.elapsed()),
        );
    }
    for n in ["node1", "node2"] {
        let node = c.json(&["get", "node", n]);
        // flannel's udp backend leaves BackendType empty in its lease (and so
        // in the annotation); weft publishes the same attributes.
        let want = if backend == "udp" { "" } else { backend };
        assert_eq!(
            node["metadata"]["annotations"]["flannel.alpha.coreos.com/backend-type"], want,
            "{n}'s backend-type annotation"
        );
        let l = link(c, n, dev);
        assert!(
            l.contains(kind),
            "{n}: {dev} should be a {kind} device for {tag}:\n{l}\n{}",
            c.weft_logs(20)
        );
    }
    if kind == "tun" {
        let caps = weftd_unprivileged(c, "node1");
        figure(
            &format!("{tag}: weftd's capabilities on its TUN device (not privileged)"),
            caps,
        );
    }
    let (ns, pods, sum) = two_pods(c, &format!("t-{tag}"));
    let (a, b) = (&pods[0], &pods[1]);
    let first = ns.wait_ping("a", &b.ip, Duration::from_secs(30));
    figure(
        &format!("{tag}: first pod-to-pod ping after the pods are Ready"),
        secs(first),
    );
    assert!(
        ns.ping("b", &a.ip),
        "{tag}: node2's pod cannot ping node1's pod"
    );
    fetch_big(&ns, "a", &b.ip, 8080, &sum);
    drop(ns);
    figure(&format!("{tag}: test wall time"), secs(t0.elapsed()));
}

/// The DaemonSet from deploy/kube-flannel.yml runs weft on every node:
/// pods Running (not privileged), nodes Ready, NetworkUnavailable cleared by
/// weft, flannel's annotations on every node, subnet.env from the podCIDR.
#[test]
fn weft_daemonset_runs_on_every_node() {
    let mut c = cluster!();
    let t0 = Instant::now();
    c.ensure_weft(&net_conf("vxlan"), "");
    let pods = c.weft_pods();
    let mut on: Vec<&str> = pods.iter().map(|(_, n)| n.as_str()).collect();
    on.sort_unstable();
    assert_eq!(on, ["node1", "node2"], "one weft pod per node: {pods:?}");
    for (pod, _) in &pods {
        let p = c.json(&["-n", WEFT_NS, "get", "pod", pod]);
        assert_eq!(p["status"]["phase"], "Running", "{pod}");
        assert_eq!(condition(&p, "Ready"), Some("True"), "{pod}");
        let sc = &p["spec"]["containers"][0]["securityContext"];
        assert_eq!(sc["privileged"], false, "{pod} runs unprivileged");
    }
    for node in &c.nodes {
        let n = c.json(&["get", "node", &node.name]);
        assert_eq!(condition(&n, "Ready"), Some("True"), "{} Ready", node.name);
        let nu = n["status"]["conditions"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["type"] == "NetworkUnavailable"))
            .cloned()
            .unwrap_or_default();
        assert_eq!(nu["status"], "False", "{}: {nu}", node.name);
        assert_eq!(nu["reason"], "FlannelIsUp", "{}: {nu}", node.name);
        let ann = &n["metadata"]["annotations"];
        let key = |k: &str| ann[format!("flannel.alpha.coreos.com/{k}")].clone();
        assert_eq!(key("kube-subnet-manager"), "true", "{}", node.name);
        assert_eq!(key("backend-type"), "vxlan", "{}", node.name);
        assert_eq!(key("public-ip"), node.ip.as_str(), "{}", node.name);
        let data: serde_json::Value =
            serde_json::from_str(key("backend-data").as_str().unwrap_or("null"))
                .expect("backend-data");
        assert_eq!(data["VNI"], 1, "{}: {data}", node.name);
        assert!(data["VtepMAC"].is_string(), "{}: {data}", node.name);
        let cidr = n["spec"]["podCIDR"].as_str().expect("podCIDR");
        let env = node.sh("cat /run/flannel/subnet.env");
        let gw = cidr.replace(".0/24", ".1/24");
        assert!(
            env.contains(&format!("FLANNEL_SUBNET={gw}"))
                && env.contains("FLANNEL_NETWORK=10.244.0.0/16"),
            "{}: subnet.env for podCIDR {cidr}:\n{env}",
            node.name
        );
        // The CNI plugin and its config, installed by the init containers.
        node.sh("test -x /opt/cni/bin/flannel && test -f /etc/cni/net.d/10-flannel.conflist");
        let pids = node.pids_named("flanneld");
        assert_eq!(pids.len(), 1, "{}: one weftd: {pids:?}", node.name);
        if let Some(rss) = k8s::rss_kib(pids[0]) {
            figure(
                &format!("weftd RSS in the pod on {}", node.name),
                format!("{:.1} MiB", rss as f64 / 1024.0),
            );
        }
    }
    figure(
        "weft_daemonset_runs_on_every_node: wall time",
        secs(t0.elapsed()),
    );
}

/// Pods on different nodes over flannel's VXLAN, in the kernel (what
/// weftd's `auto` picks on this kernel; forced here).
#[test]
fn pods_reach_each_other_kernel_vxlan() {
    let mut c = cluster!();
    backend_case(&mut c, "vxlan", "kernel", "flannel.1", "vxlan");
}

/// The same VXLAN wire format through weft's userspace engine (TUN).
#[test]
fn pods_reach_each_other_userspace_vxlan() {
    let mut c = cluster!();
    backend_case(&mut c, "vxlan", "userspace", "flannel.1", "tun");
}

/// flannel's UDP backend (TUN flannel0, port 8285).
#[test]
fn pods_reach_each_other_udp() {
    let mut c = cluster!();
    backend_case(&mut c, "udp", "", "flannel0", "tun");
}

/// WireGuard: this kernel has no WireGuard module, so weftd's engine runs it
/// in userspace (boringtun) on a TUN device.
#[test]
fn pods_reach_each_other_wireguard() {
    let mut c = cluster!();
    backend_case(&mut c, "wireguard", "", "flannel-wg", "tun");
}

/// A ClusterIP Service backed by a pod on node2, reached from a pod on node1
/// through kube-proxy's iptables rules and weft's overlay.
#[test]
fn cluster_ip_service_reaches_a_pod_on_another_node() {
    let mut c = cluster!();
    let t0 = Instant::now();
    c.ensure_weft(&net_conf("vxlan"), "");
    let (ns, _pods, sum) = two_pods(&c, "t-service");
    c.apply(&format!(
        "apiVersion: v1\nkind: Service\nmetadata: {{name: web, namespace: {}}}\n\
         spec:\n  selector: {{app: b}}\n  ports:\n  - {{port: 80, targetPort: 8080, protocol: TCP}}\n",
        ns.name
    ));
    let svc = c.json(&["-n", &ns.name, "get", "service", "web"]);
    let ip = svc["spec"]["clusterIP"]
        .as_str()
        .expect("clusterIP")
        .to_string();
    assert!(
        ip.starts_with("10.9") || ip.starts_with("10.1"),
        "a ClusterIP in 10.96.0.0/12: {ip}"
    );
    let t = Instant::now();
    k8s::poll(
        "the Service answering through kube-proxy",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || {
            let out = ns.exec(
                "a",
                &[
                    "sh",
                    "-c",
                    &format!("printf 'GET /index.html HTTP/1.0\\r\\n\\r\\n' | nc -w 2 {ip} 80"),
                ],
            );
            String::from_utf8_lossy(&out.stdout)
                .contains("hi-from-b")
                .then_some(())
        },
        || {
            c.node("node1")
                .sh("iptables-save -t nat | grep -i web || true")
        },
    );
    figure(
        "service: first answer through the ClusterIP",
        secs(t.elapsed()),
    );
    fetch_big(&ns, "a", &ip, 80, &sum);
    drop(ns);
    figure(
        "cluster_ip_service_reaches_a_pod_on_another_node: wall time",
        secs(t0.elapsed()),
    );
}

/// The pid of weftd on `node`.
fn weftd_pid(c: &Cluster, node: &str) -> i32 {
    let p = c.node(node).pids_named("flanneld");
    assert_eq!(p.len(), 1, "{node}: one weftd: {p:?}");
    p[0]
}

/// `ping -i 0.2` from pod `a` to an address, running in the pod's
/// background until [`PingStream::stop`].
struct PingStream<'a, 'c> {
    ns: &'a TestNs<'c>,
}

impl<'a, 'c> PingStream<'a, 'c> {
    fn start(ns: &'a TestNs<'c>, ip: &str) -> Self {
        ns.sh(
            "a",
            &format!("ping -i 0.2 -W 1 {ip} > /tmp/ping.out 2>&1 & echo $! > /tmp/ping.pid"),
        );
        PingStream { ns }
    }

    /// Stops the stream; returns (longest interruption, replies, sent).
    fn stop(self) -> (Duration, u64, u64) {
        let out = self.ns.sh(
            "a",
            "kill -INT $(cat /tmp/ping.pid); sleep 0.5; cat /tmp/ping.out",
        );
        let sent = out
            .lines()
            .find(|l| l.contains("packets transmitted"))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or_else(|| panic!("no ping statistics:\n{out}"));
        let replies = out.lines().filter(|l| l.contains("seq=")).count() as u64;
        let gap = k8s::longest_ping_gap(&out, sent);
        (Duration::from_millis(gap * 200), replies, sent)
    }
}

/// weft's share of a userspace node's outage in a rolling update, summed
/// over both nodes: pings lost while a weftd ran (the old one stopping its
/// engine, the new one starting it). SIGKILLed weftd is forwarding again
/// within 1.4-2.4 s of the kill, kubelet's restart included
/// ([`SIGKILL_GAP`]), so each node's own share is well under 1 s; 5 s for
/// two nodes fails a weftd that waits for anything at start or stop
/// (a lease, a lock, a timeout) while the pod is replaced.
const USERSPACE_RESTART_SHARE: Duration = Duration::from_secs(5);

/// Watches weftd (comm `flanneld`) on every node while the DaemonSet rolls:
/// for each node, how long no weftd ran between the old one's exit and the
/// new one's start. That window is Kubernetes' share of an interruption
/// (the DaemonSet controller, the scheduler, kubelet's sandbox and the two
/// init containers); weft's share is what the engine loses around it (the
/// old weftd stopping, the new one bringing its engine up).
struct WeftdWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: std::thread::JoinHandle<Vec<(String, Option<Duration>)>>,
}

impl WeftdWatch {
    fn start(c: &Cluster) -> Self {
        use std::sync::atomic::Ordering;
        let nodes: Vec<(String, String, Vec<i32>)> = c
            .nodes
            .iter()
            .map(|n| {
                let pids = n.pids_named("flanneld");
                assert!(!pids.is_empty(), "{}: weftd runs before the update", n.name);
                (n.name.clone(), n.ns.name().to_string(), pids)
            })
            .collect();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut seen: Vec<(Option<Instant>, Option<Instant>)> = vec![(None, None); nodes.len()];
            while !flag.load(Ordering::Relaxed) {
                for ((_, ns, old), (gone, back)) in nodes.iter().zip(seen.iter_mut()) {
                    let now = Instant::now();
                    let pids = k8s::node::netns_pids_named(ns, "flanneld");
                    if gone.is_none() && !pids.iter().any(|p| old.contains(p)) {
                        *gone = Some(now);
                    }
                    if gone.is_some() && back.is_none() && pids.iter().any(|p| !old.contains(p)) {
                        *back = Some(now);
                    }
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            nodes
                .into_iter()
                .zip(seen)
                .map(|((name, _, _), w)| (name, w.0.zip(w.1).map(|(g, b)| b - g)))
                .collect()
        });
        WeftdWatch { stop, handle }
    }

    /// Per node, the time no weftd ran (None: it was not replaced).
    fn stop(self) -> Vec<(String, Option<Duration>)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().expect("weftd watch thread")
    }
}

/// The longest pod-to-pod interruption (a ping every 0.2 s: missing replies
/// × 0.2 s) that SIGKILLing weftd in its pod may cause on the userspace
/// dataplane, kubelet's restart of the container included. Measured on this
/// 2-vCPU machine on 2026-12-03 (load average 4-8): 1.4, 2.4 and 1.4 s, the
/// container running again 1.6-2.8 s after the kill (kubelet's 1 s relist
/// and the start of the container; 0.4 s in a run of 2026-12-01). The bound
/// is twice the worst: kubelet's crash-loop back-off (10 s) or a weftd that
/// takes seconds to bring its engine back fails it.
const SIGKILL_GAP: Duration = Duration::from_secs(5);

/// weftd SIGKILLed inside its pod: kubelet restarts the container, the node
/// keeps its subnet, and pod-to-pod traffic resumes within [`SIGKILL_GAP`];
/// then the whole weft pod deleted: the DaemonSet replaces it, same subnet,
/// traffic resumes.
#[test]
fn killed_weftd_is_restarted_and_traffic_resumes() {
    let mut c = cluster!();
    let t0 = Instant::now();
    c.ensure_weft(&net_conf("vxlan"), "userspace");
    let (ns, pods, _sum) = two_pods(&c, "t-restart");
    let b = pods[1].ip.clone();
    ns.wait_ping("a", &b, Duration::from_secs(30));
    let cidr = |c: &Cluster| c.json(&["get", "node", "node2"])["spec"]["podCIDR"].clone();
    let before = cidr(&c);
    let env_before = c.node("node2").sh("cat /run/flannel/subnet.env");
    let pod_on = |c: &Cluster, node: &str| {
        c.weft_pods()
            .into_iter()
            .find(|(_, n)| n == node)
            .map(|(p, _)| p)
            .expect("weft pod")
    };
    let restarts = |c: &Cluster| {
        let p = c.json(&["-n", WEFT_NS, "get", "pod", &pod_on(c, "node2")]);
        p["status"]["containerStatuses"][0]["restartCount"]
            .as_u64()
            .unwrap_or(0)
    };
    let r0 = restarts(&c);

    // 1. SIGKILL weftd (the userspace dataplane dies with it).
    let stream = PingStream::start(&ns, &b);
    std::thread::sleep(Duration::from_secs(2));
    let pid = weftd_pid(&c, "node2");
    let t = Instant::now();
    // SAFETY: kill(2) on weftd's pid, found in node2's network namespace.
    unsafe { libc::kill(pid, libc::SIGKILL) };
    k8s::poll(
        "kubelet restarting weftd",
        Duration::from_secs(90),
        Duration::from_millis(200),
        || (restarts(&c) > r0 && c.node("node2").pids_named("flanneld").len() == 1).then_some(()),
        || c.weft_logs(20),
    );
    figure(
        "SIGKILLed weftd running again (kubelet restart)",
        secs(t.elapsed()),
    );
    ns.wait_ping("a", &b, Duration::from_secs(60));
    figure(
        "SIGKILLed weftd: pod-to-pod ping again after the kill",
        secs(t.elapsed()),
    );
    std::thread::sleep(Duration::from_secs(2));
    let (gap, replies, sent) = stream.stop();
    figure(
        "SIGKILLed weftd: longest pod-to-pod interruption (ping every 0.2 s)",
        format!("{} ({replies}/{sent} replies)", secs(gap)),
    );
    assert!(
        gap < SIGKILL_GAP,
        "SIGKILLed weftd interrupted pod-to-pod traffic for {gap:?} (bound {SIGKILL_GAP:?})"
    );
    assert_eq!(cidr(&c), before, "node2 keeps its podCIDR");
    assert_eq!(
        c.node("node2").sh("cat /run/flannel/subnet.env"),
        env_before,
        "node2 keeps its subnet.env"
    );

    // 2. The weft pod deleted: the DaemonSet makes a new one.
    let old = pod_on(&c, "node2");
    let stream = PingStream::start(&ns, &b);
    std::thread::sleep(Duration::from_secs(2));
    let t = Instant::now();
    c.kubectl(&["-n", WEFT_NS, "delete", "pod", &old, "--wait=false"]);
    k8s::poll(
        "a new weft pod Ready on node2",
        Duration::from_secs(90),
        Duration::from_millis(300),
        || {
            let p = c
                .weft_pods()
                .into_iter()
                .find(|(p, n)| n == "node2" && *p != old)?;
            let j = c.try_json(&["-n", WEFT_NS, "get", "pod", &p.0])?;
            (condition(&j, "Ready") == Some("True")).then_some(())
        },
        || c.weft_logs(20),
    );
    figure("deleted weft pod replaced and Ready", secs(t.elapsed()));
    ns.wait_ping("a", &b, Duration::from_secs(60));
    figure("deleted weft pod: pod-to-pod ping again", secs(t.elapsed()));
    std::thread::sleep(Duration::from_secs(2));
    let (gap, replies, sent) = stream.stop();
    figure(
        "deleted weft pod: longest pod-to-pod interruption (userspace dataplane, ping every 0.2 s)",
        format!("{} ({replies}/{sent} replies)", secs(gap)),
    );
    assert_eq!(cidr(&c), before, "node2 keeps its podCIDR");
    drop(ns);
    figure(
        "killed_weftd_is_restarted_and_traffic_resumes: wall time",
        secs(t0.elapsed()),
    );
}

/// A rolling update of the DaemonSet to a new image tag while pods ping each
/// other across nodes, one node at a time (the manifest's strategy), on the
/// kernel dataplane and then on the userspace one: the longest interruption
/// is measured for both and bounded. Kernel vxlan keeps forwarding while
/// weftd is replaced (the devices and routes stay: goal, no loss); the
/// userspace engine dies with its pod, so traffic through that node stops
/// until the new pod's engine runs (Kubernetes 1.20's DaemonSet has no
/// `maxSurge`: the new pod starts only after the old one is gone). That
/// outage has two shares, measured apart ([`WeftdWatch`]): Kubernetes'
/// (no weftd on the node: the old pod deleted, the new one scheduled, its
/// sandbox and init containers run) and weft's (the rest of the lost
/// pings: the old engine stopping, the new one coming up). weft's share is
/// bounded tightly; Kubernetes' only loosely, as it is the machine's speed.
#[test]
fn rolling_update_to_a_new_image_under_traffic() {
    let mut c = cluster!();
    let t0 = Instant::now();
    let tags = [
        k8s::WEFT_IMAGE.replace(":v0.1.0", ":v0.1.1-test"),
        k8s::WEFT_IMAGE.replace(":v0.1.0", ":v0.1.2-test"),
    ];
    for n in &c.nodes {
        for new in &tags {
            let _ = n.ctr(&["images", "rm", new]);
            n.ctr(&["images", "tag", k8s::WEFT_IMAGE, new]);
        }
    }
    // Kernel vxlan: no ping may be lost (under 0.2 s is no missing reply;
    // 255/255 on 2026-12-01, 187/187 on 2026-12-03; was a 1 s bound, which
    // let 4 pings go). Userspace: the old pod's engine goes before the new
    // pod starts (no maxSurge in 1.20): 7.0-8.2 s here (2026-12-01..06), but
    // 30.6 s in CI's run of 2026-12-05 (2 cores, 190 pings lost over both
    // nodes), where the old 20 s bound failed. Measured apart here on
    // 2026-12-06: 15.2 s lost over both nodes, 14.8 s of it with no weftd
    // on the node (7.9 and 6.9 s), weft's share 0.4 s. The whole outage is
    // bounded at 60 s (twice CI's), weft's share at USERSPACE_RESTART_SHARE.
    for (dataplane, new, bound) in [
        ("", &tags[0], Duration::from_millis(200)),
        ("userspace", &tags[1], Duration::from_secs(60)),
    ] {
        let what = if dataplane.is_empty() {
            "kernel vxlan"
        } else {
            "userspace vxlan"
        };
        c.ensure_weft(&net_conf("vxlan"), dataplane);
        let (ns, pods, _sum) = two_pods(&c, &format!("t-roll{}", dataplane.len()));
        let b = pods[1].ip.clone();
        ns.wait_ping("a", &b, Duration::from_secs(30));
        let stream = PingStream::start(&ns, &b);
        std::thread::sleep(Duration::from_secs(2));
        let t = Instant::now();
        let watch = WeftdWatch::start(&c);
        // The manifest's strategy: one node at a time.
        c.patch_weft_ds(
            r#"{"spec":{"updateStrategy":{"type":"RollingUpdate","rollingUpdate":{"maxUnavailable":1}}}}"#,
        );
        c.kubectl(&[
            "-n",
            WEFT_NS,
            "set",
            "image",
            &format!("ds/{WEFT_DS}"),
            &format!("kube-flannel={new}"),
            &format!("install-cni={new}"),
            &format!("install-cni-plugin={new}"),
        ]);
        c.wait_weft_rollout();
        figure(
            &format!("rolling update ({what}): DaemonSet rolled to the new tag"),
            secs(t.elapsed()),
        );
        let images: Vec<String> = c
            .weft_pods()
            .iter()
            .map(|(p, _)| {
                c.json(&["-n", WEFT_NS, "get", "pod", p])["spec"]["containers"][0]["image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_string()
            })
            .collect();
        assert!(
            images.iter().all(|i| i == new),
            "every weft pod runs {new}: {images:?}"
        );
        ns.wait_ping("a", &b, Duration::from_secs(30));
        std::thread::sleep(Duration::from_secs(2));
        let (gap, replies, sent) = stream.stop();
        let windows = watch.stop();
        figure(
            &format!("rolling update ({what}): longest pod-to-pod interruption (ping every 0.2 s)"),
            format!("{} ({replies}/{sent} replies)", secs(gap)),
        );
        let kube: Duration = windows.iter().filter_map(|(_, w)| *w).sum();
        let lost = Duration::from_millis(sent.saturating_sub(replies) * 200);
        let weft_share = lost.saturating_sub(kube);
        figure(
            &format!("rolling update ({what}): pings lost vs no weftd on a node"),
            format!(
                "{} lost, {} with no weftd ({windows:?}): weft's share {}",
                secs(lost),
                secs(kube),
                secs(weft_share)
            ),
        );
        assert!(
            windows.iter().all(|(_, w)| w.is_some()),
            "every node's weftd was replaced once: {windows:?}"
        );
        assert!(
            gap < bound,
            "the rolling update ({what}) interrupted pod-to-pod traffic for {gap:?} (bound {bound:?}); \
             {lost:?} lost, {kube:?} of it with no weftd on a node ({windows:?})"
        );
        if !dataplane.is_empty() {
            assert!(
                weft_share < USERSPACE_RESTART_SHARE,
                "weft's share of the rolling update's outage ({what}) is {weft_share:?} \
                 (bound {USERSPACE_RESTART_SHARE:?}): {lost:?} lost, {kube:?} with no weftd \
                 on a node ({windows:?})\n{}",
                c.weft_logs(30)
            );
        }
        drop(ns);
    }
    // The new tags hold the same image: the other tests run on it as they are.
    figure(
        "rolling_update_to_a_new_image_under_traffic: wall time",
        secs(t0.elapsed()),
    );
}

/// A third node joins: weft lands on it, it becomes Ready and its pods reach
/// the others; pods there with a bare bridge + host-local config (ahead of
/// weft's) are timed against weft's CNI plugin; then the node is drained
/// and deleted, and its subnet leaves the others: their routes, the leases
/// weftd knows, and the userspace engine's peer table (this test runs the
/// userspace dataplane; the kernel one's fdb and neighbour removal is
/// covered by tests/kernel_backends.rs and the guest tests).
#[test]
fn a_node_joins_and_leaves() {
    let mut c = cluster!();
    let t0 = Instant::now();
    c.ensure_weft(&net_conf("vxlan"), "userspace");
    let t = Instant::now();
    c.add_node();
    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| join_and_leave(&mut c, t)));
    c.remove_last_node();
    if let Err(e) = result {
        std::panic::resume_unwind(e);
    }
    figure("a_node_joins_and_leaves: wall time", secs(t0.elapsed()));
}

fn join_and_leave(c: &mut SharedCluster, t: Instant) {
    c.wait_weft_rollout();
    c.wait_nodes_ready();
    figure(
        "node3 joined: weft running and node Ready",
        secs(t.elapsed()),
    );
    let cidr3 = c.json(&["get", "node", "node3"])["spec"]["podCIDR"]
        .as_str()
        .expect("podCIDR")
        .to_string();
    let route = |c: &Cluster| c.node("node1").sh(&format!("ip route show {cidr3}"));
    k8s::poll(
        "node1's route to node3's subnet",
        Duration::from_secs(30),
        Duration::from_millis(200),
        || route(c).contains("flannel.1").then_some(()),
        || c.weft_logs(20),
    );
    {
        let ns = c.namespace("t-join");
        let (pods, took) = ns.pods(&[("a", "node1", IDLE), ("c", "node3", SERVER)]);
        figure(
            "node3: pods Ready with weft's CNI (one on node1, one on node3)",
            secs(took),
        );
        ns.wait_ping("a", &pods[1].ip, Duration::from_secs(30));
        // Pod readiness, weft's CNI plugin vs a bare bridge + host-local
        // config on node3 (00-bare sorts before weft's 10-flannel).
        let (_, weft) = ns.pods(&[
            ("w1", "node3", IDLE),
            ("w2", "node3", IDLE),
            ("w3", "node3", IDLE),
        ]);
        c.node("node3").sh(
            "cat > /etc/cni/net.d/00-bare.conflist <<'EOF'\n\
             {\"name\":\"bare\",\"cniVersion\":\"0.3.1\",\"plugins\":[{\"type\":\"bridge\",\"bridge\":\"bare0\",\
             \"isGateway\":true,\"ipMasq\":false,\"ipam\":{\"type\":\"host-local\",\"ranges\":[[{\"subnet\":\"10.250.3.0/24\"}]]}}]}\nEOF",
        );
        std::thread::sleep(Duration::from_secs(2));
        let (bare_pods, bare) = ns.pods(&[
            ("b1", "node3", IDLE),
            ("b2", "node3", IDLE),
            ("b3", "node3", IDLE),
        ]);
        assert!(
            bare_pods.iter().all(|p| p.ip.starts_with("10.250.3.")),
            "the bare config took the pods: {bare_pods:?}"
        );
        figure("3 pods Ready on one node: weft's CNI plugin", secs(weft));
        figure(
            "3 pods Ready on one node: bare bridge + host-local",
            secs(bare),
        );
        c.node("node3").sh("rm -f /etc/cni/net.d/00-bare.conflist");
    }
    // Before: node1's engine forwards to node2 and node3.
    k8s::poll(
        "node1's engine has node2 and node3 as peers",
        Duration::from_secs(10),
        Duration::from_millis(200),
        || (weft_status(c, "node1")["backend"]["devices"][0]["peers"] == 2).then_some(()),
        || format!("{:#}", weft_status(c, "node1")),
    );
    // Drain and delete node3.
    let t = Instant::now();
    c.kubectl(&[
        "drain",
        "node3",
        "--ignore-daemonsets",
        "--delete-emptydir-data",
        "--force",
        "--timeout=90s",
    ]);
    c.kubectl(&["delete", "node", "node3"]);
    let vtep = c
        .node("node1")
        .sh("ip neigh show dev flannel.1; bridge fdb show dev flannel.1");
    k8s::poll(
        "node3's subnet gone from node1 and node2",
        Duration::from_secs(60),
        Duration::from_millis(300),
        || {
            ["node1", "node2"]
                .iter()
                .all(|n| {
                    c.node(n)
                        .sh(&format!("ip route show {cidr3}"))
                        .trim()
                        .is_empty()
                })
                .then_some(())
        },
        || format!("{}\n{vtep}\n{}", route(c), c.weft_logs(20)),
    );
    figure(
        "node3 deleted: its route gone from the others",
        secs(t.elapsed()),
    );
    let ip3 = "192.0.2.13";
    for n in ["node1", "node2"] {
        let st = weft_status(c, n);
        let peers = st["peers"].as_array().expect("peers");
        assert!(
            peers.iter().all(|p| p["public_ip"] != ip3),
            "{n}: weftd still knows node3's lease: {st:#}"
        );
        let dev = &st["backend"]["devices"][0];
        assert_eq!(dev["kind"], "engine", "{n}: {st:#}");
        k8s::poll(
            &format!("{n}: node3 gone from the engine's peer table"),
            Duration::from_secs(10),
            Duration::from_millis(200),
            || (weft_status(c, n)["backend"]["devices"][0]["peers"] == 1).then_some(()),
            || format!("{:#}", weft_status(c, n)),
        );
    }
}

/// `weft status --json` of the weftd on `node` (its status socket is in the
/// node's /run/flannel, shared with the weft pod).
fn weft_status(c: &Cluster, node: &str) -> serde_json::Value {
    let weft = weft_tests::bins::path("weft");
    let out = c.node(node).sh(&format!(
        "{} status --json --subnet-file /run/flannel/subnet.env",
        weft.display()
    ));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{node}: weft status --json: {e}: {out}"))
}
