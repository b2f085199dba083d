//! TUN-to-TUN A-B: weft's own TUN module (`engine/src/sys/tun.rs`) against
//! the `tun-rs` crate (issue 32).
//!
//! What it measures: one bulk TCP stream (iperf3, 1 stream) from namespace A
//! (10.99.0.1) to namespace B (10.99.0.2), where the only path between them
//! is this process forwarding every packet TUN A -> TUN B and back, one
//! thread per direction. It prints, for one run, iperf3's receiver Gbit/s,
//! this process's CPU (utime + stime, and utime alone: `getrusage`) and the
//! machine's busy CPU (`/proc/stat`) over the client's run, as cores and
//! cores per Gbit/s. The forwarder's stime includes the receiving kernel
//! stack (a TUN write delivers the packet in the writer's context), the
//! same for both implementations; utime is each one's own work.
//!
//! With `--offload on` both sides get the virtio-net header and TSO: weft's
//! module writes each super-packet unchanged; tun-rs splits it
//! (`recv_multiple`) and re-coalesces it (`send_multiple` with a `GROTable`).
//! With `--offload off` both read and write one MTU-sized packet at a time.
//!
//! Run as root, with two existing namespaces (`run.sh` makes them, runs both
//! implementations interleaved over several rounds and prints medians):
//!
//! ```text
//! cargo run --release --manifest-path benches/tun_ab/Cargo.toml -- \
//!     <own|tunrs> --ns-a NS --ns-b NS [--offload on|off] [--secs 5] [--mtu 1500]
//! ```

mod fwd;
mod sys;

use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// The TUN's name in both namespaces.
const TUN: &str = "tunab0";
const ADDR_A: &str = "10.99.0.1";
const ADDR_B: &str = "10.99.0.2";

type Res<T> = Result<T, Box<dyn std::error::Error>>;

struct Args {
    tunrs: bool,
    ns_a: String,
    ns_b: String,
    offload: bool,
    secs: u32,
    mtu: u16,
}

fn usage() -> ! {
    eprintln!(
        "usage: tun_ab <own|tunrs> --ns-a NS --ns-b NS [--offload on|off] [--secs N] [--mtu N]"
    );
    std::process::exit(2)
}

fn parse_args() -> Args {
    let mut it = std::env::args().skip(1);
    let tunrs = match it.next().as_deref() {
        Some("own") => false,
        Some("tunrs") => true,
        _ => usage(),
    };
    let mut a = Args {
        tunrs,
        ns_a: String::new(),
        ns_b: String::new(),
        offload: true,
        secs: 5,
        mtu: 1500,
    };
    while let Some(k) = it.next() {
        let v = it.next().unwrap_or_else(|| usage());
        match k.as_str() {
            "--ns-a" => a.ns_a = v,
            "--ns-b" => a.ns_b = v,
            "--offload" => {
                a.offload = match v.as_str() {
                    "on" => true,
                    "off" => false,
                    _ => usage(),
                }
            }
            "--secs" => a.secs = v.parse().unwrap_or_else(|_| usage()),
            "--mtu" => a.mtu = v.parse().unwrap_or_else(|_| usage()),
            _ => usage(),
        }
    }
    if a.ns_a.is_empty() || a.ns_b.is_empty() {
        usage()
    }
    a
}

/// Runs `cmd`, an error unless it exits 0.
fn run(cmd: &mut Command) -> Res<()> {
    let st = cmd.status()?;
    if !st.success() {
        return Err(format!("{cmd:?}: {st}").into());
    }
    Ok(())
}

/// Sets MTU, address and peer route of the TUN in `ns`, and brings it up.
fn configure(ns: &str, mtu: u16, local: &str, peer: &str) -> Res<()> {
    let mtu = mtu.to_string();
    run(Command::new("ip").args(["-n", ns, "link", "set", TUN, "mtu", &mtu, "up"]))?;
    run(Command::new("ip").args(["-n", ns, "addr", "add", local, "peer", peer, "dev", TUN]))
}

/// One TUN of either implementation.
enum Tun {
    Own(weft_engine::bench_tun::Device),
    TunRs(tun_rs::SyncDevice),
}

impl Tun {
    /// Opens the TUN named [`TUN`] inside namespace `ns` (the fd works anywhere).
    fn open_in(ns: &str, a: &Args) -> Res<Tun> {
        let (tunrs, offload) = (a.tunrs, a.offload);
        sys::in_netns(ns, || -> Res<Tun> {
            if !tunrs {
                // One queue, USO asked for as tun-rs does.
                return Ok(Tun::Own(weft_engine::bench_tun::open(
                    TUN, 1, offload, true,
                )?));
            }
            let d = tun_rs::DeviceBuilder::new()
                .name(TUN)
                .offload(offload)
                .multi_queue(true)
                // weft's module sets the same.
                .tx_queue_len(weft_engine::TUN_TXQUEUELEN.unsigned_abs())
                .build_sync()?;
            d.set_nonblocking(true)?;
            Ok(Tun::TunRs(d))
        })
    }

    /// The offloads the kernel accepted, for the record.
    fn offloads(&self) -> String {
        use weft_engine::bench_tun::{TUN_F_TSO4, TUN_F_USO4};
        let (tso, uso) = match self {
            Tun::Own(d) => (d.offload & TUN_F_TSO4 != 0, d.offload & TUN_F_USO4 != 0),
            Tun::TunRs(d) => (d.tcp_gso(), d.udp_gso()),
        };
        format!("tso={} uso={}", u8::from(tso), u8::from(uso))
    }
}

/// Forwards both directions between `a` and `b` until `stop`; the reads and
/// errors of both directions.
fn forward(a: &Tun, b: &Tun, mtu: usize, stop: &AtomicBool, offload: bool) -> fwd::Counts {
    let (ab, ba) = std::thread::scope(|s| {
        let (ab, ba) = match (a, b) {
            (Tun::Own(a), Tun::Own(b)) => {
                let (qa, qb) = (&a.queues[0], &b.queues[0]);
                (
                    s.spawn(move || fwd::own(qa, qb, stop)),
                    s.spawn(move || fwd::own(qb, qa, stop)),
                )
            }
            (Tun::TunRs(a), Tun::TunRs(b)) if offload => (
                s.spawn(move || fwd::tunrs_offload(a, b, mtu, stop)),
                s.spawn(move || fwd::tunrs_offload(b, a, mtu, stop)),
            ),
            (Tun::TunRs(a), Tun::TunRs(b)) => (
                s.spawn(move || fwd::tunrs_plain(a, b, stop)),
                s.spawn(move || fwd::tunrs_plain(b, a, stop)),
            ),
            _ => unreachable!("both TUNs come from one implementation"),
        };
        (ab.join(), ba.join())
    });
    let (ab, ba) = (ab.unwrap_or_default(), ba.unwrap_or_default());
    fwd::Counts {
        reads: ab.reads + ba.reads,
        errors: ab.errors + ba.errors,
    }
}

/// Pulls the number after `"key":` following `section` out of iperf3's JSON.
fn json_num(json: &str, section: &str, key: &str) -> Option<f64> {
    let rest = &json[json.find(section)?..];
    let rest = &rest[rest.find(&format!("\"{key}\":"))? + key.len() + 3..];
    let end = rest.find([',', '\n', '}'])?;
    rest[..end].trim().parse().ok()
}

/// One run's figures: iperf3's receiver Gbit/s and retransmits; the
/// forwarder's user and total CPU and the machine's busy CPU, in cores.
struct Figures {
    gbps: f64,
    retr: f64,
    fwd_user: f64,
    fwd_cores: f64,
    machine_cores: f64,
}

fn main() -> Res<()> {
    let a = parse_args();
    let ta = Tun::open_in(&a.ns_a, &a)?;
    let tb = Tun::open_in(&a.ns_b, &a)?;
    configure(&a.ns_a, a.mtu, ADDR_A, ADDR_B)?;
    configure(&a.ns_b, a.mtu, ADDR_B, ADDR_A)?;
    let offloads = ta.offloads();

    let stop = AtomicBool::new(false);
    let (counts, f) = std::thread::scope(|s| -> Res<(fwd::Counts, Figures)> {
        let fw = s.spawn(|| forward(&ta, &tb, usize::from(a.mtu), &stop, a.offload));
        let mut server = Command::new("ip")
            .args(["netns", "exec", &a.ns_b, "iperf3", "-s", "-1", "-B", ADDR_B])
            .stdout(Stdio::null())
            .spawn()?;
        std::thread::sleep(Duration::from_millis(500));
        let (cpu0, stat0, t0) = (sys::self_cpu(), sys::machine_busy()?, Instant::now());
        let client = Command::new("ip")
            .args(["netns", "exec", &a.ns_a, "iperf3", "-J", "-c", ADDR_B])
            .args(["-t", &a.secs.to_string()])
            .output();
        let (cpu1, stat1, dt) = (sys::self_cpu(), sys::machine_busy()?, t0.elapsed());
        stop.store(true, Ordering::Relaxed);
        let _ = server.kill();
        let _ = server.wait();
        let counts = fw.join().map_err(|_| "forwarder panicked")?;
        let out = String::from_utf8_lossy(&client?.stdout).into_owned();
        let gbps = json_num(&out, "\"sum_received\"", "bits_per_second")
            .ok_or_else(|| format!("no iperf3 result: {out}"))?
            / 1e9;
        let retr = json_num(&out, "\"sum_sent\"", "retransmits").unwrap_or(f64::NAN);
        let secs = dt.as_secs_f64();
        Ok((
            counts,
            Figures {
                gbps,
                retr,
                fwd_user: (cpu1.0 - cpu0.0) / secs,
                fwd_cores: (cpu1.1 - cpu0.1) / secs,
                machine_cores: (stat1 - stat0) / secs,
            },
        ))
    })?;
    println!(
        "impl={} offload={} mtu={} gbps={:.3} fwd_cores={:.3} fwd_user_cores={:.3} \
         machine_cores={:.3} fwd_cores_per_gbps={:.4} \
         machine_cores_per_gbps={:.4} fwd_user_cores_per_gbps={:.4} retransmits={} reads={} errors={} {offloads}",
        if a.tunrs { "tunrs" } else { "own" },
        if a.offload { "on" } else { "off" },
        a.mtu,
        f.gbps,
        f.fwd_cores,
        f.fwd_user,
        f.machine_cores,
        f.fwd_cores / f.gbps,
        f.machine_cores / f.gbps,
        f.fwd_user / f.gbps,
        f.retr,
        counts.reads,
        counts.errors,
    );
    Ok(())
}
