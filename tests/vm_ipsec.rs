//! The ipsec backend in guests on Debian's stock kernel (this machine's
//! kernel has no ESP/XFRM): weft starts strongSwan's charon, loads flannel's
//! shared key and connections over VICI and installs flannel's XFRM
//! policies (spec §2.5); charon negotiates real IKEv2 and ESP SAs. Asserted:
//! the CHILD_SAs are established with the ESP proposal, the policies and SAs
//! are flannel's (reqid 11, tunnel mode between the public IPs), pods ping
//! and carry TCP, the SA byte counters move with the traffic, full-MTU pings
//! with DF set fit `FLANNEL_MTU` (ext − 77, − 85 with UDPEncap), and with
//! UDPEncap the SAs are ESP-in-UDP on port 4500.

use weft_tests::vm::net as guests;
use weft_tests::vm::{LabSpec, Node};

/// flannel's minimum is 96 characters.
fn psk() -> String {
    "weft-vm-ipsec-test-psk-".repeat(5)
}

fn conf(encap: bool) -> String {
    format!(
        r#"{{"Network":"10.244.0.0/16","Backend":{{"Type":"ipsec","PSK":"{}","UDPEncap":{encap}}}}}"#,
        psk()
    )
}

/// charon logs to its stderr (= weftd's log) in the guests, so the log
/// shows IKE's authentication.
fn charon_logs_to_stderr(lab: &weft_tests::vm::Lab) {
    for n in lab.nodes() {
        n.ok("printf 'charon {\\n filelog {\\n stderr {\\n default = 1\\n }\\n }\\n}\\n' > /etc/strongswan.d/zz-weft-test.conf");
    }
}

/// ESP states from `ip -s xfrm state`: (src, dst, reqid, text of the state).
fn states(n: &Node) -> Vec<(String, String, String)> {
    let out = n.ok("ip -s xfrm state");
    let mut v = Vec::new();
    for block in out.split("\nsrc ").map(|b| b.trim_start_matches("src ")) {
        if block.trim().is_empty() {
            continue;
        }
        let mut w = block.split_whitespace();
        let src = w.next().unwrap_or_default().to_string();
        let dst = w.nth(1).unwrap_or_default().to_string();
        v.push((src, dst, block.to_string()));
    }
    v
}

/// Bytes counted by the SAs from `src` to `dst` on node `n`.
fn sa_bytes(n: &Node, src: &str, dst: &str) -> u64 {
    states(n)
        .iter()
        .filter(|(s, d, _)| s == src && d == dst)
        .map(|(_, _, b)| {
            b.split("lifetime current:")
                .nth(1)
                .and_then(|t| t.split("(bytes)").next())
                .and_then(|t| t.trim().parse::<u64>().ok())
                .unwrap_or(0)
        })
        .sum()
}

/// Checks node `i`'s charon, policies and SAs towards every other node.
fn check_programmed(c: &guests::Net, i: usize, encap: bool) {
    let n = c.lab.node(i);
    let me = n.addr().to_string();
    let own = n.pod_subnet();
    let sas = n.ok("swanctl --list-sas");
    let pols = n.ok("ip xfrm policy");
    let st = states(n);
    for j in (0..c.lab.nodes().len()).filter(|j| *j != i) {
        let peer = c.lab.node(j).addr().to_string();
        let theirs = c.lab.node(j).pod_subnet();
        // flannel's connection name and child, with charon's ESP proposal.
        let conn = format!("{me}-{own}-{theirs}-{peer}");
        let at = sas
            .find(&conn)
            .unwrap_or_else(|| panic!("node {i}: no IKE SA {conn}:\n{sas}"));
        let section = &sas[at..];
        let section = &section[..section[1..].find("\n1").map_or(section.len(), |e| e + 1)];
        assert!(
            section.contains("ESTABLISHED, IKEv2"),
            "node {i}: {conn}:\n{sas}"
        );
        assert!(
            section.contains(&format!("{own}-{theirs}: #"))
                && section.contains("reqid 11, INSTALLED, TUNNEL")
                && section.contains("ESP:AES_GCM_16-128"),
            "node {i}: no installed CHILD_SA {own}-{theirs}:\n{sas}"
        );
        if encap {
            assert!(
                section.contains("[4500]"),
                "node {i}: IKE not on 4500 with UDPEncap:\n{section}"
            );
        }
        // flannel's three policies (weft installs them, charon does not).
        for (dir, src, dst, ts, td) in [
            ("out", &own, &theirs, &me, &peer),
            ("in", &theirs, &own, &peer, &me),
            ("fwd", &theirs, &own, &peer, &me),
        ] {
            let want = format!(
                "src {src} dst {dst} \n\tdir {dir} priority 0 ptype main \n\ttmpl src {ts} dst {td}\n\t\tproto esp reqid 11 mode tunnel"
            );
            assert!(
                pols.contains(&want),
                "node {i}: policy {want:?} missing:\n{pols}"
            );
        }
        // ESP SAs both ways, tunnel mode, reqid 11, encapsulated or not.
        for (s, d) in [(&me, &peer), (&peer, &me)] {
            let sa = st
                .iter()
                .find(|(a, b, _)| a == s && b == d)
                .unwrap_or_else(|| panic!("node {i}: no SA {s} -> {d}:\n{st:?}"));
            assert!(
                sa.2.contains("proto esp")
                    && sa.2.contains("reqid 11(0x0000000b) mode tunnel")
                    && sa.2.contains("rfc4106(gcm(aes))"),
                "node {i}: SA {s} -> {d}: {}",
                sa.2
            );
            assert_eq!(
                sa.2.contains("encap type espinudp sport 4500 dport 4500"),
                encap,
                "node {i}: SA {s} -> {d} (UDPEncap={encap}): {}",
                sa.2
            );
        }
    }
}

fn ipsec_case(tag: &str, nodes: usize, encap: bool) {
    let kit = weft_tests::require_vm!();
    let c = guests::net_with(
        &kit,
        &LabSpec::new(tag, nodes),
        &conf(encap),
        // As in flannel's DaemonSet: weftd's rules leave pod-to-pod traffic
        // alone, where without them the bridge plugin masquerades it to the
        // node's address, which no ipsec policy matches.
        &["--ip-masq"],
        &[],
        charon_logs_to_stderr,
    );
    let pods = c.pods();
    let first = c.first_packet(&pods[0], &pods[1]);
    let mtu = if encap { 1500 - 85 } else { 1500 - 77 };
    for (i, d) in c.weftd.iter().enumerate() {
        assert_eq!(c.mtu(i), mtu);
        let log = d.log();
        assert!(
            log.contains(&format!("IPSec config: UDPEncap={encap}")),
            "{log}"
        );
        assert!(
            log.contains("Charon daemon started"),
            "weft did not start charon:\n{log}"
        );
        // IKE authenticated both ways with the PSK from the network config.
        assert!(
            log.contains("with pre-shared key successful"),
            "no PSK authentication in:\n{log}"
        );
    }
    guests::mesh_ping(&pods);
    for i in 0..nodes {
        check_programmed(&c, i, encap);
    }
    // Traffic moves the ESP counters: node 2 -> node 1 carries the download.
    let (n1, a1, a2) = (
        c.lab.node(0),
        c.lab.node(0).addr().to_string(),
        c.lab.node(1).addr().to_string(),
    );
    let before = sa_bytes(n1, &a2, &a1);
    guests::tcp(&pods[0], &pods[1], &pods[1].ip(false));
    let after = sa_bytes(n1, &a2, &a1);
    assert!(
        after - before > 1 << 20,
        "the SAs {a2} -> {a1} counted {} bytes during a 1 MiB download",
        after - before
    );
    guests::df_ping(&pods[0], &pods[1].ip(false), mtu);
    guests::df_ping(&pods[nodes - 1], &pods[0].ip(false), mtu);
    c.report(&format!("ipsec ({nodes} nodes, UDPEncap={encap})"), first);
}

#[test]
fn ipsec_three_nodes_negotiate_esp_with_charon() {
    ipsec_case("es", 3, false);
}

#[test]
fn ipsec_udp_encap_two_nodes() {
    ipsec_case("eu", 2, true);
}
