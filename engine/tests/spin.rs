//! The poll-on window (`WEFT_ENGINE_SPIN_US`, `idle.rs`) with real TUN
//! devices and sockets: traffic passes while workers poll, and once it
//! stops they sleep again; in the default mode the engine runs its CPU
//! sampler (`spare.rs`) and takes it along when it stops. Its own test
//! binary, because the window is read from the process environment when an
//! engine starts.

mod common;

use std::time::{Duration, Instant};

use common::*;

/// CPU time (user + system) of this process, in clock ticks: the engines'
/// workers are its threads (ping and iperf3 are other processes).
fn cpu_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("read /proc/self/stat");
    // Fields after the parenthesised command name; utime and stime are 14 and 15.
    let rest = &stat[stat.rfind(')').expect("comm") + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime")
}

#[test]
fn polling_workers_forward_then_sleep() {
    if !require_root_and_tun() {
        return;
    }
    // SAFETY: set before any engine thread starts; the other threads of
    // this binary (the test harness) do not read the environment.
    unsafe { std::env::set_var("WEFT_ENGINE_SPIN_US", "1000") };
    let mut t = Topo::new("spin", 2);
    let engines = start_two(&t);
    assert!(t.ping_eventually(1, "10.244.2.2", &[]), "pod 1 -> pod 2");
    assert!(
        t.ping(2, "10.244.1.2", &["-c", "200", "-i", "0.002"]),
        "200 quick pings"
    );
    t.iperf(1, 2, false);
    let s = engines[1].stats();
    assert!(s.rx_packets > 1000, "{s:?}");
    let b = s.batching;
    assert!(
        b.poll_rounds > 0 && b.sleeps > 0,
        "the window is counted: {b:?}"
    );

    // With no traffic the workers sleep: over 2 s the process uses well
    // under 10 % of a core (a worker polling on would use 100 %, and four
    // workers polled here). One tick is 10 ms.
    std::thread::sleep(Duration::from_millis(200));
    // A worker publishes its counters once per round, so the rounds before
    // a sleep show up after its next wake-up (100 ms at most).
    let b = engines[1].stats().batching;
    let (t0, c0) = (Instant::now(), cpu_ticks());
    std::thread::sleep(Duration::from_secs(2));
    let (used, wall) = (cpu_ticks() - c0, t0.elapsed());
    let share = used as f64 * 0.01 / wall.as_secs_f64();
    assert!(
        share < 0.10,
        "{used} ticks in {wall:?} with no traffic: something polls on"
    );
    // (Stray packets, neighbour discovery and the like, still open a
    // window now and then: polled rounds are not frozen.)
    let quiet = engines[1].stats().batching;
    assert!(
        quiet.sleeps > b.sleeps,
        "idle workers wake on their timeout: {quiet:?}"
    );
    for e in engines {
        e.stop();
    }
    assert_eq!(
        threads_named("weft-cpu"),
        0,
        "a fixed window has no sampler"
    );

    // The default mode: a sampler thread per engine, gone with its engine.
    // SAFETY: as above; the engines of the first part have stopped.
    unsafe { std::env::set_var("WEFT_ENGINE_SPIN_US", "auto") };
    let engines = start_two(&t);
    assert_eq!(threads_named("weft-cpu"), 2, "one sampler per engine");
    assert!(t.ping_eventually(1, "10.244.2.2", &[]), "pod 1 -> pod 2");
    assert!(
        t.ping(2, "10.244.1.2", &["-c", "100", "-i", "0.002"]),
        "100 quick pings with the default window"
    );
    for e in engines {
        e.stop();
    }
    assert_eq!(threads_named("weft-cpu"), 0, "samplers left behind");
}

/// flannel-UDP engines on both nodes, each with the other as its peer.
fn start_two(t: &Topo) -> Vec<weft_engine::Engine> {
    (1..=2)
        .map(|n| {
            let e = start_engine(&t.node(n), udp_cfg(n));
            e.set_peers(peers_for(n, 2, &[], false));
            t.configure_udp_tun(n, "flannel0", 1472);
            e
        })
        .collect()
}

/// Threads of this process named `name`.
fn threads_named(name: &str) -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("read /proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}
