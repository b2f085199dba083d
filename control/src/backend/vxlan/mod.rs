//! The `vxlan` backend: what its two dataplanes share, so that they
//! publish byte-identical leases and size their devices alike:
//! BackendData `{"VNI":n,"VtepMAC":"..."}` ([`backend_data`],
//! [`parse_backend_data`]), the VTEP MAC ([`derive_mac`]), the MTUs
//! ([`Mtus`]). [`kernel`] runs it on the kernel's vxlan driver,
//! [`userspace`] on weft's engine; [`super::dual`] switches between them.

mod csum;
pub mod kernel;
pub mod userspace;

pub use csum::{TxCsumOffload, kernel_release};

use std::net::IpAddr;

use ipnet::IpNet;
use weft_compat::gojson;

use crate::backend::BackendError;
use crate::backend::Missing;
use crate::config::backend::VxlanOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::Route;

/// VXLAN's overhead on an IPv4 underlay: outer IPv4 20 + UDP 8 + VXLAN 8 +
/// inner Ethernet 14 (flannel's `encapOverhead`).
pub const OVERHEAD_V4: u32 = 50;
/// On an IPv6 underlay: the outer header is 40 bytes, not 20.
pub const OVERHEAD_V6: u32 = 70;

/// The MTUs of a vxlan network whose configured MTU (Backend `MTU`, else the
/// external interface's) is `cfg`, for both dataplanes.
///
/// flannel subtracts 50 for the IPv6 device too (spec §14), so a full-size
/// IPv6 pod packet leaves as a 1520-byte datagram on a 1500-byte underlay:
/// kernel vxlan answers every such packet with a Packet Too Big (pods recover
/// only where ICMPv6 gets through, after a lost round trip), and a UDP GSO
/// train of such segments is refused by the kernel outright (`EINVAL`). weft
/// subtracts 70 for `flannel-v6.<VNI>`, and `FLANNEL_MTU`, the MTU of the
/// pods' one interface for both families, is the smaller of the devices in
/// use. A peer still on −50 is unaffected: what it sends is its own PMTU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mtus {
    /// `flannel.<VNI>`.
    pub v4: u32,
    /// `flannel-v6.<VNI>`.
    pub v6: u32,
    /// `FLANNEL_MTU`.
    pub env: u32,
}

impl Mtus {
    pub fn new(cfg: u32, v6: bool) -> Mtus {
        let v4 = cfg.saturating_sub(OVERHEAD_V4);
        let v6_mtu = cfg.saturating_sub(OVERHEAD_V6);
        Mtus {
            v4,
            v6: v6_mtu,
            env: if v6 { v6_mtu } else { v4 },
        }
    }
}

/// flannel's `VXLAN config: ...` log line.
pub(super) fn log_config(opts: &VxlanOptions) {
    tracing::info!(
        "VXLAN config: VNI={} Port={} GBP={} Learning={} DirectRouting={}",
        opts.vni,
        opts.port,
        opts.gbp,
        opts.learning,
        opts.direct_routing
    );
}

/// The VTEP MACs of a node's `flannel.<VNI>` and `flannel-v6.<VNI>`.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Vteps {
    pub v4: Option<[u8; 6]>,
    pub v6: Option<[u8; 6]>,
}

/// The lease attributes of a vxlan node for the enabled families (`v4`,
/// `v6`), and its VTEP MACs: each taken from `prev` (this node's previous
/// lease) when that has one for `vni`, else derived from the public IP.
pub(super) fn lease_attrs(
    vni: u32,
    ext: &ExternalInterface,
    prev: Option<&Lease>,
    v4: bool,
    v6: bool,
) -> Result<(LeaseAttrs, Vteps), BackendError> {
    let reuse = |d: Option<&String>| {
        d.and_then(|d| parse_backend_data(d))
            .filter(|(v, _)| *v == vni)
            .map(|(_, m)| m)
    };
    let mut attrs = LeaseAttrs {
        backend_type: "vxlan".into(),
        ..Default::default()
    };
    let mut vteps = Vteps::default();
    if v4 {
        let ip = ext.ext_addr.ok_or(BackendError::Missing {
            backend: "vxlan",
            what: Missing::PublicV4,
        })?;
        let mac = reuse(prev.and_then(|p| p.attrs.backend_data.as_ref()))
            .unwrap_or_else(|| derive_mac(ip.into(), vni, 4));
        attrs.public_ip = ip;
        attrs.backend_data = Some(backend_data(vni, mac));
        vteps.v4 = Some(mac);
    }
    if v6 {
        let ip = ext.ext_v6_addr.ok_or(BackendError::Missing {
            backend: "vxlan",
            what: Missing::PublicV6,
        })?;
        let mac = reuse(prev.and_then(|p| p.attrs.backend_v6_data.as_ref()))
            .unwrap_or_else(|| derive_mac(ip.into(), vni, 6));
        attrs.public_ipv6 = Some(ip);
        attrs.backend_v6_data = Some(backend_data(vni, mac));
        vteps.v6 = Some(mac);
    }
    Ok((attrs, vteps))
}

/// One address family of a peer's vxlan lease.
#[derive(Debug)]
pub(super) struct Target<'a> {
    pub subnet: IpNet,
    pub public: Option<IpAddr>,
    pub data: Option<&'a String>,
}

impl Target<'_> {
    /// The peer's VTEP MAC from its BackendData (an undecodable one is logged).
    pub fn vtep_mac(&self) -> Option<[u8; 6]> {
        let mac = self
            .data
            .and_then(|d| parse_backend_data(d))
            .map(|(_, m)| m);
        if mac.is_none() {
            tracing::error!(
                "error decoding subnet lease JSON for {}: {:?}",
                self.subnet,
                self.data
            );
        }
        mac
    }
}

/// What `change` asks of a vxlan backend: whether it adds the peer, and
/// the families of its lease that have a subnet (IPv4 first). `None` for a
/// lease of another backend type being added (logged and ignored, as
/// flannel does).
pub(super) fn peer_change(change: &Change) -> Option<(bool, Vec<Target<'_>>)> {
    let (lease, add) = match change {
        Change::Add(l) => (l, true),
        Change::Remove(l) => (l, false),
    };
    if add && lease.attrs.backend_type != "vxlan" {
        tracing::info!(
            "ignoring non-vxlan v4Subnet({:?}) v6Subnet({:?}): type={}",
            lease.subnet,
            lease.ipv6_subnet,
            lease.attrs.backend_type
        );
        return None;
    }
    let a = &lease.attrs;
    let v4 = lease.subnet.map(|s| Target {
        subnet: IpNet::V4(s),
        public: Some(IpAddr::V4(a.public_ip)),
        data: a.backend_data.as_ref(),
    });
    let v6 = lease.ipv6_subnet.map(|s| Target {
        subnet: IpNet::V6(s),
        public: a.public_ipv6.map(IpAddr::V6),
        data: a.backend_v6_data.as_ref(),
    });
    Some((add, [v4, v6].into_iter().flatten().collect()))
}

/// DirectRouting's plain route to a peer's subnet via its public IP (`gw`;
/// `None`: any route to `subnet`, to delete it).
pub(super) fn direct_route(subnet: IpNet, gw: Option<IpAddr>) -> Route {
    Route {
        dst: subnet,
        gateway: gw,
        oif: None,
        onlink: false,
        scope_link: false,
    }
}

/// flannel's `vxlanLeaseAttrs` text: exactly `{"VNI":n,"VtepMAC":"xx:..."}`.
pub fn backend_data(vni: u32, mac: [u8; 6]) -> String {
    format!("{{\"VNI\":{vni},\"VtepMAC\":\"{}\"}}", fmt_mac(mac))
}

/// Lower-case, colon-separated, as Go's `net.HardwareAddr.String()`.
pub fn fmt_mac(m: [u8; 6]) -> String {
    format!(
        "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
        m[0], m[1], m[2], m[3], m[4], m[5]
    )
}

/// Parses BackendData (Go JSON rules): `(VNI, VtepMAC)`.
pub fn parse_backend_data(text: &str) -> Option<(u32, [u8; 6])> {
    let mut m = gojson::parse_object(text.as_bytes()).ok()?;
    let vni = gojson::take::<u32>(&mut m, "vni").ok()?.unwrap_or(0);
    let mac = gojson::take::<String>(&mut m, "vtepmac").ok()??;
    Some((vni, parse_mac(&mac)?))
}

fn parse_mac(s: &str) -> Option<[u8; 6]> {
    let mut out = [0u8; 6];
    let mut parts = s.split([':', '-']);
    for b in &mut out {
        *b = u8::from_str_radix(parts.next()?, 16).ok()?;
    }
    parts.next().is_none().then_some(out)
}

/// A stable, locally administered unicast MAC for (`ip`, `vni`) (FNV-1a).
pub fn derive_mac(ip: IpAddr, vni: u32, family: u8) -> [u8; 6] {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |b: u8| {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    };
    for b in b"weft-vtep" {
        eat(*b);
    }
    match ip {
        IpAddr::V4(a) => a.octets().iter().for_each(|b| eat(*b)),
        IpAddr::V6(a) => a.octets().iter().for_each(|b| eat(*b)),
    }
    vni.to_be_bytes().iter().for_each(|b| eat(*b));
    eat(family);
    let b = h.to_be_bytes();
    [(b[0] & 0xfe) | 0x02, b[1], b[2], b[3], b[4], b[5]]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ipv6_devices_leave_room_for_the_ipv6_outer_header() {
        // IPv4 only: flannel's figures.
        assert_eq!(
            Mtus::new(1500, false),
            Mtus {
                v4: 1450,
                v6: 1430,
                env: 1450
            }
        );
        // IPv6 only or dual stack: a 1430-byte pod packet is a 1500-byte
        // datagram on the IPv6 underlay; the pods' MTU is the smaller one.
        assert_eq!(
            Mtus::new(1500, true),
            Mtus {
                v4: 1450,
                v6: 1430,
                env: 1430
            }
        );
        assert_eq!(Mtus::new(9001, true).env, 9001 - 70);
        assert_eq!(
            Mtus::new(40, true),
            Mtus {
                v4: 0,
                v6: 0,
                env: 0
            }
        );
    }

    #[test]
    fn backend_data_is_flannels_bytes() {
        let m = [0xc6, 0xd2, 0x32, 0x6f, 0x8f, 0x44];
        assert_eq!(
            backend_data(1, m),
            r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}"#
        );
        assert_eq!(
            parse_backend_data(r#"{"vni":7,"vtepmac":"C6:D2:32:6F:8F:44"}"#),
            Some((7, m))
        );
        assert_eq!(
            parse_backend_data(r#"{"VNI":"1","VtepMAC":"c6:d2:32:6f:8f:44"}"#),
            None
        );
        assert_eq!(
            parse_backend_data(r#"{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f"}"#),
            None
        );
        assert_eq!(parse_backend_data("null"), None);
    }

    #[test]
    fn derived_macs_are_stable_local_unicast_and_distinct() {
        let a = derive_mac("192.0.2.1".parse().expect("ip"), 1, 4);
        assert_eq!(a, derive_mac("192.0.2.1".parse().expect("ip"), 1, 4));
        assert_ne!(a, derive_mac("192.0.2.2".parse().expect("ip"), 1, 4));
        assert_ne!(a, derive_mac("192.0.2.1".parse().expect("ip"), 2, 4));
        assert_eq!(a[0] & 0x03, 0x02, "locally administered unicast");
    }
}
