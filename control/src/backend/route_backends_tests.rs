//! host-gw, ipip and ipsec against the fake netlink: exact requests.

use std::sync::Arc;

use crate::backend::host_gw::{HostGw, NAT_ERROR};
use crate::backend::ipip::kernel::Ipip;
use crate::backend::ipsec::Ipsec;
use crate::backend::probe::{Capability, kernel_has};
use crate::backend::test_util::{block_on, ext, fake, lease};
use crate::backend::{Backend, Batch};
use crate::config::backend::{IpipOptions, IpsecOptions};
use crate::lease::watcher::Change;
use crate::netlink::{Client, IpipLink, LinkKind, LinkSpec, Op, Route, XfrmDir, XfrmPolicy};

fn route(dst: &str, gw: &str, oif: u32, onlink: bool) -> Route {
    Route {
        dst: dst.parse().expect("net"),
        gateway: Some(gw.parse().expect("ip")),
        oif: Some(oif),
        onlink,
        scope_link: false,
    }
}

#[test]
fn host_gw_refuses_nat_with_flannels_message() {
    block_on(async {
        let mut e = ext();
        e.ext_addr = Some("203.0.113.9".parse().expect("ip"));
        let b = || Box::new(HostGw::new(true, false, fake(&[], false)));
        let err = b().lease_attrs(&e, None).await.expect_err("nat");
        assert_eq!(err.to_string(), NAT_ERROR);
        let attrs = b().lease_attrs(&ext(), None).await.expect("attrs").attrs;
        assert_eq!(
            attrs.to_json(),
            r#"{"PublicIP":"192.0.2.1","PublicIPv6":null,"BackendType":"host-gw"}"#
        );
    });
}

#[test]
fn host_gw_routes_via_the_peer_on_the_external_interface() {
    block_on(async {
        let f = fake(&[], false);
        let b = HostGw::new(true, false, f.clone());
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let mut b = p
            .backend
            .setup(&lease("10.244.1.0/24", "192.0.2.1", "host-gw", None))
            .await
            .expect("setup");
        assert_eq!(b.mtu(), 1500);
        let p = lease("10.244.2.0/24", "192.0.2.2", "host-gw", None);
        b.apply(Batch::one(&Change::Add(p.clone())))
            .await
            .expect("add");
        let r = route("10.244.2.0/24", "192.0.2.2", 2, false);
        assert_eq!(f.take_ops(), vec![Op::RouteReplace(r.clone())]);
        // An identical route is skipped; a different one is replaced.
        b.apply(Batch::one(&Change::Add(p.clone())))
            .await
            .expect("again");
        assert_eq!(f.take_ops(), vec![]);
        let moved = lease("10.244.2.0/24", "192.0.2.7", "host-gw", None);
        b.apply(Batch::one(&Change::Add(moved)))
            .await
            .expect("moved");
        let r7 = route("10.244.2.0/24", "192.0.2.7", 2, false);
        assert_eq!(
            f.take_ops(),
            vec![Op::RouteDel(r.clone()), Op::RouteReplace(r7.clone())]
        );
        // Deleted by hand: back after one reconcile.
        f.forget_route("10.244.2.0/24".parse().expect("net"));
        b.reconcile().await.expect("reconcile");
        assert_eq!(f.routes(), vec![r7.clone()]);
        // Non-host-gw leases are ignored; removal deletes.
        f.take_ops();
        b.apply(Batch::one(&Change::Add(lease(
            "10.244.3.0/24",
            "192.0.2.3",
            "vxlan",
            None,
        ))))
        .await
        .expect("ignored");
        assert_eq!(f.take_ops(), vec![]);
        b.apply(Batch::one(&Change::Remove(p)))
            .await
            .expect("remove");
        assert_eq!(f.take_ops(), vec![Op::RouteDel(r7)]);
        assert!(f.routes().is_empty());
    });
}

#[test]
fn ipip_device_and_onlink_routes_as_flannel() {
    block_on(async {
        let f = fake(&["ipip"], false);
        let b = Ipip::new(
            IpipOptions {
                direct_routing: false,
            },
            f.clone(),
        );
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let attrs = p.attrs.clone();
        assert_eq!(
            attrs.to_json(),
            r#"{"PublicIP":"192.0.2.1","PublicIPv6":null,"BackendType":"ipip"}"#
        );
        let mut b = p
            .backend
            .setup(&lease("10.244.1.0/24", "192.0.2.1", "ipip", None))
            .await
            .expect("setup");
        assert_eq!(b.mtu(), 1480);
        let idx = f
            .links()
            .values()
            .find(|d| d.link.name == "flannel.ipip")
            .expect("dev")
            .link
            .index;
        assert_eq!(
            f.take_ops(),
            vec![
                Op::AddLink(LinkSpec::Ipip(IpipLink {
                    name: "flannel.ipip".into(),
                    local: "192.0.2.1".parse().expect("ip")
                })),
                Op::AddAddr(idx, "10.244.1.0/32".parse().expect("net")),
                Op::LinkUp(idx, None),
            ]
        );
        b.apply(Batch::one(&Change::Add(lease(
            "10.244.2.0/24",
            "192.0.2.2",
            "ipip",
            None,
        ))))
        .await
        .expect("add");
        assert_eq!(
            f.take_ops(),
            vec![Op::RouteReplace(route(
                "10.244.2.0/24",
                "192.0.2.2",
                idx,
                true
            ))]
        );
        f.forget_route("10.244.2.0/24".parse().expect("net"));
        b.reconcile().await.expect("reconcile");
        assert_eq!(
            f.routes(),
            vec![route("10.244.2.0/24", "192.0.2.2", idx, true)]
        );
    });
}

#[test]
fn ipip_direct_routing_and_device_checks() {
    block_on(async {
        let f = fake(&["ipip"], false);
        let b = Ipip::new(
            IpipOptions {
                direct_routing: true,
            },
            f.clone(),
        );
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let mut b = p
            .backend
            .setup(&lease("10.244.1.0/24", "192.0.2.1", "ipip", None))
            .await
            .expect("setup");
        let idx = f
            .links()
            .values()
            .find(|d| d.link.name == "flannel.ipip")
            .expect("dev")
            .link
            .index;
        f.take_ops();
        b.apply(Batch::one(&Change::Add(lease(
            "10.244.2.0/24",
            "192.0.2.2",
            "ipip",
            None,
        ))))
        .await
        .expect("on link");
        b.apply(Batch::one(&Change::Add(lease(
            "10.244.3.0/24",
            "198.51.100.3",
            "ipip",
            None,
        ))))
        .await
        .expect("routed");
        assert_eq!(
            f.take_ops(),
            vec![
                Op::RouteReplace(route("10.244.2.0/24", "192.0.2.2", 2, true)),
                Op::RouteReplace(route("10.244.3.0/24", "198.51.100.3", idx, true)),
            ]
        );
        // A non-ipip device with the name is an error; a mismatched ipip one is recreated.
        let f = fake(&["ipip"], false);
        f.insert_link("flannel.ipip", LinkKind::Tun, 1480, None);
        let b = Ipip::new(IpipOptions::default(), f.clone());
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let e = p
            .backend
            .setup(&lease("10.244.1.0/24", "192.0.2.1", "ipip", None))
            .await
            .expect_err("not ipip");
        assert_eq!(e.to_string(), "flannel.ipip isn't an ipip mode device");
        let f = fake(&["ipip"], false);
        let old = f.insert_link(
            "flannel.ipip",
            LinkKind::Ipip {
                local: Some("192.0.2.99".parse().expect("ip")),
                remote: None,
            },
            1480,
            None,
        );
        let b = Ipip::new(IpipOptions::default(), f.clone());
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let _b = p
            .backend
            .setup(&lease("10.244.1.0/24", "192.0.2.1", "ipip", None))
            .await
            .expect("setup");
        assert!(f.ops().contains(&Op::DelLink(old)));
    });
}

fn ipsec_opts() -> IpsecOptions {
    IpsecOptions {
        psk: "x".repeat(96).into(),
        udp_encap: false,
        esp_proposal: "aes128gcm16-sha256-prfsha256-ecp256".into(),
    }
}

#[test]
fn ipsec_installs_out_in_fwd_policies_with_reqid_11() {
    block_on(async {
        let f = fake(&[], true);
        let b = Ipsec::new(ipsec_opts(), f.clone())
            .with_ike(Box::new(crate::backend::test_util::RecordingIke::default()));
        let p = Box::new(b).lease_attrs(&ext(), None).await.expect("attrs");
        let attrs = p.attrs.clone();
        assert_eq!(
            attrs.to_json(),
            r#"{"PublicIP":"192.0.2.1","PublicIPv6":null,"BackendType":"ipsec"}"#
        );
        let mut own = lease("10.244.1.0/24", "192.0.2.1", "ipsec", None);
        own.attrs = attrs;
        let mut b = p.backend.setup(&own).await.expect("setup");
        assert_eq!(b.mtu(), 1423);
        let p = lease("10.244.2.0/24", "192.0.2.2", "ipsec", None);
        b.apply(Batch::one(&Change::Add(p.clone())))
            .await
            .expect("add");
        let pol = |src: &str, dst: &str, ts: &str, td: &str, dir| XfrmPolicy {
            src: src.parse().expect("net"),
            dst: dst.parse().expect("net"),
            dir,
            tmpl_src: ts.parse().expect("ip"),
            tmpl_dst: td.parse().expect("ip"),
            reqid: 11,
        };
        let want = vec![
            pol(
                "10.244.1.0/24",
                "10.244.2.0/24",
                "192.0.2.1",
                "192.0.2.2",
                XfrmDir::Out,
            ),
            pol(
                "10.244.2.0/24",
                "10.244.1.0/24",
                "192.0.2.2",
                "192.0.2.1",
                XfrmDir::In,
            ),
            pol(
                "10.244.2.0/24",
                "10.244.1.0/24",
                "192.0.2.2",
                "192.0.2.1",
                XfrmDir::Fwd,
            ),
        ];
        assert_eq!(
            f.take_ops(),
            want.iter()
                .cloned()
                .map(Op::PolicyUpdate)
                .collect::<Vec<_>>()
        );
        f.forget_policy(&want[1]);
        b.reconcile().await.expect("reconcile");
        assert_eq!(f.take_ops(), vec![Op::PolicyUpdate(want[1].clone())]);
        b.apply(Batch::one(&Change::Remove(p)))
            .await
            .expect("remove");
        assert_eq!(
            f.take_ops(),
            want.into_iter().map(Op::PolicyDel).collect::<Vec<_>>()
        );
        assert!(f.policies().is_empty());
    });
}

#[test]
fn probes_create_and_remove_a_throwaway_link() {
    block_on(async {
        let f = fake(&["vxlan"], true);
        assert!(
            kernel_has(Capability::Vxlan, &*f, &*f)
                .await
                .expect("vxlan")
        );
        assert!(!kernel_has(Capability::Ipip, &*f, &*f).await.expect("ipip"));
        assert!(
            !kernel_has(Capability::Wireguard, &*f, &*f)
                .await
                .expect("wg")
        );
        assert!(kernel_has(Capability::Esp, &*f, &*f).await.expect("esp"));
        assert_eq!(f.links().len(), 2, "nothing left behind");
        let ops = f.take_ops();
        assert!(matches!(&ops[0], Op::AddLink(LinkSpec::Vxlan(v)) if v.name == "weftprobe-vx"));
        assert!(matches!(ops[1], Op::DelLink(_)));
        let no_esp = fake(&[], false);
        assert!(
            !kernel_has(Capability::Esp, &*no_esp, &*no_esp)
                .await
                .expect("esp")
        );
        let _: Arc<dyn Client> = f;
    });
}
