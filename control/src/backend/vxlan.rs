//! The `vxlan` backend on weft's userspace engine, wire-compatible with
//! Linux kernel vxlan peers configured the way flannel configures them
//! (spec §2.2, §4): VNI (default 1), UDP port 8472, inner Ethernet from our
//! VTEP MAC to the peer's, lease BackendData `{"VNI":1,"VtepMAC":"..."}`.
//!
//! Devices are TUNs named like flannel's: `flannel.<VNI>` (IPv4) and
//! `flannel-v6.<VNI>` (IPv6), each with `<subnet IP>/32` (`/128`), the MTUs
//! of [`Mtus`] (cfg.MTU − 50 for IPv4, − 70 for IPv6), and one route per peer subnet. With DirectRouting, a peer on
//! the same link is reached by a plain route via its public IP, as flannel does.
//!
//! The VTEP MAC persists across restarts (flannel loses it in etcd mode): it
//! is taken from this node's previous lease when that has one, else derived
//! from the node's public IP and the VNI, so it is stable without state.

use std::net::IpAddr;

use async_trait::async_trait;
use ipnet::IpNet;
use weft_compat::gojson;
use weft_engine::{Encap, EngineConfig};

use super::tunnel::{Tunnel, Userspace};
use super::{Backend, BackendError, Dataplane, EngineTuning};
use crate::config::backend::VxlanOptions;
use crate::iface::ExternalInterface;
use crate::lease::watcher::Change;
use crate::lease::{Lease, LeaseAttrs};
use crate::netlink::Route;

/// One address family's device.
#[derive(Debug)]
struct Family {
    mac: [u8; 6],
    tunnel: Option<Tunnel>,
}

/// See the module docs.
#[derive(Debug)]
pub struct Vxlan {
    opts: VxlanOptions,
    v4: Option<Family>,
    v6: Option<Family>,
    ext: Option<ExternalInterface>,
    tuning: EngineTuning,
    us: Userspace,
    /// Direct routes installed for on-link peers (DirectRouting).
    direct: Vec<Route>,
}

impl Vxlan {
    /// A userspace vxlan backend for the enabled families.
    pub fn new(
        opts: VxlanOptions,
        v4: bool,
        v6: bool,
        tuning: EngineTuning,
        us: Userspace,
    ) -> Vxlan {
        let fam = |on: bool| {
            on.then_some(Family {
                mac: [0; 6],
                tunnel: None,
            })
        };
        Vxlan {
            opts,
            v4: fam(v4),
            v6: fam(v6),
            ext: None,
            tuning,
            us,
            direct: Vec::new(),
        }
    }

    fn port(&self) -> u16 {
        self.opts.effective_port()
    }
}

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

#[async_trait]
impl Backend for Vxlan {
    fn name(&self) -> &'static str {
        "vxlan"
    }

    fn dataplane(&self) -> Option<Dataplane> {
        Some(Dataplane::Userspace)
    }

    fn status(&self) -> crate::status::BackendStatus {
        let mut st = crate::status::BackendStatus::new(self.name(), self.dataplane());
        for t in [&self.v4, &self.v6]
            .into_iter()
            .flatten()
            .filter_map(|f| f.tunnel.as_ref())
        {
            t.report(&mut st);
        }
        st
    }

    async fn lease_attrs(
        &mut self,
        ext: &ExternalInterface,
        prev: Option<&Lease>,
    ) -> Result<LeaseAttrs, BackendError> {
        if self.opts.gbp {
            return Err(BackendError::Config(
                "VXLAN GBP is not supported by the userspace engine".into(),
            ));
        }
        tracing::info!(
            "VXLAN config: VNI={} Port={} GBP={} Learning={} DirectRouting={}",
            self.opts.vni,
            self.opts.port,
            self.opts.gbp,
            self.opts.learning,
            self.opts.direct_routing
        );
        self.ext = Some(ext.clone());
        let vni = self.opts.vni;
        let reuse = |data: Option<&String>| {
            data.and_then(|d| parse_backend_data(d))
                .filter(|(v, _)| *v == vni)
                .map(|(_, m)| m)
        };
        let mut attrs = LeaseAttrs {
            backend_type: "vxlan".into(),
            ..Default::default()
        };
        if let Some(f) = self.v4.as_mut() {
            let ip = ext
                .ext_addr
                .ok_or_else(|| BackendError::Config("vxlan: no IPv4 public address".into()))?;
            f.mac = reuse(prev.and_then(|p| p.attrs.backend_data.as_ref()))
                .unwrap_or_else(|| derive_mac(ip.into(), vni, 4));
            attrs.public_ip = ip;
            attrs.backend_data = Some(backend_data(vni, f.mac));
        }
        if let Some(f) = self.v6.as_mut() {
            let ip = ext
                .ext_v6_addr
                .ok_or_else(|| BackendError::Config("vxlan: no IPv6 public address".into()))?;
            f.mac = reuse(prev.and_then(|p| p.attrs.backend_v6_data.as_ref()))
                .unwrap_or_else(|| derive_mac(ip.into(), vni, 6));
            attrs.public_ipv6 = Some(ip);
            attrs.backend_v6_data = Some(backend_data(vni, f.mac));
        }
        Ok(attrs)
    }

    async fn setup(&mut self, lease: &Lease) -> Result<u32, BackendError> {
        let ext = self
            .ext
            .clone()
            .ok_or_else(|| BackendError::Config("setup before lease_attrs".into()))?;
        let mtus = Mtus::new(ext.backend_mtu(self.opts.mtu), self.v6.is_some());
        let (vni, port, tuning) = (self.opts.vni, self.port(), self.tuning);
        let engine =
            |name: String, mac: [u8; 6], local: IpAddr, tun_addr: IpAddr, mtu: u32| EngineConfig {
                tun_name: name,
                encap: Encap::Vxlan {
                    vni,
                    port,
                    local_mac: mac,
                },
                local_addr: local,
                tun_addr: Some(tun_addr),
                mtu: u16::try_from(mtu).unwrap_or(u16::MAX),
                workers: tuning.workers,
                offload: tuning.offload,
                anti_spoof: tuning.anti_spoof != weft_engine::AntiSpoofing::Off,
            };
        if let (Some(f), Some(sn)) = (self.v4.as_mut(), lease.subnet) {
            let local = ext
                .ext_addr
                .map(IpAddr::V4)
                .ok_or_else(|| BackendError::Config("no IPv4 address".into()))?;
            let mtu = mtus.v4;
            let cfg = engine(
                format!("flannel.{vni}"),
                f.mac,
                local,
                sn.network().into(),
                mtu,
            );
            let addr = IpNet::new(sn.network().into(), 32)
                .map_err(|e| BackendError::Config(e.to_string()))?;
            f.tunnel = Some(Tunnel::start(&self.us, cfg, addr, mtu, tuning.anti_spoof).await?);
        }
        if let (Some(f), Some(sn)) = (self.v6.as_mut(), lease.ipv6_subnet) {
            let local = ext
                .ext_v6_addr
                .map(IpAddr::V6)
                .ok_or_else(|| BackendError::Config("no IPv6 address".into()))?;
            let cfg = engine(
                format!("flannel-v6.{vni}"),
                f.mac,
                local,
                sn.network().into(),
                mtus.v6,
            );
            let addr = IpNet::new(sn.network().into(), 128)
                .map_err(|e| BackendError::Config(e.to_string()))?;
            f.tunnel = Some(Tunnel::start(&self.us, cfg, addr, mtus.v6, tuning.anti_spoof).await?);
        }
        Ok(mtus.env)
    }

    async fn apply(&mut self, change: &Change) -> Result<(), BackendError> {
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
            return Ok(());
        }
        let direct = self.opts.direct_routing;
        let ext = self.ext.clone();
        let targets = [
            (
                self.v4.as_mut(),
                lease.subnet.map(IpNet::V4),
                Some(IpAddr::V4(lease.attrs.public_ip)),
                lease.attrs.backend_data.as_ref(),
            ),
            (
                self.v6.as_mut(),
                lease.ipv6_subnet.map(IpNet::V6),
                lease.attrs.public_ipv6.map(IpAddr::V6),
                lease.attrs.backend_v6_data.as_ref(),
            ),
        ];
        let mut direct_routes = Vec::new();
        for (fam, subnet, endpoint, data) in targets {
            let (Some(fam), Some(subnet)) = (fam, subnet) else {
                continue;
            };
            let Some(t) = fam.tunnel.as_mut() else {
                continue;
            };
            if !add {
                t.remove_peer(subnet);
                t.del_route(subnet).await?;
                direct_routes.push((subnet, None));
                continue;
            }
            let Some(endpoint) = endpoint else { continue };
            if direct && ext.as_ref().is_some_and(|e| on_link(e, endpoint)) {
                direct_routes.push((subnet, Some(endpoint)));
                continue;
            }
            let Some((_, mac)) = data.and_then(|d| parse_backend_data(d)) else {
                tracing::error!("error decoding subnet lease JSON for {subnet}: {data:?}");
                continue;
            };
            t.upsert_peer(subnet, endpoint, Some(mac));
            t.add_route(subnet, false).await?;
        }
        for (subnet, via) in direct_routes {
            self.direct.retain(|r| r.dst != subnet);
            match via {
                Some(gw) => {
                    let r = Route {
                        dst: subnet,
                        gateway: Some(gw),
                        oif: None,
                        onlink: false,
                        scope_link: false,
                    };
                    self.us.nl.route_replace(&r).await?;
                    self.direct.push(r);
                }
                None => {
                    let r = Route {
                        dst: subnet,
                        gateway: None,
                        oif: None,
                        onlink: false,
                        scope_link: false,
                    };
                    let _ = self.us.nl.route_del(&r).await;
                }
            }
        }
        Ok(())
    }

    fn flush(&mut self) {
        for f in [self.v4.as_mut(), self.v6.as_mut()].into_iter().flatten() {
            if let Some(t) = f.tunnel.as_mut() {
                t.flush();
            }
        }
    }

    async fn reconcile(&mut self) -> Result<(), BackendError> {
        for f in [self.v4.as_mut(), self.v6.as_mut()].into_iter().flatten() {
            if let Some(t) = f.tunnel.as_mut() {
                t.reconcile().await?;
            }
        }
        for r in &self.direct {
            if self.us.nl.routes_exact(r.dst).await?.is_empty() {
                tracing::info!("Route recovered {}", r.dst);
                self.us.nl.route_replace(r).await?;
            }
        }
        Ok(())
    }

    async fn teardown(&mut self) {
        for f in [self.v4.as_mut(), self.v6.as_mut()].into_iter().flatten() {
            if let Some(mut t) = f.tunnel.take() {
                t.stop();
            }
        }
    }
}

/// Whether `ip` is on one of the external interface's connected prefixes
/// (flannel: `ip route get` gives a single route without a gateway).
fn on_link(ext: &ExternalInterface, ip: IpAddr) -> bool {
    ext.connected.iter().any(|n| n.contains(&ip))
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
