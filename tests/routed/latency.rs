//! ADD and DEL latency, routed mode (weftd IPAM + netlink) versus flannel's
//! bridge delegation (bridge + host-local), same node, same run, alternating
//! per iteration. Prints p50/p99 and the ratio; a measurement, not a timed
//! assertion. Run with
//!
//! ```text
//! cargo build --workspace --bins --release
//! cargo test --release -p weft-tests --test routed -- --ignored --nocapture
//! ```
//!
//! The measuring thread enters the node's namespace with `setns`, so each
//! sample is one plain fork+exec of the plugin, as a runtime does it.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weft_control::demo::netns::Netns;
use weft_tests::cluster::CniMode;

use super::cluster;

const CALLS: usize = 200;
const WARMUP: usize = 10;

fn timed(plugin: &str, cni_path: &str, cmd: &str, id: &str, netns: &str, conf: &[u8]) -> Duration {
    let start = Instant::now();
    let mut child = Command::new(plugin)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(conf)
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{cmd} {id} failed: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    took
}

fn percentile(samples: &mut [Duration], p: f64) -> Duration {
    samples.sort();
    let idx = ((samples.len() as f64 - 1.0) * p).round() as usize;
    samples[idx.min(samples.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[test]
#[ignore = "measurement; run with --ignored --nocapture (root)"]
fn add_del_latency_routed_vs_bridge() {
    weft_testenv::require_root!();
    let (_w, c) = cluster("rl", 1);
    let pod = Netns::new(&format!("{}-pod", weft_tests::unique("rlp")));
    let routed = c.cni_conf(0, CniMode::Routed).into_bytes();
    let bridge = c.cni_conf(0, CniMode::Bridge).into_bytes();
    let plugin = weft_tests::bins::path("flannel")
        .to_string_lossy()
        .into_owned();
    let cni_path = format!("{}:/usr/lib/cni", weft_tests::bins::dir().display());
    let node_path = c.nodes[0].ns.path();
    let pod_path = pod.path();
    let (mut ra, mut rd, mut ba, mut bd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let ns = std::fs::File::open(&node_path).expect("open node netns");
            // SAFETY: setns on a valid open namespace fd affects only this thread.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns: {}", std::io::Error::last_os_error());
            for i in 0..WARMUP + CALLS {
                let one = |conf: &[u8], id: &str| {
                    let a = timed(&plugin, &cni_path, "ADD", id, &pod_path, conf);
                    let d = timed(&plugin, &cni_path, "DEL", id, &pod_path, conf);
                    (a, d)
                };
                let (rid, bid) = (format!("lat-r-{i}"), format!("lat-b-{i}"));
                // Alternate the order so neither side always runs on a warm cache.
                let (r, b) = if i % 2 == 0 {
                    let r = one(&routed, &rid);
                    (r, one(&bridge, &bid))
                } else {
                    let b = one(&bridge, &bid);
                    (one(&routed, &rid), b)
                };
                if i >= WARMUP {
                    ra.push(r.0);
                    rd.push(r.1);
                    ba.push(b.0);
                    bd.push(b.1);
                }
            }
        });
    });
    let state = std::fs::read_to_string(c.nodes[0].dir.join("weft-ipam.json")).unwrap_or_default();
    assert!(
        state.contains("\"allocations\":[]"),
        "every routed ADD was deleted: {state}"
    );

    println!("\nCNI latency over {CALLS} calls each (ms), one node, pod netns reused:");
    println!("{:<34} {:>8} {:>8}", "", "p50", "p99");
    let mut rows = Vec::new();
    for (name, v) in [
        ("routed (weftd IPAM + netlink) ADD", &mut ra),
        ("bridge delegation ADD", &mut ba),
        ("routed DEL", &mut rd),
        ("bridge delegation DEL", &mut bd),
    ] {
        let (p50, p99) = (percentile(v, 0.50), percentile(v, 0.99));
        println!("{name:<34} {:>8.2} {:>8.2}", ms(p50), ms(p99));
        rows.push((p50, p99));
    }
    let ratio = |a: Duration, b: Duration| b.as_secs_f64() / a.as_secs_f64();
    println!(
        "bridge/routed: ADD p50 {:.2}x p99 {:.2}x; DEL p50 {:.2}x p99 {:.2}x",
        ratio(rows[0].0, rows[1].0),
        ratio(rows[0].1, rows[1].1),
        ratio(rows[2].0, rows[3].0),
        ratio(rows[2].1, rows[3].1)
    );
}
