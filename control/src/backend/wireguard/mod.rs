//! The `wireguard` backend: what its two dataplanes share, so that they
//! publish byte-identical leases and lay out the same devices: the key
//! ([`key`]), BackendData `{"PublicKey":"<b64>","Port":<port>}`
//! ([`backend_data`], [`parse_backend_data`], [`lease_attrs`]), the device
//! plan ([`device_plan`]) and the config log line. [`kernel`] runs it on the
//! kernel's WireGuard module, [`userspace`] on weft's engine (boringtun);
//! [`super::dual`] switches between them.

pub mod kernel;
pub mod key;
pub mod userspace;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::backend::BackendError;
use crate::config::backend::{WireguardMode, WireguardOptions};
use crate::gojson;
use crate::iface::ExternalInterface;
use crate::lease::{Lease, LeaseAttrs};

/// Which families a device carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Carries {
    V4,
    V6,
    Both,
}

/// One device of a WireGuard node as flannel lays them out (spec §5), for
/// both dataplanes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DevicePlan {
    pub name: &'static str,
    pub carries: Carries,
    pub port: u16,
    /// `<subnet IP>/32` and/or `/128`.
    pub addrs: Vec<IpNet>,
    /// Where the userspace engine binds its socket (the kernel device binds all).
    pub bind: IpAddr,
}

/// The devices of a node holding `lease`, and their MTU (cfg.MTU − 80):
/// `Separate` mode gives `flannel-wg` (IPv4, `ListenPort`) and
/// `flannel-wg-v6` (IPv6, `ListenPortV6`) for the enabled networks; the
/// other modes one `flannel-wg` carrying both on `ListenPort`.
pub(super) fn device_plan(
    opts: &WireguardOptions,
    ext: &ExternalInterface,
    v4: bool,
    v6: bool,
    lease: &Lease,
) -> (u32, Vec<DevicePlan>) {
    let cfg_mtu = ext.backend_mtu(opts.mtu);
    let a4 = lease
        .subnet
        .and_then(|s| Ipv4Net::new(s.network(), 32).ok())
        .map(IpNet::V4);
    let a6 = lease
        .ipv6_subnet
        .and_then(|s| Ipv6Net::new(s.network(), 128).ok())
        .map(IpNet::V6);
    let any4 = IpAddr::V4(Ipv4Addr::UNSPECIFIED);
    let any6 = IpAddr::V6(Ipv6Addr::UNSPECIFIED);
    let (p4, p6) = (opts.listen_port, opts.listen_port_v6);
    let dev = |name, carries, port, addrs: Vec<IpNet>, bind| DevicePlan {
        name,
        carries,
        port,
        addrs,
        bind,
    };
    let plan = match opts.mode {
        WireguardMode::Separate => [
            a4.filter(|_| v4)
                .map(|a| dev("flannel-wg", Carries::V4, p4, vec![a], any4)),
            a6.filter(|_| v6)
                .map(|a| dev("flannel-wg-v6", Carries::V6, p6, vec![a], any6)),
        ]
        .into_iter()
        .flatten()
        .collect(),
        mode => {
            let bind = if mode == WireguardMode::Ipv6 || !v4 {
                any6
            } else {
                any4
            };
            let addrs = [a4, a6].into_iter().flatten().collect();
            vec![dev("flannel-wg", Carries::Both, p4, addrs, bind)]
        }
    };
    (cfg_mtu.saturating_sub(80), plan)
}

/// flannel's `WireGuard config: ...` log line, with the public key and `path`.
pub(super) fn log_config(
    opts: &WireguardOptions,
    keepalive: u16,
    psk: bool,
    public: &[u8; 32],
    path: &str,
) {
    tracing::info!(
        "WireGuard config: ListenPort={} ListenPortV6={} Mode={:?} PersistentKeepaliveInterval={}s PSK={}; public key {}{path}",
        opts.listen_port,
        opts.listen_port_v6,
        opts.mode,
        keepalive,
        if psk { "set" } else { "none" },
        weft_engine::wg::key_to_base64(public)
    );
}

/// flannel's lease text: exactly `{"PublicKey":"<base64>","Port":<port>}`.
pub fn backend_data(public_key: &[u8; 32], port: u16) -> String {
    format!(
        "{{\"PublicKey\":\"{}\",\"Port\":{port}}}",
        weft_engine::wg::key_to_base64(public_key)
    )
}

/// The lease attributes of a WireGuard node with `public` key, for the IPv4
/// and/or IPv6 network: the one function both the userspace and the kernel
/// backend publish through, so their leases are byte-identical.
pub(super) fn lease_attrs(
    public: &[u8; 32],
    ext: &ExternalInterface,
    opts: &WireguardOptions,
    v4: bool,
    v6: bool,
) -> Result<LeaseAttrs, BackendError> {
    let mut attrs = LeaseAttrs {
        backend_type: "wireguard".into(),
        ..Default::default()
    };
    if v4 {
        attrs.public_ip = ext
            .ext_addr
            .ok_or_else(|| BackendError::Config("wireguard: no IPv4 public address".into()))?;
        attrs.backend_data = Some(backend_data(public, opts.listen_port));
    }
    if v6 {
        let ip = ext
            .ext_v6_addr
            .ok_or_else(|| BackendError::Config("wireguard: no IPv6 public address".into()))?;
        attrs.public_ipv6 = Some(ip);
        attrs.backend_v6_data = Some(backend_data(public, opts.listen_port_v6));
    }
    Ok(attrs)
}

/// Parses BackendData (Go JSON rules): `(PublicKey, Port)`, Port 0 when absent.
pub fn parse_backend_data(text: &str) -> Option<([u8; 32], u16)> {
    let mut m = gojson::parse_object(text.as_bytes()).ok()?;
    let key = gojson::take::<String>(&mut m, "publickey").ok()??;
    let port = gojson::take::<u16>(&mut m, "port").ok()?.unwrap_or(0);
    Some((weft_engine::wg::key_from_base64(&key)?, port))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_data_is_flannels_bytes() {
        let k = weft_engine::wg::key_from_base64("hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=")
            .expect("key");
        assert_eq!(
            backend_data(&k, 51820),
            r#"{"PublicKey":"hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=","Port":51820}"#
        );
        assert_eq!(
            backend_data(&k, 51821),
            r#"{"PublicKey":"hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=","Port":51821}"#
        );
        assert_eq!(
            parse_backend_data(&backend_data(&k, 51820)),
            Some((k, 51820))
        );
        // Go JSON: keys case-insensitive; a missing Port means 0 (-> our own port).
        assert_eq!(
            parse_backend_data(r#"{"publickey":"hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo="}"#),
            Some((k, 0))
        );
        assert_eq!(parse_backend_data(r#"{"PublicKey":"hSDw","Port":1}"#), None);
        assert_eq!(
            parse_backend_data(
                r#"{"PublicKey":"hSDwCYkwp1R0i33ctD73Wg2/Og0mOBr066SpjqqbTmo=","Port":"1"}"#
            ),
            None
        );
        assert_eq!(parse_backend_data("null"), None);
    }
}
