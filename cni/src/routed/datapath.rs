//! The routed pod datapath (Terway's VPC-route layout): a veth pair, no
//! bridge, a host route per pod and a link-local gateway answered by a
//! permanent neighbour entry.
//!
//! ```text
//! pod netns                                host netns
//!   eth0  10.244.1.5/32                      weft1a2b3c4d5e6 (no address)
//!   default via 169.254.1.1 dev eth0 onlink  10.244.1.5 dev weft1a2b3c4d5e6 scope link
//!   169.254.1.1 lladdr <host veth MAC> PERMANENT
//!                                            10.244.1.5 lladdr <pod MAC> PERMANENT
//! ```
//!
//! IPv6 is the same with `<ip>/128` (no DAD), `default via fe80::1 onlink`
//! and a permanent `fe80::1` neighbour. Neither side ever ARPs or solicits:
//! the host side also gets a permanent entry for the pod's addresses.
//!
//! Contract:
//! - The host-side name is derived from `(containerID, ifname)` only
//!   ([`host_veth_name`]), so DEL, CHECK and GC find it without saved state.
//! - [`create`] either completes or leaves nothing behind: if any step after
//!   the veth creation fails, the veth is deleted (which removes the pod side,
//!   the host route and the neighbour entries with it) and the step's error
//!   is returned.
//! - [`remove`] deletes the host veth; a missing one is success. The pod's
//!   namespace is not needed (when it is gone, so is the veth pair).

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::RoutedError;
use super::nl::{Link, NlError, Socket, max_prefix};

/// The pods' IPv4 gateway: link-local, never on the wire.
pub const GATEWAY_V4: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);
/// The pods' IPv6 gateway.
pub const GATEWAY_V6: Ipv6Addr = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1);

/// What ADD built.
#[derive(Debug, Clone)]
pub struct Attached {
    /// The host veth's name.
    pub host_name: String,
    /// The host veth's MAC.
    pub host_mac: Vec<u8>,
    /// The pod interface's MAC.
    pub pod_mac: Vec<u8>,
}

/// The host-side veth name for an attachment: `weft` + 11 hex digits of the
/// FNV-1a hash of `containerID` NUL `ifname` (15 bytes, Linux's limit).
pub fn host_veth_name(container_id: &str, ifname: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in container_id.bytes().chain([0]).chain(ifname.bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("weft{:011x}", h >> 20)
}

/// The gateway of `ip`'s family.
pub fn gateway(ip: IpAddr) -> IpAddr {
    if ip.is_ipv4() {
        IpAddr::V4(GATEWAY_V4)
    } else {
        IpAddr::V6(GATEWAY_V6)
    }
}

/// Builds the datapath for a pod with addresses `ips` (see the module docs).
pub fn create(
    host: &mut Socket,
    netns: &File,
    host_name: &str,
    ifname: &str,
    ips: &[IpAddr],
    mtu: u32,
) -> Result<Attached, RoutedError> {
    if let Err(e) = host.add_veth(host_name, ifname, mtu, netns) {
        return Err(match e.errno() {
            Some(libc::EEXIST) => RoutedError::Exists(format!(
                "container veth name provided ({ifname}) already exists"
            )),
            _ => e.into(),
        });
    }
    match configure(host, netns, host_name, ifname, ips) {
        Ok(a) => Ok(a),
        Err(e) => {
            if let Err(de) = host.del_link(host_name) {
                crate::log(&format!("rollback: {de}"));
            }
            Err(e)
        }
    }
}

fn configure(
    host: &mut Socket,
    netns: &File,
    host_name: &str,
    ifname: &str,
    ips: &[IpAddr],
) -> Result<Attached, RoutedError> {
    let host_link = must_link(host, host_name)?;
    host.set_up(host_link.index)?;
    let mut pod = Socket::open_in(netns)?;
    let pod_link = must_link(&mut pod, ifname)?;
    for &ip in ips {
        pod.add_host_addr(pod_link.index, ip)?;
    }
    pod.set_up(pod_link.index)?;
    for &ip in ips {
        let gw = gateway(ip);
        pod.add_permanent_neigh(pod_link.index, gw, &host_link.mac)?;
        let any = if ip.is_ipv4() {
            IpAddr::V4(Ipv4Addr::UNSPECIFIED)
        } else {
            IpAddr::V6(Ipv6Addr::UNSPECIFIED)
        };
        pod.add_route(any, 0, Some(gw), pod_link.index)?;
        host.add_permanent_neigh(host_link.index, ip, &pod_link.mac)?;
        host.add_route(ip, max_prefix(ip), None, host_link.index)?;
    }
    Ok(Attached {
        host_name: host_name.to_string(),
        host_mac: host_link.mac,
        pod_mac: pod_link.mac,
    })
}

fn must_link(sock: &mut Socket, name: &str) -> Result<Link, RoutedError> {
    sock.link(name)?
        .ok_or_else(|| RoutedError::Check(format!("link {name} vanished right after its creation")))
}

/// Deletes the host veth (and with it everything [`create`] made); `false`
/// if it did not exist.
pub fn remove(host: &mut Socket, host_name: &str) -> Result<bool, NlError> {
    host.del_link(host_name)
}

/// Verifies the datapath of a pod with addresses `ips`; the first problem
/// found is the error.
pub fn verify(
    host: &mut Socket,
    netns: &File,
    host_name: &str,
    ifname: &str,
    ips: &[IpAddr],
) -> Result<(), RoutedError> {
    let fail = |m: String| Err(RoutedError::Check(m));
    let Some(host_link) = host.link(host_name)? else {
        return fail(format!("host veth {host_name} is missing"));
    };
    if !host_link.up {
        return fail(format!("host veth {host_name} is down"));
    }
    let mut pod = Socket::open_in(netns)?;
    let Some(pod_link) = pod.link(ifname)? else {
        return fail(format!("pod interface {ifname} is missing"));
    };
    if !pod_link.up {
        return fail(format!("pod interface {ifname} is down"));
    }
    let addrs = pod.addrs(pod_link.index)?;
    let neighs = pod.permanent_neighs(pod_link.index)?;
    for &ip in ips {
        let len = max_prefix(ip);
        if !addrs.contains(&(ip, len)) {
            return fail(format!("pod interface {ifname} lacks {ip}/{len}"));
        }
        let gw = gateway(ip);
        let default = pod
            .routes(ip.is_ipv6())?
            .into_iter()
            .any(|r| r.len == 0 && r.gw == Some(gw) && r.oif == pod_link.index);
        if !default {
            return fail(format!("pod has no default route via {gw} dev {ifname}"));
        }
        if !neighs
            .iter()
            .any(|(n, mac)| *n == gw && *mac == host_link.mac)
        {
            return fail(format!(
                "pod has no permanent neighbour {gw} -> {}",
                super::nl::fmt_mac(&host_link.mac)
            ));
        }
        let host_route = host
            .routes(ip.is_ipv6())?
            .into_iter()
            .any(|r| r.dst == Some(ip) && r.len == len && r.oif == host_link.index);
        if !host_route {
            return fail(format!("host has no route {ip}/{len} dev {host_name}"));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_names_are_stable_short_and_distinct() {
        let a = host_veth_name("abc", "eth0");
        assert_eq!(a, host_veth_name("abc", "eth0"));
        assert_eq!(a.len(), 15);
        assert!(a.starts_with("weft") && a[4..].bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, host_veth_name("abc", "eth1"));
        assert_ne!(
            a,
            host_veth_name("abce", "th0"),
            "the separator keeps the fields apart"
        );
        let names: std::collections::BTreeSet<String> = (0..10_000)
            .map(|i| host_veth_name(&format!("c{i}"), "eth0"))
            .collect();
        assert_eq!(names.len(), 10_000);
    }
}
