//! Relays for nodes behind NATs that cannot be punched (docs/nat.md,
//! "Relays"), through real weftd daemons on userspace WireGuard and pods
//! from weft's CNI plugin, in the topology of `weft_tests::nat` with both
//! routers symmetric NATs (`MASQUERADE --random-fully`) and two more public
//! nodes running `--nat-relay`:
//!
//! ```text
//!  n1 192.0.2.1   n4 192.0.2.4 (relay)   n5 192.0.2.5 (relay)
//!        └──────────── br0 (internet) ────────────┘
//!  r2 192.0.2.102 (symmetric)           r3 192.0.2.103 (symmetric)
//!  n2 10.12.0.2                         n3 172.16.3.2
//! ```
//!
//! Punching between n2 and n3 cannot work (each NAT gives every
//! destination its own random port), so after `RELAY_AFTER` (11 s) both
//! go through the first live relay; the relay in use is then killed and
//! the pair must recover through the other within [`FAILOVER_BOUND`].
//! In the third test (one relay, `--nat-relay-limit`) both NATs then turn
//! into cone NATs and the pair must go back to the direct path by its
//! probes within [`DIRECT_BOUND`], losing no more than [`SWITCH_LOST`]
//! pings across the switch. In the fourth (cone NATs, one relay) the pair
//! punches, its direct path is then cut (a `DROP` of the other NAT's
//! address in each router's `FORWARD` chain: the relay stays reachable)
//! and both ends must be relayed within [`RERELAY_BOUND`], then go direct
//! again when the cut is lifted.

use std::time::{Duration, Instant};

use weft_testenv::{require_root, require_tool};
use weft_tests::cluster::Cluster;
use weft_tests::nat::{NatCluster, path, start_pair};
use weft_tests::ping::{self, Stream};

/// The relays' node indices and addresses.
const RELAYS: [(usize, &str); 2] = [(3, "192.0.2.4"), (4, "192.0.2.5")];

/// Relay failover bound: the silent relay is noticed after 7 s without an
/// ack (three 2 s registrations missed, `RELAY_SILENT`), the path choice
/// runs every 2 s (`NAT_RECONCILE_EVERY`), then one handshake through the
/// other relay (its initiation goes out at once; a lost one is retried
/// after 5 s, `REKEY_TIMEOUT`): 7 + 2 + 5 = 14 s, and 4 s of slack for the
/// two sides not switching in the same reconcile.
const FAILOVER_BOUND: Duration = Duration::from_secs(18);

/// Waits up to `within` for node `i`'s path to `public_ip` to start with
/// `relayed via ` (followed by `want`, when given); the relay's address.
/// Traffic may resume before a node's own path choice moves (its engine
/// roams to the relay its peer chose), so a test waits for the relay it
/// expects.
#[track_caller]
fn wait_relayed(
    c: &Cluster,
    i: usize,
    public_ip: &str,
    want: Option<&str>,
    within: Duration,
) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some(via) = path(c, i, public_ip)
            .as_deref()
            .and_then(|p| p.strip_prefix("relayed via "))
            .filter(|via| want.is_none_or(|w| w == *via))
        {
            return via.to_string();
        }
        if Instant::now() > deadline {
            panic!(
                "node {i}'s path to {public_ip} is not relayed (via {want:?}): {:?}\nlog:\n{}",
                c.status(i).peers,
                c.log(i)
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn nodes_behind_symmetric_nats_meet_through_a_relay_and_fail_over() {
    require_root!();
    require_tool!("iptables", "iptables", "iptables");
    require_tool!("curl", "curl", "curl");
    let mut args = vec![Vec::new(); 5];
    for (i, _) in RELAYS {
        args[i] = vec!["--nat-relay".to_string()];
    }
    let mut n = NatCluster::create_with("nrl", true, 5, args, true);
    let first = start_pair(&mut n, Duration::from_secs(45));
    let (a, b) = (NatCluster::node_ip(1), NatCluster::node_ip(2));
    let to = n.c.pods[1].ip.clone();
    let c = &n.c;
    let logs = || (1..5).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n");
    let first =
        first.unwrap_or_else(|| panic!("pods behind symmetric NATs never met; logs:\n{}", logs()));
    println!(
        "time to first packet between pods behind the symmetric NATs (from weftd start): {first:?}"
    );
    // Both leases of the relays say so; the pair's paths name the relay.
    for (_, ip) in RELAYS {
        let nat = &c.lease_of(ip)["value"]["WeftNAT"];
        assert_eq!(nat["Relay"], serde_json::json!(true), "{ip}: {nat}");
        assert_eq!(nat["RelayPort"], serde_json::json!(51830), "{ip}: {nat}");
    }
    let via = wait_relayed(c, 1, &b, None, Duration::from_secs(5));
    let back = wait_relayed(c, 2, &a, None, Duration::from_secs(15));
    assert_eq!(via, back, "both ends use the same relay");
    println!("relayed via {via}");
    // A public node is never relayed.
    assert_eq!(path(c, 1, "192.0.2.1").as_deref(), Some("direct"));

    // Kill the relay in use; traffic must come back through the other.
    let (dead, _) = RELAYS
        .iter()
        .copied()
        .find(|(_, ip)| *ip == via)
        .expect("a relay");
    let other = RELAYS.iter().find(|(_, ip)| *ip != via).expect("other").1;
    let s = Stream::start(&n.c.pods[0].ns, &to);
    let before = s.replies();
    let killed = Instant::now();
    n.c.kill_weftd(dead);
    s.wait_more(before, 100, FAILOVER_BOUND + Duration::from_secs(5));
    let gap = s.finish();
    println!(
        "relay {via} killed: ping gap {:?} (bound {FAILOVER_BOUND:?}), {} lost, resumed {:?} after the kill",
        gap.longest,
        gap.lost(),
        killed.elapsed()
    );
    let c = &n.c;
    assert!(
        gap.longest < FAILOVER_BOUND,
        "failover took {:?}; logs:\n{}",
        gap.longest,
        (1..3).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n")
    );
    let now_via = wait_relayed(c, 1, &b, Some(other), Duration::from_secs(5));
    assert_eq!(now_via, other, "node 2 fails over to the live relay");
    assert_eq!(
        wait_relayed(c, 2, &a, Some(other), Duration::from_secs(5)),
        other
    );
    let log = c.log(1);
    assert!(
        log.contains("relaying") && log.contains("went silent"),
        "{log}"
    );

    // The relayed path's throughput beside a direct one from the same node
    // (node 2 to the public node 1's pod), both 3 s of iperf3 TCP.
    n.c.add_pod(0, "p0").unwrap_or_else(|e| panic!("pod: {e}"));
    let c = &n.c;
    // And what each costs: the relay's weftd (forwarding ciphertext) and
    // the public node's (decrypting the direct stream), per Gbit moved.
    let relay = RELAYS.iter().find(|(_, ip)| *ip == other).expect("relay").0;
    let cpu = c.weftd_cpu(relay);
    let relayed = c.iperf_bytes(0, 1, 3);
    let relay_cpu = c.weftd_cpu(relay).saturating_sub(cpu);
    let cpu = c.weftd_cpu(0);
    let direct = c.iperf_bytes(0, 2, 3);
    let direct_cpu = c.weftd_cpu(0).saturating_sub(cpu);
    let mbit = |b: u64| b as f64 * 8.0 / 3.0 / 1e6;
    let per_gbit = |cpu: Duration, b: u64| cpu.as_secs_f64() / (b as f64 * 8.0 / 1e9).max(1e-9);
    println!(
        "iperf3 3 s: relayed via {other} {:.0} Mbit/s, the relay's weftd {:.3} core-seconds \
         per Gbit; direct to the public node {:.0} Mbit/s, its weftd {:.3} core-seconds per Gbit",
        mbit(relayed),
        per_gbit(relay_cpu, relayed),
        mbit(direct),
        per_gbit(direct_cpu, direct)
    );
    assert!(relayed > 0, "nothing moved through the relay");
    assert!(
        relay_cpu > Duration::ZERO,
        "the relay's weftd used no CPU while {relayed} bytes went through it"
    );
}

/// The premise: without a relay, punching through the two symmetric NATs
/// never works (each NAT gives every destination its own random port), so
/// the pods of the test above can only have met through the relay. 22 s
/// from weftd start (about 20 s from the pods') is past `RELAY_AFTER` and
/// four WireGuard handshake rounds, while a pair
/// behind cone NATs meets within 6 s of the start (tests/nat.rs).
#[test]
fn without_a_relay_symmetric_nats_keep_the_pair_apart() {
    require_root!();
    require_tool!("iptables", "iptables", "iptables");
    require_tool!("curl", "curl", "curl");
    let mut n = NatCluster::create_with("nrn", true, 3, Vec::new(), true);
    if let Some(t) = start_pair(&mut n, Duration::from_secs(22)) {
        panic!("pods behind symmetric NATs met without a relay after {t:?}");
    }
    // Both published an endpoint (discovery works) and punch to it.
    for i in [1, 2] {
        let nat = &n.c.lease_of(&NatCluster::node_ip(i))["value"]["WeftNAT"];
        assert!(nat["Endpoint"].is_string(), "node {}: {nat}", i + 1);
    }
}

/// Back to direct bound, from the NAT change: each node's discovery sees
/// its new mapping within one 15 s round (`disco::SLOW`), the main loop
/// publishes it within 1 s (`nat::POLL`) and the peer's store watch sees
/// it within 2 s (the embedded store's poll); the peer probes the new
/// endpoint at its next reconcile (2 s) and reads the ack at the one after
/// (2 s); the side whose probe its peer's NAT dropped probes back at its
/// next reconcile (2 s) and reads that ack 2 s later: 15 + 1 + 2 + 4 + 4
/// = 26 s, and 9 s of slack for a probe lost in the race of the two NATs
/// (the next round: `PROBE_EVERY`, 10 s, takes one of them further).
const DIRECT_BOUND: Duration = Duration::from_secs(35);

/// Pings (one every 200 ms) a switch from the relay to the direct path may
/// lose, counted from 1 s before the first end reports the direct path:
/// none is expected (the session and its keys stay; packets in flight
/// through the relay still arrive and decrypt), 2 allow for a reply that
/// crossed the moment the second end roamed.
const SWITCH_LOST: u64 = 2;

/// Pings (one every 200 ms) the NAT change itself may lose: the flushed
/// mappings break the relayed path until each node's next registration
/// with a new counter reaches the relay (registrations every 2 s, the
/// counter renewed at every 2 s reconcile: at most 4 s), 20 pings, and 5
/// more for a reply in flight.
const CHANGE_LOST: u64 = 25;

/// The relay's limit in the back-to-direct test (`--nat-relay-limit`), well
/// below what the relay carries without one (700-1100 Mbit/s here).
const LIMIT_MBIT: u64 = 100;

/// How far above the limit iperf3's goodput may be: the bucket holds
/// 100 ms of the rate (`relay::BURST`), 3 % of a 3 s run, and iperf3's
/// receiver counts its bytes over its own interval, which may end a little
/// after the sender's 3 s; WireGuard's and the inner headers count against
/// the limit, not in the goodput.
const LIMIT_MARGIN: f64 = 1.1;

/// Whether `path` (`weft status`) is the punched or direct path.
fn is_direct(path: Option<&str>) -> bool {
    matches!(path, Some("punched" | "direct"))
}

/// A pair behind symmetric NATs meets through the relay; both NATs then turn
/// into cone NATs (plain `MASQUERADE`, conntrack flushed) and the pair must
/// find the direct path with its probes, without losing the session.
#[test]
fn a_relayed_pair_goes_direct_when_its_nats_allow_it() {
    require_root!();
    require_tool!("iptables", "iptables", "iptables");
    require_tool!("conntrack", "conntrack", "conntrack");
    require_tool!("curl", "curl", "curl");
    require_tool!("iperf3", "iperf3", "iperf3");
    let mut args = vec![Vec::new(); 4];
    args[3] = vec![
        "--nat-relay".to_string(),
        format!("--nat-relay-limit={LIMIT_MBIT}"),
    ];
    let mut n = NatCluster::create_with("nrd", true, 4, args, true);
    let met = start_pair(&mut n, Duration::from_secs(45));
    let (a, b) = (NatCluster::node_ip(1), NatCluster::node_ip(2));
    let to = n.c.pods[1].ip.clone();
    let c = &n.c;
    assert!(
        met.is_some(),
        "pods behind symmetric NATs never met; logs:\n{}",
        (1..4).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n")
    );
    let via = wait_relayed(c, 1, &b, None, Duration::from_secs(5));
    assert_eq!(wait_relayed(c, 2, &a, None, Duration::from_secs(15)), via);
    // The relay's limit holds (and its drops are counted) while the
    // probes run and find nothing (symmetric NATs).
    let relayed_at = Instant::now();
    let metric = |name: &str| -> u64 {
        let m = c.nodes[3]
            .ns
            .exec(&["curl", "-sf", "http://127.0.0.1:8471/metrics"]);
        m.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /metrics:\n{m}"))
    };
    let limited_before = metric("weft_nat_relay_limited_datagrams_total");
    let bytes = c.iperf_bytes(0, 1, 3);
    let mbit = bytes as f64 * 8.0 / 3.0 / 1e6;
    let limited = metric("weft_nat_relay_limited_datagrams_total") - limited_before;
    let forwarded = metric("weft_nat_relay_forwarded_datagrams_total");
    println!(
        "iperf3 3 s through the relay limited to {LIMIT_MBIT} Mbit/s: {mbit:.1} Mbit/s; \
         {limited} datagrams dropped over the limit, {forwarded} forwarded in all"
    );
    assert!(bytes > 0, "nothing moved through the relay");
    assert!(
        mbit <= LIMIT_MBIT as f64 * LIMIT_MARGIN,
        "{mbit:.1} Mbit/s through a relay limited to {LIMIT_MBIT}"
    );
    assert!(limited > 0, "no drop over the limit counted");
    std::thread::sleep(Duration::from_secs(12).saturating_sub(relayed_at.elapsed()));
    assert!(path(c, 1, &b).is_some_and(|p| p.starts_with("relayed via")));
    assert!(path(c, 2, &a).is_some_and(|p| p.starts_with("relayed via")));

    let s = Stream::start_every(&n.c.pods[0].ns, &to, "0.2", 5);
    let changed = Instant::now();
    for i in [1, 2] {
        let r = n.router(i);
        let rule = ["-t", "nat", "POSTROUTING", "-o", "wan", "-j", "MASQUERADE"];
        let del = [&rule[..2], &["-D"], &rule[2..], &["--random-fully"]].concat();
        let add = [&rule[..2], &["-A"], &rule[2..]].concat();
        r.exec(&[&["iptables"][..], &del].concat());
        r.exec(&[&["iptables"][..], &add].concat());
        r.exec(&["conntrack", "-F"]);
    }
    let c = &n.c;
    let mut direct = [None, None];
    while direct.iter().any(Option::is_none) && changed.elapsed() < DIRECT_BOUND {
        for (k, (i, ip)) in [(1, &b), (2, &a)].into_iter().enumerate() {
            if direct[k].is_none() && is_direct(path(c, i, ip).as_deref()) {
                let unix = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0.0, |d| d.as_secs_f64());
                direct[k] = Some((changed.elapsed(), unix));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let logs = || (1..4).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n");
    let [Some((t1, at1)), Some((t2, at2))] = direct else {
        panic!(
            "not direct {DIRECT_BOUND:?} after the NATs turned cone: {:?} / {:?}; logs:\n{}",
            path(c, 1, &b),
            path(c, 2, &a),
            logs()
        );
    };
    // Traffic keeps flowing on the direct path.
    std::thread::sleep(Duration::from_secs(5));
    let log = s.text();
    let switch_lost = ping::lost_from(&log, at1.min(at2) - 1.0);
    let gap = s.finish();
    println!(
        "NATs turned cone: node 2 direct after {t1:?}, node 3 after {t2:?} (bound {DIRECT_BOUND:?}); \
         pings every 200 ms: {gap}, {switch_lost} lost from 1 s before the switch"
    );
    assert!(
        is_direct(path(c, 1, &b).as_deref()) && is_direct(path(c, 2, &a).as_deref()),
        "not direct 5 s later: {:?} / {:?}",
        path(c, 1, &b),
        path(c, 2, &a)
    );
    assert!(
        switch_lost <= SWITCH_LOST,
        "{switch_lost} pings lost across the switch; logs:\n{}",
        logs()
    );
    assert!(gap.lost() <= CHANGE_LOST + SWITCH_LOST, "{gap}");
    for i in [1, 2] {
        let log = c.log(i);
        let nat: Vec<&str> = log.lines().filter(|l| l.contains("NAT: ")).collect();
        println!("node {} log:\n{}", i + 1, nat.join("\n"));
    }
    assert!(
        c.log(1).contains("answered a direct probe")
            || c.log(2).contains("answered a direct probe"),
        "{}",
        logs()
    );
}

/// Back to the relay bound, from the cut: the end that sends finds the
/// peer silent at the first reconcile at least 2 s (`nat::QUIET`) after
/// the last packet came (2-4 s), probes it at that reconcile and the next
/// (`nat::CHECKS` = 2, every 2 s) and relays it at the one after (2 s):
/// 8 s; the greeting through the relay takes a round trip (a lost one is
/// retried after 5 s, `REKEY_TIMEOUT`); the other end's engine roams to
/// the relay on that greeting and its path follows two looks later (2-4
/// s; its traffic already goes through the relay). 8 + 4 = 12 s, and 6 s
/// for a lost greeting.
const RERELAY_BOUND: Duration = Duration::from_secs(18);

/// Back to direct after the cut is lifted: the relayed peers are probed
/// every 10 s (`PROBE_EVERY`), the ack is read at the next reconcile (2 s),
/// the other end follows with its own probe (up to 10 s later) or by
/// roaming: 10 + 2 + 10 + 2 = 24 s, and 6 s of slack.
const REDIRECT_BOUND: Duration = Duration::from_secs(30);

/// A pair behind cone NATs punches; the direct path between the two NATs
/// is then cut while the relay stays reachable: both ends must be relayed
/// (the same relay) within [`RERELAY_BOUND`], losing at most the pings of
/// that time, and go direct again when the cut is lifted.
#[test]
fn a_punched_pair_whose_direct_path_breaks_is_relayed_fast() {
    require_root!();
    require_tool!("iptables", "iptables", "iptables");
    require_tool!("curl", "curl", "curl");
    let mut args = vec![Vec::new(); 4];
    args[3] = vec!["--nat-relay".to_string()];
    let mut n = NatCluster::create_with("nrb", true, 4, args, false);
    let met = start_pair(&mut n, Duration::from_secs(45));
    assert!(met.is_some(), "pods never met");
    let (a, b) = (NatCluster::node_ip(1), NatCluster::node_ip(2));
    let to = n.c.pods[1].ip.clone();
    let c = &n.c;
    let logs = || (1..4).map(|i| c.log(i)).collect::<Vec<_>>().join("\n---\n");
    weft_tests::nat::wait_path(c, 1, &b, "punched", Duration::from_secs(15));
    weft_tests::nat::wait_path(c, 2, &a, "punched", Duration::from_secs(15));
    // The engine's endpoint is the punched one; nothing roamed.
    let peer = |i: usize, ip: &str| {
        let st = c.status(i);
        let p = st.peers.into_iter().find(|p| p.public_ip == ip);
        p.map(|p| (p.endpoint, p.roamed)).unwrap_or_default()
    };
    let (ep, roamed) = peer(1, &b);
    assert!(
        ep.as_deref()
            .is_some_and(|e| e.starts_with(NatCluster::public_ip(2))),
        "{ep:?}"
    );
    assert_eq!(roamed, Some(false));

    // Cut the direct path in both routers; the relay stays reachable.
    let cut = |op: &str| {
        for (i, other) in [(1, 2), (2, 1)] {
            let far = NatCluster::public_ip(other);
            for dir in ["-s", "-d"] {
                n.router(i)
                    .exec(&["iptables", op, "FORWARD", dir, far, "-j", "DROP"]);
            }
        }
    };
    let s = Stream::start_every(&n.c.pods[0].ns, &to, "0.2", 5);
    std::thread::sleep(Duration::from_secs(2));
    let cut_at = Instant::now();
    cut("-I");
    let c = &n.c;
    let mut relayed = [None, None];
    while relayed.iter().any(Option::is_none) && cut_at.elapsed() < RERELAY_BOUND {
        for (k, (i, ip)) in [(1, &b), (2, &a)].into_iter().enumerate() {
            let p = path(c, i, ip);
            if relayed[k].is_none() && p.as_deref().is_some_and(|p| p.starts_with("relayed via")) {
                relayed[k] = Some((cut_at.elapsed(), p.unwrap_or_default()));
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let [Some((t1, via1)), Some((t2, via2))] = relayed.clone() else {
        panic!(
            "not relayed {RERELAY_BOUND:?} after the cut: {relayed:?}; logs:\n{}",
            logs()
        );
    };
    assert_eq!(via1, via2, "both ends on the same relay");
    assert_eq!(via1, "relayed via 192.0.2.4");
    // Traffic flows through the relay.
    let before = s.replies();
    s.wait_more(before, 10, Duration::from_secs(5));
    let log = s.text();
    let gap = ping::parse(&log);
    println!(
        "direct path cut: node 2 relayed after {t1:?}, node 3 after {t2:?} (bound \
         {RERELAY_BOUND:?}); pings every 200 ms: {gap}"
    );
    assert!(
        gap.longest < RERELAY_BOUND,
        "ping gap {:?}; logs:\n{}",
        gap.longest,
        logs()
    );
    // At most the pings of the bound (one every 200 ms), and a few more
    // in flight.
    let lost_bound = RERELAY_BOUND.as_millis() as u64 / 200 + 5;
    assert!(gap.lost() <= lost_bound, "{gap}");
    for (i, ip) in [(1, &b), (2, &a)] {
        let (ep, _) = peer(i, ip);
        assert_eq!(ep.as_deref(), Some("192.0.2.4:51830"), "node {i}");
    }
    assert!(
        c.log(1).contains("direct probes to") || c.log(2).contains("direct probes to"),
        "{}",
        logs()
    );

    // Lift the cut: back to direct by the probes.
    let lifted = Instant::now();
    cut("-D");
    let mut direct = [None, None];
    while direct.iter().any(Option::is_none) && lifted.elapsed() < REDIRECT_BOUND {
        for (k, (i, ip)) in [(1, &b), (2, &a)].into_iter().enumerate() {
            if direct[k].is_none() && is_direct(path(c, i, ip).as_deref()) {
                direct[k] = Some(lifted.elapsed());
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let [Some(d1), Some(d2)] = direct else {
        panic!(
            "not direct {REDIRECT_BOUND:?} after the cut was lifted: {direct:?}; logs:\n{}",
            logs()
        );
    };
    std::thread::sleep(Duration::from_secs(2));
    let gap = s.finish();
    println!(
        "cut lifted: node 2 direct after {d1:?}, node 3 after {d2:?} (bound {REDIRECT_BOUND:?}); \
         whole run: {gap}"
    );
    for i in [1, 2] {
        let log = c.log(i);
        let nat: Vec<&str> = log.lines().filter(|l| l.contains("NAT: ")).collect();
        println!("node {} log:\n{}", i + 1, nat.join("\n"));
    }
}
