//! Benchmark-style measurements of both lease stores (no timed assertions).
//! Ignored by default; run them with
//! `cargo test -p weft-control --test store_bench -- --ignored --nocapture --test-threads=1`.
//!
//! Each one creates 1,000 leases (`WEFT_BENCH_LEASES`) (in 10.16.0.0/12), lists them, takes a
//! watch snapshot, and measures the latency from the start of a write on one
//! handle to the matching event on another handle's watch.

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use weft_control::lease::{LeaseAttrs, LeaseEvent, SubnetKey};
use weft_control::store::Registry;
use weft_control::store::embedded::EmbeddedStore;
use weft_control::store::etcd::{EtcdOptions, EtcdStore};

/// Leases per run; `WEFT_BENCH_LEASES` overrides the default 1,000.
fn leases() -> u32 {
    std::env::var("WEFT_BENCH_LEASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1000)
}
const LATENCY_SAMPLES: u32 = 200;

fn subnet(i: u32) -> SubnetKey {
    format!("10.{}.{}.0-24", 16 + i / 256, i % 256)
        .parse()
        .expect("key")
}

fn attrs(i: u32) -> LeaseAttrs {
    let [_, _, a, b] = i.to_be_bytes();
    LeaseAttrs {
        public_ip: Ipv4Addr::new(192, 0, a, b),
        backend_type: "vxlan".into(),
        backend_data: Some(format!(
            r#"{{"VNI":1,"VtepMAC":"c6:d2:32:6f:{a:02x}:{b:02x}"}}"#
        )),
        ..Default::default()
    }
}

fn pct(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() * p / 100).min(sorted.len() - 1)]
}

async fn measure(name: &str, writer: impl Registry, reader: impl Registry) {
    let n = leases();
    let ttl = Some(Duration::from_secs(86_400));
    let t = Instant::now();
    for i in 0..n {
        writer
            .create_lease(&subnet(i), &attrs(i), ttl)
            .await
            .expect("create");
    }
    let create = t.elapsed();
    let t = Instant::now();
    let listed = reader.list_leases().await.expect("list");
    let list = t.elapsed();
    assert_eq!(listed.len(), n as usize);
    let t = Instant::now();
    let mut rx: mpsc::Receiver<LeaseEvent> = reader.watch_leases().await.expect("watch");
    match rx.recv().await {
        Some(LeaseEvent::Snapshot(l)) => assert_eq!(l.len(), n as usize),
        other => panic!("expected a snapshot, got {other:?}"),
    }
    let snapshot = t.elapsed();

    let mut lat = Vec::new();
    for s in 0..LATENCY_SAMPLES {
        let k = subnet(s % n);
        let mut a = attrs(s);
        a.public_ip = Ipv4Addr::new(198, 51, 100, (s % 250) as u8);
        let t = Instant::now();
        writer.update_lease(&k, &a, ttl).await.expect("update");
        loop {
            match tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
                Ok(Some(LeaseEvent::Added(l))) if l.key() == k && l.attrs == a => break,
                Ok(Some(_)) => {}
                other => panic!("no event for the write: {other:?}"),
            }
        }
        lat.push(t.elapsed());
    }
    lat.sort();
    println!(
        "[{name}] create {n} leases: {create:?} ({:?}/lease); list {n}: {list:?}; watch snapshot of {n}: {snapshot:?}",
        create / n
    );
    println!(
        "[{name}] write -> event on another handle ({LATENCY_SAMPLES} samples, store holding {n} leases): \
         p50 {:?}, p90 {:?}, p99 {:?}, max {:?}",
        pct(&lat, 50),
        pct(&lat, 90),
        pct(&lat, 99),
        lat[lat.len() - 1]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run with --ignored --nocapture"]
async fn bench_embedded_1000() {
    let dir = tempfile::tempdir().expect("tempdir");
    let writer = EmbeddedStore::open(dir.path()).await.expect("open");
    let reader = EmbeddedStore::open(dir.path()).await.expect("open");
    measure("embedded", writer, reader).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run with --ignored --nocapture"]
async fn bench_etcd_1000() {
    weft_tests::require_etcd!();
    let etcd = weft_tests::etcd::Etcd::start();
    let opts = EtcdOptions {
        endpoints: etcd.endpoint(),
        ..EtcdOptions::default()
    };
    let writer = EtcdStore::connect(&opts).await.expect("connect");
    let reader = EtcdStore::connect(&opts).await.expect("connect");
    measure("etcd", writer, reader).await;
}
