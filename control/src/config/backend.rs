//! Backend types and their options, decoded from the config's `Backend` object
//! the way each flannel backend decodes it (Go `encoding/json`, defaults set
//! before decoding), plus the MTU each backend writes as `FLANNEL_MTU` (spec §2).
//!
//! weft is stricter than Go in one place: integer options that must fit a
//! kernel field (VNI, ports, MTU) are range-checked here instead of failing
//! later in netlink.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde_json::value::RawValue;

use weft_compat::gojson::{Field, FieldTypeError, JsonDoc, for_each_member, parse_doc};

/// Errors from selecting a backend and decoding its options.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OptionsError {
    /// No backend is registered under this (lower-cased) name.
    #[error("unknown backend type: {0}")]
    UnknownType(String),
    /// An option has the wrong JSON type (`context` is flannel's prefix, e.g.
    /// `error decoding VXLAN backend config`).
    #[error("{context}: {source}")]
    Decode {
        /// flannel's message prefix for this backend.
        context: &'static str,
        /// The Go decode error.
        #[source]
        source: FieldTypeError,
    },
    /// An integer option outside the range its kernel field can hold.
    #[error("{context}: {field} {value} is out of range")]
    OutOfRange {
        /// flannel's message prefix for this backend.
        context: &'static str,
        /// The option name.
        field: &'static str,
        /// The configured value.
        value: i64,
    },
    /// ipsec `PSK` shorter than 96 bytes.
    #[error("config error, password is too short")]
    PasswordTooShort,
    /// wireguard `Mode` not one of separate, auto, ipv4, ipv6.
    #[error("no valid Mode configured")]
    InvalidMode,
}

/// The backends flannel registers (each backend's `init()`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BackendKind {
    /// `udp`: TUN + plain UDP encapsulation.
    Udp,
    /// `vxlan`.
    Vxlan,
    /// `host-gw`: plain routes via peers.
    HostGw,
    /// `ipip`.
    Ipip,
    /// `ipsec` (strongSwan).
    Ipsec,
    /// `wireguard`.
    Wireguard,
    /// `alloc`: lease only.
    Alloc,
    /// `extension`: user commands.
    Extension,
    /// `tencent-vpc`.
    TencentVpc,
}

impl BackendKind {
    /// The registered (lower-case) name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Udp => "udp",
            BackendKind::Vxlan => "vxlan",
            BackendKind::HostGw => "host-gw",
            BackendKind::Ipip => "ipip",
            BackendKind::Ipsec => "ipsec",
            BackendKind::Wireguard => "wireguard",
            BackendKind::Alloc => "alloc",
            BackendKind::Extension => "extension",
            BackendKind::TencentVpc => "tencent-vpc",
        }
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for BackendKind {
    type Err = OptionsError;

    /// Case-insensitive, like flannel's `strings.ToLower` lookup.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.to_lowercase();
        Ok(match lower.as_str() {
            "udp" => BackendKind::Udp,
            "vxlan" => BackendKind::Vxlan,
            "host-gw" => BackendKind::HostGw,
            "ipip" => BackendKind::Ipip,
            "ipsec" => BackendKind::Ipsec,
            "wireguard" => BackendKind::Wireguard,
            "alloc" => BackendKind::Alloc,
            "extension" => BackendKind::Extension,
            "tencent-vpc" => BackendKind::TencentVpc,
            _ => return Err(OptionsError::UnknownType(lower)),
        })
    }
}

/// udp options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UdpOptions {
    /// `Port` (default 8285); every node must use the same one.
    pub port: u16,
}

/// vxlan options (flannel's `VXLANConfig`; its JSON tags are lower-case, which
/// does not matter because keys match case-insensitively).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VxlanOptions {
    /// `VNI` (default 1).
    pub vni: u32,
    /// `Port`; 0 (default) leaves the kernel default 8472.
    pub port: u16,
    /// `MTU`; 0 (default) means the external interface's MTU.
    pub mtu: u32,
    /// `GBP`.
    pub gbp: bool,
    /// `Learning`.
    pub learning: bool,
    /// `DirectRouting`.
    pub direct_routing: bool,
}

impl VxlanOptions {
    /// The UDP port on the wire: `port`, or 8472 when 0.
    pub fn effective_port(&self) -> u16 {
        if self.port == 0 { 8472 } else { self.port }
    }
}

/// ipip options.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IpipOptions {
    /// `DirectRouting`.
    pub direct_routing: bool,
}

/// ipsec options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpsecOptions {
    /// `PSK`, at least 96 bytes.
    pub psk: crate::secret::Secret,
    /// `UDPEncap`.
    pub udp_encap: bool,
    /// `ESPProposal` (default `aes128gcm16-sha256-prfsha256-ecp256`).
    pub esp_proposal: String,
}

/// wireguard `Mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireguardMode {
    /// One device per family: `flannel-wg`, `flannel-wg-v6` (default).
    Separate,
    /// One device; endpoint family chosen per peer.
    Auto,
    /// One device; IPv4 endpoints.
    Ipv4,
    /// One device; IPv6 endpoints.
    Ipv6,
}

/// wireguard options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WireguardOptions {
    /// `ListenPort` (default 51820).
    pub listen_port: u16,
    /// `ListenPortV6` (default 51821).
    pub listen_port_v6: u16,
    /// `MTU`; 0 (default) means the external interface's MTU.
    pub mtu: u32,
    /// `PSK`: base64 pre-shared key, empty for none.
    pub psk: crate::secret::Secret,
    /// `PersistentKeepaliveInterval`: the JSON integer is seconds; zero = off.
    pub persistent_keepalive_interval: Duration,
    /// `Mode`.
    pub mode: WireguardMode,
}

/// A backend with its decoded options.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackendOptions {
    /// udp.
    Udp(UdpOptions),
    /// vxlan.
    Vxlan(VxlanOptions),
    /// host-gw (no options).
    HostGw,
    /// ipip.
    Ipip(IpipOptions),
    /// ipsec.
    Ipsec(IpsecOptions),
    /// wireguard.
    Wireguard(WireguardOptions),
    /// alloc (no options).
    Alloc,
    /// extension (options not interpreted by weft).
    Extension,
    /// tencent-vpc (options not interpreted by weft).
    TencentVpc,
}

impl BackendOptions {
    /// Selects the backend named `backend_type` (case-insensitive) and decodes its
    /// options from the raw `Backend` value (`Config::backend`).
    pub fn from_config(backend_type: &str, backend: Option<&str>) -> Result<Self, OptionsError> {
        Self::parse(backend_type.parse()?, backend)
    }

    /// Decodes `kind`'s options from the raw `Backend` JSON text
    /// (`Config::backend`). An absent or `null` value gives the defaults (Go
    /// leaves the struct untouched). `parse_config` has already rejected
    /// non-object values; here they also give the defaults.
    pub fn parse(kind: BackendKind, backend: Option<&str>) -> Result<Self, OptionsError> {
        let members = match backend.map(|b| parse_doc(b.as_bytes())) {
            Some(Ok(JsonDoc::Object(m))) => m,
            _ => Vec::new(),
        };
        let obj = members.as_slice();
        Ok(match kind {
            BackendKind::Udp => BackendOptions::Udp(parse_udp(obj)?),
            BackendKind::Vxlan => BackendOptions::Vxlan(parse_vxlan(obj)?),
            BackendKind::HostGw => BackendOptions::HostGw,
            BackendKind::Ipip => BackendOptions::Ipip(parse_ipip(obj)?),
            BackendKind::Ipsec => BackendOptions::Ipsec(parse_ipsec(obj)?),
            BackendKind::Wireguard => BackendOptions::Wireguard(parse_wireguard(obj)?),
            BackendKind::Alloc => BackendOptions::Alloc,
            BackendKind::Extension => BackendOptions::Extension,
            BackendKind::TencentVpc => BackendOptions::TencentVpc,
        })
    }

    /// Which backend these options belong to.
    pub fn kind(&self) -> BackendKind {
        match self {
            BackendOptions::Udp(_) => BackendKind::Udp,
            BackendOptions::Vxlan(_) => BackendKind::Vxlan,
            BackendOptions::HostGw => BackendKind::HostGw,
            BackendOptions::Ipip(_) => BackendKind::Ipip,
            BackendOptions::Ipsec(_) => BackendKind::Ipsec,
            BackendOptions::Wireguard(_) => BackendKind::Wireguard,
            BackendOptions::Alloc => BackendKind::Alloc,
            BackendOptions::Extension => BackendKind::Extension,
            BackendOptions::TencentVpc => BackendKind::TencentVpc,
        }
    }

    /// `FLANNEL_MTU` for this backend given the external interface's MTU.
    pub fn mtu(&self, ext_mtu: u32) -> u32 {
        mtu(self, ext_mtu)
    }
}

/// `FLANNEL_MTU` (flannel's `Network.MTU()`), spec §2: udp ext−28, vxlan
/// cfg.MTU−50, host-gw ext, ipip ext−20, ipsec ext−77 (−8 more with UDPEncap),
/// wireguard cfg.MTU−80, alloc/extension/tencent-vpc ext. cfg.MTU defaults to ext.
pub fn mtu(opts: &BackendOptions, ext_mtu: u32) -> u32 {
    let or_ext = |m: u32| if m == 0 { ext_mtu } else { m };
    match opts {
        BackendOptions::Udp(_) => ext_mtu.saturating_sub(28),
        BackendOptions::Vxlan(o) => or_ext(o.mtu).saturating_sub(50),
        BackendOptions::Ipip(_) => ext_mtu.saturating_sub(20),
        BackendOptions::Ipsec(o) => ext_mtu.saturating_sub(if o.udp_encap { 85 } else { 77 }),
        BackendOptions::Wireguard(o) => or_ext(o.mtu).saturating_sub(80),
        BackendOptions::HostGw
        | BackendOptions::Alloc
        | BackendOptions::Extension
        | BackendOptions::TencentVpc => ext_mtu,
    }
}

/// Decodes one backend's option struct: `ctx` is flannel's error prefix,
/// `apply(key, value)` handles a folded key.
type Members = [(String, Box<RawValue>)];

fn decode(
    obj: &Members,
    ctx: &'static str,
    mut apply: impl FnMut(&str, &RawValue, &dyn Fn(&'static str) -> Field) -> Result<(), FieldTypeError>,
) -> Result<(), OptionsError> {
    let f = |name| Field { strukt: "", name };
    for_each_member(obj, |k, v| apply(k, v, &f)).map_err(|source| OptionsError::Decode {
        context: ctx,
        source,
    })
}

fn ranged<T: TryFrom<i64>>(
    ctx: &'static str,
    field: &'static str,
    v: i64,
) -> Result<T, OptionsError> {
    T::try_from(v).map_err(|_| OptionsError::OutOfRange {
        context: ctx,
        field,
        value: v,
    })
}

fn set<T>(slot: &mut T, v: Option<T>) {
    if let Some(v) = v {
        *slot = v;
    }
}

const UDP_CTX: &str = "error decoding UDP backend config";
const VXLAN_CTX: &str = "error decoding VXLAN backend config";
const IPIP_CTX: &str = "error decoding IPIP backend config";
const IPSEC_CTX: &str = "error decoding IPSEC backend config";
const WG_CTX: &str = "error decoding backend config";

fn parse_udp(obj: &Members) -> Result<UdpOptions, OptionsError> {
    let mut port = 8285i64;
    decode(obj, UDP_CTX, |k, v, f| {
        if k == "port" {
            set(&mut port, f("Port").int(v, "int")?);
        }
        Ok(())
    })?;
    Ok(UdpOptions {
        port: ranged(UDP_CTX, "Port", port)?,
    })
}

fn parse_vxlan(obj: &Members) -> Result<VxlanOptions, OptionsError> {
    let (mut vni, mut port, mut mtu) = (1i64, 0i64, 0i64);
    let (mut gbp, mut learning, mut direct_routing) = (false, false, false);
    decode(obj, VXLAN_CTX, |k, v, f| {
        match k {
            "vni" => set(&mut vni, f("vni").int(v, "int")?),
            "port" => set(&mut port, f("port").int(v, "int")?),
            "mtu" => set(&mut mtu, f("mtu").int(v, "int")?),
            "gbp" => set(&mut gbp, f("gbp").bool(v)?),
            "learning" => set(&mut learning, f("learning").bool(v)?),
            "directrouting" => set(&mut direct_routing, f("directRouting").bool(v)?),
            _ => {}
        }
        Ok(())
    })?;
    let vni: u32 = ranged(VXLAN_CTX, "VNI", vni)?;
    if vni >= 1 << 24 {
        return Err(OptionsError::OutOfRange {
            context: VXLAN_CTX,
            field: "VNI",
            value: i64::from(vni),
        });
    }
    Ok(VxlanOptions {
        vni,
        port: ranged(VXLAN_CTX, "Port", port)?,
        mtu: ranged(VXLAN_CTX, "MTU", mtu)?,
        gbp,
        learning,
        direct_routing,
    })
}

fn parse_ipip(obj: &Members) -> Result<IpipOptions, OptionsError> {
    let mut o = IpipOptions::default();
    decode(obj, IPIP_CTX, |k, v, f| {
        if k == "directrouting" {
            set(&mut o.direct_routing, f("DirectRouting").bool(v)?);
        }
        Ok(())
    })?;
    Ok(o)
}

fn parse_ipsec(obj: &Members) -> Result<IpsecOptions, OptionsError> {
    let mut psk = String::new();
    let mut o = IpsecOptions {
        psk: Default::default(),
        udp_encap: false,
        esp_proposal: "aes128gcm16-sha256-prfsha256-ecp256".to_string(),
    };
    decode(obj, IPSEC_CTX, |k, v, f| {
        match k {
            "udpencap" => set(&mut o.udp_encap, f("UDPEncap").bool(v)?),
            "espproposal" => set(&mut o.esp_proposal, f("ESPProposal").string(v)?),
            "psk" => set(&mut psk, f("PSK").string(v)?),
            _ => {}
        }
        Ok(())
    })?;
    if psk.len() < 96 {
        return Err(OptionsError::PasswordTooShort);
    }
    o.psk = psk.into();
    Ok(o)
}

fn parse_wireguard(obj: &Members) -> Result<WireguardOptions, OptionsError> {
    let (mut port, mut port6, mut mtu, mut keepalive) = (51820i64, 51821i64, 0i64, 0i64);
    let (mut psk, mut mode) = (String::new(), "separate".to_string());
    decode(obj, WG_CTX, |k, v, f| {
        match k {
            "listenport" => set(&mut port, f("ListenPort").int(v, "int")?),
            "listenportv6" => set(&mut port6, f("ListenPortV6").int(v, "int")?),
            "mtu" => set(&mut mtu, f("MTU").int(v, "int")?),
            "psk" => set(&mut psk, f("PSK").string(v)?),
            "persistentkeepaliveinterval" => set(
                &mut keepalive,
                f("PersistentKeepaliveInterval").int(v, "time.Duration")?,
            ),
            "mode" => set(&mut mode, f("Mode").string(v)?),
            _ => {}
        }
        Ok(())
    })?;
    let mode = match mode.as_str() {
        "separate" => WireguardMode::Separate,
        "auto" => WireguardMode::Auto,
        "ipv4" => WireguardMode::Ipv4,
        "ipv6" => WireguardMode::Ipv6,
        _ => return Err(OptionsError::InvalidMode),
    };
    let keepalive: u64 = ranged(WG_CTX, "PersistentKeepaliveInterval", keepalive)?;
    Ok(WireguardOptions {
        listen_port: ranged(WG_CTX, "ListenPort", port)?,
        listen_port_v6: ranged(WG_CTX, "ListenPortV6", port6)?,
        mtu: ranged(WG_CTX, "MTU", mtu)?,
        psk: psk.into(),
        persistent_keepalive_interval: Duration::from_secs(keepalive),
        mode,
    })
}

#[cfg(test)]
#[path = "backend_tests.rs"]
mod tests;
