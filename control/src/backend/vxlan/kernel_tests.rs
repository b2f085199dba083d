//! Kernel vxlan against the fake netlink: the exact requests flannel makes.

use std::net::IpAddr;

use super::*;
use crate::backend::test_util::{attrs_of, block_on, ext, fake, lease};
use crate::backend::vxlan::userspace::Vxlan;
use crate::backend::vxlan::{TxCsumOffload, backend_data, derive_mac};
use crate::backend::{EngineTuning, Running};
use crate::netlink::{Client, FakeNetlink, Op, VxlanAttrs};

fn opts(direct: bool) -> VxlanOptions {
    VxlanOptions {
        vni: 1,
        port: 0,
        mtu: 0,
        gbp: false,
        learning: false,
        direct_routing: direct,
    }
}

const PEER_MAC: [u8; 6] = [0x0e, 0xaa, 0xbb, 0xcc, 0xdd, 0x02];

fn peer(subnet: &str, public: &str) -> Lease {
    lease(subnet, public, "vxlan", Some(&backend_data(1, PEER_MAC)))
}

/// A backend set up for 10.244.1.0/24 on the fake; returns it, the fake and the device index.
async fn up(direct: bool) -> (Box<dyn Running>, Arc<FakeNetlink>, u32) {
    let f = fake(&["vxlan"], false);
    let b = KernelVxlan::new(opts(direct), true, false, f.clone());
    let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
    let attrs = p.attrs.clone();
    let mut own = lease("10.244.1.0/24", "192.0.2.1", "vxlan", None);
    own.attrs = attrs;
    let b = p.backend.setup(&own).await.expect("setup");
    assert_eq!(b.mtu(), 1450);
    let index = f
        .links()
        .values()
        .find(|d| d.link.name == "flannel.1")
        .expect("device")
        .link
        .index;
    (b, f, index)
}

#[test]
fn device_is_created_as_flannel_does() {
    block_on(async {
        let (_b, f, idx) = up(false).await;
        let mac = derive_mac("192.0.2.1".parse().expect("ip"), 1, 4);
        assert_eq!(
            f.ops(),
            vec![
                Op::AddLink(LinkSpec::Vxlan(VxlanLink {
                    name: "flannel.1".into(),
                    vni: 1,
                    vtep_index: 2,
                    local: "192.0.2.1".parse().expect("ip"),
                    port: 0,
                    learning: false,
                    gbp: false,
                    mtu: 1450,
                    mac,
                })),
                Op::Sysctl("net/ipv6/conf/flannel.1/accept_ra".into(), "0".into()),
                Op::AddAddr(idx, "10.244.1.0/32".parse().expect("net")),
                Op::LinkUp(idx, None),
            ]
        );
    });
}

#[test]
fn lease_is_byte_identical_to_the_userspace_backend() {
    block_on(async {
        let f = fake(&["vxlan"], false);
        let (_, us) = crate::backend::tunnel::fake::FakeEngines::new(&fake(&[], false));
        let tuning = EngineTuning {
            nat: false,
            relay: None,
            tunnel_gso: Default::default(),
            workers: 1,
            offload: false,
            anti_spoof: weft_engine::AntiSpoofing::Strict,
        };
        let k = || KernelVxlan::new(opts(false), true, false, f.clone());
        let u = || Vxlan::new(opts(false), true, false, tuning, us.clone());
        let (ka, ua) = (
            attrs_of(k(), None).await.expect("k"),
            attrs_of(u(), None).await.expect("u"),
        );
        assert_eq!(ka, ua);
        assert_eq!(ka.to_json(), ua.to_json());
        // With a previous lease, both keep its MAC.
        let prev = lease(
            "10.244.1.0/24",
            "192.0.2.1",
            "vxlan",
            Some(&backend_data(1, PEER_MAC)),
        );
        let (ka, ua) = (
            attrs_of(k(), Some(&prev)).await.expect("k"),
            attrs_of(u(), Some(&prev)).await.expect("u"),
        );
        assert_eq!(
            ka.backend_data.as_deref(),
            Some(r#"{"VNI":1,"VtepMAC":"0e:aa:bb:cc:dd:02"}"#)
        );
        assert_eq!(ka, ua);
    });
}

#[test]
fn peer_gets_neighbour_fdb_and_onlink_route_in_order_and_loses_them() {
    block_on(async {
        let (mut b, f, idx) = up(false).await;
        f.take_ops();
        let p = peer("10.244.2.0/24", "192.0.2.2");
        b.apply(Batch::one(&Change::Add(p.clone())))
            .await
            .expect("add");
        let gw: IpAddr = "10.244.2.0".parse().expect("ip");
        let neigh = Neigh {
            index: idx,
            ip: gw,
            mac: PEER_MAC,
        };
        let fdb = Fdb {
            index: idx,
            mac: PEER_MAC,
            dst: "192.0.2.2".parse().expect("ip"),
        };
        let route = Route {
            dst: "10.244.2.0/24".parse().expect("net"),
            gateway: Some(gw),
            oif: Some(idx),
            onlink: true,
            scope_link: false,
        };
        assert_eq!(
            f.take_ops(),
            vec![
                Op::NeighReplace(neigh.clone()),
                Op::FdbReplace(fdb.clone()),
                Op::RouteReplace(route.clone())
            ]
        );
        b.apply(Batch::one(&Change::Remove(p)))
            .await
            .expect("remove");
        assert_eq!(
            f.take_ops(),
            vec![Op::NeighDel(neigh), Op::FdbDel(fdb), Op::RouteDel(route)]
        );
        assert!(f.routes().is_empty() && f.all_neighs().is_empty() && f.all_fdbs().is_empty());
    });
}

#[test]
fn other_backend_types_and_bad_data_are_ignored() {
    block_on(async {
        let (mut b, f, _) = up(false).await;
        f.take_ops();
        b.apply(Batch::one(&Change::Add(lease(
            "10.244.3.0/24",
            "192.0.2.3",
            "host-gw",
            None,
        ))))
        .await
        .expect("apply");
        b.apply(Batch::one(&Change::Add(lease(
            "10.244.4.0/24",
            "192.0.2.4",
            "vxlan",
            Some(r#"{"VNI":1}"#),
        ))))
        .await
        .expect("apply");
        assert_eq!(f.take_ops(), vec![]);
    });
}

#[test]
fn direct_routing_uses_a_plain_route_for_on_link_peers_only() {
    block_on(async {
        let (mut b, f, idx) = up(true).await;
        f.take_ops();
        b.apply(Batch::one(&Change::Add(peer("10.244.2.0/24", "192.0.2.2"))))
            .await
            .expect("add");
        let direct = Route {
            dst: "10.244.2.0/24".parse().expect("net"),
            gateway: Some("192.0.2.2".parse().expect("ip")),
            oif: None,
            onlink: false,
            scope_link: false,
        };
        assert_eq!(f.take_ops(), vec![Op::RouteReplace(direct.clone())]);
        // A peer behind a router gets the three vxlan entries.
        b.apply(Batch::one(&Change::Add(peer(
            "10.244.3.0/24",
            "198.51.100.3",
        ))))
        .await
        .expect("add");
        let ops = f.take_ops();
        assert_eq!(ops.len(), 3, "{ops:?}");
        assert!(matches!(&ops[2], Op::RouteReplace(r) if r.oif == Some(idx) && r.onlink));
        b.apply(Batch::one(&Change::Remove(peer(
            "10.244.2.0/24",
            "192.0.2.2",
        ))))
        .await
        .expect("remove");
        assert_eq!(f.take_ops(), vec![Op::RouteDel(direct)]);
    });
}

#[test]
fn reconcile_restores_deleted_neighbour_fdb_and_route() {
    block_on(async {
        let (mut b, f, _) = up(false).await;
        b.apply(Batch::one(&Change::Add(peer("10.244.2.0/24", "192.0.2.2"))))
            .await
            .expect("add");
        let (routes, neighs, fdbs) = (f.routes(), f.all_neighs(), f.all_fdbs());
        b.reconcile().await.expect("reconcile");
        f.take_ops();
        b.reconcile().await.expect("reconcile");
        assert!(f.take_ops().is_empty(), "nothing missing, nothing written");
        f.forget_route("10.244.2.0/24".parse().expect("net"));
        f.forget_neigh("10.244.2.0".parse().expect("ip"));
        f.forget_fdb("192.0.2.2".parse().expect("ip"));
        b.reconcile().await.expect("reconcile");
        assert_eq!(
            (f.routes(), f.all_neighs(), f.all_fdbs()),
            (routes, neighs, fdbs)
        );
        assert_eq!(f.take_ops().len(), 3);
    });
}

#[test]
fn deleted_device_is_recreated_with_its_peers() {
    block_on(async {
        let (mut b, f, idx) = up(false).await;
        b.apply(Batch::one(&Change::Add(peer("10.244.2.0/24", "192.0.2.2"))))
            .await
            .expect("add");
        f.delete_link(idx).await.expect("delete by hand");
        assert!(f.routes().is_empty());
        b.reconcile().await.expect("reconcile");
        let new = f
            .links()
            .values()
            .find(|d| d.link.name == "flannel.1")
            .expect("recreated")
            .link
            .index;
        assert_ne!(new, idx);
        assert_eq!(f.routes().len(), 1);
        assert_eq!(f.routes()[0].oif, Some(new));
        assert_eq!(f.all_fdbs().len(), 1);
        assert_eq!(f.all_neighs()[0].index, new);
    });
}

#[test]
fn compatible_device_is_reused_and_incompatible_recreated() {
    block_on(async {
        let mac = derive_mac("192.0.2.1".parse().expect("ip"), 1, 4);
        let attrs = |vni| VxlanAttrs {
            vni,
            vtep_index: 2,
            local: Some("192.0.2.1".parse().expect("ip")),
            port: 8472,
            ..Default::default()
        };
        for (vni, reused) in [(1, true), (2, false)] {
            let f = fake(&["vxlan"], false);
            let old = f.insert_link("flannel.1", LinkKind::Vxlan(attrs(vni)), 1450, Some(mac));
            let b = KernelVxlan::new(opts(false), true, false, f.clone());
            let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
            let _b = p
                .backend
                .setup(&lease("10.244.1.0/24", "192.0.2.1", "vxlan", None))
                .await
                .expect("setup");
            let ops = f.ops();
            assert_eq!(
                !ops.iter().any(|o| matches!(o, Op::AddLink(_))),
                reused,
                "vni {vni}: {ops:?}"
            );
            assert_eq!(ops.contains(&Op::DelLink(old)), !reused);
        }
        // A non-vxlan link of that name (e.g. a leftover TUN) is replaced too.
        let f = fake(&["vxlan"], false);
        f.insert_link("flannel.1", LinkKind::Tun, 1450, None);
        let b = KernelVxlan::new(opts(false), true, false, f.clone());
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let _b = p
            .backend
            .setup(&lease("10.244.1.0/24", "192.0.2.1", "vxlan", None))
            .await
            .expect("setup");
        assert!(matches!(
            f.links()
                .values()
                .find(|d| d.link.name == "flannel.1")
                .map(|d| &d.kind),
            Some(LinkKind::Vxlan(_))
        ));
    });
}

#[test]
fn remove_all_deletes_the_device_but_teardown_keeps_it() {
    block_on(async {
        let (mut b, f, idx) = up(false).await;
        b.teardown().await;
        assert!(f.links().contains_key(&idx));
        b.remove_all().await;
        assert!(!f.links().contains_key(&idx));
    });
}

/// Regression (chaos run, issue 22): a weftd SIGKILLed and restarted kept
/// the routes, fdb entries and neighbours of leases deleted while it was
/// down (the device outlives the process; only known peers were touched).
/// Applying the first snapshot removes them and keeps the rest.
#[test]
fn prune_removes_state_of_peers_that_went_while_no_weftd_ran() {
    block_on(async {
        let (mut old, f, idx) = up(false).await;
        let other = lease(
            "10.244.3.0/24",
            "192.0.2.3",
            "vxlan",
            Some(&backend_data(1, [0x0e, 0xaa, 0xbb, 0xcc, 0xdd, 0x03])),
        );
        for l in [peer("10.244.2.0/24", "192.0.2.2"), other] {
            old.apply(Batch::one(&Change::Add(l))).await.expect("add");
        }
        drop(old); // SIGKILL: the device and its entries stay.
        let b = KernelVxlan::new(opts(false), true, false, f.clone());
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let attrs = p.attrs.clone();
        let mut own = lease("10.244.1.0/24", "192.0.2.1", "vxlan", None);
        own.attrs = attrs;
        let mut b = p.backend.setup(&own).await.expect("setup");
        // The snapshot holds 10.244.2.0/24 only: 10.244.3.0/24 went meanwhile.
        b.apply(Batch::one(&Change::Add(peer("10.244.2.0/24", "192.0.2.2"))))
            .await
            .expect("add");
        f.take_ops();
        b.apply(Batch::snapshot(&[])).await.expect("prune");
        let gone: IpAddr = "10.244.3.0".parse().expect("ip");
        let routes: Vec<String> = f.routes().iter().map(|r| r.dst.to_string()).collect();
        assert_eq!(routes, ["10.244.2.0/24"]);
        let fdbs: Vec<String> = f.all_fdbs().iter().map(|x| x.dst.to_string()).collect();
        assert_eq!(fdbs, ["192.0.2.2"]);
        assert!(
            f.all_neighs()
                .iter()
                .all(|n| n.ip != gone && n.index == idx)
        );
        assert_eq!(f.all_neighs().len(), 1);
        // Nothing known is touched; a second prune does nothing.
        b.apply(Batch::snapshot(&[])).await.expect("prune again");
        let ops = f.take_ops();
        assert_eq!(
            ops.len(),
            3,
            "one delete each for route, fdb, neighbour: {ops:?}"
        );
    });
}

#[test]
fn checksum_offload_is_set_where_the_flag_wants_it_and_kept_so() {
    block_on(async {
        for (policy, release, want) in [
            (TxCsumOffload::Auto, "4.19.0-27-amd64", Some(false)),
            (TxCsumOffload::Auto, "6.18.1", None),
            (TxCsumOffload::Off, "6.18.1", Some(false)),
        ] {
            let f = fake(&["vxlan"], false);
            let b =
                KernelVxlan::new(opts(false), true, false, f.clone()).with_tx_csum(policy, release);
            let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
            let mut own = lease("10.244.1.0/24", "192.0.2.1", "vxlan", None);
            own.attrs = p.attrs.clone();
            let mut b = p.backend.setup(&own).await.expect("setup");
            let set = |f: &FakeNetlink| {
                f.ops()
                    .into_iter()
                    .filter(|o| matches!(o, Op::TxChecksum(..)))
                    .collect::<Vec<_>>()
            };
            let expect: Vec<Op> = want
                .map(|on| Op::TxChecksum("flannel.1".into(), on))
                .into_iter()
                .collect();
            assert_eq!(set(&f), expect, "{policy:?} on {release}");
            // Turned back on by hand: the reconcile turns it off again.
            if want == Some(false) {
                f.set_tx_checksum("flannel.1", true).await.expect("by hand");
                b.reconcile().await.expect("reconcile");
                let ops = set(&f);
                assert_eq!(
                    ops.last(),
                    Some(&Op::TxChecksum("flannel.1".into(), false)),
                    "{ops:?}"
                );
                assert_eq!(ops.len(), 3);
                b.reconcile().await.expect("reconcile");
                assert_eq!(
                    set(&f).len(),
                    3,
                    "a reconcile with nothing to do changed it"
                );
            }
        }
    });
}
