//! The backend layer's error type: one variant per cause a caller (the
//! daemon, a switch, the operator reading the log) acts on differently;
//! messages stay flannel's where flannel has them.

use crate::netlink::NetlinkError;

use super::{Dataplane, ipsec, probe};

/// Errors from a backend.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The `Backend` object of net-conf.json: an unknown type (flannel's
    /// message) or an option of the wrong type or range.
    #[error(transparent)]
    Options(#[from] crate::config::OptionsError),
    /// A backend flannel knows but weft does not implement (yet).
    #[error("backend type {0:?} is not supported by weft")]
    Unsupported(String),
    /// The backend's options are invalid.
    #[error("{0}")]
    Config(String),
    /// The node lacks an address or lease part the backend runs on.
    #[error("{backend}: {what}")]
    Missing {
        /// The backend ("vxlan", "wireguard", ...).
        backend: &'static str,
        /// What it lacks.
        what: Missing,
    },
    /// The kernel lacks a module the requested kernel dataplane needs
    /// (`userspace`: whether weft has a userspace engine for the backend, the
    /// fix `--dataplane=auto` offers).
    #[error("{}", kernel_lacks(backend, feature, *forced, *userspace))]
    KernelLacks {
        /// The backend.
        backend: &'static str,
        /// The missing kernel feature ("ipip", "wireguard", ...).
        feature: &'static str,
        /// The operator asked for the kernel path explicitly.
        forced: bool,
        /// weft has a userspace engine for the backend.
        userspace: bool,
    },
    /// A switch was refused: the other dataplane would publish different
    /// lease attributes (peers would have to re-learn this node).
    #[error(
        "the {path} dataplane would publish different lease attributes ({attrs}); not switching"
    )]
    AttrsDiffer {
        /// The dataplane switched to.
        path: Dataplane,
        /// Its attributes, as JSON.
        attrs: String,
    },
    /// A device of the backend's name exists and is not what the backend
    /// makes (another kind, or an address it cannot take).
    #[error("{name} {why}")]
    ForeignDevice {
        /// The device.
        name: String,
        /// How it differs.
        why: String,
    },
    /// The node's WireGuard key could not be read or written.
    #[error("wireguard key: {0}")]
    Key(String),
    /// The NAT relay's socket (`--nat-relay`).
    #[error("NAT relay on {bind}: {source}")]
    Relay {
        /// The address it would listen on.
        bind: std::net::SocketAddr,
        /// Why it cannot.
        #[source]
        source: std::io::Error,
    },
    /// NAT discovery on the kernel WireGuard path (`--nat-traversal`).
    #[error(transparent)]
    NatDiscovery(#[from] crate::backend::wireguard::kernel_disco::KernelDiscoError),
    /// Programming the kernel failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// The userspace engine could not start (the message adds the fix for a
    /// TUN failure, [`probe::engine_error`]).
    #[error("engine: {}", probe::engine_error(.0))]
    Engine(#[source] weft_engine::EngineError),
    /// `--tunnel-gso=on` and a condition of the tunnel TAP failed.
    #[error("--tunnel-gso=on: {0}")]
    TunnelGso(#[from] crate::backend::tunnel::gso::Unmet),
    /// The engine's TUN device was gone right after the engine made it.
    #[error("engine: tun {0} vanished")]
    TunVanished(String),
    /// The IKE daemon (charon) could not be started or refused a request.
    #[error(transparent)]
    Ike(#[from] ipsec::charon::CharonError),
    /// A device the backend runs on was deleted under it (e.g. `ip link del
    /// flannel.1`); the daemon rebuilds the backend on the same lease.
    #[error("device {0} was deleted")]
    DeviceGone(String),
    /// A dataplane switch failed and the old path could not be restored:
    /// nothing forwards; the daemon exits (its supervisor restarts it).
    #[error(
        "switching to the {to} path failed ({error}) and the {from} path could not be restored ({restore})"
    )]
    NoDataplane {
        /// The path switched to.
        to: Dataplane,
        /// The path that ran.
        from: Dataplane,
        /// Why the new path failed.
        error: Box<BackendError>,
        /// Why the old one could not come back.
        restore: Box<BackendError>,
    },
}

/// flannel-style wording: with `--dataplane=kernel` the flag is named; on
/// `auto` the message says there is no userspace path to fall back to.
fn kernel_lacks(backend: &str, feature: &str, forced: bool, userspace: bool) -> String {
    if forced || userspace {
        format!(
            "--dataplane=kernel: this kernel cannot run the {backend} backend: no {feature} support"
        )
    } else {
        format!(
            "this kernel cannot run the {backend} backend (no {feature} support) and weft has no userspace {backend} engine yet"
        )
    }
}

/// What [`BackendError::Missing`] names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Missing {
    /// The node's IPv4 public address (`--public-ip` or the interface's).
    PublicV4,
    /// The node's IPv6 public address.
    PublicV6,
    /// An IPv4 address on the external interface.
    InterfaceV4,
    /// An IPv4 subnet in this node's lease.
    LeaseV4,
    /// An address for the engine's device (no subnet in the lease).
    DeviceAddress,
    /// An IPv4 `Network` in net-conf.json.
    NetworkV4,
}

impl std::fmt::Display for Missing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Missing::PublicV4 => "no IPv4 public address",
            Missing::PublicV6 => "no IPv6 public address",
            Missing::InterfaceV4 => "the external interface has no IPv4 address",
            Missing::LeaseV4 => "the backend needs an IPv4 lease",
            Missing::DeviceAddress => "no device address (the lease has no subnet)",
            Missing::NetworkV4 => "the backend needs an IPv4 Network",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_backend_the_cause_and_the_fix() {
        let e = BackendError::Missing {
            backend: "vxlan",
            what: Missing::PublicV6,
        };
        assert_eq!(e.to_string(), "vxlan: no IPv6 public address");
        let lacks = |forced, userspace| BackendError::KernelLacks {
            backend: "ipip",
            feature: "ipip",
            forced,
            userspace,
        };
        assert_eq!(
            lacks(true, true).to_string(),
            "--dataplane=kernel: this kernel cannot run the ipip backend: no ipip support"
        );
        assert_eq!(
            lacks(false, false).to_string(),
            "this kernel cannot run the ipip backend (no ipip support) and weft has no userspace ipip engine yet"
        );
        let e = BackendError::AttrsDiffer {
            path: Dataplane::Userspace,
            attrs: "{}".into(),
        };
        assert!(
            e.to_string()
                .starts_with("the userspace dataplane would publish")
        );
    }
}
