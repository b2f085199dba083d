//! `lease_bench scale STORE N BACKEND DATAPLANE WEFTD IFACE`: the control-plane
//! scale benchmark (see the module docs of `lease_bench`).
//!
//! Runs inside a network namespace prepared by `benches/harness/scale.sh`:
//! `IFACE` has 192.0.2.1/24, and the N fake peers have public IPs
//! 192.0.2.2-254 (on-link, so that host-gw routes through them are valid; a
//! public IP is shared by several leases, which no backend minds). Leases are
//! `10.<1 + i/256>.<i%256>.0/24` in Network 10.0.0.0/8; etcd (when asked) is
//! started on the namespace's loopback.

use std::io::{Read, Seek, SeekFrom};
use std::net::Ipv4Addr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use weft_control::lease::{LeaseAttrs, SubnetKey};
use weft_control::store::Registry;
use weft_control::store::embedded::EmbeddedStore;
use weft_control::store::embedded::file::{self, Entry, Paths};
use weft_control::store::etcd::{EtcdOptions, EtcdStore};

/// Give up waiting for weftd after this long.
const TIMEOUT: Duration = Duration::from_secs(120);
/// Targets from issue 9.
const TARGET_SECS: f64 = 2.0;
const TARGET_MIB: f64 = 64.0;
/// TTL of the fake leases (an hour: none expires during a run).
pub(super) const LEASE_TTL_MS: u64 = 3_600_000;

/// What one run measured.
struct Figures {
    fill: Duration,
    lease: Option<Duration>,
    first_peer: Option<Duration>,
    peers: Duration,
    routes: Option<Duration>,
    hwm_kib: u64,
}

pub fn run(rt: &tokio::runtime::Runtime, args: &[String]) -> anyhow::Result<()> {
    let [store, n, backend, dataplane, weftd, iface] = args else {
        anyhow::bail!(
            "usage: lease_bench scale embedded|etcd N BACKEND auto|kernel|userspace WEFTD IFACE"
        );
    };
    let n: u32 = n.parse()?;
    anyhow::ensure!(
        n <= 60_000,
        "at most 60000 leases fit in 10.1.0.0-10.255.255.0"
    );
    let work = tempfile::tempdir()?;
    let net_conf = format!(r#"{{"Network":"10.0.0.0/8","Backend":{{"Type":"{backend}"}}}}"#);
    std::fs::write(work.path().join("net-conf.json"), &net_conf)?;
    let mut weftd_args = vec![
        format!(
            "--net-config-path={}",
            work.path().join("net-conf.json").display()
        ),
        format!("--subnet-file={}", work.path().join("subnet.env").display()),
        format!("--iface={iface}"),
        format!("--dataplane={dataplane}"),
        "--traffic-manager=none".into(),
    ];
    let f = match store.as_str() {
        "embedded" => {
            let path = work.path().join("store");
            let reg = rt.block_on(EmbeddedStore::open(&path))?;
            rt.block_on(reg.put_network_config(&net_conf))?;
            weftd_args.extend([
                "--store=embedded".into(),
                format!("--store-path={}", path.display()),
            ]);
            // One generation with every lease (as if written long before), not N rewrites of the file.
            let fill = || fill_embedded(&path, &leases(n, backend)?);
            measure(
                fill,
                weftd,
                &weftd_args,
                n,
                backend == "host-gw",
                work.path(),
            )?
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
            weftd_args.extend([
                "--store=etcd".into(),
                format!("--etcd-endpoints={}", etcd.endpoint()),
            ]);
            let fill = || rt.block_on(fill_registry(&reg, &net_conf, leases(n, backend)?));
            measure(
                fill,
                weftd,
                &weftd_args,
                n,
                backend == "host-gw",
                work.path(),
            )?
        }
        other => anyhow::bail!("unknown store {other}"),
    };
    report(store, n, backend, dataplane, &f);
    Ok(())
}

fn report(store: &str, n: u32, backend: &str, dataplane: &str, f: &Figures) {
    let secs = f.routes.unwrap_or(f.peers).max(f.peers).as_secs_f64();
    let mib = f.hwm_kib as f64 / 1024.0;
    let ok = secs <= TARGET_SECS && mib <= TARGET_MIB;
    let opt =
        |d: Option<Duration>| d.map_or("-".to_string(), |d| format!("{:.3}", d.as_secs_f64()));
    println!(
        "scale\t{store}\t{backend}\t{dataplane}\t{n}\tfill_s={:.2}\tlease_s={}\tfirst_peer_s={}\tpeers_s={:.3}\troutes_s={}\tdone_s={secs:.3}\tvmhwm_mib={mib:.1}\t{}",
        f.fill.as_secs_f64(),
        opt(f.lease),
        opt(f.first_peer),
        f.peers.as_secs_f64(),
        opt(f.routes),
        if ok { "PASS" } else { "FAIL" },
    );
}

fn measure(
    fill: impl FnOnce() -> anyhow::Result<()>,
    weftd: &str,
    weftd_args: &[String],
    n: u32,
    routes: bool,
    work: &Path,
) -> anyhow::Result<Figures> {
    let t_fill = Instant::now();
    fill()?;
    let fill = t_fill.elapsed();
    let log_path = work.join("weftd.log");
    let log = std::fs::File::create(&log_path)?;
    let t0 = Instant::now();
    let child = Command::new(weftd)
        .args(weftd_args)
        .env("WIREGUARD_KEY_FILE", work.join("wgkey"))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .spawn()?;
    let mut guard = Weftd(child);
    let res = wait(&mut guard, t0, n, routes, work, &log_path);
    let hwm_kib = vm_hwm(guard.0.id());
    guard.stop();
    let (lease, first_peer, peers, routes) = res.map_err(|e| {
        let tail = std::fs::read_to_string(&log_path).unwrap_or_default();
        let tail: Vec<&str> = tail.lines().rev().take(15).collect();
        anyhow::anyhow!(
            "{e}; weftd log (last lines, newest first):\n{}",
            tail.join("\n")
        )
    })?;
    Ok(Figures {
        fill,
        lease,
        first_peer,
        peers,
        routes,
        hwm_kib: hwm_kib.unwrap_or(0),
    })
}

/// The `n` peer leases: `10.<1 + i/256>.<i%256>.0/24`, public IPs 192.0.2.2-254.
pub(super) fn leases(n: u32, backend: &str) -> anyhow::Result<Vec<(SubnetKey, LeaseAttrs)>> {
    (0..n)
        .map(|i| {
            let key: SubnetKey = format!("10.{}.{}.0-24", 1 + i / 256, i % 256).parse()?;
            let public_ip = Ipv4Addr::new(192, 0, 2, u8::try_from(2 + i % 253)?);
            let backend_data = match backend {
                "vxlan" => Some(format!(
                    r#"{{"VNI":1,"VtepMAC":"02:00:{:02x}:{:02x}:{:02x}:01"}}"#,
                    i >> 16,
                    (i >> 8) & 255,
                    i & 255
                )),
                _ => None,
            };
            // flannel writes an empty type for udp.
            let backend_type = if backend == "udp" {
                String::new()
            } else {
                backend.to_string()
            };
            Ok((
                key,
                LeaseAttrs {
                    public_ip,
                    backend_type,
                    backend_data,
                    ..Default::default()
                },
            ))
        })
        .collect()
}

/// Writes every lease into the embedded store in one locked generation.
pub(super) fn fill_embedded(dir: &Path, leases: &[(SubnetKey, LeaseAttrs)]) -> anyhow::Result<()> {
    let paths = Paths::new(dir.to_path_buf());
    file::modify(&paths, |data, now| {
        for (k, a) in leases {
            data.leases.insert(
                k.to_string(),
                Entry {
                    attrs: a.to_json(),
                    expires_ms: Some(now + LEASE_TTL_MS),
                },
            );
        }
        Ok(((), true))
    })?;
    Ok(())
}

/// Writes the config and every lease through the store's API, 64 at a time.
pub(super) async fn fill_registry<R: Registry>(
    reg: &R,
    net_conf: &str,
    leases: Vec<(SubnetKey, LeaseAttrs)>,
) -> anyhow::Result<()> {
    use futures::StreamExt;
    reg.put_network_config(net_conf).await?;
    let ttl = Some(Duration::from_millis(LEASE_TTL_MS));
    let mut writes = futures::stream::iter(leases.iter().map(|(k, a)| reg.create_lease(k, a, ttl)))
        .buffer_unordered(64);
    while let Some(r) = writes.next().await {
        r?;
    }
    Ok(())
}

type Times = (
    Option<Duration>,
    Option<Duration>,
    Duration,
    Option<Duration>,
);

/// Polls weftd's log (and the kernel's routes) until all `n` peers are in.
fn wait(
    w: &mut Weftd,
    t0: Instant,
    n: u32,
    routes: bool,
    work: &Path,
    log: &Path,
) -> anyhow::Result<Times> {
    let (mut lease, mut first, mut peers, mut seen) = (None, None, None, 0u32);
    let mut file = std::fs::File::open(log)?;
    let (mut pos, mut carry) = (0u64, String::new());
    loop {
        anyhow::ensure!(
            t0.elapsed() < TIMEOUT,
            "timeout: {seen} of {n} peers after {TIMEOUT:?}"
        );
        anyhow::ensure!(matches!(w.0.try_wait(), Ok(None)), "weftd exited");
        if lease.is_none() && work.join("subnet.env").exists() {
            lease = Some(t0.elapsed());
        }
        file.seek(SeekFrom::Start(pos))?;
        let mut buf = String::new();
        pos += file.read_to_string(&mut buf)? as u64;
        carry.push_str(&buf);
        if let Some(end) = carry.rfind('\n') {
            let done: String = carry.drain(..=end).collect();
            seen += u32::try_from(done.matches("Subnet added: ").count())?;
        }
        if seen > 0 && first.is_none() {
            first = Some(t0.elapsed());
        }
        if seen >= n && peers.is_none() {
            peers = Some(t0.elapsed());
        }
        if let Some(p) = peers {
            if !routes {
                return Ok((lease, first, p, None));
            }
            if count_routes()? >= n {
                return Ok((lease, first, p, Some(t0.elapsed())));
            }
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Routes to the fake peers' subnets in this namespace's main table.
pub(super) fn count_routes() -> anyhow::Result<u32> {
    let out = Command::new("ip")
        .args(["-4", "route", "show", "root", "10.0.0.0/8"])
        .output()?;
    Ok(u32::try_from(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(" via 192.0.2."))
            .count(),
    )?)
}

/// Peak resident set size of `pid` in KiB (`VmHWM`).
fn vm_hwm(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = s.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The weftd under test; stopped (SIGTERM, then SIGKILL) when dropped.
pub(super) struct Weftd(pub(super) Child);

impl Weftd {
    pub(super) fn stop(&mut self) {
        if !matches!(self.0.try_wait(), Ok(None)) {
            return;
        }
        let _ = Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        for _ in 0..100 {
            if !matches!(self.0.try_wait(), Ok(None)) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Weftd {
    fn drop(&mut self) {
        self.stop();
    }
}
