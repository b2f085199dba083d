//! Choosing the node's external interface and public address (flannel-compat
//! spec §9.3, flannel pkg/ipmatch/match.go).
//!
//! Order: `--iface` (names or IPs, tried in order), then `--iface-regex`
//! (matched against addresses first, then names), then `--iface-can-reach`
//! (the interface the kernel would use to reach that address): a candidate
//! that matches nothing, or has no address of an enabled family, passes to
//! the next, and only when all fail is it an error. Without any of these
//! flags: the interface owning `--public-ip`, else the default-route
//! interface. An address that selected the interface (`--iface=IP`, a
//! regex matching an address, the source towards `--iface-can-reach`) is
//! the interface address, as in flannel.

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

impl ExternalInterface {
    /// flannel's `cfg.MTU`: a backend's `MTU` option, or this interface's
    /// MTU when the option is 0 (unset), before the backend's overhead.
    pub fn backend_mtu(&self, option: u32) -> u32 {
        if option == 0 { self.iface.mtu } else { option }
    }
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
    if opts.ifaces.is_empty() && opts.regexes.is_empty() && opts.can_reach.is_none() {
        let link = match opts.public_ip {
            Some(ip) => owner(&links, &addrs, IpAddr::V4(ip))
                .ok_or(IfaceError::NoInterfaceWithIp(IpAddr::V4(ip)))?,
            None => default_link(nl, &links, opts).await?,
        };
        return resolve(link, None, &addrs, opts);
    }
    choose(&links, &addrs, opts, local_addr_towards)
}

/// flanneld's search when any `--iface*` flag is given (its main.go): each
/// `--iface` in order, then each `--iface-regex`, then `--iface-can-reach`;
/// the first candidate that is usable (it exists, has an address of every
/// enabled family and an MTU) wins. A candidate that is not is logged and
/// the search goes on; when none is, [`IfaceError::NoMatch`]. `reach` is
/// `ip route get`: the local address the kernel would send from.
fn choose(
    links: &[Link],
    addrs: &[Addr],
    opts: &IfaceOptions,
    reach: impl Fn(IpAddr) -> Result<IpAddr, IfaceError>,
) -> Result<ExternalInterface, IfaceError> {
    // An invalid expression is a mistake to report, not a candidate to skip.
    let res = opts
        .regexes
        .iter()
        .map(|r| Regex::new(r).map_err(|e| IfaceError::BadRegex(r.clone(), e)))
        .collect::<Result<Vec<_>, _>>()?;
    let found = |what: &str, c: Option<(Link, Option<IpAddr>)>| match c {
        Some((link, ip)) => match resolve(link, ip, addrs, opts) {
            Ok(e) => Some(e),
            Err(e) => {
                tracing::info!("Could not find valid interface matching {what}: {e}");
                None
            }
        },
        None => {
            tracing::info!("Could not find valid interface matching {what}");
            None
        }
    };
    for s in &opts.ifaces {
        if let Some(e) = found(s, by_name_or_ip(links, addrs, s)) {
            return Ok(e);
        }
    }
    for (text, re) in opts.regexes.iter().zip(&res) {
        if let Some(e) = found(text, by_regex(links, addrs, re, opts)) {
            return Ok(e);
        }
    }
    if let Some(dst) = opts.can_reach {
        let what = format!("--iface-can-reach {dst}");
        match reach(dst) {
            Ok(local) => {
                let c = owner(links, addrs, local).map(|l| (l, Some(local)));
                if let Some(e) = found(&what, c) {
                    return Ok(e);
                }
            }
            Err(e) => tracing::info!("Could not find valid interface matching {what}: {e}"),
        }
    }
    Err(IfaceError::NoMatch)
}

/// The external interface on `link`: `ip` (the address a flag matched) is
/// its address of that family, the best address of the link otherwise.
fn resolve(
    link: Link,
    ip: Option<IpAddr>,
    addrs: &[Addr],
    opts: &IfaceOptions,
) -> Result<ExternalInterface, IfaceError> {
    if link.mtu == 0 {
        return Err(IfaceError::NoMtu(link.name));
    }
    let iface_addr = if opts.v4 {
        let matched = match ip {
            Some(IpAddr::V4(a)) => Some(a),
            _ => None,
        };
        Some(
            matched
                .or_else(|| best_v4(addrs, link.index))
                .ok_or_else(|| IfaceError::NoAddress {
                    family: "IPv4",
                    iface: link.name.clone(),
                })?,
        )
    } else {
        None
    };
    let iface_v6_addr = if opts.v6 {
        let matched = match ip {
            Some(IpAddr::V6(a)) => Some(a),
            _ => None,
        };
        Some(
            matched
                .or_else(|| best_v6(addrs, link.index))
                .ok_or_else(|| IfaceError::NoAddress {
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

/// `--iface` value `s`: a name, or an address (which is then the interface address).
fn by_name_or_ip(links: &[Link], addrs: &[Addr], s: &str) -> Option<(Link, Option<IpAddr>)> {
    match s.parse::<IpAddr>() {
        Ok(ip) => owner(links, addrs, ip).map(|l| (l, Some(ip))),
        Err(_) => links
            .iter()
            .find(|l| l.name == s)
            .map(|l| (l.clone(), None)),
    }
}

/// `--iface-regex` `re`: the first address of an enabled family it matches
/// (which is then the interface address), else the first name.
fn by_regex(
    links: &[Link],
    addrs: &[Addr],
    re: &Regex,
    opts: &IfaceOptions,
) -> Option<(Link, Option<IpAddr>)> {
    let family = |a: &&Addr| {
        if a.net.addr().is_ipv4() {
            opts.v4
        } else {
            opts.v6
        }
    };
    // Addresses first, then names (flannel's order).
    for a in addrs.iter().filter(family) {
        let ip = a.net.addr();
        if re.is_match(&ip.to_string())
            && let Some(l) = links.iter().find(|l| l.index == a.index)
        {
            return Some((l.clone(), Some(ip)));
        }
    }
    links
        .iter()
        .find(|l| re.is_match(&l.name))
        .map(|l| (l.clone(), None))
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

    fn link(index: u32, name: &str) -> Link {
        Link {
            index,
            name: name.into(),
            mtu: 1500,
            up: true,
            mac: None,
        }
    }

    fn v4() -> IfaceOptions {
        IfaceOptions {
            v4: true,
            ..Default::default()
        }
    }

    #[test]
    fn regex_matches_addresses_before_names() {
        let links = vec![link(2, "eth0"), link(3, "192x")];
        let addrs = vec![addr(2, "192.0.2.1/24", true, false)];
        let re = |r: &str| Regex::new(r).expect("re");
        let hit = |r: &str| by_regex(&links, &addrs, &re(r), &v4()).map(|(l, ip)| (l.index, ip));
        assert_eq!(
            hit("^192"),
            Some((2, Some("192.0.2.1".parse().expect("ip"))))
        );
        assert_eq!(hit("^eth"), Some((2, None)));
        assert_eq!(hit("x$"), Some((3, None)));
        assert!(hit("nope").is_none());
        // Only addresses of an enabled family are matched.
        let v6 = IfaceOptions {
            v6: true,
            ..Default::default()
        };
        assert_eq!(
            by_regex(&links, &addrs, &re("^192"), &v6).map(|(l, _)| l.index),
            Some(3),
            "falls to the name 192x"
        );
    }

    /// A node with two interfaces (`eth0` 192.0.2.1 plus a secondary
    /// 192.0.2.9, `eth1` 198.51.100.1), one without IPv4 (`eth2`) and `lo`.
    fn node() -> (Vec<Link>, Vec<Addr>) {
        let links = vec![
            link(1, "lo"),
            link(2, "eth0"),
            link(3, "eth1"),
            link(4, "eth2"),
        ];
        let addrs = vec![
            addr(1, "127.0.0.1/8", true, false),
            addr(2, "192.0.2.1/24", true, false),
            addr(2, "192.0.2.9/24", true, false),
            addr(3, "198.51.100.1/24", true, false),
            addr(4, "2001:db8::4/64", true, false),
        ];
        (links, addrs)
    }

    fn pick(opts: IfaceOptions) -> Result<(String, Ipv4Addr, Ipv4Addr), String> {
        let (links, addrs) = node();
        let reach = |dst: IpAddr| -> Result<IpAddr, IfaceError> {
            match dst {
                // The kernel would reach 203.0.113.7 from eth1's address.
                IpAddr::V4(a) if a == Ipv4Addr::new(203, 0, 113, 7) => {
                    Ok(IpAddr::V4(Ipv4Addr::new(198, 51, 100, 1)))
                }
                _ => Err(IfaceError::Unreachable(
                    dst,
                    std::io::Error::from_raw_os_error(libc::ENETUNREACH),
                )),
            }
        };
        choose(&links, &addrs, &opts, reach)
            .map(|e| {
                (
                    e.iface.name,
                    e.iface_addr.expect("v4"),
                    e.ext_addr.expect("ext"),
                )
            })
            .map_err(|e| e.to_string())
    }

    fn strings(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn iface_falls_through_to_regex_then_can_reach() {
        let eth1 = Ok((
            "eth1".to_string(),
            Ipv4Addr::new(198, 51, 100, 1),
            Ipv4Addr::new(198, 51, 100, 1),
        ));
        // --iface matches nothing: the regex decides.
        let o = IfaceOptions {
            ifaces: strings(&["nosuch0", "203.0.113.99"]),
            regexes: strings(&["^198\\.51\\."]),
            ..v4()
        };
        assert_eq!(pick(o), eth1);
        // --iface names an interface without IPv4: not usable, the regex decides.
        let o = IfaceOptions {
            ifaces: strings(&["eth2"]),
            regexes: strings(&["^eth1$"]),
            ..v4()
        };
        assert_eq!(pick(o), eth1);
        // Neither --iface nor --iface-regex match: --iface-can-reach decides.
        let o = IfaceOptions {
            ifaces: strings(&["nosuch0"]),
            regexes: strings(&["^nosuch"]),
            can_reach: Some("203.0.113.7".parse().expect("ip")),
            ..v4()
        };
        assert_eq!(pick(o), eth1);
        // An --iface that matches wins over the rest.
        let o = IfaceOptions {
            ifaces: strings(&["nosuch0", "eth0"]),
            regexes: strings(&["^eth1$"]),
            can_reach: Some("203.0.113.7".parse().expect("ip")),
            ..v4()
        };
        assert_eq!(pick(o).expect("eth0").0, "eth0");
        // Nothing usable anywhere: flannel's error.
        let o = IfaceOptions {
            ifaces: strings(&["eth2"]),
            regexes: strings(&["^nosuch"]),
            can_reach: Some("203.0.113.50".parse().expect("ip")),
            ..v4()
        };
        assert_eq!(
            pick(o),
            Err("Failed to find interface to use that matches the interfaces and/or regexes provided".into())
        );
        // An invalid regex is reported, not skipped.
        let o = IfaceOptions {
            ifaces: strings(&["eth0"]),
            regexes: strings(&["("]),
            ..v4()
        };
        assert!(
            pick(o)
                .expect_err("bad regex")
                .contains("invalid --iface-regex")
        );
    }

    #[test]
    fn the_matching_address_is_the_interface_address() {
        let o = IfaceOptions {
            ifaces: strings(&["192.0.2.9"]),
            ..v4()
        };
        let nine = Ipv4Addr::new(192, 0, 2, 9);
        assert_eq!(pick(o), Ok(("eth0".into(), nine, nine)));
        let o = IfaceOptions {
            regexes: strings(&["\\.9$"]),
            ..v4()
        };
        assert_eq!(pick(o), Ok(("eth0".into(), nine, nine)));
        // By name: the link's best address; --public-ip is what is published.
        let o = IfaceOptions {
            ifaces: strings(&["eth0"]),
            public_ip: Some(Ipv4Addr::new(203, 0, 113, 1)),
            ..v4()
        };
        assert_eq!(
            pick(o),
            Ok((
                "eth0".into(),
                Ipv4Addr::new(192, 0, 2, 1),
                Ipv4Addr::new(203, 0, 113, 1)
            ))
        );
    }
}
