//! The ipsec backend against a real strongSwan charon (root; without root or
//! charon / swanctl the tests skip, logged, or fail under CI: see
//! `weft_testenv`). Each
//! charon runs in its own network namespace (`wt-ch<tag>-<pid>`) and mount
//! namespace (a private `/run`, since charon's pid file is fixed at
//! `/var/run/charon.pid`), with its own `STRONGSWAN_CONF` naming a VICI
//! socket in a temp dir. XFRM policies go to the fake (they are the host's
//! namespace otherwise); everything IKE is real.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::*;
use crate::backend::ipsec::charon::{Launch, find_exec, look_path};
use crate::backend::test_util::{Staged, ext, fake, lease};

/// charon, when the test can run (root, charon and swanctl installed); `None`
/// when it is to skip (under CI the guard fails the test instead).
fn ready() -> Option<PathBuf> {
    if !weft_testenv::require_root() {
        return None;
    }
    let charon = find_exec().ok();
    let swanctl = look_path("swanctl").is_some();
    let ok = weft_testenv::require(
        charon.is_some() && swanctl,
        "charon/swanctl not found: apt-get install strongswan-charon strongswan-swanctl",
    );
    charon.filter(|_| ok)
}

fn sh(args: &[&str]) -> String {
    let out = Command::new(args[0])
        .args(&args[1..])
        .output()
        .expect("run");
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// A network namespace, deleted on drop.
struct Ns(String);

impl Ns {
    fn new(tag: &str) -> Ns {
        let name = format!("wt-ch{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).output();
        assert!(
            Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .expect("ip")
                .success()
        );
        sh(&["ip", "-n", &name, "link", "set", "lo", "up"]);
        Ns(name)
    }
}

impl Drop for Ns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
    }
}

/// A charon config in `dir` with its socket and log there; the launch for `ns`.
fn charon_in(ns: &Ns, dir: &Path, charon: &Path) -> (PathBuf, Launch) {
    let sock = dir.join("charon.vici");
    let conf = dir.join("strongswan.conf");
    let text = format!(
        "charon {{\n load_modular = yes\n install_routes = no\n retransmit_timeout = 1.0\n plugins {{\n  include /etc/strongswan.d/charon/*.conf\n  vici {{ socket = unix://{} }}\n }}\n filelog {{ weft {{ path = {}\n default = 1\n flush_line = yes\n }} }}\n}}\n",
        sock.display(),
        dir.join("charon.log").display()
    );
    std::fs::write(&conf, text).expect("conf");
    let script = format!("mount -t tmpfs none /run && exec {}", charon.display());
    let launch = Launch {
        program: "ip".into(),
        args: [
            "netns",
            "exec",
            &ns.0,
            "unshare",
            "-m",
            "--propagation",
            "private",
            "sh",
            "-c",
            &script,
        ]
        .map(String::from)
        .to_vec(),
        envs: vec![(
            "STRONGSWAN_CONF".into(),
            conf.to_string_lossy().into_owned(),
        )],
    };
    (sock, launch)
}

fn swanctl(what: &str, sock: &Path) -> String {
    sh(&[
        "swanctl",
        what,
        "--uri",
        &format!("unix://{}", sock.display()),
    ])
}

fn opts() -> IpsecOptions {
    IpsecOptions {
        psk: "k".repeat(96).into(),
        udp_encap: false,
        esp_proposal: "aes128gcm16-sha256-prfsha256-ecp256".into(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flannels_connections_load_into_a_real_charon() {
    let Some(charon) = ready() else { return };
    let ns = Ns::new("a");
    let dir = tempfile::tempdir().expect("tempdir");
    let (sock, launch) = charon_in(&ns, dir.path(), &charon);
    let ike = CharonIke::new(sock.clone(), Some(launch));
    let f = fake(&[], true);
    let mut b = Staged::new(Ipsec::new(opts(), f.clone()).with_ike(Box::new(ike)));
    b.lease_attrs(&ext(), None).await.expect("attrs");
    b.setup(&lease("10.244.1.0/24", "192.0.2.1", "ipsec", None))
        .await
        .expect("setup starts charon");
    let p = lease("10.244.2.0/24", "192.0.2.2", "ipsec", None);
    b.apply(Batch::one(&Change::Add(p.clone())))
        .await
        .expect("load");

    let conns = swanctl("--list-conns", &sock);
    println!("{conns}");
    let name = "192.0.2.1-10.244.1.0/24-10.244.2.0/24-192.0.2.2";
    // swanctl looks fields up by dotted paths, so it cannot print the IKE
    // version of a name with dots (flannel's names): "NAME: , no reauthentication".
    assert!(
        conns.contains(&format!("{name}: , no reauthentication, no rekeying")),
        "{conns}"
    );
    assert!(
        conns.contains("local:  192.0.2.1") && conns.contains("remote: 192.0.2.2"),
        "{conns}"
    );
    assert!(
        conns.contains("local pre-shared key authentication"),
        "{conns}"
    );
    assert!(
        conns.contains("remote pre-shared key authentication"),
        "{conns}"
    );
    assert!(
        conns.contains("10.244.1.0/24-10.244.2.0/24: TUNNEL, rekeying every 3600s"),
        "{conns}"
    );
    assert!(
        conns.contains("local:  10.244.1.0/24") && conns.contains("remote: 10.244.2.0/24"),
        "{conns}"
    );
    // The raw VICI answer: what charon parsed (proposals are not listed;
    // the two-charon test checks the negotiated one).
    let raw = sh(&[
        "swanctl",
        "--list-conns",
        "--raw",
        "--uri",
        &format!("unix://{}", sock.display()),
    ]);
    println!("{raw}");
    for want in [
        "local_addrs=[192.0.2.1] remote_addrs=[192.0.2.2] version=IKEv2 reauth_time=0 rekey_time=0",
        "local-1 {class=pre-shared key id=%any",
        "remote-1 {class=pre-shared key id=%any",
        // dpd_action restart is listed by its action name "start".
        "children {10.244.1.0/24-10.244.2.0/24 {mode=TUNNEL rekey_time=3600",
        "dpd_action=start close_action=trap local-ts=[10.244.1.0/24] remote-ts=[10.244.2.0/24]",
    ] {
        assert!(raw.contains(want), "{want:?} not in {raw}");
    }
    // Reconcile sees the connection loaded (no reload).
    b.reconcile().await.expect("reconcile");

    // charon dies: reconciliation starts a new one and loads everything again.
    let pids = sh(&["ip", "netns", "pids", &ns.0]);
    for pid in pids.split_whitespace() {
        sh(&["kill", "-9", pid]);
    }
    let t0 = Instant::now();
    while !sh(&["ip", "netns", "pids", &ns.0]).trim().is_empty()
        && t0.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!pids.trim().is_empty(), "charon ran in the namespace");
    assert!(
        sh(&["ip", "netns", "pids", &ns.0]).trim().is_empty(),
        "charon killed"
    );
    // The listener goes away with the process; under load that can lag the
    // process list, so wait for it (bounded) rather than sample once.
    let t0 = Instant::now();
    while crate::backend::ipsec::vici::ViciClient::connect(&sock)
        .await
        .is_ok()
        && t0.elapsed() < Duration::from_secs(10)
    {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        crate::backend::ipsec::vici::ViciClient::connect(&sock)
            .await
            .is_err(),
        "socket dead"
    );
    b.reconcile().await.expect("reconcile restarts charon");
    let conns = swanctl("--list-conns", &sock);
    assert!(
        conns.contains(&format!("{name}: ")),
        "reloaded after a charon restart: {conns}"
    );

    // Removal unloads it.
    b.apply(Batch::one(&Change::Remove(p)))
        .await
        .expect("unload");
    let conns = swanctl("--list-conns", &sock);
    assert!(!conns.contains(name), "{conns}");
    b.teardown().await;
    assert!(
        crate::backend::ipsec::vici::ViciClient::connect(&sock)
            .await
            .is_err(),
        "charon stopped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_charons_negotiate_ike_and_the_child_sa_needs_esp() {
    let Some(charon) = ready() else { return };
    let (na, nb) = (Ns::new("l"), Ns::new("r"));
    let va = format!("wtchv{}", std::process::id() % 100_000);
    sh(&[
        "ip", "link", "add", &va, "netns", &na.0, "type", "veth", "peer", "name", "eth0", "netns",
        &nb.0,
    ]);
    sh(&["ip", "-n", &na.0, "link", "set", &va, "name", "eth0"]);
    for (ns, ip) in [(&na, "192.0.2.1/24"), (&nb, "192.0.2.2/24")] {
        sh(&["ip", "-n", &ns.0, "addr", "add", ip, "dev", "eth0"]);
        sh(&["ip", "-n", &ns.0, "link", "set", "eth0", "up"]);
    }
    let (da, db) = (
        tempfile::tempdir().expect("dir"),
        tempfile::tempdir().expect("dir"),
    );
    let mut nodes = Vec::new();
    for (ns, dir, me, peer, sn, psn) in [
        (
            &na,
            &da,
            "192.0.2.1",
            "192.0.2.2",
            "10.244.1.0/24",
            "10.244.2.0/24",
        ),
        (
            &nb,
            &db,
            "192.0.2.2",
            "192.0.2.1",
            "10.244.2.0/24",
            "10.244.1.0/24",
        ),
    ] {
        let (sock, launch) = charon_in(ns, dir.path(), &charon);
        let mut e = ext();
        e.ext_addr = Some(me.parse().expect("ip"));
        e.iface_addr = e.ext_addr;
        let mut b = Staged::new(
            Ipsec::new(opts(), fake(&[], true))
                .with_ike(Box::new(CharonIke::new(sock.clone(), Some(launch)))),
        );
        b.lease_attrs(&e, None).await.expect("attrs");
        b.setup(&lease(sn, me, "ipsec", None)).await.expect("setup");
        b.apply(Batch::one(&Change::Add(lease(psn, peer, "ipsec", None))))
            .await
            .expect("add");
        nodes.push((b, sock, dir.path().join("charon.log")));
    }
    // start_action=start: both initiate; the IKE SA comes up with the shared PSK.
    let deadline = Instant::now() + Duration::from_secs(60);
    let sas = loop {
        let sas = swanctl("--list-sas", &nodes[0].1);
        if sas.contains("ESTABLISHED") || Instant::now() > deadline {
            break sas;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    println!("{sas}");
    assert!(
        sas.contains("ESTABLISHED"),
        "IKE SA not established:\n{sas}"
    );
    assert!(
        sas.contains("AES_CBC-256/HMAC_SHA2_256_128/PRF_HMAC_SHA2_256/MODP_4096"),
        "{sas}"
    );
    // This kernel has no ESP: installing the CHILD_SA fails, and charon says so.
    let deadline = Instant::now() + Duration::from_secs(30);
    let log = loop {
        let log = std::fs::read_to_string(&nodes[0].2).unwrap_or_default();
        if log.contains("unable to install") || Instant::now() > deadline {
            break log;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("SAD") || l.contains("unable to install") || l.contains("CHILD_SA"))
        .collect();
    println!("{}", lines.join("\n"));
    let tail: Vec<&str> = log.lines().rev().take(60).collect();
    assert!(
        log.contains("unable to install"),
        "no CHILD_SA install failure in the log:\n{}",
        tail.into_iter().rev().collect::<Vec<_>>().join("\n")
    );
    for (mut b, _, _) in nodes {
        b.teardown().await;
    }
}
