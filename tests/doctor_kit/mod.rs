//! The helpers of `tests/doctor.rs`: weft's CNI directories on a node,
//! `weft doctor`, `weft status` and `/metrics` on a node, the probes'
//! verdicts, a weftd restart, and the table of faults.

use std::path::{Path, PathBuf};
use std::time::Duration;

use weft_tests::cluster::{self, Cluster};

/// weft's CNI config and plugin directories for node `i`.
pub fn cni_dirs(c: &Cluster, i: usize) -> (PathBuf, PathBuf) {
    let d = c.nodes[i].dir.join("cni");
    (d.join("net.d"), d.join("bin"))
}

/// Installs node `i`'s CNI config and the plugins it needs, as the
/// DaemonSet's install-conf would.
pub fn install_cni(c: &Cluster, i: usize) {
    let (conf, bin) = cni_dirs(c, i);
    std::fs::create_dir_all(&conf).expect("CNI conf dir");
    std::fs::create_dir_all(&bin).expect("CNI bin dir");
    let mut flannel: serde_json::Value =
        serde_json::from_str(&c.cni_conf(i, Default::default())).expect("CNI config");
    flannel
        .as_object_mut()
        .expect("an object")
        .remove("cniVersion");
    let list = serde_json::json!({
        "cniVersion": "1.0.0", "name": "cbr0",
        "plugins": [flannel, {"type": "portmap", "capabilities": {"portMappings": true}}]
    });
    std::fs::write(conf.join("10-flannel.conflist"), list.to_string())
        .expect("write the CNI config");
    let _ = std::os::unix::fs::symlink(weft_tests::bins::path("flannel"), bin.join("flannel"));
    for p in ["bridge", "host-local", "portmap"] {
        let _ = std::os::unix::fs::symlink(Path::new(cluster::CNI_PLUGIN_DIR).join(p), bin.join(p));
    }
}

/// `weft doctor --json` on node `i`: (exit code, report).
pub fn doctor(c: &Cluster, i: usize) -> (i32, serde_json::Value) {
    let (conf, bin) = cni_dirs(c, i);
    let out = c.nodes[i]
        .ns
        .command(&weft_tests::bins::path("weft").to_string_lossy())
        .arg("doctor")
        .arg("--json")
        .arg(format!("--subnet-file={}", c.subnet_file(i).display()))
        .arg(format!("--cni-conf-dir={}", conf.display()))
        .arg(format!("--cni-bin-dir={}", bin.display()))
        .output()
        .expect("run weft doctor");
    let v = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "weft doctor printed no JSON ({e}): {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), v)
}

/// The ids of the findings at `severity` or worse.
pub fn ids(v: &serde_json::Value, worst_to: &[&str]) -> Vec<String> {
    v["findings"]
        .as_array()
        .expect("findings")
        .iter()
        .filter(|f| worst_to.contains(&f["severity"].as_str().unwrap_or("")))
        .map(|f| f["id"].as_str().expect("id").to_string())
        .collect()
}

#[track_caller]
pub fn assert_clean(c: &Cluster, i: usize, after: &str) {
    let (code, v) = doctor(c, i);
    assert!(
        code == 0 && ids(&v, &["error", "warning"]).is_empty(),
        "node {i} after {after}: exit {code}, report {v:#}\nlog:\n{}",
        c.log(i)
    );
}

/// One fault: shell on the node to break it and to restore it, the
/// finding (id and severity) it must give.
pub struct Row {
    pub name: &'static str,
    pub node: usize,
    pub brk: String,
    pub restore: String,
    pub id: &'static str,
    pub severity: &'static str,
    pub exit: i32,
}

pub fn row(
    name: &'static str,
    node: usize,
    brk: String,
    restore: String,
    id: &'static str,
    severity: &'static str,
    exit: i32,
) -> Row {
    Row {
        name,
        node,
        brk,
        restore,
        id,
        severity,
        exit,
    }
}

/// Each node's healthz listener (/metrics), on its own loopback.
pub const HEALTHZ_PORT: u16 = 8471;

/// Waits until node `i`'s status shows the peers at `lost` unreachable and
/// every other peer reachable (by the overlay probes).
pub fn wait_reach(c: &Cluster, i: usize, lost: &[String], timeout: Duration) {
    let mut last = String::new();
    let ok = weft_tests::proc::wait_for_or_show(
        "the probes' verdicts",
        timeout,
        || {
            let st = c.status(i);
            last = format!(
                "{:?}",
                st.peers
                    .iter()
                    .map(|p| (&p.public_ip, &p.probe))
                    .collect::<Vec<_>>()
            );
            let want = |ip: &String| Some(!lost.contains(ip));
            (st.peers.len() == 2
                && st
                    .peers
                    .iter()
                    .all(|p| p.probe.as_ref().and_then(|x| x.reachable) == want(&p.public_ip)))
            .then_some(true)
        },
        || format!("node {i}, want lost {lost:?}"),
    );
    assert!(ok, "{last}");
}

/// `weft status` (text) of node `i`.
pub fn status_text(c: &Cluster, i: usize) -> String {
    let out = std::process::Command::new(weft_tests::bins::path("weft"))
        .arg("status")
        .arg(format!("--subnet-file={}", c.subnet_file(i).display()))
        .output()
        .expect("run weft status");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Restarts node `i`'s weftd and waits until its status socket answers.
pub fn restart_weftd(c: &mut Cluster, i: usize) {
    c.stop_weftd(i);
    c.start_weftd(i).expect("restart weftd");
    weft_tests::proc::wait_for("weftd's status socket", Duration::from_secs(60), || {
        (doctor(c, i).0 != 3).then_some(())
    });
}

/// `weft doctor` (text) on node `i`.
pub fn doctor_text(c: &Cluster, i: usize) -> String {
    let (conf, bin) = cni_dirs(c, i);
    let out = c.nodes[i]
        .ns
        .command(&weft_tests::bins::path("weft").to_string_lossy())
        .arg("doctor")
        .arg(format!("--subnet-file={}", c.subnet_file(i).display()))
        .arg(format!("--cni-conf-dir={}", conf.display()))
        .arg(format!("--cni-bin-dir={}", bin.display()))
        .output()
        .expect("run weft doctor");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `GET /metrics` on node `i`'s healthz listener.
pub fn metrics(c: &Cluster, i: usize) -> String {
    c.nodes[i].ns.exec(&[
        "curl",
        "-sf",
        &format!("http://127.0.0.1:{HEALTHZ_PORT}/metrics"),
    ])
}

/// subnet.env's text `env` with `FLANNEL_SUBNET` set to `subnet`.
pub fn with_subnet(env: &str, subnet: &str) -> String {
    env.lines()
        .map(|l| {
            if l.starts_with("FLANNEL_SUBNET=") {
                format!("FLANNEL_SUBNET={subnet}")
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Rows that break node 1's policy routing or its nftables firewall: an
/// `ip rule` sending the pod network to a table routing it out of eth0;
/// an nftables base chain on the forward hook with policy drop (outside
/// iptables' tables, as firewalld's nftables backend or /etc/nftables.conf
/// make it), which drops pod traffic whatever iptables accepts.
pub fn firewall_and_rule_rows() -> [Row; 2] {
    [
        row(
            "a policy rule sending the pod network to another table",
            0,
            "ip route add 10.244.0.0/16 dev eth0 table 100; ip rule add to 10.244.0.0/16 lookup 100 pref 100".into(),
            "ip rule del pref 100; ip route flush table 100".into(),
            "policy_rule_steals",
            "error",
            1,
        ),
        row(
            "an nftables forward chain with policy drop",
            0,
            "nft add table inet wefttest; nft add chain inet wefttest fw '{ type filter hook forward priority 0; policy drop; }'".into(),
            "nft delete table inet wefttest".into(),
            "nft_forward_drop",
            "error",
            1,
        ),
    ]
}
