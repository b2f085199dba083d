//! Kernel WireGuard against the fake netlink: the exact rtnetlink and genl
//! requests, reconciliation, dataplane choice and live switching.

use std::sync::Mutex;
use std::time::Duration;

use netlink_packet_generic::GenlMessage;
use netlink_packet_wireguard::{
    WireguardAddressFamily, WireguardAllowedIp, WireguardAllowedIpAttr, WireguardAttribute,
    WireguardCmd, WireguardDeviceFlags, WireguardMessage, WireguardPeer, WireguardPeerAttribute,
    WireguardPeerFlags,
};
use rtnetlink::packet_core::{Emitable, NetlinkMessage, ParseableParametrized};

use super::*;
use crate::backend::dual::Dual;
use crate::backend::probe::Capability;
use crate::backend::test_util::{Staged, block_on, ext, fake, lease};
use crate::backend::wireguard::{backend_data, key, select_endpoint};
use crate::backend::{Dataplane, DataplaneChoice, Switch};
use crate::config::backend::WireguardMode;
use crate::lease::LeaseAttrs;
use crate::netlink::{FakeNetlink, LinkKind, Op, WgPeerSet, WgSet};

const PEER_KEY: &str = "hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=";
const PEER_KEY2: &str = "8bdQrVLqiw3ZoHCucNh1YfH0iCWuyStniRr8t7H24Fk=";
const PSK: &str = "GJ7tuWF3o36o0zY0Xx3jyMxXoxEpuMWpAO5D0fTvmD4=";

fn key(b64: &str) -> [u8; 32] {
    weft_engine::wg::key_from_base64(b64).expect("key")
}

fn opts(mode: WireguardMode, psk: &str, keepalive: u64) -> WireguardOptions {
    WireguardOptions {
        listen_port: 51820,
        listen_port_v6: 51821,
        mtu: 0,
        psk: psk.into(),
        persistent_keepalive_interval: Duration::from_secs(keepalive),
        mode,
    }
}

struct Rig {
    nl: Arc<FakeNetlink>,
    b: Staged,
    _dir: tempfile::TempDir,
    secret: [u8; 32],
}

/// A kernel backend with its own key file, set up on 10.244.1.0/24.
fn rig(mode: WireguardMode, psk: &str, keepalive: u64) -> Rig {
    let nl = fake(&["wireguard"], false);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wgkey");
    let secret = key::load_or_generate(&path).expect("key").0;
    let net = Some("10.244.0.0/16".parse().expect("net"));
    let b = KernelWireguard::new(
        opts(mode, psk, keepalive),
        net,
        None,
        nl.clone(),
        nl.clone(),
    )
    .with_key_file(path);
    Rig {
        nl,
        b: Staged::new(b),
        _dir: dir,
        secret,
    }
}

fn peer_lease(subnet: &str, ip: &str, k: &str, port: Option<u16>) -> Lease {
    let data = match port {
        Some(p) => format!(r#"{{"PublicKey":"{k}","Port":{p}}}"#),
        None => format!(r#"{{"PublicKey":"{k}"}}"#),
    };
    lease(subnet, ip, "wireguard", Some(&data))
}

#[test]
fn set_device_message_has_wgctrls_attributes() {
    let set = WgSet {
        ifname: "flannel-wg".into(),
        private_key: Some([7; 32]),
        listen_port: Some(51820),
        replace_peers: true,
        peers: vec![WgPeerSet {
            public_key: [9; 32],
            remove: false,
            psk: Some([5; 32]),
            endpoint: Some("192.0.2.2:51820".parse().expect("ep")),
            keepalive: Some(25),
            allowed_ips: vec!["10.244.2.0/24".parse().expect("net")],
        }],
    };
    let want = WireguardMessage {
        cmd: WireguardCmd::SetDevice,
        attributes: vec![
            WireguardAttribute::IfName("flannel-wg".into()),
            WireguardAttribute::PrivateKey([7; 32]),
            WireguardAttribute::ListenPort(51820),
            WireguardAttribute::Flags(WireguardDeviceFlags::ReplacePeers),
            WireguardAttribute::Peers(vec![WireguardPeer(vec![
                WireguardPeerAttribute::PublicKey([9; 32]),
                WireguardPeerAttribute::Flags(WireguardPeerFlags::ReplaceAllowedIps),
                WireguardPeerAttribute::PresharedKey([5; 32]),
                WireguardPeerAttribute::Endpoint("192.0.2.2:51820".parse().expect("ep")),
                WireguardPeerAttribute::PersistentKeepalive(25),
                WireguardPeerAttribute::AllowedIps(vec![WireguardAllowedIp(vec![
                    WireguardAllowedIpAttr::Family(WireguardAddressFamily::Ipv4),
                    WireguardAllowedIpAttr::IpAddr("10.244.2.0".parse().expect("ip")),
                    WireguardAllowedIpAttr::Cidr(24),
                ])]),
            ])]),
        ],
    };
    assert_eq!(set.message(), want);

    // On the wire: genl header (cmd SET_DEVICE = 1, version 1), then IFNAME
    // (type 2, "flannel-wg\0", padded) first; and it parses back unchanged.
    let mut nl = NetlinkMessage::from(GenlMessage::from_payload(set.message()));
    nl.finalize();
    let mut buf = vec![0u8; nl.buffer_len()];
    nl.emit(&mut buf);
    assert_eq!(&buf[16..18], &[1, 1], "genl cmd, version");
    assert_eq!(&buf[20..24], &[15, 0, 2, 0], "IFNAME nla: len 15, type 2");
    assert_eq!(&buf[24..35], b"flannel-wg\0");
    let header = netlink_packet_generic::GenlHeader::parse(&buf[16..20]).expect("header");
    let back = WireguardMessage::parse_with_param(&buf[20..], header).expect("parse");
    assert_eq!(back, want);

    // A removal carries only the key and REMOVE_ME.
    let rm = WgPeerSet::removal([9; 32]);
    let m = WgSet {
        ifname: "flannel-wg".into(),
        private_key: None,
        listen_port: None,
        replace_peers: false,
        peers: vec![rm],
    }
    .message();
    assert_eq!(
        m.attributes,
        vec![
            WireguardAttribute::IfName("flannel-wg".into()),
            WireguardAttribute::Peers(vec![WireguardPeer(vec![
                WireguardPeerAttribute::PublicKey([9; 32]),
                WireguardPeerAttribute::Flags(WireguardPeerFlags::RemoveMe),
            ])]),
        ]
    );
}

#[test]
fn setup_creates_flannels_device_then_peers() {
    let mut r = rig(WireguardMode::Separate, PSK, 25);
    let own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    let mtu = block_on(async {
        let attrs = r.b.lease_attrs(&ext(), None).await.expect("attrs");
        let public = weft_engine::WgSecret(r.secret).public_key();
        assert_eq!(
            attrs.backend_data.as_deref(),
            Some(backend_data(&public, 51820).as_str())
        );
        assert_eq!(attrs.backend_type, "wireguard");
        r.b.setup(&own).await.expect("setup")
    });
    assert_eq!(mtu, 1420);
    let index =
        r.nl.links()
            .values()
            .find(|d| d.link.name == "flannel-wg")
            .expect("device")
            .link
            .index;
    assert_eq!(
        r.nl.take_ops(),
        vec![
            Op::AddLink(LinkSpec::Wireguard(WireguardLink {
                name: "flannel-wg".into(),
                mtu: 1420
            })),
            Op::WgSet(WgSet {
                ifname: "flannel-wg".into(),
                private_key: Some(r.secret),
                listen_port: Some(51820),
                replace_peers: true,
                peers: vec![]
            }),
            Op::AddAddr(index, "10.244.1.0/32".parse().expect("net")),
            Op::LinkUp(index, None),
            Op::RouteReplace(Route {
                dst: "10.244.0.0/16".parse().expect("net"),
                gateway: None,
                oif: Some(index),
                onlink: false,
                scope_link: true
            }),
        ]
    );

    // A peer: its port, PSK, keepalive, its subnet.
    let p = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY, Some(51000));
    block_on(r.b.apply(Batch::one(&Change::Add(p.clone())))).expect("add");
    let set = |peers| {
        Op::WgSet(WgSet {
            ifname: "flannel-wg".into(),
            private_key: Some(r.secret),
            listen_port: Some(51820),
            replace_peers: false,
            peers,
        })
    };
    let want_peer = WgPeerSet {
        public_key: key(PEER_KEY),
        remove: false,
        psk: Some(key(PSK)),
        endpoint: Some("192.0.2.2:51000".parse().expect("ep")),
        keepalive: Some(25),
        allowed_ips: vec!["10.244.2.0/24".parse().expect("net")],
    };
    assert_eq!(r.nl.take_ops(), vec![set(vec![want_peer.clone()])]);

    // The peer restarts with a new key on the same IP and no Port (old
    // flannel): our own port, and the old key is dropped.
    let p2 = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY2, None);
    block_on(r.b.apply(Batch::one(&Change::Add(p2.clone())))).expect("add");
    let new_peer = WgPeerSet {
        public_key: key(PEER_KEY2),
        endpoint: Some("192.0.2.2:51820".parse().expect("ep")),
        ..want_peer
    };
    assert_eq!(
        r.nl.take_ops(),
        vec![
            set(vec![new_peer]),
            set(vec![WgPeerSet::removal(key(PEER_KEY))])
        ]
    );

    // Removal by key; non-wireguard leases are ignored.
    block_on(r.b.apply(Batch::one(&Change::Remove(p2)))).expect("remove");
    block_on(r.b.apply(Batch::one(&Change::Add(lease(
        "10.244.3.0/24",
        "192.0.2.3",
        "vxlan",
        None,
    )))))
    .expect("ignored");
    assert_eq!(
        r.nl.take_ops(),
        vec![set(vec![WgPeerSet::removal(key(PEER_KEY2))])]
    );
}

#[test]
fn leftover_device_is_recreated_and_reconcile_restores_and_teardown_deletes() {
    let mut r = rig(WireguardMode::Separate, "", 0);
    let old = r.nl.insert_link("flannel-wg", LinkKind::Tun, 1400, None);
    let own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    block_on(async {
        r.b.lease_attrs(&ext(), None).await.expect("attrs");
        r.b.setup(&own).await.expect("setup");
    });
    let ops = r.nl.take_ops();
    assert_eq!(ops[0], Op::DelLink(old));
    assert!(matches!(&ops[1], Op::AddLink(LinkSpec::Wireguard(w)) if w.name == "flannel-wg"));
    let dst: IpNet = "10.244.0.0/16".parse().expect("net");
    r.nl.forget_route(dst);
    block_on(r.b.reconcile()).expect("reconcile");
    assert_eq!(
        r.nl.routes().iter().filter(|x| x.dst == dst).count(),
        1,
        "route restored"
    );
    let index =
        r.nl.links()
            .values()
            .find(|d| d.link.name == "flannel-wg")
            .expect("dev")
            .link
            .index;
    block_on(r.b.teardown());
    assert!(
        r.nl.links().values().all(|d| d.link.name != "flannel-wg"),
        "deleted on teardown"
    );
    assert!(r.nl.ops().contains(&Op::DelLink(index)));
    // A device deleted by hand is reported, not silently recreated.
    let mut r = rig(WireguardMode::Separate, "", 0);
    block_on(async {
        r.b.lease_attrs(&ext(), None).await.expect("attrs");
        r.b.setup(&own).await.expect("setup");
    });
    let index =
        r.nl.links()
            .values()
            .find(|d| d.link.name == "flannel-wg")
            .expect("dev")
            .link
            .index;
    block_on(r.nl.delete_link(index)).expect("del");
    assert!(
        matches!(block_on(r.b.reconcile()), Err(BackendError::DeviceGone(n)) if n == "flannel-wg")
    );
}

#[test]
fn single_device_modes_carry_both_families() {
    let nl = fake(&["wireguard"], false);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wgkey");
    let mut b = Staged::new(
        KernelWireguard::new(
            opts(WireguardMode::Auto, "", 0),
            Some("10.244.0.0/16".parse().expect("net")),
            Some("fd00:10::/56".parse().expect("net")),
            nl.clone(),
            nl.clone(),
        )
        .with_key_file(path),
    );
    let mut e = ext();
    e.ext_v6_addr = Some("2001:db8::1".parse().expect("ip"));
    let mut own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    own.ipv6_subnet = Some("fd00:10:0:1::/64".parse().expect("net"));
    block_on(async {
        b.lease_attrs(&e, None).await.expect("attrs");
        b.setup(&own).await.expect("setup");
    });
    let ops = nl.take_ops();
    let adds: Vec<_> = ops.iter().filter(|o| matches!(o, Op::AddLink(_))).collect();
    assert_eq!(adds.len(), 1, "one device: {ops:?}");
    assert_eq!(
        ops.iter().filter(|o| matches!(o, Op::AddAddr(..))).count(),
        2
    );
    assert_eq!(
        ops.iter()
            .filter(|o| matches!(o, Op::RouteReplace(_)))
            .count(),
        2
    );
    // A peer with a private IPv4 and a public IPv6: auto picks IPv6 (flannel's selectPublicEndpoint).
    let mut p = peer_lease("10.244.2.0/24", "10.1.1.2", PEER_KEY, Some(51820));
    p.ipv6_subnet = Some("fd00:10:0:2::/64".parse().expect("net"));
    p.attrs.public_ipv6 = Some("2001:db8::2".parse().expect("ip"));
    p.attrs.backend_v6_data = Some(format!(r#"{{"PublicKey":"{PEER_KEY}","Port":51821}}"#));
    block_on(b.apply(Batch::one(&Change::Add(p)))).expect("add");
    let Some(Op::WgSet(set)) = nl.take_ops().pop() else {
        panic!("no wg set")
    };
    assert_eq!(
        set.peers[0].endpoint,
        Some("[2001:db8::2]:51820".parse().expect("ep"))
    );
    assert_eq!(set.peers[0].allowed_ips.len(), 2);
    // And flannel's rules directly.
    let pub4 = "198.51.100.2".parse().expect("ip");
    assert_eq!(
        select_endpoint(pub4, Some("2001:db8::2".parse().expect("ip")), &e),
        IpAddr::V4(pub4)
    );
    let priv4 = "10.1.1.2".parse().expect("ip");
    assert_eq!(
        select_endpoint(priv4, Some("fd00::2".parse().expect("ip")), &e),
        IpAddr::V4(priv4)
    );
    assert_eq!(select_endpoint(priv4, None, &e), IpAddr::V4(priv4));
}

/// A userspace stand-in publishing what the userspace wireguard backend
/// publishes for the same key file.
#[derive(Debug)]
struct UserspaceStandIn {
    attrs: LeaseAttrs,
    log: Arc<Mutex<Vec<String>>>,
}

impl Observe for UserspaceStandIn {
    fn name(&self) -> &'static str {
        "wireguard"
    }
    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }
}

/// One type for the three stages.
#[async_trait]
impl Backend for UserspaceStandIn {
    fn name(&self) -> &'static str {
        "wireguard"
    }
    async fn lease_attrs(
        self: Box<Self>,
        _: &ExternalInterface,
        _: Option<&Lease>,
    ) -> Result<Prepared, BackendError> {
        Ok(Prepared {
            attrs: self.attrs.clone(),
            backend: self,
        })
    }
}

#[async_trait]
impl Setup for UserspaceStandIn {
    async fn setup(self: Box<Self>, _: &Lease) -> Result<Box<dyn Running>, BackendError> {
        self.log.lock().expect("log").push("setup".into());
        Ok(self)
    }
}

#[async_trait]
impl Running for UserspaceStandIn {
    fn mtu(&self) -> u32 {
        1420
    }
    async fn apply(&mut self, batch: Batch<'_>) -> Result<(), ApplyError> {
        for c in batch.changes {
            self.log
                .lock()
                .expect("log")
                .push(format!("{c:?}").chars().take(3).collect());
        }
        Ok(())
    }
    async fn reconcile(&mut self) -> Result<(), BackendError> {
        Ok(())
    }
    async fn teardown(&mut self) {}
}

/// `d` run through its stages for `own`.
async fn up_dual(d: Dual, own: &Lease) -> Box<dyn Switch> {
    let p = Box::new(d).lease_attrs(&ext(), None).await.expect("attrs");
    p.backend.setup(own).await.expect("setup")
}

fn dual(
    nl: &Arc<FakeNetlink>,
    choice: DataplaneChoice,
    dir: &std::path::Path,
    log: Arc<Mutex<Vec<String>>>,
) -> Dual {
    let path = dir.join("wgkey");
    let secret = key::load_or_generate(&path).expect("key");
    let attrs = LeaseAttrs {
        public_ip: "192.0.2.1".parse().expect("ip"),
        backend_type: "wireguard".into(),
        backend_data: Some(backend_data(&secret.public_key(), 51820)),
        ..Default::default()
    };
    let (c, w) = (nl.clone(), nl.clone());
    Dual::new("wireguard", choice, nl.clone(), nl.clone())
        .kernel(
            Some(Capability::Wireguard),
            Box::new(move || {
                let net = Some("10.244.0.0/16".parse().expect("net"));
                Box::new(
                    KernelWireguard::new(
                        opts(WireguardMode::Separate, "", 0),
                        net,
                        None,
                        c.clone(),
                        w.clone(),
                    )
                    .with_key_file(path.clone()),
                )
            }),
        )
        .userspace(Box::new(move || {
            Box::new(UserspaceStandIn {
                attrs: attrs.clone(),
                log: log.clone(),
            })
        }))
        .kernel_links(vec!["flannel-wg".into(), "flannel-wg-v6".into()])
}

#[test]
fn kernel_without_wireguard_fails_clearly_and_auto_picks_userspace() {
    let nl = fake(&["vxlan"], false);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Mutex::new(Vec::new()));
    let err = block_on(
        Box::new(dual(&nl, DataplaneChoice::Kernel, dir.path(), log.clone()))
            .lease_attrs(&ext(), None),
    )
    .expect_err("kernel");
    assert_eq!(
        err.to_string(),
        "--dataplane=kernel: this kernel cannot run the wireguard backend: no wireguard support"
    );
    let own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    let d = block_on(up_dual(
        dual(&nl, DataplaneChoice::Auto, dir.path(), log),
        &own,
    ));
    assert_eq!(d.dataplane(), Some(Dataplane::Userspace));
    // With the module, auto takes the kernel.
    let nl = fake(&["wireguard"], false);
    let d = dual(
        &nl,
        DataplaneChoice::Auto,
        dir.path(),
        Arc::new(Mutex::new(Vec::new())),
    );
    let d = block_on(up_dual(d, &own));
    assert_eq!(d.dataplane(), Some(Dataplane::Kernel));
}

#[test]
fn live_switch_between_kernel_and_userspace_keeps_the_lease() {
    let nl = fake(&["wireguard"], false);
    let dir = tempfile::tempdir().expect("tempdir");
    let log = Arc::new(Mutex::new(Vec::new()));
    let d = dual(&nl, DataplaneChoice::Auto, dir.path(), log.clone());
    let own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    let p = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY, Some(51820));
    let mut d = block_on(async {
        let mut d = up_dual(d, &own).await;
        d.apply(Batch::one(&Change::Add(p.clone())))
            .await
            .expect("add");
        d
    });
    assert_eq!(d.dataplane(), Some(Dataplane::Kernel));
    let has_dev = |nl: &FakeNetlink| nl.links().values().any(|l| l.link.name == "flannel-wg");
    assert!(has_dev(&nl));
    assert_eq!(
        block_on(d.switch_dataplane(DataplaneChoice::Userspace)).expect("to userspace"),
        Dataplane::Userspace
    );
    assert!(!has_dev(&nl), "kernel device removed");
    assert_eq!(
        *log.lock().expect("log"),
        vec!["setup".to_string(), "Add".to_string()]
    );
    nl.take_ops();
    assert_eq!(
        block_on(d.switch_dataplane(DataplaneChoice::Kernel)).expect("to kernel"),
        Dataplane::Kernel
    );
    assert!(has_dev(&nl));
    let peers: Vec<_> = nl
        .ops()
        .into_iter()
        .filter_map(|o| match o {
            Op::WgSet(s) => Some(s.peers),
            _ => None,
        })
        .flatten()
        .collect();
    assert_eq!(
        peers.len(),
        2,
        "the known peer is applied again, greeted first: {peers:?}"
    );
    assert!(peers.iter().all(|p| p.public_key == key(PEER_KEY)));
    assert_eq!(
        (peers[0].keepalive, peers[1].keepalive),
        (Some(1), Some(0)),
        "a keepalive that starts a handshake, then the configured none"
    );
}

#[test]
fn a_new_peer_is_greeted_with_a_handshake_unless_it_has_a_keepalive() {
    let mut r = rig(WireguardMode::Separate, "", 0);
    let own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    block_on(async {
        r.b.lease_attrs(&ext(), None).await.expect("attrs");
        r.b.setup(&own).await.expect("setup");
    });
    r.nl.take_ops();
    let set = |peers| {
        Op::WgSet(WgSet {
            ifname: "flannel-wg".into(),
            private_key: Some(r.secret),
            listen_port: Some(51820),
            replace_peers: false,
            peers,
        })
    };
    let peer = |k: &str, keepalive| WgPeerSet {
        public_key: key(k),
        remove: false,
        psk: None,
        endpoint: Some("192.0.2.2:51820".parse().expect("ep")),
        keepalive: Some(keepalive),
        allowed_ips: vec!["10.244.2.0/24".parse().expect("net")],
    };
    // New: keepalive 1 s (the kernel sends a keepalive, so a handshake
    // initiation, at once), then the configured 0.
    let p = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY, Some(51820));
    block_on(r.b.apply(Batch::one(&Change::Add(p.clone())))).expect("add");
    assert_eq!(
        r.nl.take_ops(),
        vec![set(vec![peer(PEER_KEY, 1)]), set(vec![peer(PEER_KEY, 0)])]
    );
    // Known (a lease event for the same peer): configured, not greeted again.
    block_on(r.b.apply(Batch::one(&Change::Add(p)))).expect("again");
    assert_eq!(r.nl.take_ops(), vec![set(vec![peer(PEER_KEY, 0)])]);
    // A new key at the same address is new: greeted, and the old key goes.
    let p2 = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY2, Some(51820));
    block_on(r.b.apply(Batch::one(&Change::Add(p2)))).expect("new key");
    assert_eq!(
        r.nl.take_ops(),
        vec![
            set(vec![peer(PEER_KEY2, 1)]),
            set(vec![peer(PEER_KEY2, 0)]),
            set(vec![WgPeerSet::removal(key(PEER_KEY))]),
        ]
    );
    // After a device is recreated (teardown, a new backend set up), every peer is new again.
    block_on(async {
        r.b.teardown().await;
        let path = r._dir.path().join("wgkey");
        let net = Some("10.244.0.0/16".parse().expect("net"));
        let opts = opts(WireguardMode::Separate, "", 0);
        let b = KernelWireguard::new(opts, net, None, r.nl.clone(), r.nl.clone());
        r.b = Staged::new(b.with_key_file(path));
        r.b.lease_attrs(&ext(), None).await.expect("attrs");
        r.b.setup(&own).await.expect("setup again");
    });
    r.nl.take_ops();
    let p3 = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY2, Some(51820));
    block_on(r.b.apply(Batch::one(&Change::Add(p3)))).expect("re-add");
    assert_eq!(
        r.nl.take_ops(),
        vec![set(vec![peer(PEER_KEY2, 1)]), set(vec![peer(PEER_KEY2, 0)])]
    );
}

/// Issue 18: reconciliation reads the peers back: a peer removed by hand
/// is configured again (greeted), wrong allowed-ips are replaced without
/// touching a roamed endpoint, and a device in order gets no request.
#[test]
fn reconcile_restores_a_removed_peer_and_fixes_allowed_ips_only() {
    let mut r = rig(WireguardMode::Separate, PSK, 0);
    let own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    block_on(async {
        r.b.lease_attrs(&ext(), None).await.expect("attrs");
        r.b.setup(&own).await.expect("setup");
    });
    let p = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY, Some(51000));
    block_on(r.b.apply(Batch::one(&Change::Add(p)))).expect("add");
    let want_peer = WgPeerSet {
        public_key: key(PEER_KEY),
        remove: false,
        psk: Some(key(PSK)),
        endpoint: Some("192.0.2.2:51000".parse().expect("ep")),
        keepalive: Some(0),
        allowed_ips: vec!["10.244.2.0/24".parse().expect("net")],
    };
    let set = |peers| {
        Op::WgSet(WgSet {
            ifname: "flannel-wg".into(),
            private_key: Some(r.secret),
            listen_port: Some(51820),
            replace_peers: false,
            peers,
        })
    };
    r.nl.take_ops();

    // In order: nothing is set.
    block_on(r.b.reconcile()).expect("reconcile");
    assert!(
        !r.nl.take_ops().iter().any(|o| matches!(o, Op::WgSet(_))),
        "no wg set for a device in order"
    );

    // `wg set flannel-wg peer K remove`: back, greeted like a new peer.
    r.nl.edit_wg_peers("flannel-wg", |p| p.clear());
    block_on(r.b.reconcile()).expect("reconcile");
    let greet = WgPeerSet {
        keepalive: Some(1),
        ..want_peer.clone()
    };
    let wg_ops: Vec<Op> =
        r.nl.take_ops()
            .into_iter()
            .filter(|o| matches!(o, Op::WgSet(_)))
            .collect();
    assert_eq!(wg_ops, vec![set(vec![greet]), set(vec![want_peer.clone()])]);
    let dev = r.nl.wg_device("flannel-wg").expect("device");
    assert_eq!(dev.peers.len(), 1);
    assert_eq!(dev.peers[0].allowed_ips, want_peer.allowed_ips);

    // The peer roamed and someone changed its allowed-ips: only those are
    // set again (no endpoint, no PSK, keepalive unchanged).
    let roamed: std::net::SocketAddr = "198.51.100.7:40000".parse().expect("ep");
    r.nl.edit_wg_peers("flannel-wg", |p| {
        p[0].endpoint = Some(roamed);
        p[0].allowed_ips = vec!["10.99.0.0/16".parse().expect("net")];
    });
    block_on(r.b.reconcile()).expect("reconcile");
    let fix = WgPeerSet {
        psk: None,
        endpoint: None,
        keepalive: None,
        ..want_peer.clone()
    };
    let wg_ops: Vec<Op> =
        r.nl.take_ops()
            .into_iter()
            .filter(|o| matches!(o, Op::WgSet(_)))
            .collect();
    assert_eq!(wg_ops, vec![set(vec![fix])]);
    let dev = r.nl.wg_device("flannel-wg").expect("device");
    assert_eq!(dev.peers[0].endpoint, Some(roamed), "roamed endpoint kept");
    assert_eq!(dev.peers[0].allowed_ips, want_peer.allowed_ips);

    // A removed lease is not restored.
    let p = peer_lease("10.244.2.0/24", "192.0.2.2", PEER_KEY, Some(51000));
    block_on(r.b.apply(Batch::one(&Change::Remove(p)))).expect("remove");
    r.nl.take_ops();
    block_on(r.b.reconcile()).expect("reconcile");
    assert!(r.nl.wg_device("flannel-wg").expect("dev").peers.is_empty());
    assert!(!r.nl.take_ops().iter().any(|o| matches!(o, Op::WgSet(_))));
}

/// A peer lease with `WeftNAT` (docs/nat.md), published endpoint `ep`.
fn nat_lease(subnet: &str, ip: &str, k: &str, ep: Option<&str>) -> Lease {
    let mut l = peer_lease(subnet, ip, k, Some(51820));
    l.attrs.weft_nat = Some(crate::lease::NatAttrs {
        endpoint: ep.map(|e| e.parse().expect("endpoint")),
        relay: None,
    });
    l
}

#[test]
fn nat_traversal_punches_to_published_endpoints_with_keepalives() {
    // No discovery server among these leases: the raw socket this starts
    // in the test's namespace sends nothing (no traffic off the machine).
    let mut r = rig(WireguardMode::Separate, "", 0);
    let off = block_on(r.b.lease_attrs(&ext(), None)).expect("attrs");
    assert_eq!(off.weft_nat, None, "off: no WeftNAT in the lease");

    let nl = fake(&["wireguard"], false);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("wgkey");
    let secret = key::load_or_generate(&path).expect("key").0;
    let net = Some("10.244.0.0/16".parse().expect("net"));
    let b = KernelWireguard::new(
        opts(WireguardMode::Separate, "", 0),
        net,
        None,
        nl.clone(),
        nl.clone(),
    )
    .with_key_file(path)
    .with_nat(true);
    let mut b = Staged::new(b);
    let own = lease("10.244.1.0/24", "192.0.2.1", "wireguard", None);
    block_on(async {
        let attrs = b.lease_attrs(&ext(), None).await.expect("attrs");
        assert_eq!(
            attrs.weft_nat,
            Some(crate::lease::NatAttrs {
                endpoint: None,
                relay: None
            }),
            "on: WeftNAT, no endpoint yet"
        );
        b.setup(&own).await.expect("setup")
    });
    nl.take_ops();
    let set = |peers| {
        Op::WgSet(WgSet {
            ifname: "flannel-wg".into(),
            private_key: Some(secret),
            listen_port: Some(51820),
            replace_peers: false,
            peers,
        })
    };
    let peer = |k: &str, ep: &str, keepalive: u16, net: &str| WgPeerSet {
        public_key: key(k),
        remove: false,
        psk: None,
        endpoint: Some(ep.parse().expect("ep")),
        keepalive: Some(keepalive),
        allowed_ips: vec![net.parse().expect("net")],
    };

    // Behind NAT: its published endpoint, a 25 s keepalive (new on the
    // device: the kernel sends at once when a keepalive is set).
    let behind = nat_lease(
        "10.244.2.0/24",
        "10.12.0.2",
        PEER_KEY,
        Some("203.0.113.9:40001"),
    );
    block_on(b.apply(Batch::one(&Change::Add(behind)))).expect("add");
    let punched = peer(PEER_KEY, "203.0.113.9:40001", 25, "10.244.2.0/24");
    assert_eq!(nl.take_ops(), vec![set(vec![punched.clone()])]);

    // Its NAT mapping moved and the kernel has not heard from it there:
    // removed and added again, so the kernel initiates at once.
    let moved = nat_lease(
        "10.244.2.0/24",
        "10.12.0.2",
        PEER_KEY,
        Some("203.0.113.9:40002"),
    );
    block_on(b.apply(Batch::one(&Change::Add(moved)))).expect("update");
    let punched2 = peer(PEER_KEY, "203.0.113.9:40002", 25, "10.244.2.0/24");
    let again = |p: &WgPeerSet| {
        vec![
            set(vec![WgPeerSet::removal(p.public_key)]),
            set(vec![p.clone()]),
        ]
    };
    assert_eq!(nl.take_ops(), again(&punched2));
    // Moved again, but the kernel roamed there already (the peer's
    // authenticated packets came from it): the session stays.
    let roamed = peer(PEER_KEY, "203.0.113.9:40004", 25, "10.244.2.0/24");
    block_on(nl.wg_set(&WgSet {
        ifname: "flannel-wg".into(),
        private_key: None,
        listen_port: None,
        replace_peers: false,
        peers: vec![roamed.clone()],
    }))
    .expect("roam");
    nl.take_ops();
    let moved = nat_lease(
        "10.244.2.0/24",
        "10.12.0.2",
        PEER_KEY,
        Some("203.0.113.9:40004"),
    );
    block_on(b.apply(Batch::one(&Change::Add(moved)))).expect("update");
    assert_eq!(nl.take_ops(), vec![set(vec![roamed])], "no removal");

    // Another node behind the same NAT: its own mapping; both stay (the
    // one-key-per-endpoint-IP rule is for direct peers).
    let k3 = weft_engine::wg::key_to_base64(&[3; 32]);
    let same_nat = nat_lease("10.244.4.0/24", "10.12.0.3", &k3, Some("203.0.113.9:40003"));
    block_on(b.apply(Batch::one(&Change::Add(same_nat)))).expect("add");
    let punched3 = peer(&k3, "203.0.113.9:40003", 25, "10.244.4.0/24");
    assert_eq!(nl.take_ops(), vec![set(vec![punched3])], "no removal");

    // Behind another NAT, nothing published yet: at PublicIP:Port but no
    // keepalive and no greeting (an initiation there would go nowhere and
    // hold back the punch's for 5 s) ...
    let waiting = nat_lease("10.244.3.0/24", "10.13.0.7", PEER_KEY2, None);
    block_on(b.apply(Batch::one(&Change::Add(waiting)))).expect("add");
    let w = peer(PEER_KEY2, "10.13.0.7:51820", 0, "10.244.3.0/24");
    assert_eq!(nl.take_ops(), vec![set(vec![w])]);
    // ... then its endpoint: punched, and the kernel sends at once.
    let published = nat_lease(
        "10.244.3.0/24",
        "10.13.0.7",
        PEER_KEY2,
        Some("198.51.100.9:51820"),
    );
    block_on(b.apply(Batch::one(&Change::Add(published)))).expect("update");
    let p2 = peer(PEER_KEY2, "198.51.100.9:51820", 25, "10.244.3.0/24");
    assert_eq!(nl.take_ops(), again(&p2));
    // A node without the feature: as flannel programs it, greeted (this
    // node being public, no keepalive).
    let k5 = weft_engine::wg::key_to_base64(&[5; 32]);
    let flannel = peer_lease("10.244.5.0/24", "10.13.0.8", &k5, Some(51820));
    block_on(b.apply(Batch::one(&Change::Add(flannel)))).expect("add");
    let d = peer(&k5, "10.13.0.8:51820", 0, "10.244.5.0/24");
    let greet = WgPeerSet {
        keepalive: Some(1),
        ..d.clone()
    };
    assert_eq!(nl.take_ops(), vec![set(vec![greet]), set(vec![d])]);
    block_on(b.teardown());
    drop(dir);
}
