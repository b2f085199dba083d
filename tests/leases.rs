//! weftd's lease handling against both stores, with real daemons: the
//! embedded store in a temp dir and a real etcd on loopback.
//!
//! These daemons run the `alloc` backend on `lo` with distinct `--public-ip`s,
//! so they need no namespaces: what is under test is allocation, renewal,
//! watching and restarts, not forwarding.

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use weft_tests::etcd::Etcd;
use weft_tests::proc::wait_for;
use weft_tests::weftd::Weftd;

/// The daemons allocate from 10.244.1-63.0/24 only, so the leases the tests
/// write by hand (10.244.98.0/24, 10.244.99.0/24) are never a daemon's own:
/// without `SubnetMax`, a daemon drew one of them about once in 128 runs and
/// the test's write replaced its own lease (seen in CI, 2026-12-01).
const NET_CONF: &str =
    r#"{"Network":"10.244.0.0/16","SubnetMax":"10.244.63.0","Backend":{"Type":"alloc"}}"#;
const READY: Duration = Duration::from_secs(60);

/// Where the daemons keep their leases.
#[derive(Clone)]
enum Store {
    Embedded(std::path::PathBuf),
    Etcd(String),
}

impl Store {
    fn args(&self, dir: &Path, ip: u8, extra: &[&str]) -> Vec<String> {
        let mut a = vec![
            "--iface=lo".to_string(),
            // These daemons run in the host's namespace: no host rules.
            "--traffic-manager=none".to_string(),
            format!("--public-ip=192.0.2.{ip}"),
            format!("--net-config-path={}", dir.join("net-conf.json").display()),
        ];
        match self {
            Store::Embedded(p) => a.extend([
                "--store=embedded".to_string(),
                format!("--store-path={}", p.display()),
            ]),
            Store::Etcd(ep) => {
                a.extend(["--store=etcd".to_string(), format!("--etcd-endpoints={ep}")])
            }
        }
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    }
}

fn embedded(dir: &Path) -> Store {
    std::fs::write(dir.join("net-conf.json"), NET_CONF).expect("write net-conf");
    Store::Embedded(dir.join("store"))
}

fn etcd_store(etcd: &Etcd, dir: &Path) -> Store {
    std::fs::write(dir.join("net-conf.json"), NET_CONF).expect("write net-conf");
    etcd.etcdctl_ok(&["put", "/coreos.com/network/config", NET_CONF]);
    Store::Etcd(etcd.endpoint())
}

fn weft(args: &[&str]) -> String {
    let out = std::process::Command::new(weft_tests::bins::path("weft"))
        .args(args)
        .output()
        .expect("run weft");
    assert!(
        out.status.success(),
        "weft {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// 20 daemons started at once take 20 distinct subnets of the network.
fn concurrent_distinct(store: Store, dir: &Path) {
    let mut ds: Vec<Weftd> = (1..=20)
        .map(|i| Weftd::start(&format!("n{i}"), dir, None, &store.args(dir, i, &[])))
        .collect();
    let mut subnets = BTreeSet::new();
    for d in &mut ds {
        let env = d.wait_ready(READY);
        assert_eq!(
            env.get("FLANNEL_NETWORK").map(String::as_str),
            Some("10.244.0.0/16")
        );
        let sn = env.get("FLANNEL_SUBNET").expect("FLANNEL_SUBNET").clone();
        assert!(sn.starts_with("10.244.") && sn.ends_with(".1/24"), "{sn}");
        let third: u8 = sn
            .split('.')
            .nth(2)
            .and_then(|o| o.parse().ok())
            .expect("octet");
        assert!(
            (1..=63).contains(&third),
            "{sn} is outside SubnetMin..SubnetMax"
        );
        assert!(subnets.insert(sn.clone()), "{sn} handed out twice");
    }
    assert_eq!(subnets.len(), 20);
}

/// A daemon killed and restarted keeps its subnet; SIGTERM exits 0 cleanly.
fn restart_keeps_subnet(store: Store, dir: &Path) {
    let mut a = Weftd::start("a", dir, None, &store.args(dir, 1, &[]));
    let first = a.wait_ready(READY)["FLANNEL_SUBNET"].clone();
    a.proc.stop(libc::SIGKILL, Duration::from_secs(10));
    std::fs::remove_file(&a.subnet_env).expect("rm subnet.env");
    a.restart();
    assert_eq!(
        a.wait_ready(READY)["FLANNEL_SUBNET"],
        first,
        "same public IP must get the same subnet back"
    );
    assert_eq!(a.proc.stop(libc::SIGTERM, Duration::from_secs(20)), Some(0));
    assert!(a.proc.log().contains("Exiting cleanly"), "{}", a.proc.log());
}

/// Deleting a lease by hand: the other daemons see it removed; its owner
/// exits 0 as flanneld does.
fn removal_is_seen(store: Store, dir: &Path, delete: impl Fn(&str)) {
    let mut a = Weftd::start("a", dir, None, &store.args(dir, 1, &[]));
    let mut b = Weftd::start("b", dir, None, &store.args(dir, 2, &[]));
    let sa = a.wait_ready(READY)["FLANNEL_SUBNET"].clone();
    b.wait_ready(READY);
    let key = sa.replace(".1/", ".0-");
    b.wait_log(&format!("Subnet added: {key}"), READY);
    delete(&key);
    b.wait_log(&format!("Subnet removed: {key}"), READY);
    wait_for("the owner to exit", READY, || {
        (!a.proc.running()).then_some(())
    });
    assert!(
        a.proc
            .log()
            .contains("Lease has been revoked. Shutting down daemon."),
        "{}",
        a.proc.log()
    );
    assert!(b.proc.running(), "the other daemon must keep running");
}

#[test]
fn embedded_concurrent_daemons_get_distinct_subnets() {
    let dir = tempfile::tempdir().expect("tempdir");
    concurrent_distinct(embedded(dir.path()), dir.path());
}

#[test]
fn embedded_restart_keeps_subnet() {
    let dir = tempfile::tempdir().expect("tempdir");
    restart_keeps_subnet(embedded(dir.path()), dir.path());
}

#[test]
fn embedded_removed_lease_is_seen() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = embedded(dir.path());
    let path = dir.path().join("store");
    removal_is_seen(store, dir.path(), |key| {
        weft(&[
            "leases",
            "rm",
            key,
            &format!("--store-path={}", path.display()),
        ]);
    });
}

#[test]
fn embedded_subnet_env_and_readyz() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = embedded(dir.path());
    let port = free_port();
    let mut a = Weftd::start(
        "a",
        dir.path(),
        None,
        &store.args(
            dir.path(),
            1,
            &["--healthz-ip=127.0.0.1", &format!("--healthz-port={port}")],
        ),
    );
    a.wait_ready(READY);
    let text = std::fs::read_to_string(&a.subnet_env).expect("subnet.env");
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 4, "{text}");
    assert_eq!(lines[0], "FLANNEL_NETWORK=10.244.0.0/16");
    assert!(
        lines[1].starts_with("FLANNEL_SUBNET=10.244.") && lines[1].ends_with(".1/24"),
        "{text}"
    );
    assert!(lines[2].starts_with("FLANNEL_MTU="), "{text}");
    assert_eq!(lines[3], "FLANNEL_IPMASQ=false");
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&a.subnet_env)
        .expect("stat")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o644);
    // Ready once the first lease snapshot is programmed too, right after
    // subnet.env (no peers here: milliseconds).
    let ready = wait_for("/readyz 200", Duration::from_secs(5), || {
        let r = http_get(port, "/readyz");
        (r.0 == 200).then_some(r)
    });
    assert_eq!(ready, (200, "flanneld is ready".to_string()));
    assert_eq!(
        http_get(port, "/healthz"),
        (200, "flanneld is running".to_string())
    );
    let listed = weft(&[
        "leases",
        "--json",
        &format!("--store-path={}", dir.path().join("store").display()),
    ]);
    let v: serde_json::Value = serde_json::from_str(&listed).expect("json");
    assert_eq!(v[0]["value"]["PublicIP"], "192.0.2.1");
    assert!(v[0]["value"]["PublicIPv6"].is_null());
}

#[test]
fn etcd_concurrent_daemons_get_distinct_subnets() {
    let Some(etcd) = start_etcd() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    concurrent_distinct(etcd_store(&etcd, dir.path()), dir.path());
    // The keys and values are flannel's.
    let keys = etcd.etcdctl_ok(&[
        "get",
        "--prefix",
        "--keys-only",
        "/coreos.com/network/subnets/",
    ]);
    assert_eq!(keys.lines().filter(|l| !l.is_empty()).count(), 20, "{keys}");
    let v = etcd.etcdctl_ok(&[
        "get",
        "--print-value-only",
        keys.lines().next().expect("a key"),
    ]);
    assert!(
        v.trim().starts_with(r#"{"PublicIP":"192.0.2."#)
            && v.trim().ends_with(r#","PublicIPv6":null}"#),
        "{v}"
    );
}

#[test]
fn etcd_restart_keeps_subnet() {
    let Some(etcd) = start_etcd() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    restart_keeps_subnet(etcd_store(&etcd, dir.path()), dir.path());
}

#[test]
fn etcd_removed_lease_is_seen() {
    let Some(etcd) = start_etcd() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = etcd_store(&etcd, dir.path());
    removal_is_seen(store, dir.path(), |key| {
        etcd.etcdctl_ok(&["del", &format!("/coreos.com/network/subnets/{key}")]);
    });
}

#[test]
fn etcd_hand_written_lease_renewal_and_outage() {
    let Some(mut etcd) = start_etcd() else { return };
    let dir = tempfile::tempdir().expect("tempdir");
    let store = etcd_store(&etcd, dir.path());
    // A short TTL so that renewal is observable: weftd renews at TTL/2.
    let mut a = Weftd::start(
        "a",
        dir.path(),
        None,
        &store.args(dir.path(), 1, &["--lease-ttl=6"]),
    );
    let sa = a.wait_ready(READY)["FLANNEL_SUBNET"].clone();
    let own = format!("/coreos.com/network/subnets/{}", sa.replace(".1/", ".0-"));

    // A lease written by hand in flannel's exact JSON is read back as is.
    let flannel = r#"{"PublicIP":"192.0.2.99","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}"#;
    etcd.etcdctl_ok(&["put", "/coreos.com/network/subnets/10.244.99.0-24", flannel]);
    a.wait_log(&format!("Subnet added: 10.244.99.0-24 {flannel}"), READY);

    // Renewal: the key outlives its 6 s TTL several times over.
    a.wait_log("Lease renewed", READY);
    std::thread::sleep(Duration::from_secs(8));
    assert!(
        !etcd
            .etcdctl_ok(&["get", "--keys-only", &own])
            .trim()
            .is_empty(),
        "own lease expired; log:\n{}",
        a.proc.log()
    );

    // etcd down for a while: weftd keeps running, then resyncs.
    etcd.stop();
    std::thread::sleep(Duration::from_secs(4));
    assert!(
        a.proc.running(),
        "weftd died while etcd was down:\n{}",
        a.proc.log()
    );
    etcd.start_again();
    etcd.wait_healthy();
    etcd.etcdctl_ok(&[
        "put",
        "/coreos.com/network/subnets/10.244.98.0-24",
        r#"{"PublicIP":"192.0.2.98","PublicIPv6":null}"#,
    ]);
    a.wait_log("Subnet added: 10.244.98.0-24", READY);
    assert!(a.proc.running());
}

/// A fresh etcd, or `None` when it is not installed and the test is to skip
/// (under CI the guard fails the test instead).
fn start_etcd() -> Option<Etcd> {
    weft_tests::etcd::require().then(Etcd::start)
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

fn http_get(port: u16, path: &str) -> (u16, String) {
    use std::io::{Read, Write};
    let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(c, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").expect("write");
    let mut s = String::new();
    c.read_to_string(&mut s).expect("read");
    let code = s.get(9..12).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = s.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
    (code, body)
}
