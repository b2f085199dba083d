//! `weft doctor`'s WireGuard handshake check on a two-node userspace
//! WireGuard cluster: healthy, a clean report; node 2's firewall dropping
//! WireGuard's port both ways with a session just made, only `peer_unreachable` (the
//! handshake is recent); node 1's weftd restarted behind that firewall, so
//! no handshake ever completes: `wg_handshake_failing` too, with this
//! node's clock state in its evidence; the port open again, clean. The
//! clock itself (a node whose wall clock stepped back) cannot be broken in
//! a namespace (CLOCK_REALTIME is the machine's): the check's evidence and
//! fix name it, and its judgement is unit-tested. ~40 s on this machine.

#[allow(dead_code)] // shared with tests/doctor.rs, which uses all of it
mod doctor_kit;

use std::time::Duration;

use doctor_kit::{assert_clean, doctor, ids, install_cni, restart_weftd};
use weft_testenv::require_root;
use weft_tests::cluster::{self, Cluster};

/// Waits until node 1's probes judge its one peer `reachable`.
fn wait_verdict(c: &Cluster, reachable: bool) {
    weft_tests::proc::wait_for_or_show(
        &format!("node 1's verdict reachable={reachable}"),
        Duration::from_secs(45),
        || {
            let st = c.status(0);
            let p = st.peers.first()?.probe.clone()?;
            (p.reachable == Some(reachable)).then_some(())
        },
        || format!("{:?}\n{}", c.status(0).peers, c.log(0)),
    );
}

#[test]
fn doctor_names_failing_wireguard_handshakes() {
    require_root!();
    let (_w, mut c) = cluster::start(
        "dwg",
        &cluster::net_conf(r#"{"Type":"wireguard"}"#),
        2,
        &["--traffic-manager=none", "--dataplane=userspace"],
    );
    for i in 0..2 {
        c.add_pod(i, &format!("p{i}"))
            .unwrap_or_else(|e| panic!("pod: {e}"));
        install_cni(&c, i);
    }
    c.assert_mesh();
    wait_verdict(&c, true);
    for i in 0..2 {
        assert_clean(&c, i, "start");
    }

    // Both ways: with only its input dropped, node 2's own initiations
    // still reach node 1, whose engine (boringtun) may count the answered
    // initiation as a handshake although no packet of the session arrives.
    let drop_port = "iptables -w -I INPUT -p udp --dport 51820 -j DROP; iptables -w -I OUTPUT -p udp --dport 51820 -j DROP";
    c.nodes[1].ns.sh(drop_port);
    wait_verdict(&c, false);
    let (code, v) = doctor(&c, 0);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(
        ids(&v, &["error"]),
        ["peer_unreachable"],
        "a recent handshake: {v:#}"
    );

    restart_weftd(&mut c, 0);
    wait_verdict(&c, false);
    let (code, v) = doctor(&c, 0);
    assert_eq!(code, 1, "{v:#}");
    assert_eq!(
        ids(&v, &["error"]),
        ["peer_unreachable", "wg_handshake_failing"],
        "{v:#}\nstatus: {:?}",
        c.status(0)
    );
    let f = v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .find(|f| f["id"] == "wg_handshake_failing")
        .expect("the finding");
    let evidence = f["evidence"].as_str().unwrap_or("");
    assert!(
        evidence.contains("never since weftd started") && evidence.contains("clock:"),
        "{f:#}"
    );
    eprintln!("{f:#}");

    c.nodes[1].ns.sh(&drop_port.replace(" -I ", " -D "));
    wait_verdict(&c, true);
    assert_clean(&c, 0, "the port open again");
}
