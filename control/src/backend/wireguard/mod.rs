//! The `wireguard` backend: what its two dataplanes share, so that they
//! publish byte-identical leases and lay out the same devices: the key
//! ([`key`]), BackendData `{"PublicKey":"<b64>","Port":<port>}`
//! ([`backend_data`], [`parse_backend_data`], [`lease_attrs`]), the device
//! plan ([`device_plan`]) and the config log line. [`kernel`] runs it on the
//! kernel's WireGuard module, [`userspace`] on weft's engine (boringtun);
//! [`super::dual`] switches between them.

pub mod kernel;
pub mod kernel_disco;
pub mod key;
pub mod nat;
pub mod userspace;

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};
use weft_engine::WgSecret;

use crate::backend::BackendError;
use crate::backend::Missing;
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
        attrs.public_ip = ext.ext_addr.ok_or(BackendError::Missing {
            backend: "wireguard",
            what: Missing::PublicV4,
        })?;
        attrs.backend_data = Some(backend_data(public, opts.listen_port));
    }
    if v6 {
        let ip = ext.ext_v6_addr.ok_or(BackendError::Missing {
            backend: "wireguard",
            what: Missing::PublicV6,
        })?;
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

/// What both WireGuard paths are built with: the options, the networks, the
/// key file and the PSK. [`NodeSpec::lease_attrs`] reads the key and gives
/// the [`Node`].
pub(super) struct NodeSpec {
    pub opts: WireguardOptions,
    pub network: Option<Ipv4Net>,
    pub network_v6: Option<Ipv6Net>,
    pub key_file: PathBuf,
    pub psk: Option<[u8; 32]>,
}

/// What both WireGuard paths hold and decide alike once the key is read: the
/// options, the networks, the key and PSK, the external interface; the
/// device plan, each device's routes and the peer each lease gives it.
pub(super) struct Node {
    pub opts: WireguardOptions,
    pub network: Option<Ipv4Net>,
    pub network_v6: Option<Ipv6Net>,
    pub key: WgSecret,
    pub psk: Option<[u8; 32]>,
    pub ext: ExternalInterface,
}

impl std::fmt::Debug for NodeSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeSpec")
            .field("opts", &self.opts)
            .field("network", &self.network)
            .field("network_v6", &self.network_v6)
            .field("key_file", &self.key_file)
            .field("psk", &crate::secret::redacted(&self.psk))
            .finish()
    }
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("opts", &self.opts)
            .field("network", &self.network)
            .field("network_v6", &self.network_v6)
            .field("key", &self.key)
            .field("psk", &crate::secret::redacted(&self.psk))
            .field("ext", &self.ext)
            .finish()
    }
}

/// What one peer lease gives one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct LeasePeer {
    pub key: [u8; 32],
    /// The peer's port from its BackendData; 0 means our own.
    pub port: u16,
    pub endpoint: IpAddr,
    /// The peer's subnets the device carries (its AllowedIPs).
    pub subnets: Vec<IpNet>,
}

/// Checks the options the paths rely on: a valid PSK and at least one network.
pub fn validate(
    opts: &WireguardOptions,
    network: Option<Ipv4Net>,
    network_v6: Option<Ipv6Net>,
) -> Result<(), BackendError> {
    if !opts.psk.is_empty() && weft_engine::wg::key_from_base64(opts.psk.expose()).is_none() {
        // The value is not shown: a mistyped key is still nearly the secret.
        return Err(BackendError::Config(
            "could not parse the Backend's PSK: not a base64 wireguard key (32 bytes)".into(),
        ));
    }
    if network.is_none() && network_v6.is_none() {
        return Err(BackendError::Config(
            "the wireguard backend needs a Network or IPv6Network".into(),
        ));
    }
    Ok(())
}

impl NodeSpec {
    /// A node for the enabled networks ([`validate`] first: an invalid PSK
    /// is ignored here); the key is read by [`NodeSpec::lease_attrs`].
    pub fn new(
        opts: WireguardOptions,
        network: Option<Ipv4Net>,
        network_v6: Option<Ipv6Net>,
    ) -> NodeSpec {
        let psk = weft_engine::wg::key_from_base64(opts.psk.expose());
        NodeSpec {
            opts,
            network,
            network_v6,
            key_file: key::key_file_path(),
            psk,
        }
    }

    /// Loads (or makes) the key, logs the config (`path` ends the line) and
    /// returns the lease attributes and the node with its key.
    pub fn lease_attrs(
        self,
        ext: &ExternalInterface,
        path: &str,
    ) -> Result<(LeaseAttrs, Node), BackendError> {
        let key =
            key::load_or_generate(&self.key_file).map_err(|e| BackendError::Key(e.to_string()))?;
        let public = key.public_key();
        let node = Node {
            opts: self.opts,
            network: self.network,
            network_v6: self.network_v6,
            key,
            psk: self.psk,
            ext: ext.clone(),
        };
        log_config(
            &node.opts,
            node.keepalive(),
            node.psk.is_some(),
            &public,
            path,
        );
        let attrs = lease_attrs(
            &public,
            ext,
            &node.opts,
            node.network.is_some(),
            node.network_v6.is_some(),
        )?;
        Ok((attrs, node))
    }
}

impl Node {
    /// PersistentKeepaliveInterval in seconds.
    pub fn keepalive(&self) -> u16 {
        u16::try_from(self.opts.persistent_keepalive_interval.as_secs()).unwrap_or(u16::MAX)
    }

    /// [`device_plan`] for `lease`.
    pub fn plan(&self, lease: &Lease) -> (u32, Vec<DevicePlan>) {
        let (v4, v6) = (self.network.is_some(), self.network_v6.is_some());
        device_plan(&self.opts, &self.ext, v4, v6, lease)
    }

    /// The networks a device carrying `carries` routes (`Network dev NAME`).
    pub fn routes(&self, carries: Carries) -> Vec<IpNet> {
        [self.network.map(IpNet::V4), self.network_v6.map(IpNet::V6)]
            .into_iter()
            .flatten()
            .filter(|net| {
                matches!(
                    (carries, net),
                    (Carries::Both, _) | (Carries::V4, IpNet::V4(_)) | (Carries::V6, IpNet::V6(_))
                )
            })
            .collect()
    }

    /// The key (and port) of `lease` on a device carrying `carries`: the
    /// family's BackendData; on a device carrying both (flannel), the IPv6
    /// data when IPv6 is on, else the IPv4 data, with the IPv4 data's port,
    /// the one the peer's single device listens on.
    fn data_for(&self, lease: &Lease, carries: Carries) -> Option<([u8; 32], u16)> {
        let a = &lease.attrs;
        let v4 = a.backend_data.as_deref().and_then(parse_backend_data);
        let v6 = a.backend_v6_data.as_deref().and_then(parse_backend_data);
        match carries {
            Carries::V4 => v4,
            Carries::V6 => v6,
            Carries::Both => {
                let (k, p) = if self.network_v6.is_some() {
                    v6.or(v4)?
                } else {
                    v4?
                };
                Some((k, v4.map_or(p, |d| d.1)))
            }
        }
    }

    /// The key `lease` had on a device carrying `carries` (to remove it).
    pub fn key_for(&self, lease: &Lease, carries: Carries) -> Option<[u8; 32]> {
        self.data_for(lease, carries).map(|d| d.0)
    }

    /// The peer `lease` gives a device carrying `carries`, or `None` when it
    /// is not usable. With `select`, a device carrying both families in
    /// `auto` mode reaches each peer as flannel's `selectPublicEndpoint`
    /// picks (the kernel device listens on both); without, over IPv4.
    pub fn peer(&self, lease: &Lease, carries: Carries, select: bool) -> Option<LeasePeer> {
        let a = &lease.attrs;
        let (key, port) = self.data_for(lease, carries)?;
        let (endpoint, subnets) = match carries {
            Carries::V4 => (IpAddr::V4(a.public_ip), vec![IpNet::V4(lease.subnet?)]),
            Carries::V6 => (
                IpAddr::V6(a.public_ipv6?),
                vec![IpNet::V6(lease.ipv6_subnet?)],
            ),
            Carries::Both => {
                let ip = match self.opts.mode {
                    WireguardMode::Ipv6 => IpAddr::V6(a.public_ipv6?),
                    WireguardMode::Auto if select => {
                        select_endpoint(a.public_ip, a.public_ipv6, &self.ext)
                    }
                    _ => IpAddr::V4(a.public_ip),
                };
                let nets = [
                    lease.subnet.map(IpNet::V4),
                    lease.ipv6_subnet.map(IpNet::V6),
                ];
                (ip, nets.into_iter().flatten().collect())
            }
        };
        Some(LeasePeer {
            key,
            port,
            endpoint,
            subnets,
        })
    }
}

/// flannel's `selectPublicEndpoint` (auto mode): IPv4 unless only IPv6
/// exists, or the peer's IPv4 is private and both our and its IPv6 are not ULA.
pub fn select_endpoint(
    peer_v4: Ipv4Addr,
    peer_v6: Option<Ipv6Addr>,
    ext: &ExternalInterface,
) -> IpAddr {
    let Some(v6) = peer_v6 else {
        return IpAddr::V4(peer_v4);
    };
    if !peer_v4.is_private() && ext.ext_addr.is_some() {
        return IpAddr::V4(peer_v4);
    }
    if !v6.is_unique_local() && ext.ext_v6_addr.is_some_and(|a| !a.is_unique_local()) {
        return IpAddr::V6(v6);
    }
    IpAddr::V4(peer_v4)
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
