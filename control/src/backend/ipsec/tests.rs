//! ipsec against the fake XFRM layer and a recording IKE daemon: flannel's
//! VICI messages, their order, and the start-up error without ESP. The real
//! charon is exercised in `charon_tests.rs`.

use super::*;
use crate::backend::DataplaneChoice;
use crate::backend::dual::Dual;
use crate::backend::ipsec::vici::Packet;
use crate::backend::probe::Capability;
use crate::backend::test_util::{RecordingIke, Staged, block_on, ext, fake, lease};
use crate::netlink::Op;

fn opts(encap: bool) -> IpsecOptions {
    IpsecOptions {
        psk: "p".repeat(96).into(),
        udp_encap: encap,
        esp_proposal: "aes128gcm16-sha256-prfsha256-ecp256".into(),
    }
}

fn net(s: &str) -> Ipv4Net {
    s.parse().expect("net")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

#[test]
fn connection_and_key_are_flannels() {
    let c = connection(
        net("10.244.1.0/24"),
        ip("192.0.2.1"),
        net("10.244.2.0/24"),
        ip("192.0.2.2"),
        "aes128gcm16-sha256-prfsha256-ecp256",
        true,
    );
    let child = Section::new()
        .list("local_ts", &["10.244.1.0/24"])
        .list("remote_ts", &["10.244.2.0/24"])
        .list("esp_proposals", &["aes128gcm16-sha256-prfsha256-ecp256"])
        .kv("start_action", "start")
        .kv("close_action", "trap")
        .kv("dpd_action", "restart")
        .kv("reqid", "11")
        .kv("rekey_time", "1h")
        .kv("mode", "tunnel")
        .kv("policies", "no");
    let want = Section::new().section(
        "192.0.2.1-10.244.1.0/24-10.244.2.0/24-192.0.2.2",
        Section::new()
            .list("local_addrs", &["192.0.2.1"])
            .list("remote_addrs", &["192.0.2.2"])
            .list("proposals", &["aes256-sha256-modp4096"])
            .kv("version", "2")
            .kv("encap", "true")
            .kv("keyingtries", "0")
            .kv("rekey_time", "")
            .section("local", Section::new().kv("id", "").kv("auth", "psk"))
            .section("remote", Section::new().kv("id", "").kv("auth", "psk"))
            .section(
                "children",
                Section::new().section("10.244.1.0/24-10.244.2.0/24", child),
            ),
    );
    assert_eq!(c, want);
    // It survives the wire unchanged.
    let bytes = Packet::Request("load-conn".into(), c.clone())
        .encode()
        .expect("encode");
    assert_eq!(
        Packet::decode(&bytes[4..]).expect("decode"),
        Packet::Request("load-conn".into(), c)
    );
    let no_encap = connection(
        net("10.244.1.0/24"),
        ip("192.0.2.1"),
        net("10.244.2.0/24"),
        ip("192.0.2.2"),
        "x",
        false,
    );
    let Some(Value::Section(ike)) = no_encap.0.first().map(|(_, v)| v) else {
        panic!("no conn")
    };
    assert_eq!(ike.str("encap").as_deref(), Some("false"));
    assert_eq!(
        shared_key("secret", ip("192.0.2.2")),
        Section::new()
            .kv("type", "IKE")
            .kv("data", "secret")
            .list("owners", &["192.0.2.2"])
    );
}

#[test]
fn peers_load_and_unload_charon_connections_in_flannels_order() {
    let f = fake(&[], true);
    let ike = RecordingIke::default();
    let mut b = Staged::new(Ipsec::new(opts(false), f.clone()).with_ike(Box::new(ike.clone())));
    let cmds = |ike: &RecordingIke| {
        ike.log
            .lock()
            .expect("log")
            .drain(..)
            .map(|(c, _)| c)
            .collect::<Vec<_>>()
    };
    block_on(async {
        let own = lease("10.244.1.0/24", "192.0.2.1", "ipsec", None);
        b.lease_attrs(&ext(), None).await.expect("attrs");
        assert_eq!(b.setup(&own).await.expect("setup"), 1423);
        assert_eq!(
            ike.log.lock().expect("log")[1],
            (
                "load-shared".to_string(),
                shared_key(&"p".repeat(96), ip("192.0.2.1"))
            )
        );
        assert_eq!(cmds(&ike), ["start", "load-shared"]);
        let p = lease("10.244.2.0/24", "192.0.2.2", "ipsec", None);
        b.apply(Batch::one(&Change::Add(p.clone())))
            .await
            .expect("add");
        // Own lease and other backends are ignored.
        b.apply(Batch::one(&Change::Add(own.clone())))
            .await
            .expect("own");
        b.apply(Batch::one(&Change::Add(lease(
            "10.244.3.0/24",
            "192.0.2.3",
            "vxlan",
            None,
        ))))
        .await
        .expect("other");
        let log: Vec<_> = ike.log.lock().expect("log").drain(..).collect();
        assert_eq!(log.len(), 2);
        assert_eq!(
            log[0],
            (
                "load-shared".into(),
                shared_key(&"p".repeat(96), ip("192.0.2.2"))
            )
        );
        let want = connection(
            net("10.244.1.0/24"),
            ip("192.0.2.1"),
            net("10.244.2.0/24"),
            ip("192.0.2.2"),
            "aes128gcm16-sha256-prfsha256-ecp256",
            false,
        );
        assert_eq!(log[1], ("load-conn".into(), want));
        assert_eq!(f.take_ops().len(), 3, "out, in, fwd policies");

        // charon restarted and lost the connection: reconcile loads it again.
        ike.conns.lock().expect("conns").clear();
        b.reconcile().await.expect("reconcile");
        assert_eq!(
            cmds(&ike),
            ["get-conns", "load-shared", "load-shared", "load-conn"]
        );
        b.reconcile().await.expect("reconcile");
        assert_eq!(cmds(&ike), ["get-conns"], "nothing missing");

        b.apply(Batch::one(&Change::Remove(p)))
            .await
            .expect("remove");
        let log: Vec<_> = ike.log.lock().expect("log").drain(..).collect();
        assert_eq!(
            log,
            vec![(
                "unload-conn".to_string(),
                Section::new().kv("name", "192.0.2.1-10.244.1.0/24-10.244.2.0/24-192.0.2.2")
            )]
        );
        assert!(f.take_ops().iter().all(|o| matches!(o, Op::PolicyDel(_))));
        assert!(f.policies().is_empty());
        b.teardown().await;
        assert_eq!(cmds(&ike), ["stop"]);
    });
}

#[test]
fn without_esp_start_up_fails_clearly_and_charon_is_not_started() {
    let f = fake(&[], false);
    let ike = RecordingIke::default();
    let make_ike = ike.clone();
    let x = f.clone();
    let d = Dual::new("ipsec", DataplaneChoice::Auto, f.clone(), f.clone()).kernel(
        Some(Capability::Esp),
        Box::new(move || {
            Box::new(Ipsec::new(opts(false), x.clone()).with_ike(Box::new(make_ike.clone())))
        }),
    );
    let e = block_on(Box::new(d).lease_attrs(&ext(), None)).expect_err("no esp");
    assert_eq!(
        e.to_string(),
        "this kernel cannot run the ipsec backend (no esp4 (CONFIG_INET_ESP) support) and weft has no userspace ipsec engine yet"
    );
    assert!(ike.log.lock().expect("log").is_empty());
    assert!(f.ops().is_empty());
}

#[test]
fn missing_charon_names_the_searched_paths() {
    let e = CharonError::NotFound(
        crate::backend::ipsec::charon::SEARCH
            .iter()
            .map(|s| s.to_string())
            .collect(),
    );
    let text = BackendError::from(e).to_string();
    assert!(
        text.contains("/usr/lib/ipsec/charon") && text.contains("strongswan-charon"),
        "{text}"
    );
}

/// Issue 18: SAs deleted in the kernel get the peer's child rekeyed
/// (once per REINITIATE_EVERY); a peer never seen with SAs is charon's
/// until SA_SETTLE has passed (next test).
#[test]
fn deleted_sas_get_the_child_rekeyed() {
    use crate::netlink::XfrmSa;
    let f = fake(&[], true);
    let ike = RecordingIke::default();
    let mut b = Staged::new(Ipsec::new(opts(false), f.clone()).with_ike(Box::new(ike.clone())));
    let log = |ike: &RecordingIke| -> Vec<(String, Section)> {
        ike.log
            .lock()
            .expect("log")
            .drain(..)
            .filter(|(c, _)| c == "rekey" || c == "initiate")
            .collect()
    };
    block_on(async {
        let own = lease("10.244.1.0/24", "192.0.2.1", "ipsec", None);
        b.lease_attrs(&ext(), None).await.expect("attrs");
        b.setup(&own).await.expect("setup");
        let p = lease("10.244.2.0/24", "192.0.2.2", "ipsec", None);
        b.apply(Batch::one(&Change::Add(p.clone())))
            .await
            .expect("add");

        // Not negotiated yet: charon's business.
        b.reconcile().await.expect("reconcile");
        assert!(log(&ike).is_empty());

        let sa = |src: &str, dst: &str, spi| XfrmSa {
            src: ip(src),
            dst: ip(dst),
            spi,
            reqid: REQID,
        };
        f.insert_sa(sa("192.0.2.1", "192.0.2.2", 0xc1));
        f.insert_sa(sa("192.0.2.2", "192.0.2.1", 0xc2));
        b.reconcile().await.expect("reconcile");
        assert!(log(&ike).is_empty(), "SAs in place");

        // One direction deleted by hand: initiated again, once.
        f.forget_sas(|s| s.spi == 0xc2);
        b.reconcile().await.expect("reconcile");
        assert_eq!(
            log(&ike),
            vec![(
                "rekey".to_string(),
                Section::new()
                    .kv("child", "10.244.1.0/24-10.244.2.0/24")
                    .kv("ike", "192.0.2.1-10.244.1.0/24-10.244.2.0/24-192.0.2.2")
            )]
        );
        b.reconcile().await.expect("reconcile");
        assert!(log(&ike).is_empty(), "not again within REINITIATE_EVERY");

        // Other SAs (another reqid) do not count.
        f.forget_sas(|_| true);
        f.insert_sa(XfrmSa {
            reqid: 7,
            ..sa("192.0.2.1", "192.0.2.2", 0xd1)
        });
        b.apply(Batch::one(&Change::Remove(p)))
            .await
            .expect("remove");
        b.reconcile().await.expect("reconcile");
        assert!(log(&ike).is_empty(), "a removed peer is not initiated");
    });
}

#[test]
fn sas_never_seen_are_renewed_once_after_the_settle_time() {
    let f = fake(&[], true);
    let ike = RecordingIke::default();
    let mut b = Staged::new(
        Ipsec::new(opts(false), f.clone())
            .with_ike(Box::new(ike.clone()))
            .with_sa_settle(Duration::ZERO),
    );
    let initiates = |ike: &RecordingIke| {
        ike.log
            .lock()
            .expect("log")
            .drain(..)
            .filter(|(c, _)| c == "rekey" || c == "initiate")
            .count()
    };
    block_on(async {
        let own = lease("10.244.1.0/24", "192.0.2.1", "ipsec", None);
        b.lease_attrs(&ext(), None).await.expect("attrs");
        b.setup(&own).await.expect("setup");
        let p = lease("10.244.2.0/24", "192.0.2.2", "ipsec", None);
        b.apply(Batch::one(&Change::Add(p))).await.expect("add");
        b.reconcile().await.expect("reconcile");
        assert_eq!(initiates(&ike), 1, "settled without SAs: initiated");
        b.reconcile().await.expect("reconcile");
        assert_eq!(initiates(&ike), 0, "only once: charon retries by itself");
    });
}
