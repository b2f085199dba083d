//! ADD and DEL latency of the plugin versus calling the delegate (bridge +
//! host-local) directly with the same delegate config. Prints p50/p99; it is
//! a measurement, not a timed assertion. Root only; run it with
//!
//! ```text
//! cargo test --release -p weft-cni --test latency -- --ignored --nocapture
//! ```
//!
//! The measuring thread enters the throwaway host namespace with `setns`, so
//! each sample is one plain fork+exec of the plugin, as a runtime does it.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{Netns, World};
use weft_testenv::require_root;

const CALLS: usize = 200;
const WARMUP: usize = 10;

struct Env<'a> {
    cni_path: String,
    netns: &'a str,
}

/// Runs `binary` for `cmd` and returns how long it took; panics on failure.
fn timed(binary: &str, cmd: &str, id: &str, env: &Env<'_>, stdin: &[u8]) -> Duration {
    let start = Instant::now();
    let mut child = Command::new(binary)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("CNI_COMMAND", cmd)
        .env("CNI_CONTAINERID", id)
        .env("CNI_NETNS", env.netns)
        .env("CNI_IFNAME", "eth0")
        .env("CNI_PATH", &env.cni_path)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    let out = child.wait_with_output().expect("wait");
    let took = start.elapsed();
    assert!(
        out.status.success(),
        "{binary} {cmd} failed: {}",
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
fn add_del_latency_vs_direct_bridge() {
    require_root!();
    let w = World::new("lat", 48);
    w.write_subnet_env();
    let pod = Netns::new(&format!("{}-pod", w.tag));
    let conf = serde_json::to_vec(&w.net_conf("1.0.0")).expect("json");
    let host_path = format!("/var/run/netns/{}", w.host.name);
    let pod_path = pod.path();
    let env = Env {
        cni_path: w.cni_path(),
        netns: &pod_path,
    };

    let (mut fa, mut fd, mut ba, mut bd) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    std::thread::scope(|s| {
        s.spawn(|| {
            let ns = std::fs::File::open(&host_path).expect("open host netns");
            nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).expect("setns");
            let bridge = format!("{}/bridge", common::SYSTEM_PLUGINS);
            // The exact delegate config the plugin sends, for the direct calls.
            timed(common::FLANNEL, "ADD", "lat-probe", &env, &conf);
            let delegate =
                std::fs::read(w.path("flannel/lat-probe")).expect("saved delegate config");
            timed(common::FLANNEL, "DEL", "lat-probe", &env, &conf);
            for i in 0..WARMUP + CALLS {
                let keep = i >= WARMUP;
                let (f_id, b_id) = (format!("lat-f-{i}"), format!("lat-b-{i}"));
                let flannel = || {
                    let a = timed(common::FLANNEL, "ADD", &f_id, &env, &conf);
                    let d = timed(common::FLANNEL, "DEL", &f_id, &env, &conf);
                    (a, d)
                };
                let direct = || {
                    let a = timed(&bridge, "ADD", &b_id, &env, &delegate);
                    let d = timed(&bridge, "DEL", &b_id, &env, &delegate);
                    (a, d)
                };
                // Alternate the order so neither side always runs on a warm cache.
                let ((a1, d1), (a2, d2)) = if i % 2 == 0 {
                    (flannel(), direct())
                } else {
                    let (b, f) = (direct(), flannel());
                    (f, b)
                };
                if keep {
                    fa.push(a1);
                    fd.push(d1);
                    ba.push(a2);
                    bd.push(d2);
                }
            }
        });
    });
    assert!(
        w.leases().is_empty() && w.saved().is_empty(),
        "every ADD was deleted"
    );

    println!(
        "\nCNI latency over {CALLS} calls each (ms), pod netns reused, real bridge + host-local:"
    );
    println!("{:<28} {:>8} {:>8}", "", "p50", "p99");
    let mut rows = Vec::new();
    for (name, v) in [
        ("flannel (weft) ADD", &mut fa),
        ("bridge direct ADD", &mut ba),
        ("flannel (weft) DEL", &mut fd),
        ("bridge direct DEL", &mut bd),
    ] {
        let (p50, p99) = (percentile(v, 0.50), percentile(v, 0.99));
        println!("{name:<28} {:>8.2} {:>8.2}", ms(p50), ms(p99));
        rows.push((p50, p99));
    }
    let ratio = |a: Duration, b: Duration| a.as_secs_f64() / b.as_secs_f64();
    println!(
        "ratio ADD p50 {:.2}x p99 {:.2}x; DEL p50 {:.2}x p99 {:.2}x (target <= 1.2x)",
        ratio(rows[0].0, rows[1].0),
        ratio(rows[0].1, rows[1].1),
        ratio(rows[2].0, rows[3].0),
        ratio(rows[2].1, rows[3].1)
    );
}
