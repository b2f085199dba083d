//! Choosing the node's external interface and public address (flannel-compat
//! spec §9.3, flannel pkg/ipmatch/match.go).
//!
//! Order: `--iface` (names or IPs, tried in order), then `--iface-regex`
//! (matched against addresses first, then names), then `--iface-can-reach`
//! (the interface the kernel would use to reach that address), else the
//! interface owning `--public-ip`, else the default-route interface.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use regex::Regex;

use crate::netlink::{Addr, Link, Netlink, NetlinkError};

/// The interface weftd sends overlay traffic on, and the addresses it publishes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExternalInterface {
    /// The link.
    pub iface: Link,
    /// Its IPv4 address (flannel's IfaceAddr), if IPv4 is in use.
    pub iface_addr: Option<Ipv4Addr>,
    /// Its IPv6 address (IfaceV6Addr), if IPv6 is in use.
    pub iface_v6_addr: Option<Ipv6Addr>,
    /// The public IPv4 address published in the lease (ExtAddr).
    pub ext_addr: Option<Ipv4Addr>,
    /// The public IPv6 address published in the lease (ExtV6Addr).
    pub ext_v6_addr: Option<Ipv6Addr>,
    /// The prefixes configured on the interface (on-link destinations).
    pub connected: Vec<ipnet::IpNet>,
}

/// What the user asked for.
#[derive(Debug, Clone, Default)]
pub struct IfaceOptions {
    /// `--iface` values (names or addresses).
    pub ifaces: Vec<String>,
    /// `--iface-regex` values.
    pub regexes: Vec<String>,
    /// `--iface-can-reach`.
    pub can_reach: Option<IpAddr>,
    /// `--public-ip`.
    pub public_ip: Option<Ipv4Addr>,
    /// `--public-ipv6`.
    pub public_ipv6: Option<Ipv6Addr>,
    /// Whether IPv4 / IPv6 are enabled in the network config.
    pub v4: bool,
    /// See `v4`.
    pub v6: bool,
}

/// Why no interface could be chosen.
#[derive(Debug, thiserror::Error)]
pub enum IfaceError {
    /// Reading links, addresses or routes failed.
    #[error(transparent)]
    Netlink(#[from] NetlinkError),
    /// `--iface*` were given and nothing matched (flannel's text).
    #[error("Failed to find interface to use that matches the interfaces and/or regexes provided")]
    NoMatch,
    /// An `--iface-regex` is not a valid regular expression.
    #[error("invalid --iface-regex {0:?}: {1}")]
    BadRegex(String, #[source] regex::Error),
    /// No interface owns `--public-ip`.
    #[error("no interface with address {0}")]
    NoInterfaceWithIp(IpAddr),
    /// There is no default route to take the interface from.
    #[error("failed to get default interface: no default route")]
    NoDefaultRoute,
    /// flannel's dual-stack rule.
    #[error("v6 default route interface {0} must be the same with v4 default route interface {1}")]
    DualStackMismatch(String, String),
    /// The chosen interface lacks an address of an enabled family.
    #[error("failed to find {family} address for interface {iface}")]
    NoAddress {
        /// "IPv4" or "IPv6".
        family: &'static str,
        /// The interface name.
        iface: String,
    },
    /// flannel refuses an interface with MTU 0.
    #[error("failed to determine MTU for {0} interface")]
    NoMtu(String),
    /// `--iface-can-reach` could not be resolved to a local address.
    #[error("cannot find a route to {0}: {1}")]
    Unreachable(IpAddr, #[source] std::io::Error),
}

/// Picks the external interface as flanneld does.
pub async fn select(nl: &Netlink, opts: &IfaceOptions) -> Result<ExternalInterface, IfaceError> {
    let links = nl.links().await?;
    let addrs = nl.addrs().await?;
    let link = if !opts.ifaces.is_empty() {
        opts.ifaces
            .iter()
            .find_map(|s| by_name_or_ip(&links, &addrs, s))
            .ok_or(IfaceError::NoMatch)?
    } else if !opts.regexes.is_empty() {
        let res = opts
            .regexes
            .iter()
            .map(|r| Regex::new(r).map_err(|e| IfaceError::BadRegex(r.clone(), e)))
            .collect::<Result<Vec<_>, _>>()?;
        by_regex(&links, &addrs, &res).ok_or(IfaceError::NoMatch)?
    } else if let Some(dst) = opts.can_reach {
        let local = local_addr_towards(dst)?;
        owner(&links, &addrs, local).ok_or(IfaceError::NoMatch)?
    } else if let Some(ip) = opts.public_ip {
        owner(&links, &addrs, IpAddr::V4(ip))
            .ok_or(IfaceError::NoInterfaceWithIp(IpAddr::V4(ip)))?
    } else {
        default_link(nl, &links, opts).await?
    };
    if link.mtu == 0 {
        return Err(IfaceError::NoMtu(link.name));
    }
    let iface_addr = if opts.v4 {
        Some(
            best_v4(&addrs, link.index).ok_or_else(|| IfaceError::NoAddress {
                family: "IPv4",
                iface: link.name.clone(),
            })?,
        )
    } else {
        None
    };
    let iface_v6_addr = if opts.v6 {
        Some(
            best_v6(&addrs, link.index).ok_or_else(|| IfaceError::NoAddress {
                family: "IPv6",
                iface: link.name.clone(),
            })?,
        )
    } else {
        None
    };
    let connected = addrs
        .iter()
        .filter(|a| a.index == link.index)
        .map(|a| a.net.trunc())
        .collect();
    Ok(ExternalInterface {
        connected,
        ext_addr: opts.public_ip.or(iface_addr).filter(|_| opts.v4),
        ext_v6_addr: opts.public_ipv6.or(iface_v6_addr).filter(|_| opts.v6),
        iface: link,
        iface_addr,
        iface_v6_addr,
    })
}

fn by_name_or_ip(links: &[Link], addrs: &[Addr], s: &str) -> Option<Link> {
    match s.parse::<IpAddr>() {
        Ok(ip) => owner(links, addrs, ip),
        Err(_) => links.iter().find(|l| l.name == s).cloned(),
    }
}

fn by_regex(links: &[Link], addrs: &[Addr], res: &[Regex]) -> Option<Link> {
    for re in res {
        // Addresses first, then names (flannel's order).
        if let Some(a) = addrs
            .iter()
            .find(|a| re.is_match(&a.net.addr().to_string()))
            && let Some(l) = links.iter().find(|l| l.index == a.index)
        {
            return Some(l.clone());
        }
        if let Some(l) = links.iter().find(|l| re.is_match(&l.name)) {
            return Some(l.clone());
        }
    }
    None
}

fn owner(links: &[Link], addrs: &[Addr], ip: IpAddr) -> Option<Link> {
    let a = addrs.iter().find(|a| a.net.addr() == ip)?;
    links.iter().find(|l| l.index == a.index).cloned()
}

async fn default_link(
    nl: &Netlink,
    links: &[Link],
    opts: &IfaceOptions,
) -> Result<Link, IfaceError> {
    let find = |idx: u32| links.iter().find(|l| l.index == idx).cloned();
    let v4 = if opts.v4 {
        nl.default_route_oif(false).await?.and_then(find)
    } else {
        None
    };
    let v6 = if opts.v6 {
        nl.default_route_oif(true).await?.and_then(find)
    } else {
        None
    };
    match (opts.v4, opts.v6, v4, v6) {
        (true, true, Some(a), Some(b)) if a.index != b.index => {
            Err(IfaceError::DualStackMismatch(b.name, a.name))
        }
        (true, _, Some(a), _) => Ok(a),
        (false, true, _, Some(b)) => Ok(b),
        _ => Err(IfaceError::NoDefaultRoute),
    }
}

/// Preference: global before link-local, permanent before dynamic; deprecated skipped.
fn rank(a: &Addr) -> (bool, bool) {
    (a.link_local, !a.permanent)
}

fn best_v4(addrs: &[Addr], index: u32) -> Option<Ipv4Addr> {
    addrs
        .iter()
        .filter(|a| a.index == index && a.net.addr().is_ipv4() && !a.deprecated)
        .min_by_key(|a| rank(a))
        .and_then(|a| match a.net.addr() {
            IpAddr::V4(v) => Some(v),
            IpAddr::V6(_) => None,
        })
}

fn best_v6(addrs: &[Addr], index: u32) -> Option<Ipv6Addr> {
    addrs
        .iter()
        .filter(|a| a.index == index && a.net.addr().is_ipv6() && !a.deprecated)
        .min_by_key(|a| rank(a))
        .and_then(|a| match a.net.addr() {
            IpAddr::V6(v) => Some(v),
            IpAddr::V4(_) => None,
        })
}

/// The source address the kernel picks towards `dst` (`ip route get`): a
/// connected UDP socket sends nothing but reports its bound address.
fn local_addr_towards(dst: IpAddr) -> Result<IpAddr, IfaceError> {
    let bind: std::net::SocketAddr = match dst {
        IpAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        IpAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    let s = std::net::UdpSocket::bind(bind).map_err(|e| IfaceError::Unreachable(dst, e))?;
    s.connect((dst, 9))
        .map_err(|e| IfaceError::Unreachable(dst, e))?;
    Ok(s.local_addr()
        .map_err(|e| IfaceError::Unreachable(dst, e))?
        .ip())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipnet::IpNet;

    fn addr(index: u32, net: &str, permanent: bool, deprecated: bool) -> Addr {
        let net: IpNet = net.parse().expect("net");
        Addr {
            index,
            net,
            permanent,
            deprecated,
            link_local: net.addr().to_string().starts_with("fe80"),
        }
    }

    #[test]
    fn address_preference() {
        let addrs = vec![
            addr(2, "fe80::1/64", true, false),
            addr(2, "2001:db8::9/64", false, false),
            addr(2, "2001:db8::1/64", true, true),
            addr(2, "2001:db8::2/64", true, false),
            addr(3, "192.0.2.9/24", true, false),
        ];
        assert_eq!(best_v6(&addrs, 2), Some("2001:db8::2".parse().expect("ip")));
        assert_eq!(best_v4(&addrs, 2), None);
        assert_eq!(best_v4(&addrs, 3), Some(Ipv4Addr::new(192, 0, 2, 9)));
    }

    #[test]
    fn regex_matches_addresses_before_names() {
        let links = vec![
            Link {
                index: 2,
                name: "eth0".into(),
                mtu: 1500,
                up: true,
                mac: None,
            },
            Link {
                index: 3,
                name: "192x".into(),
                mtu: 1500,
                up: true,
                mac: None,
            },
        ];
        let addrs = vec![addr(2, "192.0.2.1/24", true, false)];
        let re = vec![Regex::new("^192").expect("re")];
        assert_eq!(by_regex(&links, &addrs, &re).map(|l| l.index), Some(2));
        let re = vec![Regex::new("^eth").expect("re")];
        assert_eq!(by_regex(&links, &addrs, &re).map(|l| l.index), Some(2));
        assert!(by_regex(&links, &addrs, &[Regex::new("nope").expect("re")]).is_none());
    }
}
