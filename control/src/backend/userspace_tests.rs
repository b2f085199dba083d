//! The userspace backends' lease → peer translation, without root: each
//! runs on [`FakeEngines`] (a recording engine per TUN) and the fake
//! netlink, so what they hand the engine and which routes they program is
//! checked per lease change, as the kernel backends' tests do with the fake
//! netlink alone. The real engine is exercised end to end by tests/.

use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use weft_engine::{AntiSpoofing, Encap, Peer};

use super::test_util::{block_on, ext, fake, lease, up};
use super::tunnel::fake::FakeEngines;
use super::{Backend, Batch, Change, EngineTuning, Running};
use crate::config::backend::{BackendOptions, IpipOptions, VxlanOptions, WireguardOptions};

fn tuning() -> EngineTuning {
    EngineTuning {
        nat: false,
        relay: None,
        tunnel_gso: Default::default(),
        workers: 1,
        offload: false,
        anti_spoof: AntiSpoofing::Subnet,
    }
}

/// `type`'s options decoded from `json` (flannel's defaults for what it omits).
fn options(ty: &str, json: &str) -> BackendOptions {
    BackendOptions::from_config(ty, Some(json)).expect("options")
}

fn vxlan_opts(json: &str) -> VxlanOptions {
    match options("vxlan", json) {
        BackendOptions::Vxlan(o) => o,
        other => panic!("{other:?}"),
    }
}

fn wg_opts(json: &str) -> WireguardOptions {
    match options("wireguard", json) {
        BackendOptions::Wireguard(o) => o,
        other => panic!("{other:?}"),
    }
}

fn net(s: &str) -> IpNet {
    s.parse().expect("net")
}

fn ip(s: &str) -> IpAddr {
    s.parse().expect("ip")
}

fn own() -> super::Lease {
    lease("10.244.1.0/24", "192.0.2.1", "", None)
}

/// The routes of the fake kernel to `dst`, as (gateway, oif).
fn routes_to(f: &crate::netlink::FakeNetlink, dst: &str) -> Vec<(Option<IpAddr>, Option<u32>)> {
    f.routes()
        .into_iter()
        .filter(|r| r.dst == net(dst))
        .map(|r| (r.gateway, r.oif))
        .collect()
}

/// Removes `peer`'s lease: the engine's table is empty again.
async fn remove(b: &mut dyn Running, e: &super::tunnel::fake::FakeEngine, peer: super::Lease) {
    b.apply(Batch::one(&Change::Remove(peer)))
        .await
        .expect("remove");
    assert!(e.peers().is_empty(), "{:?}", e.peers());
}

#[test]
fn vxlan_peers_carry_the_vtep_mac_and_get_a_route_each() {
    block_on(async {
        let f = fake(&[], false);
        let (engines, us) = FakeEngines::new(&f);
        let b = super::vxlan::userspace::Vxlan::new(vxlan_opts("{}"), true, false, tuning(), us);
        let mut b = up(b, &own()).await.expect("up");
        assert_eq!(b.mtu(), 1450);
        let e = engines.running("flannel.1");
        assert!(
            matches!(
                e.cfg.encap,
                Encap::Vxlan {
                    vni: 1,
                    port: 8472,
                    ..
                }
            ),
            "{:?}",
            e.cfg.encap
        );
        assert_eq!((e.cfg.mtu, e.anti), (1450, AntiSpoofing::Subnet));
        let tun = f
            .links()
            .into_values()
            .find(|l| l.link.name == "flannel.1")
            .expect("tun link");
        assert!(tun.link.up && tun.link.mtu == 1450, "{tun:?}");

        let mac = [0x02, 0, 0, 0, 0, 2];
        let data = super::vxlan::backend_data(1, mac);
        let peer = lease("10.244.2.0/24", "192.0.2.2", "vxlan", Some(&data));
        b.apply(Batch::one(&Change::Add(peer.clone())))
            .await
            .expect("add");
        // Leases the engine cannot use are skipped, not half-applied.
        let broken = lease("10.244.3.0/24", "192.0.2.3", "vxlan", Some("{\"VNI\":1}"));
        b.apply(Batch::one(&Change::Add(broken)))
            .await
            .expect("bad data");
        let other = lease("10.244.4.0/24", "192.0.2.4", "udp", None);
        b.apply(Batch::one(&Change::Add(other)))
            .await
            .expect("other type");
        assert_eq!(
            e.peers(),
            vec![Peer {
                subnet: net("10.244.2.0/24"),
                endpoint: ip("192.0.2.2"),
                vtep_mac: Some(mac),
                nat: None,
                wireguard: None,
                tunnel_gso: false,
            }]
        );
        assert_eq!(*e.tables.lock().expect("lock"), 1, "one table per batch");
        assert_eq!(
            routes_to(&f, "10.244.2.0/24"),
            vec![(None, Some(tun.link.index))]
        );
        assert!(routes_to(&f, "10.244.3.0/24").is_empty());
        assert!(routes_to(&f, "10.244.4.0/24").is_empty());

        remove(b.as_mut(), &e, peer).await;
        assert!(routes_to(&f, "10.244.2.0/24").is_empty());
        b.teardown().await;
        assert!(e.stopped.load(std::sync::atomic::Ordering::Relaxed));
    });
}

#[test]
fn vxlan_direct_routing_sends_on_link_peers_around_the_engine() {
    block_on(async {
        let f = fake(&[], false);
        let (engines, us) = FakeEngines::new(&f);
        let opts = vxlan_opts(r#"{"DirectRouting":true}"#);
        let b = super::vxlan::userspace::Vxlan::new(opts, true, false, tuning(), us);
        let mut b = up(b, &own()).await.expect("up");
        let data = super::vxlan::backend_data(1, [2, 0, 0, 0, 0, 9]);
        for (sn, pub_ip) in [
            ("10.244.2.0/24", "192.0.2.2"),
            ("10.244.3.0/24", "203.0.113.3"),
        ] {
            let l = lease(sn, pub_ip, "vxlan", Some(&data));
            b.apply(Batch::one(&Change::Add(l))).await.expect("add");
        }
        let e = engines.running("flannel.1");
        let peers: Vec<IpNet> = e.peers().iter().map(|p| p.subnet).collect();
        assert_eq!(peers, vec![net("10.244.3.0/24")], "only the off-link peer");
        assert_eq!(
            routes_to(&f, "10.244.2.0/24"),
            vec![(Some(ip("192.0.2.2")), None)]
        );
    });
}

#[test]
fn udp_peers_are_public_ips_behind_one_network_route() {
    block_on(async {
        let f = fake(&[], false);
        let (engines, us) = FakeEngines::new(&f);
        let b = super::udp::Udp::new(
            match options("udp", "{}") {
                BackendOptions::Udp(o) => o,
                other => panic!("{other:?}"),
            },
            "10.244.0.0/16".parse().expect("net"),
            tuning(),
            us,
        );
        let mut b = up(b, &own()).await.expect("up");
        assert_eq!(b.mtu(), 1472);
        let e = engines.running("flannel%d");
        assert!(
            matches!(e.cfg.encap, Encap::FlannelUdp { port: 8285 }),
            "{:?}",
            e.cfg.encap
        );
        assert_eq!(routes_to(&f, "10.244.0.0/16").len(), 1, "{:?}", f.routes());
        let peer = lease("10.244.2.0/24", "192.0.2.2", "udp", None);
        b.apply(Batch::one(&Change::Add(peer.clone())))
            .await
            .expect("add");
        assert_eq!(
            e.peers(),
            vec![Peer {
                subnet: net("10.244.2.0/24"),
                endpoint: ip("192.0.2.2"),
                vtep_mac: None,
                nat: None,
                wireguard: None,
                tunnel_gso: false,
            }]
        );
        remove(b.as_mut(), &e, peer).await;
    });
}

#[test]
fn ipip_peers_get_a_route_through_the_tun() {
    block_on(async {
        let f = fake(&[], false);
        let (engines, us) = FakeEngines::new(&f);
        let b = super::ipip::userspace::IpipUser::new(IpipOptions::default(), tuning(), us);
        let mut b = up(b, &own()).await.expect("up");
        assert_eq!(b.mtu(), 1480);
        let e = engines.running("flannel.ipip");
        let peer = lease("10.244.2.0/24", "203.0.113.2", "ipip", None);
        b.apply(Batch::one(&Change::Add(peer.clone())))
            .await
            .expect("add");
        let peers = e.peers();
        assert_eq!(peers.len(), 1, "{peers:?}");
        assert_eq!(
            (peers[0].subnet, peers[0].endpoint),
            (net("10.244.2.0/24"), ip("203.0.113.2"))
        );
        assert_eq!(routes_to(&f, "10.244.2.0/24").len(), 1, "{:?}", f.routes());
        remove(b.as_mut(), &e, peer).await;
        assert!(routes_to(&f, "10.244.2.0/24").is_empty());
    });
}

#[test]
fn wireguard_peers_carry_key_port_psk_and_keepalive() {
    block_on(async {
        let f = fake(&[], false);
        let (engines, us) = FakeEngines::new(&f);
        let dir = tempfile::tempdir().expect("tempdir");
        let psk = "GJ7tuWF3o36o0zY0Xx3jyMxXoxEpuMWpAO5D0fTvmD4=";
        let opts = wg_opts(&format!(
            r#"{{"PSK":"{psk}","PersistentKeepaliveInterval":25}}"#
        ));
        let b = super::wireguard::userspace::Wireguard::new(
            opts,
            Some("10.244.0.0/16".parse().expect("net")),
            None,
            tuning(),
            us,
        )
        .with_key_file(dir.path().join("wgkey"));
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        assert!(
            p.attrs
                .backend_data
                .is_some_and(|d| d.contains("\"Port\":51820"))
        );
        let mut b = p.backend.setup(&own()).await.expect("setup");
        assert_eq!(b.mtu(), 1420);
        let e = engines.running("flannel-wg");
        assert!(
            matches!(e.cfg.encap, Encap::WireGuard { port: 51820, .. }),
            "{:?}",
            e.cfg.encap
        );
        assert_eq!(routes_to(&f, "10.244.0.0/16").len(), 1, "{:?}", f.routes());
        let key = [7u8; 32];
        let data = super::wireguard::backend_data(&key, 51999);
        let peer = lease("10.244.2.0/24", "192.0.2.2", "wireguard", Some(&data));
        b.apply(Batch::one(&Change::Add(peer.clone())))
            .await
            .expect("add");
        // No usable key: no peer.
        let keyless = lease("10.244.3.0/24", "192.0.2.3", "wireguard", Some("{}"));
        b.apply(Batch::one(&Change::Add(keyless)))
            .await
            .expect("keyless");
        let peers = e.peers();
        assert_eq!(peers.len(), 1, "{peers:?}");
        let wg = peers[0].wireguard.clone().expect("wireguard parameters");
        assert_eq!(
            (peers[0].subnet, peers[0].endpoint),
            (
                net("10.244.2.0/24"),
                IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2))
            )
        );
        assert_eq!((wg.public_key, wg.port, wg.keepalive), (key, 51999, 25));
        assert_eq!(wg.psk, weft_engine::wg::key_from_base64(psk));
        remove(b.as_mut(), &e, peer).await;
    });
}

/// NAT traversal (docs/nat.md): the lease says so, a peer behind NAT is
/// sent to the endpoint its lease publishes with a keepalive that holds the
/// mapping, reachable peers with the feature are asked for ours; with the
/// feature off the same leases give exactly what they gave before.
#[test]
fn wireguard_nat_traversal_punches_to_published_endpoints() {
    use crate::lease::NatAttrs;
    let nat = |mut l: super::Lease, ep: Option<&str>| {
        l.attrs.weft_nat = Some(NatAttrs {
            endpoint: ep.map(|e| e.parse().expect("endpoint")),
            relay: None,
        });
        l
    };
    for on in [true, false] {
        block_on(async {
            let f = fake(&[], false);
            let (engines, us) = FakeEngines::new(&f);
            let dir = tempfile::tempdir().expect("tempdir");
            let b = super::wireguard::userspace::Wireguard::new(
                wg_opts("{}"),
                Some("10.244.0.0/16".parse().expect("net")),
                None,
                EngineTuning {
                    nat: on,
                    relay: None,
                    ..tuning()
                },
                us,
            )
            .with_key_file(dir.path().join("wgkey"));
            let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
            assert_eq!(p.attrs.weft_nat.is_some(), on);
            assert_eq!(p.attrs.to_json().ends_with(r#""WeftNAT":{}}"#), on);
            let mut b = p.backend.setup(&own()).await.expect("setup");
            let e = engines.running("flannel-wg");
            let data = super::wireguard::backend_data(&[7u8; 32], 0);
            let behind = lease("10.244.2.0/24", "10.12.0.2", "wireguard", Some(&data));
            let behind = nat(behind, Some("203.0.113.9:40001"));
            let public = lease("10.244.3.0/24", "198.51.100.3", "wireguard", Some(&data));
            let public = nat(public, None);
            for l in [behind, public] {
                b.apply(Batch::one(&Change::Add(l))).await.expect("add");
            }
            let peers = e.peers();
            let by = |s: &str| peers.iter().find(|p| p.subnet == net(s)).expect("peer");
            let (p2, p3) = (by("10.244.2.0/24"), by("10.244.3.0/24"));
            let wg2 = p2.wireguard.clone().expect("wg");
            let wg3 = p3.wireguard.clone().expect("wg");
            if on {
                assert_eq!(
                    (p2.endpoint, wg2.port, wg2.keepalive),
                    (ip("203.0.113.9"), 40001, 25)
                );
                assert_eq!(
                    (p3.endpoint, wg3.port, wg3.keepalive),
                    (ip("198.51.100.3"), 0, 0)
                );
                let servers = e.discovery.lock().expect("lock").clone();
                let want = vec!["198.51.100.3:51820".parse().expect("addr")];
                assert_eq!(servers, Some((true, want)));
                // We turn out to sit behind the same NAT: the peer is on our
                // LAN (no hairpin), chosen again at the next reconcile.
                *e.seen.lock().expect("lock") = Some("203.0.113.9:51820".parse().expect("a"));
                b.reconcile().await.expect("reconcile");
                let p2 = e
                    .peers()
                    .into_iter()
                    .find(|p| p.subnet == net("10.244.2.0/24"));
                assert_eq!(p2.map(|p| p.endpoint), Some(ip("10.12.0.2")));
            } else {
                assert_eq!(
                    (p2.endpoint, wg2.port, wg2.keepalive),
                    (ip("10.12.0.2"), 0, 0)
                );
                assert_eq!(*e.discovery.lock().expect("lock"), None);
            }
        });
    }
}

#[test]
fn an_engine_that_cannot_start_fails_setup_with_its_reason() {
    block_on(async {
        let f = fake(&[], false);
        let (engines, us) = FakeEngines::new(&f);
        engines
            .fail
            .store(true, std::sync::atomic::Ordering::Relaxed);
        let b = super::vxlan::userspace::Vxlan::new(vxlan_opts("{}"), true, false, tuning(), us);
        let e = up(b, &own()).await.expect_err("no engine");
        assert!(e.to_string().contains("/dev/net/tun"), "{e}");
    });
}

/// `--tunnel-gso`: the IPv4 engine is asked for the tunnel TAP only where
/// the node passes the checks (required with `on`), weftd configures the
/// TAP it got, and status says which and why; `on` on a node that fails a
/// check does not start.
#[test]
fn vxlan_tunnel_gso_follows_the_node() {
    use super::tunnel::gso::{TAP as TUNNEL_TAP, TunnelGso};
    use weft_engine::TunnelTap;
    block_on(async {
        let node = |offload: bool| {
            let f = fake(&[], false);
            f.set_feature("eth0", "tx-udp_tnl-segmentation", offload);
            f.set_sysctl("net/ipv4/ip_forward", "1");
            f
        };
        let start = |f: &std::sync::Arc<crate::netlink::FakeNetlink>, mode| {
            let (engines, us) = FakeEngines::new(f);
            let t = EngineTuning {
                tunnel_gso: mode,
                ..tuning()
            };
            let b = super::vxlan::userspace::Vxlan::new(vxlan_opts("{}"), true, false, t, us);
            (engines, b)
        };
        let gso = |b: &dyn Running| {
            let st = b.view().read();
            st.devices[0].tunnel_gso.clone().expect("tunnel_gso")
        };

        let f = node(true);
        let (engines, b) = start(&f, TunnelGso::Off);
        let b = up(b, &own()).await.expect("off");
        assert_eq!(engines.running("flannel.1").cfg.tunnel_tap, None);
        assert_eq!(gso(&*b).reason.as_deref(), Some("off"));

        for (mode, required) in [(TunnelGso::Auto, false), (TunnelGso::On, true)] {
            let f = node(true);
            let (engines, b) = start(&f, mode);
            let b = up(b, &own()).await.expect("passes");
            assert_eq!(
                engines.running("flannel.1").cfg.tunnel_tap,
                Some(TunnelTap {
                    name: TUNNEL_TAP.into(),
                    required
                })
            );
            let tap = f
                .links()
                .into_values()
                .find(|l| l.link.name == TUNNEL_TAP)
                .expect("tap");
            assert!(tap.link.up, "{tap:?}");
            let g = gso(&*b);
            assert_eq!((g.tap.as_deref(), g.reason), (Some(TUNNEL_TAP), None));
        }

        let f = node(false);
        let (engines, b) = start(&f, TunnelGso::Auto);
        let b = up(b, &own()).await.expect("auto falls back");
        assert_eq!(engines.running("flannel.1").cfg.tunnel_tap, None);
        let why = gso(&*b).reason.expect("reason");
        assert!(
            why.starts_with("uplink eth0 has no tx-udp_tnl-segmentation"),
            "{why}"
        );

        let f = node(false);
        let (_, b) = start(&f, TunnelGso::On);
        let e = up(b, &own()).await.expect_err("on refuses");
        assert!(
            e.to_string()
                .starts_with("--tunnel-gso=on: uplink eth0 has no tx-udp_tnl-segmentation"),
            "{e}"
        );
    });
}
