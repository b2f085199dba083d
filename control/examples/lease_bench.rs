//! Control-plane benchmark (not a test): how fast leases are allocated, and
//! how long a lease write takes to reach another process's watch.
//!
//! ```sh
//! cargo run --release -p weft-control --example lease_bench            # both stores
//! cargo run --release -p weft-control --example lease_bench -- embedded 1000
//! ```
//!
//! `scale` mode (root, inside a network namespace: `benches/harness/scale.sh`
//! sets that up and runs every combination): N leases are written to the
//! store, then one real `weftd` starts on it; reported are the time until its
//! peer table holds all N peers (it logs `Subnet added: <key>` per peer), for
//! host-gw also until the kernel holds all N routes, and weftd's peak RSS
//! (`VmHWM`). Targets: N = 5,000 within 2 s and 64 MiB.
//!
//! ```sh
//! ip netns exec NS lease_bench scale embedded 5000 host-gw auto /path/to/weftd eth0
//! ```
//!
//! `churn` mode (root, in such a namespace too; issue 33): N leases, one
//! weftd, then RATE lease changes per second for SECS seconds while `weft
//! status` and `/healthz` are timed, each change's route is timed from the
//! store write to the kernel's notification, and the lease renewals' delays
//! are read from weftd's log (see `lease_bench/churn.rs`).
//!
//! ```sh
//! ip netns exec NS lease_bench churn etcd 5000 host-gw auto /path/to/weftd eth0 100 60
//! ```
//!
//! For each store (the embedded store in a temp dir, and a real etcd started
//! on 127.0.0.1 when `/usr/bin/etcd` exists):
//! - allocation: N nodes (distinct public IPs) each run the real allocator
//!   (`LocalManager::acquire_lease`) one after another in a /12 network;
//! - event latency: a child process (this binary, `watch` mode) watches the
//!   store; the parent writes leases one at a time and the child reports when
//!   each arrives. Reported as median and p99 over the samples.

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use weft_control::config::parse_config;
use weft_control::lease::{LeaseAttrs, LeaseEvent, SubnetKey};
use weft_control::store::Registry;
use weft_control::store::embedded::EmbeddedStore;
use weft_control::store::etcd::{EtcdOptions, EtcdStore};
use weft_control::subnet::{LocalManager, Previous};

#[path = "lease_bench/churn.rs"]
mod churn;
#[path = "lease_bench/scale.rs"]
mod scale;

const SAMPLES: usize = 50;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    if args.get(1).map(String::as_str) == Some("watch") {
        return rt.block_on(watch_mode(&args[2], &args[3]));
    }
    if args.get(1).map(String::as_str) == Some("scale") {
        return scale::run(&rt, &args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("churn") {
        return churn::run(&rt, &args[2..]);
    }
    let which = args.get(1).cloned().unwrap_or_else(|| "all".into());
    let n: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1000);
    if which == "all" || which == "embedded" {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("store");
        let store = rt.block_on(EmbeddedStore::open(&path))?;
        let spec = format!("{}", path.display());
        report(
            "embedded",
            n,
            rt.block_on(bench(store, n, "embedded", &spec))?,
        );
    }
    if (which == "all" || which == "etcd") && weft_tests::etcd::available() {
        let etcd = weft_tests::etcd::Etcd::start();
        let opts = EtcdOptions {
            endpoints: etcd.endpoint(),
            ..Default::default()
        };
        let store = rt.block_on(EtcdStore::connect(&opts))?;
        report(
            "etcd",
            n,
            rt.block_on(bench(store, n, "etcd", &etcd.endpoint()))?,
        );
    }
    Ok(())
}

struct Figures {
    alloc_total: Duration,
    latencies: Vec<Duration>,
}

fn report(name: &str, n: u32, mut f: Figures) {
    f.latencies.sort();
    let pct = |p: f64| {
        f.latencies
            .get(((f.latencies.len() as f64 - 1.0) * p) as usize)
            .copied()
            .unwrap_or_default()
    };
    println!(
        "{name:>8}: allocate {n} leases in 10.0.0.0/12: {:.2?} total, {:.2?} per lease; write→event in another process: median {:.2?}, p99 {:.2?} ({} samples)",
        f.alloc_total,
        f.alloc_total / n.max(1),
        pct(0.5),
        pct(0.99),
        f.latencies.len()
    );
}

async fn bench<R: Registry + Clone>(
    store: R,
    n: u32,
    kind: &str,
    spec: &str,
) -> anyhow::Result<Figures> {
    let mut cfg = parse_config(br#"{"Network":"10.0.0.0/12","Backend":{"Type":"alloc"}}"#)?;
    cfg.check_network_config()?;
    let t0 = Instant::now();
    for i in 0..n {
        let ip = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i);
        let attrs = LeaseAttrs {
            public_ip: ip,
            ..Default::default()
        };
        let m = LocalManager::new(
            store.clone(),
            cfg.clone(),
            Previous::default(),
            Some(Duration::from_secs(3600)),
        );
        m.acquire_lease(&attrs).await?;
    }
    let alloc_total = t0.elapsed();

    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["watch", kind, spec])
        .stdout(Stdio::piped())
        .spawn()?;
    let mut lines = BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout"))?,
    )
    .lines();
    let ready = lines.next().transpose()?;
    anyhow::ensure!(
        ready.as_deref() == Some("ready"),
        "watcher did not start: {ready:?}"
    );
    let mut latencies = Vec::with_capacity(SAMPLES);
    for i in 0..SAMPLES {
        let key: SubnetKey = format!("10.15.{}.0-24", i).parse()?;
        let attrs = LeaseAttrs {
            public_ip: Ipv4Addr::new(203, 0, 113, 1),
            ..Default::default()
        };
        let sent = now_ns();
        store
            .update_lease(&key, &attrs, Some(Duration::from_secs(3600)))
            .await?;
        let line = lines
            .next()
            .transpose()?
            .ok_or_else(|| anyhow::anyhow!("watcher exited"))?;
        let (k, at) = line
            .split_once(' ')
            .ok_or_else(|| anyhow::anyhow!("bad line {line}"))?;
        anyhow::ensure!(k == key.to_string(), "unexpected event {k}");
        let at: u128 = at.parse()?;
        latencies.push(Duration::from_nanos(
            u64::try_from(at.saturating_sub(sent)).unwrap_or(u64::MAX),
        ));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(Figures {
        alloc_total,
        latencies,
    })
}

fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

async fn watch_mode(kind: &str, spec: &str) -> anyhow::Result<()> {
    let mut rx = if kind == "etcd" {
        let opts = EtcdOptions {
            endpoints: spec.to_string(),
            ..Default::default()
        };
        EtcdStore::connect(&opts).await?.watch_leases().await?
    } else {
        EmbeddedStore::open(spec).await?.watch_leases().await?
    };
    // The first event is the snapshot; after it, every Added is reported.
    let first = rx.recv().await;
    anyhow::ensure!(
        matches!(first, Some(LeaseEvent::Snapshot(_))),
        "no snapshot"
    );
    println!("ready");
    while let Some(ev) = rx.recv().await {
        if let LeaseEvent::Added(l) = ev {
            println!("{} {}", l.key(), now_ns());
        }
    }
    Ok(())
}
