//! `--tunnel-gso` (issue 32): whether the userspace vxlan or udp engine on
//! an IPv4 node writes each TCP super-packet whole to a tunnel TAP with
//! UDP-tunnel GSO (Linux 6.17+) instead of cutting it into datagrams itself
//! ([`start`]); udp only toward peers whose lease has `WeftGSO`
//! ([`crate::lease::LeaseAttrs::weft_gso`]: a weft node, which takes such a
//! datagram whole where flanneld's plain socket would not). The kernel
//! forwards the frame (outer IPv4 from the node's address to the peer node)
//! out of the uplink, which segments it when it has
//! `tx-udp_tnl-segmentation`; without it the node's stack must, and that
//! costs 2.3x the CPU per bit of the sockets (docs/performance.md, "The
//! engine writing through it"). Hence:
//!
//! - `off` (the default): the sockets.
//! - `auto`: the TAP only when every condition of [`check`] holds (the
//!   uplink carrying the node's public IP has `tx-udp_tnl-segmentation` on,
//!   `net.ipv4.ip_forward` is 1, `net.ipv4.conf.all.rp_filter` is not 1,
//!   no other device is named [`TAP`]) and the kernel takes the TAP's
//!   offloads; else the sockets, and one log line naming the condition.
//! - `on`: the same conditions, each a start-up error ([`Unmet`]).
//!
//! Invariants: weftd never writes a node-wide sysctl (`ip_forward` and
//! `all.rp_filter` are read, never set); it writes only the TAP's own
//! `rp_filter=0` and `accept_local=1` and sets the TAP up ([`configure`]).
//! The engine creates the TAP not persistent, so it goes with the engine
//! (weftd's exit, a switch to the kernel dataplane, a rebuild). The host
//! firewall's accept for packets forwarded in from it is a rule of the
//! traffic manager's forward chain (`traffic::rules::forward_rules`).

use std::str::FromStr;

use ipnet::IpNet;
use weft_engine::{AntiSpoofing, EngineConfig, TunnelTapState};

use super::{Tunnel, Userspace};
use crate::backend::BackendError;
use crate::netlink::Client;
use crate::view::TunnelGsoStatus;

/// The tunnel TAP's name (one per network namespace: only the IPv4 vxlan or
/// udp device uses it, and a node runs one backend).
pub const TAP: &str = "weft-gso0";

/// The uplink feature the TAP path needs.
pub const UPLINK_FEATURE: &str = "tx-udp_tnl-segmentation";

/// `--tunnel-gso`: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TunnelGso {
    /// The engine's UDP sockets only.
    #[default]
    Off,
    /// The TAP where the node's conditions hold, else the sockets.
    Auto,
    /// The TAP, or weftd does not start.
    On,
}

impl TunnelGso {
    /// The flag value.
    pub fn as_str(self) -> &'static str {
        match self {
            TunnelGso::Off => "off",
            TunnelGso::Auto => "auto",
            TunnelGso::On => "on",
        }
    }
}

impl FromStr for TunnelGso {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim() {
            "off" => Ok(TunnelGso::Off),
            "auto" => Ok(TunnelGso::Auto),
            "on" => Ok(TunnelGso::On),
            _ => Err(format!("{s:?} is not one of off, auto, on")),
        }
    }
}

impl std::fmt::Display for TunnelGso {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why the tunnel TAP is not used: the condition that failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unmet {
    /// The uplink does not segment UDP tunnels.
    #[error("uplink {dev} has no {UPLINK_FEATURE} (the node's stack would segment: 2.3x the CPU)")]
    UplinkOffload {
        /// The uplink.
        dev: String,
    },
    /// The uplink's features could not be read.
    #[error("cannot read uplink {dev}'s features: {why}")]
    UplinkUnreadable {
        /// The uplink.
        dev: String,
        /// Why.
        why: String,
    },
    /// The node does not forward.
    #[error("net.ipv4.ip_forward is {0}, not 1 (weftd does not change it)")]
    NoForwarding(String),
    /// Strict reverse-path filtering drops the TAP's frames.
    #[error(
        "net.ipv4.conf.all.rp_filter is 1 (strict), which drops the TAP's frames (weftd does not change it)"
    )]
    StrictRpFilter,
    /// A sysctl could not be read.
    #[error("cannot read {key}: {why}")]
    Unreadable {
        /// The sysctl.
        key: &'static str,
        /// Why.
        why: String,
    },
    /// Another device has the TAP's name.
    #[error("a device named {TAP} exists and is not weft's")]
    NameTaken,
    /// The engine could not open the TAP (a kernel before 6.17 refuses its
    /// offloads).
    #[error("the kernel refused the tunnel TAP: {0}")]
    Kernel(String),
    /// Configuring the TAP failed.
    #[error("configuring {TAP}: {0}")]
    Configure(String),
}

/// The node-side conditions of `auto` and `on`, in order, before the engine
/// starts: the first one that fails. `uplink` is the interface carrying the
/// node's public IP. Reads only.
pub async fn check(nl: &dyn Client, uplink: &str) -> Result<(), Unmet> {
    match nl.ethtool_feature(uplink, UPLINK_FEATURE).await {
        Ok(Some(true)) => {}
        Ok(_) => {
            return Err(Unmet::UplinkOffload { dev: uplink.into() });
        }
        Err(e) => {
            return Err(Unmet::UplinkUnreadable {
                dev: uplink.into(),
                why: e.to_string(),
            });
        }
    }
    let read = |key: &'static str| async move {
        nl.sysctl_read(key).await.map_err(|e| Unmet::Unreadable {
            key,
            why: e.to_string(),
        })
    };
    let fwd = read("net/ipv4/ip_forward").await?;
    if fwd != "1" {
        return Err(Unmet::NoForwarding(fwd));
    }
    if read("net/ipv4/conf/all/rp_filter").await? == "1" {
        return Err(Unmet::StrictRpFilter);
    }
    match nl.link_detail(TAP).await {
        Ok(None) => Ok(()),
        Ok(Some(_)) => Err(Unmet::NameTaken),
        Err(e) => Err(Unmet::Configure(e.to_string())),
    }
}

/// Configures the TAP the engine opened: `rp_filter=0` and
/// `accept_local=1` on it (its frames come from the node's own address),
/// then up. Node-wide sysctls stay as they are.
pub async fn configure(nl: &dyn Client, tap: &str) -> Result<(), Unmet> {
    let err = |e: crate::netlink::NetlinkError| Unmet::Configure(e.to_string());
    nl.sysctl(&format!("net/ipv4/conf/{tap}/rp_filter"), "0")
        .await
        .map_err(err)?;
    nl.sysctl(&format!("net/ipv4/conf/{tap}/accept_local"), "1")
        .await
        .map_err(err)?;
    let link = nl
        .link_detail(tap)
        .await
        .map_err(err)?
        .ok_or_else(|| Unmet::Configure("it vanished".into()))?;
    nl.link_up(link.link.index, None).await.map_err(err)?;
    Ok(())
}

/// [`Tunnel::start`] for `cfg` (a vxlan or udp engine on an IPv4 node) with
/// the tunnel TAP of `mode`: [`check`] on the node's `uplink`, the engine
/// asked for the TAP, the TAP [`configure`]d, and the outcome on the
/// tunnel's status. `on` fails on the first unmet condition; `auto` logs it
/// and runs on the sockets.
pub async fn start(
    us: &Userspace,
    mut cfg: EngineConfig,
    (addr, mtu): (IpNet, u32),
    anti: AntiSpoofing,
    mode: TunnelGso,
    uplink: &str,
) -> Result<Tunnel, BackendError> {
    let unmet = match mode {
        TunnelGso::Off => Some("off".to_string()),
        _ => check(&*us.nl, uplink)
            .await
            .err()
            .map(|u| fall_back(mode, u))
            .transpose()?,
    };
    if unmet.is_none() {
        cfg.tunnel_tap = Some(weft_engine::TunnelTap {
            name: TAP.into(),
            required: mode == TunnelGso::On,
        });
    }
    let mut t = Tunnel::start(us, cfg, addr, mtu, anti)
        .await
        .map_err(|e| match e {
            // `on`: the kernel refused the TAP or its offloads.
            BackendError::Engine(weft_engine::EngineError::TunnelTap { why, .. }) => {
                BackendError::TunnelGso(Unmet::Kernel(why))
            }
            e => e,
        })?;
    let used = match (unmet, t.tunnel_tap()) {
        (Some(why), _) => Err(why),
        (None, TunnelTapState::Open(tap)) => match configure(&*us.nl, &tap).await {
            Ok(()) => {
                tracing::info!("--tunnel-gso={mode}: TCP super-packets leave through {tap}");
                Ok(tap)
            }
            Err(u) => Err(fall_back(mode, u)?),
        },
        (None, TunnelTapState::Unavailable(why)) => Err(fall_back(mode, Unmet::Kernel(why))?),
        (None, TunnelTapState::NotAsked) => Err("not asked".to_string()),
    };
    t.set_tunnel_gso(status(mode, used.as_deref().map_err(Clone::clone)));
    Ok(t)
}

/// `on`: the unmet condition is the error; `auto`: logged, and the reason
/// status shows.
fn fall_back(mode: TunnelGso, u: Unmet) -> Result<String, BackendError> {
    if mode == TunnelGso::On {
        return Err(BackendError::TunnelGso(u));
    }
    tracing::info!("--tunnel-gso={mode}: UDP sockets, not the tunnel TAP: {u}");
    Ok(u.to_string())
}

/// What status shows for mode `mode`: the TAP in use, or why not.
pub fn status(mode: TunnelGso, r: Result<&str, String>) -> TunnelGsoStatus {
    let (tap, reason) = match r {
        Ok(tap) => (Some(tap.to_string()), None),
        Err(why) => (None, Some(why)),
    };
    TunnelGsoStatus {
        mode: mode.as_str().into(),
        tap,
        reason,
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::netlink::{FakeNetlink, LinkKind, Op};

    fn node() -> Arc<FakeNetlink> {
        let nl = Arc::new(FakeNetlink::new(&[], false));
        nl.set_feature("eth0", UPLINK_FEATURE, true);
        nl.set_sysctl("net/ipv4/ip_forward", "1");
        nl
    }

    #[test]
    fn parses_the_flags_values_and_refuses_others() {
        for m in [TunnelGso::Off, TunnelGso::Auto, TunnelGso::On] {
            assert_eq!(m.as_str().parse(), Ok(m));
        }
        assert_eq!(TunnelGso::default(), TunnelGso::Off);
        let e = "yes".parse::<TunnelGso>().expect_err("refused");
        assert!(e.contains("off, auto, on"), "{e}");
    }

    #[tokio::test]
    async fn a_node_that_has_everything_passes() {
        assert_eq!(check(&*node(), "eth0").await, Ok(()));
        // Loose reverse-path filtering is fine.
        let nl = node();
        nl.set_sysctl("net/ipv4/conf/all/rp_filter", "2");
        assert_eq!(check(&*nl, "eth0").await, Ok(()));
    }

    #[tokio::test]
    async fn each_condition_is_named() {
        let nl = node();
        nl.set_feature("eth0", UPLINK_FEATURE, false);
        let e = check(&*nl, "eth0").await.expect_err("offload off");
        assert_eq!(e, Unmet::UplinkOffload { dev: "eth0".into() });
        assert!(
            e.to_string()
                .contains("eth0 has no tx-udp_tnl-segmentation")
        );
        // A kernel without the feature's name counts as without it.
        let e = check(&*node(), "eth1").await.expect_err("unknown");
        assert_eq!(e, Unmet::UplinkOffload { dev: "eth1".into() });

        let nl = node();
        nl.set_sysctl("net/ipv4/ip_forward", "0");
        let e = check(&*nl, "eth0").await.expect_err("no forwarding");
        assert_eq!(e, Unmet::NoForwarding("0".into()));
        assert!(e.to_string().starts_with("net.ipv4.ip_forward is 0"));

        let nl = node();
        nl.set_sysctl("net/ipv4/conf/all/rp_filter", "1");
        let e = check(&*nl, "eth0").await.expect_err("strict");
        assert_eq!(e, Unmet::StrictRpFilter);

        let nl = node();
        nl.insert_link(TAP, LinkKind::Tun, 1500, None);
        let e = check(&*nl, "eth0").await.expect_err("taken");
        assert_eq!(
            e.to_string(),
            "a device named weft-gso0 exists and is not weft's"
        );
    }

    #[tokio::test]
    async fn checking_writes_nothing_and_configuring_only_the_taps_own() {
        let nl = node();
        nl.set_sysctl("net/ipv4/conf/all/rp_filter", "1");
        let _ = check(&*nl, "eth0").await;
        assert!(nl.ops().is_empty(), "{:?}", nl.ops());
        let idx = nl.insert_link(TAP, LinkKind::Tun, 1500, None);
        configure(&*nl, TAP).await.expect("configure");
        let ops = nl.ops();
        assert!(ops.contains(&Op::Sysctl(
            "net/ipv4/conf/weft-gso0/rp_filter".into(),
            "0".into()
        )));
        assert!(ops.contains(&Op::Sysctl(
            "net/ipv4/conf/weft-gso0/accept_local".into(),
            "1".into()
        )));
        assert!(
            ops.iter()
                .all(|o| !matches!(o, Op::Sysctl(k, _) if !k.contains("/weft-gso0/"))),
            "{ops:?}"
        );
        assert!(
            ops.iter()
                .any(|o| matches!(o, Op::LinkUp(i, None) if *i == idx)),
            "{ops:?}"
        );
        let e = configure(&*node(), TAP).await.expect_err("no TAP");
        assert!(matches!(e, Unmet::Configure(_)), "{e}");
    }

    #[test]
    fn status_says_the_tap_or_why_not() {
        let s = status(TunnelGso::Auto, Ok(TAP));
        assert_eq!((s.tap.as_deref(), s.reason), (Some(TAP), None));
        let s = status(TunnelGso::Off, Err("off".into()));
        assert_eq!(
            (s.mode.as_str(), s.tap, s.reason.as_deref()),
            ("off", None, Some("off"))
        );
    }
}
