//! The VM kit itself (tests/support/vm.rs): three guests on one hub-switched
//! segment reach each other (ARP, unicast, broadcast), the agent runs
//! commands concurrently with exit status and both streams, daemons start,
//! log and stop, and the stock kernel has what the kernel-backend tests need.

use std::time::{Duration, Instant};

use weft_tests::vm::{Lab, LabSpec};

#[test]
fn three_guests_share_one_segment_and_run_commands() {
    let kit = weft_tests::require_vm!();
    let t0 = Instant::now();
    let lab = Lab::start(&kit, &LabSpec::new("kit", 3).with_ipv6());
    let (a, b, c) = (lab.node(0), lab.node(1), lab.node(2));

    // The agent: status, both streams, quoting, concurrency.
    let out = a.sh("echo out; echo err >&2; exit 7");
    assert_eq!(
        (out.rc, out.stdout.as_str(), out.stderr.as_str()),
        (7, "out\n", "err\n")
    );
    assert_eq!(b.ok("hostname").trim(), b.name());
    let slow = std::thread::scope(|s| {
        // Concurrent means the second command runs while the first still
        // does: the first leaves a mark and sleeps, the second waits for
        // the mark (up to 20 s) and answers while the first is asleep. An
        // agent that runs one command at a time fails either way round: if
        // the slow command came first, the fast one answers only after it
        // ended; if the fast one came first, it never sees the mark. 20 s
        // of sleep, not 2: one command can take seconds in the emulated
        // guest on a loaded machine (a `weft status` took 5.96 s in CI).
        let h = s.spawn(|| c.sh("touch /tmp/w-slow-started; sleep 20; echo slow"));
        let t = Instant::now();
        let fast = c.sh(
            "for i in $(seq 200); do test -e /tmp/w-slow-started && echo fast && exit 0; sleep 0.1; done; exit 1",
        );
        assert_eq!(
            (fast.rc, fast.stdout.as_str()),
            (0, "fast\n"),
            "the second command never saw the first one running ({:?}): {fast}",
            t.elapsed()
        );
        assert!(
            !h.is_finished(),
            "commands ran one at a time (the second one took {:?})",
            t.elapsed()
        );
        h.join().expect("join")
    });
    assert_eq!(slow.stdout, "slow\n");

    // The stock kernel has the modules this machine's kernel lacks.
    let m = a.sh("for m in ipip wireguard esp4 xfrm_user dummy vxlan; do modprobe $m || echo missing $m; done; uname -r");
    assert!(m.success() && !m.stdout.contains("missing"), "{m}");

    // One L2 segment through the hub: unicast v4 and v6 both ways between
    // every pair, and ARP (broadcast) resolved the peers' MACs.
    for x in lab.nodes() {
        for y in lab.nodes() {
            if x.index() == y.index() {
                continue;
            }
            x.ok(&format!("ping -c1 -W5 {}", y.addr()));
            x.ok(&format!("ping -c1 -W5 {}", y.addr6().expect("v6")));
        }
    }
    let neigh = a.ok("ip neigh show dev eth0");
    for y in [b, c] {
        assert!(
            neigh.contains(&format!(
                "{} lladdr 52:54:00:77:00:0{}",
                y.addr(),
                y.index() + 1
            )),
            "{neigh}"
        );
    }

    // Daemons: pid, log, exit status on stop.
    let d = b.spawn("sleeper", "echo started; exec sleep 1000");
    d.wait_log("started", Duration::from_secs(10));
    assert!(d.running() && d.pid().is_some());
    assert_eq!(
        d.stop(libc::SIGTERM, Duration::from_secs(10)),
        Some(128 + libc::SIGTERM)
    );
    let e = c.spawn("short", "exit 3");
    weft_tests::proc::wait_for("short to exit", Duration::from_secs(10), || e.exit_code());
    assert_eq!(e.exit_code(), Some(3));
    println!(
        "vm kit: boot {:?}, whole test {:?}",
        lab.boot_time(),
        t0.elapsed()
    );
}
