//! `lease_bench churn STORE N BACKEND DATAPLANE WEFTD IFACE RATE SECS`: does
//! weftd stay responsive under lease churn (issue 33)?
//!
//! In a namespace prepared by `benches/harness/scale.sh` (as `scale`): N
//! leases in the store, one weftd on it (`--lease-ttl=6`: a renewal due
//! every 3 s; `/healthz` on 127.0.0.1), and once the kernel holds its N
//! routes, RATE lease changes per second for SECS seconds: leases of a pool
//! of 1,024 other subnets (10.200.0.0/14, public IPs on-link) are added and
//! removed in turn, about 64 of them present at a time. Meanwhile:
//! - `weft status` over the socket every 100 ms (a raw client: the time to
//!   the whole answer, not a JSON parse of 5,000 peers on our side);
//! - `GET /healthz` every 50 ms;
//! - `ip monitor route`: each change's route appearing or going; event to
//!   route = from the start of the store write to the kernel's notification;
//! - weftd's log: the times of `Lease renewed` (the longest interval
//!   between two beyond the median is how late a renewal started).
//!
//! `CHURN_SWITCH_SECS=K` also asks weftd every K seconds to switch its
//! dataplane (`weft dataplane set`, userspace and kernel in turn: vxlan,
//! ipip, wireguard), the longest stall the old main loop had: the whole
//! switch, every peer replayed. `LEASE_BENCH_LOG=PATH` keeps weftd's log there.
//!
//! Prints one `churn` line: p50/p99/max of each, the changes superseded
//! before their route moved (a lease added and removed again while weftd
//! was busy: with the newest state winning, neither is programmed), those
//! whose route never came, and the load average. Only backends that give
//! each peer a route (host-gw, vxlan, ipip) can be measured.

use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use weft_control::lease::{LeaseAttrs, SubnetKey};
use weft_control::store::Registry;
use weft_control::store::embedded::EmbeddedStore;
use weft_control::store::etcd::{EtcdOptions, EtcdStore};

use super::scale::{LEASE_TTL_MS, Weftd, fill_embedded, fill_registry, leases};

/// The own lease's TTL: a renewal is due every TTL/2 = 3 s.
const OWN_TTL_SECS: u64 = 6;
/// Churned leases present at a time.
const PRESENT: usize = 64;
/// Give up waiting for the initial N routes, and for the last changes' routes.
const SETTLE: Duration = Duration::from_secs(120);
const TAIL: Duration = Duration::from_secs(10);

pub fn run(rt: &tokio::runtime::Runtime, args: &[String]) -> anyhow::Result<()> {
    let [store, n, backend, dataplane, weftd, iface, rate, secs] = args else {
        anyhow::bail!(
            "usage: lease_bench churn embedded|etcd N BACKEND auto|kernel|userspace WEFTD IFACE RATE SECS"
        );
    };
    let n: u32 = n.parse()?;
    let rate: u32 = rate.parse()?;
    let secs: u64 = secs.parse()?;
    anyhow::ensure!(n <= 50_000 && rate > 0, "N at most 50000, RATE > 0");
    let work = tempfile::tempdir()?;
    let net_conf = format!(r#"{{"Network":"10.0.0.0/8","Backend":{{"Type":"{backend}"}}}}"#);
    std::fs::write(work.path().join("net-conf.json"), &net_conf)?;
    let port = free_port()?;
    let subnet_file = work.path().join("subnet.env");
    let mut weftd_args = vec![
        format!(
            "--net-config-path={}",
            work.path().join("net-conf.json").display()
        ),
        format!("--subnet-file={}", subnet_file.display()),
        format!("--iface={iface}"),
        format!("--dataplane={dataplane}"),
        "--traffic-manager=none".into(),
        "--healthz-ip=127.0.0.1".into(),
        format!("--healthz-port={port}"),
        format!("--lease-ttl={OWN_TTL_SECS}"),
    ];
    let all = leases(n, backend)?;
    let plan = Plan {
        n,
        port,
        rate,
        secs,
        backend: backend.clone(),
    };
    let f = match store.as_str() {
        "embedded" => {
            let path = work.path().join("store");
            let reg = rt.block_on(EmbeddedStore::open(&path))?;
            rt.block_on(reg.put_network_config(&net_conf))?;
            fill_embedded(&path, &all)?;
            weftd_args.extend([
                "--store=embedded".into(),
                format!("--store-path={}", path.display()),
            ]);
            measure(rt, &reg, weftd, &weftd_args, work.path(), &plan)?
        }
        "etcd" => {
            anyhow::ensure!(
                weft_tests::etcd::available(),
                "no etcd binary (Debian etcd-server)"
            );
            let etcd = weft_tests::etcd::Etcd::start();
            let opts = EtcdOptions {
                endpoints: etcd.endpoint(),
                ..Default::default()
            };
            let reg = rt.block_on(EtcdStore::connect(&opts))?;
            rt.block_on(fill_registry(&reg, &net_conf, all))?;
            weftd_args.extend([
                "--store=etcd".into(),
                format!("--etcd-endpoints={}", etcd.endpoint()),
            ]);
            measure(rt, &reg, weftd, &weftd_args, work.path(), &plan)?
        }
        other => anyhow::bail!("unknown store {other}"),
    };
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let load: Vec<&str> = load.split_whitespace().take(3).collect();
    let switches = f
        .switches
        .as_ref()
        .map_or_else(String::new, |s| format!("\t{}", s.line("switch")));
    println!(
        "churn\t{store}\t{backend}\t{dataplane}\t{n}\trate={:.0}\t{}\t{}\t{}\troute_superseded={}\troute_missing={}\trenewals={}\trenew_late_max_ms={:.1}\tload={}{switches}",
        f.achieved_rate,
        f.status.line("status"),
        f.healthz.line("healthz"),
        f.route.line("route"),
        f.route_superseded,
        f.route_missing,
        f.renewals,
        f.renew_late_max.as_secs_f64() * 1e3,
        load.join(","),
    );
    Ok(())
}

/// Samples of one kind, with failures counted.
#[derive(Debug, Default)]
struct Samples {
    d: Vec<Duration>,
    failed: usize,
}

impl Samples {
    fn pct(&self, p: f64) -> f64 {
        let mut v = self.d.clone();
        v.sort();
        v.get(((v.len() as f64 - 1.0) * p).round() as usize)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1e3)
    }

    fn line(&self, name: &str) -> String {
        format!(
            "{name}_p50_ms={:.1}\t{name}_p99_ms={:.1}\t{name}_max_ms={:.1}\t{name}_n={}\t{name}_failed={}",
            self.pct(0.5),
            self.pct(0.99),
            self.pct(1.0),
            self.d.len(),
            self.failed
        )
    }
}

/// What one run does.
struct Plan {
    n: u32,
    port: u16,
    rate: u32,
    secs: u64,
    backend: String,
}

struct Figures {
    /// The dataplane switches' durations (`CHURN_SWITCH_SECS`).
    switches: Option<Samples>,
    status: Samples,
    healthz: Samples,
    route: Samples,
    route_superseded: usize,
    route_missing: usize,
    renewals: usize,
    renew_late_max: Duration,
    achieved_rate: f64,
}

fn measure<R: Registry>(
    rt: &tokio::runtime::Runtime,
    reg: &R,
    weftd: &str,
    weftd_args: &[String],
    work: &Path,
    plan: &Plan,
) -> anyhow::Result<Figures> {
    let &Plan {
        n,
        port,
        rate,
        secs,
        ..
    } = plan;
    let log_path = work.join("weftd.log");
    let log = std::fs::File::create(&log_path)?;
    let child = Command::new(weftd)
        .args(weftd_args)
        .env("WIREGUARD_KEY_FILE", work.join("wgkey"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let mut guard = Weftd(child);
    let t0 = Instant::now();
    while count_routes()? < n {
        anyhow::ensure!(
            t0.elapsed() < SETTLE,
            "weftd did not program {n} routes in {SETTLE:?}"
        );
        anyhow::ensure!(matches!(guard.0.try_wait(), Ok(None)), "weftd exited");
        std::thread::sleep(Duration::from_millis(200));
    }
    let monitor = Monitor::start()?;
    let stop = Arc::new(AtomicBool::new(false));
    let socket = weft_control::status::server::socket_path(&work.join("subnet.env"));
    let status = prober(&stop, Duration::from_millis(100), move || {
        status_once(&socket)
    });
    let healthz = prober(&stop, Duration::from_millis(50), move || healthz_once(port));
    let switches = std::env::var("CHURN_SWITCH_SECS")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .map(|every| {
            let socket = weft_control::status::server::socket_path(&work.join("subnet.env"));
            switcher(&stop, Duration::from_secs(every), socket)
        });

    // The churn: add and remove leases of the pool in turn.
    let pool: Vec<SubnetKey> = (0..1024u32)
        .map(|i| format!("10.{}.{}.0-24", 200 + i / 256, i % 256).parse())
        .collect::<Result<_, _>>()?;
    let attrs = |i: usize| LeaseAttrs {
        public_ip: Ipv4Addr::new(192, 0, 2, u8::try_from(2 + i % 253).unwrap_or(2)),
        backend_type: plan.backend.clone(),
        backend_data: backend_data(&plan.backend, i),
        ..Default::default()
    };
    let ttl = Some(Duration::from_millis(LEASE_TTL_MS));
    let mut present: VecDeque<usize> = VecDeque::new();
    let mut next = 0usize;
    let mut writes: Vec<(String, bool, Instant)> = Vec::new();
    let period = Duration::from_secs(1) / rate;
    let start = Instant::now();
    let mut i = 0u32;
    while start.elapsed() < Duration::from_secs(secs) {
        let due = start + period * i;
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let add = present.len() < PRESENT || i.is_multiple_of(2);
        let at = Instant::now();
        if add {
            let k = next % pool.len();
            next += 1;
            rt.block_on(reg.create_lease(&pool[k], &attrs(k), ttl))?;
            present.push_back(k);
            writes.push((net(&pool[k]), true, at));
        } else if let Some(k) = present.pop_front() {
            rt.block_on(reg.delete_lease(&pool[k]))?;
            writes.push((net(&pool[k]), false, at));
        }
        i += 1;
    }
    let achieved_rate = f64::from(i) / start.elapsed().as_secs_f64();
    // The last changes' routes: until no route moved for 2 s.
    let tail = Instant::now();
    while tail.elapsed() < TAIL && monitor.quiet_for() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Relaxed);
    let status = status
        .join()
        .map_err(|_| anyhow::anyhow!("status prober"))?;
    let healthz = healthz
        .join()
        .map_err(|_| anyhow::anyhow!("healthz prober"))?;
    let switches = match switches {
        Some(h) => Some(h.join().map_err(|_| anyhow::anyhow!("switcher"))?),
        None => None,
    };
    let alive = matches!(guard.0.try_wait(), Ok(None));
    guard.stop();
    if let Some(keep) = std::env::var_os("LEASE_BENCH_LOG") {
        std::fs::copy(&log_path, keep)?;
    }
    if !alive {
        let log = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = log.lines().rev().take(5).collect();
        anyhow::bail!(
            "weftd exited during the churn; its last lines, newest first:\n{}",
            tail.join("\n")
        );
    }
    let (route, route_superseded, route_missing) = monitor.match_writes(&writes);
    let (renewals, renew_late_max) = renewals(&std::fs::read_to_string(&log_path)?);
    Ok(Figures {
        switches,
        status,
        healthz,
        route,
        route_superseded,
        route_missing,
        renewals,
        renew_late_max,
        achieved_rate,
    })
}

/// vxlan's BackendData for churned lease `i` (VNI 1, a MAC of its own).
fn backend_data(backend: &str, i: usize) -> Option<String> {
    (backend == "vxlan").then(|| {
        format!(
            r#"{{"VNI":1,"VtepMAC":"02:01:{:02x}:{:02x}:{:02x}:01"}}"#,
            (i >> 16) & 255,
            (i >> 8) & 255,
            i & 255
        )
    })
}

/// `10.200.3.0/24` for key `10.200.3.0-24`.
fn net(k: &SubnetKey) -> String {
    k.v4.map(|n| n.to_string()).unwrap_or_default()
}

/// Routes through a gateway under 10.0.0.0/8 (one per peer on host-gw and
/// kernel vxlan).
fn count_routes() -> anyhow::Result<u32> {
    let out = Command::new("ip")
        .args(["-4", "route", "show", "root", "10.0.0.0/8"])
        .output()?;
    Ok(u32::try_from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(" via "))
            .count(),
    )?)
}

fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Calls `once` every `every` until `stop`, timing each call.
fn prober(
    stop: &Arc<AtomicBool>,
    every: Duration,
    once: impl Fn() -> bool + Send + 'static,
) -> std::thread::JoinHandle<Samples> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let mut s = Samples::default();
        while !stop.load(Ordering::Relaxed) {
            let t = Instant::now();
            let ok = once();
            s.d.push(t.elapsed());
            if !ok {
                s.failed += 1;
            }
            std::thread::sleep(every);
        }
        s
    })
}

/// Every `every`, asks weftd to switch its dataplane (userspace and kernel
/// in turn), timing each switch to its reply.
fn switcher(
    stop: &Arc<AtomicBool>,
    every: Duration,
    socket: std::path::PathBuf,
) -> std::thread::JoinHandle<Samples> {
    let stop = stop.clone();
    std::thread::spawn(move || {
        let mut s = Samples::default();
        let mut last = Instant::now();
        let mut to = "userspace";
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(100));
            if last.elapsed() < every {
                continue;
            }
            let t = Instant::now();
            let r = weft_control::status::server::call(
                &socket,
                &serde_json::json!({"op": "dataplane", "set": to}),
                Duration::from_secs(120),
            );
            s.d.push(t.elapsed());
            if let Err(e) = r {
                eprintln!("switch to {to}: {e}");
                s.failed += 1;
            }
            to = if to == "kernel" {
                "userspace"
            } else {
                "kernel"
            };
            last = Instant::now();
        }
        s
    })
}

/// One `{"op":"status"}` over the socket, read to the end; whether it was a status.
fn status_once(socket: &Path) -> bool {
    let Ok(mut s) = std::os::unix::net::UnixStream::connect(socket) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(30)));
    if s.write_all(b"{\"op\":\"status\"}\n").is_err() {
        return false;
    }
    let mut out = Vec::new();
    s.read_to_end(&mut out).is_ok() && out.starts_with(b"{\"version\"")
}

/// One `GET /healthz`; whether it said 200.
fn healthz_once(port: u16) -> bool {
    let Ok(mut c) = std::net::TcpStream::connect(("127.0.0.1", port)) else {
        return false;
    };
    let _ = c.set_read_timeout(Some(Duration::from_secs(30)));
    if c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .is_err()
    {
        return false;
    }
    let mut out = Vec::new();
    c.read_to_end(&mut out).is_ok() && out.starts_with(b"HTTP/1.1 200")
}

/// `ip monitor route`, each line's route and when it arrived.
struct Monitor {
    child: std::process::Child,
    seen: Arc<Mutex<Vec<(String, bool, Instant)>>>,
}

impl Monitor {
    fn start() -> anyhow::Result<Monitor> {
        let mut child = Command::new("ip")
            .args(["-4", "monitor", "route"])
            .stdout(Stdio::piped())
            .spawn()?;
        let out = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?;
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let at = Instant::now();
                let (gone, rest) = match line.strip_prefix("Deleted ") {
                    Some(r) => (true, r),
                    None => (false, line.as_str()),
                };
                let dst = rest.split_whitespace().next().unwrap_or_default();
                if dst.starts_with("10.20") {
                    s.lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .push((dst.to_string(), !gone, at));
                }
            }
        });
        // `ip monitor` subscribes before its first read; give it a moment.
        std::thread::sleep(Duration::from_millis(200));
        Ok(Monitor { child, seen })
    }

    /// How long since the last route of a churned subnet moved.
    fn quiet_for(&self) -> Duration {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner());
        seen.last().map_or(Duration::MAX, |(_, _, at)| at.elapsed())
    }

    /// Each write's latency to the first matching route event after it and
    /// before the subnet's next write; the writes superseded before any
    /// event (a lease added and removed while weftd was busy: the newest
    /// state wins, neither is programmed), and those no event matched.
    fn match_writes(self, writes: &[(String, bool, Instant)]) -> (Samples, usize, usize) {
        let seen = self.seen.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let mut by: BTreeMap<(String, bool), VecDeque<Instant>> = BTreeMap::new();
        for (dst, add, at) in seen {
            by.entry((dst, add)).or_default().push_back(at);
        }
        // Each write's window ends at the same subnet's next write.
        let mut until = vec![None; writes.len()];
        let mut last: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, (dst, _, at)) in writes.iter().enumerate() {
            if let Some(j) = last.insert(dst.as_str(), i) {
                until[j] = Some(*at);
            }
        }
        let mut s = Samples::default();
        let (mut superseded, mut missing) = (0, 0);
        for ((dst, add, at), until) in writes.iter().zip(until) {
            let q = by.entry((dst.clone(), *add)).or_default();
            while q.front().is_some_and(|t| t < at) {
                q.pop_front();
            }
            match q.front().copied().filter(|t| until.is_none_or(|u| *t < u)) {
                Some(t) => {
                    q.pop_front();
                    s.d.push(t - *at);
                }
                None if until.is_some() => superseded += 1,
                None => {
                    if missing < 5 {
                        eprintln!(
                            "no route event for {} {dst}",
                            if *add { "adding" } else { "removing" }
                        );
                    }
                    missing += 1;
                }
            }
        }
        (s, superseded, missing)
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The renewals in weftd's log, and how much longer than the run's median
/// interval the longest interval between two was: a loop that was busy when
/// one came due shows as a longer interval. (Not the interval less TTL/2:
/// etcd reports a lease's remaining TTL in whole seconds, so weftd renews
/// up to a second early, every 2-3 s at a TTL of 6 s.)
fn renewals(log: &str) -> (usize, Duration) {
    let times: Vec<f64> = log
        .lines()
        .filter(|l| l.contains("Lease renewed"))
        .filter_map(seconds_of_day)
        .collect();
    let mut gaps: Vec<f64> = times.windows(2).map(|w| w[1] - w[0]).collect();
    gaps.sort_by(f64::total_cmp);
    let late = match (gaps.get(gaps.len() / 2), gaps.last()) {
        (Some(median), Some(max)) => (max - median).max(0.0),
        _ => 0.0,
    };
    (times.len(), Duration::from_secs_f64(late))
}

/// The time of day of a log line's RFC 3339 timestamp, in seconds.
fn seconds_of_day(line: &str) -> Option<f64> {
    let t = line.split_whitespace().next()?;
    let (_, time) = t.split_once('T')?;
    let time = time.trim_end_matches('Z');
    let mut parts = time.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}
