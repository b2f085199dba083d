//! A thin typed layer over rtnetlink (and xfrmnetlink): the only place in
//! weftd that talks netlink. Each operation names the `ip` / `bridge` command
//! it mirrors.
//!
//! - [`Client`] is the small trait the kernel backends program through: links,
//!   addresses, routes, neighbours, fdb entries and the one sysctl flannel
//!   writes. [`XfrmClient`] is its IPsec counterpart (policies, SA probe).
//! - [`Netlink`] is the real implementation (one rtnetlink socket in the
//!   current network namespace); [`XfrmNetlink`] opens a NETLINK_XFRM socket.
//! - [`WgClient`] configures kernel WireGuard devices over generic netlink
//!   ([`WgNetlink`]; typed request [`WgSet`]).
//! - [`FakeNetlink`] implements all three traits in memory: it keeps a tiny model of
//!   the kernel's tables (so reconciliation can be tested by deleting entries)
//!   and records every request as a typed [`Op`], so unit tests assert the
//!   exact messages a backend sends without root.
//! - The typed requests ([`VxlanLink`], [`Neigh`], [`Fdb`], [`Route`], ...)
//!   build their netlink messages with pure functions (`message()`), shared
//!   by the real client and the unit tests.
//!
//! Errors carry the kernel's errno so that callers can tell "already exists"
//! from real failures without string matching.

mod client;
mod fake;
mod real;
mod types;
mod wg;
mod xfrm;

#[cfg(test)]
mod tests;

pub use client::{Client, WgClient, XfrmClient};
pub use fake::{FakeNetlink, Op};
pub use real::Netlink;
pub use real::route_mtu::{PEER_ROUTE_PROTO, lowered_mtu, set_lowered_mtu};
pub use real::rules::{Rule, RuleDo};
pub use types::{
    Addr, Fdb, IpipLink, Link, LinkDetail, LinkKind, LinkSpec, Neigh, Route, VxlanAttrs, VxlanLink,
    WireguardLink,
};
pub use wg::{WgDevice, WgNetlink, WgPeer, WgPeerSet, WgSet};
pub use xfrm::{XfrmDir, XfrmNetlink, XfrmPolicy, XfrmSa};

/// A netlink failure.
#[derive(Debug, thiserror::Error)]
pub enum NetlinkError {
    /// The netlink socket could not be opened.
    #[error("cannot open netlink socket: {0}")]
    Connect(#[source] std::io::Error),
    /// The kernel refused a request.
    #[error("{op}: {source}")]
    Request {
        /// What was asked, in `ip` terms.
        op: String,
        /// The kernel's answer.
        #[source]
        source: rtnetlink::Error,
    },
    /// The kernel refused an XFRM request.
    #[error("{op}: {source}")]
    Xfrm {
        /// What was asked, in `ip xfrm` terms.
        op: String,
        /// The kernel's answer (boxed: the crate's error embeds whole messages).
        #[source]
        source: Box<xfrmnetlink::Error>,
    },
    /// The kernel (or the fake) refused a request with this errno.
    #[error("{op}: {}", std::io::Error::from_raw_os_error(*.errno))]
    Errno {
        /// What was asked, in `ip` terms.
        op: String,
        /// The positive errno.
        errno: i32,
    },
    /// A generic netlink (WireGuard) request failed without an errno.
    #[error("{op}: {msg}")]
    Genl {
        /// What was asked, in `wg` terms.
        op: String,
        /// The failure.
        msg: String,
    },
    /// A link that must exist does not.
    #[error("link {0:?} not found")]
    NoSuchLink(String),
    /// Reading or setting a device's offloads (SIOCETHTOOL) failed.
    #[error("ethtool {dev}: {source}")]
    Ethtool {
        /// The device.
        dev: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Writing a sysctl file failed.
    #[error("sysctl {path}: {source}")]
    Sysctl {
        /// The file under /proc/sys.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

impl NetlinkError {
    /// The kernel errno (positive), if the kernel answered with one.
    pub fn errno(&self) -> Option<i32> {
        match self {
            NetlinkError::Request {
                source: rtnetlink::Error::NetlinkError(e),
                ..
            } => e.code.map(|c| -c.get()),
            NetlinkError::Xfrm { source, .. } => match source.as_ref() {
                xfrmnetlink::Error::NetlinkError(e) => e.code.map(|c| -c.get()),
                _ => None,
            },
            NetlinkError::Errno { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// Whether the kernel said "not supported" in one of its ways (unknown
    /// link kind, missing module, missing ESP): EOPNOTSUPP, ENOSYS,
    /// EAFNOSUPPORT, EPROTONOSUPPORT or ENOENT for a missing rtnl link kind.
    pub fn is_unsupported(&self) -> bool {
        matches!(
            self.errno(),
            Some(
                libc::EOPNOTSUPP
                    | libc::ENOSYS
                    | libc::EAFNOSUPPORT
                    | libc::EPROTONOSUPPORT
                    | libc::ENOENT
            )
        )
    }
}
