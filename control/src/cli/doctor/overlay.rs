//! The overlay's checks: weft's devices, the routes, neighbour and fdb
//! entries each peer lease needs, the interface weftd chose, rp_filter.
//! All need weftd's status (its lease, peers and devices); without it they
//! find nothing (the `weftd_down` finding says why).
//!
//! Routes are judged by longest prefix match over the main table, as the
//! kernel picks them (policy routing rules are not read): a peer's subnet
//! is fine when its best route leaves through one of weft's devices or goes
//! via the peer's public IP (host-gw).

use std::net::{IpAddr, Ipv4Addr};

use ipnet::{IpNet, Ipv4Net};

use super::facts::{Facts, LinkFact};
use super::{Finding, Severity};
use crate::netlink::Route;
use crate::status::model::{PeerStatus, Status};

fn status(f: &Facts) -> Option<&Status> {
    f.daemon.as_ref().ok()
}

fn link_by_index(f: &Facts, index: u32) -> Option<&LinkFact> {
    f.links.iter().find(|l| l.index == index)
}

fn link_name(f: &Facts, index: Option<u32>) -> String {
    index
        .and_then(|i| link_by_index(f, i))
        .map_or("?".to_string(), |l| l.name.clone())
}

/// weft's devices as links (those that exist).
fn weft_links<'a>(f: &'a Facts, st: &Status) -> Vec<&'a LinkFact> {
    f.links
        .iter()
        .filter(|l| st.backend.devices.iter().any(|d| d.name == l.name))
        .collect()
}

/// The best main-table route for `net` (longest prefix that covers all of it).
pub fn best_route(routes: &[Route], net: IpNet) -> Option<&Route> {
    routes
        .iter()
        .filter(|r| r.dst.prefix_len() <= net.prefix_len() && r.dst.contains(&net.network()))
        .max_by_key(|r| r.dst.prefix_len())
}

fn show_route(f: &Facts, r: Option<&Route>) -> String {
    match r {
        None => "no route".to_string(),
        Some(r) if r.oif.is_none() && r.gateway.is_none() => format!("{} (blackhole)", r.dst),
        Some(r) => {
            let via = r.gateway.map(|g| format!(" via {g}")).unwrap_or_default();
            format!("{}{via} dev {}", r.dst, link_name(f, r.oif))
        }
    }
}

fn peer_subnet(p: &PeerStatus) -> Option<Ipv4Net> {
    p.subnet.as_deref()?.parse().ok()
}

fn peer_ip(p: &PeerStatus) -> Option<IpAddr> {
    p.public_ip.parse().ok()
}

/// Every weft device exists and is up.
pub fn devices(f: &Facts) -> Vec<Finding> {
    let Some(st) = status(f) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for d in &st.backend.devices {
        match f.links.iter().find(|l| l.name == d.name) {
            None => out.push(Finding::new(
                "device_missing",
                Severity::Error,
                format!("weft's device {} does not exist: no traffic to other nodes", d.name),
                format!("weftd's status names {}; ip link has no such link", d.name),
                "weftd recreates it at its next reconcile (within 10 s); if it stays missing, see weftd's log",
            )),
            Some(l) if !l.up => out.push(Finding::new(
                "device_down",
                Severity::Error,
                format!("weft's device {} is down: no traffic to other nodes", d.name),
                format!("{} is administratively down", d.name),
                format!("ip link set {} up", d.name),
            )),
            Some(_) => {}
        }
    }
    out
}

/// Each peer's subnet is routed into the overlay.
pub fn peer_routes(f: &Facts) -> Vec<Finding> {
    let Some(st) = status(f) else {
        return Vec::new();
    };
    if st.backend.dataplane == "none" || st.backend.name == "ipsec" {
        return Vec::new();
    }
    let devs: Vec<u32> = weft_links(f, st).iter().map(|l| l.index).collect();
    let mut out = Vec::new();
    for p in &st.peers {
        let Some(net) = peer_subnet(p) else { continue };
        let best = best_route(&f.routes, IpNet::V4(net));
        let ok = best
            .is_some_and(|r| r.oif.is_some_and(|o| devs.contains(&o)) || r.gateway == peer_ip(p));
        if !ok {
            out.push(Finding::new(
                "route_missing",
                Severity::Error,
                format!(
                    "the route to peer {} ({net}) is missing or leads elsewhere: pods there are unreachable",
                    p.public_ip
                ),
                format!("best route for {net}: {}", show_route(f, best)),
                "weftd restores its routes at its next reconcile (within 10 s); if it stays, look for another agent deleting or overriding them",
            ));
        }
    }
    out
}

fn mac(m: &[u8; 6]) -> String {
    m.iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Kernel vxlan: each peer's neighbour entry and the fdb entry of its MAC
/// point at the peer's VTEP; no fdb entry points anywhere else.
pub fn vxlan_l2(f: &Facts) -> Vec<Finding> {
    let Some(st) = status(f) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for dev in weft_links(f, st).into_iter().filter(|l| l.kind == "vxlan") {
        let mut expected: Vec<[u8; 6]> = Vec::new();
        for p in &st.peers {
            let (Some(net), Some(vtep)) = (peer_subnet(p), peer_ip(p)) else {
                continue;
            };
            let gw = IpAddr::V4(net.network());
            let Some(n) = f.neighs.iter().find(|n| n.dev == dev.name && n.ip == gw) else {
                out.push(Finding::new(
                    "neigh_missing",
                    Severity::Error,
                    format!(
                        "no neighbour entry for peer {} on {}: its pods are unreachable",
                        p.public_ip, dev.name
                    ),
                    format!(
                        "ip neigh show dev {} has no permanent entry for {gw}",
                        dev.name
                    ),
                    "weftd restores it at its next reconcile (within 10 s)",
                ));
                continue;
            };
            expected.push(n.mac);
            let fdbs: Vec<_> = f
                .fdbs
                .iter()
                .filter(|e| e.dev == dev.name && e.mac == n.mac)
                .collect();
            if fdbs.iter().any(|e| e.ip == vtep) {
                continue;
            }
            let seen = fdbs.iter().map(|e| e.ip.to_string()).collect::<Vec<_>>();
            out.push(if seen.is_empty() {
                Finding::new(
                    "fdb_missing",
                    Severity::Error,
                    format!("no fdb entry for peer {}'s VTEP MAC on {}: its pods are unreachable", p.public_ip, dev.name),
                    format!("neighbour {gw} is {}; bridge fdb has no entry for it", mac(&n.mac)),
                    "weftd restores it at its next reconcile (within 10 s)",
                )
            } else {
                Finding::new(
                    "fdb_stale",
                    Severity::Error,
                    format!(
                        "the fdb entry for peer {}'s VTEP MAC sends to the wrong node (a node that re-joined with a new address?)",
                        p.public_ip
                    ),
                    format!(
                        "{} dev {} dst {}; the peer's lease says {vtep}",
                        mac(&n.mac),
                        dev.name,
                        seen.join(",")
                    ),
                    format!(
                        "bridge fdb replace {} dev {} dst {vtep} self permanent (weftd does this at its next reconcile)",
                        mac(&n.mac),
                        dev.name
                    ),
                )
            });
        }
        for e in f.fdbs.iter().filter(|e| e.dev == dev.name) {
            if !expected.contains(&e.mac) {
                out.push(Finding::new(
                    "fdb_stale",
                    Severity::Warning,
                    format!(
                        "an fdb entry on {} belongs to no peer lease (left by a node that is gone)",
                        dev.name
                    ),
                    format!("{} dev {} dst {}", mac(&e.mac), dev.name, e.ip),
                    format!(
                        "bridge fdb del {} dev {} dst {}",
                        mac(&e.mac),
                        dev.name,
                        e.ip
                    ),
                ));
            }
        }
    }
    out
}

/// The interface whose address weftd published (or the default route's).
pub(super) fn ext_link(f: &Facts) -> Option<&LinkFact> {
    let public = status(f)
        .and_then(|st| st.lease.as_ref())
        .and_then(|l| l.public_ip.parse::<IpAddr>().ok());
    match public {
        Some(ip) => f
            .addrs
            .iter()
            .find(|(_, a)| a.addr() == ip)
            .and_then(|(i, _)| link_by_index(f, *i)),
        None => {
            let r = best_route(
                &f.routes,
                IpNet::V4(Ipv4Net::new(Ipv4Addr::UNSPECIFIED, 0).ok()?),
            )?;
            link_by_index(f, r.oif?)
        }
    }
}

/// Links with a global IPv4 address outside the pod network (not weft's, not cni0).
fn homes(f: &Facts) -> Vec<(String, IpNet)> {
    let network = f
        .subnet_env
        .as_ref()
        .ok()
        .and_then(|e| e.as_ref())
        .and_then(|e| e.network);
    f.addrs
        .iter()
        .filter_map(|(i, a)| {
            let IpAddr::V4(v4) = a.addr() else {
                return None;
            };
            let l = link_by_index(f, *i)?;
            let skip = v4.is_loopback()
                || v4.is_link_local()
                || network.is_some_and(|n| n.contains(&v4))
                || l.name == "cni0";
            (!skip).then(|| (l.name.clone(), *a))
        })
        .collect()
}

/// The public address weftd published, the interface it is on, and
/// whether traffic to the peers leaves through it.
pub fn interface(f: &Facts) -> Vec<Finding> {
    let Some(st) = status(f) else {
        return Vec::new();
    };
    let Some(lease) = &st.lease else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let Some(ext) = ext_link(f) else {
        return vec![Finding::new(
            "public_ip_not_local",
            Severity::Warning,
            format!(
                "the public IP weftd published ({}) is on no interface of this node: fine behind NAT with --public-ip, otherwise peers send to the wrong address",
                lease.public_ip
            ),
            format!("no interface holds {}", lease.public_ip),
            "if this node is not behind NAT, start weftd with --iface=<the interface the other nodes reach> (or --public-ip=<its address>)",
        )];
    };
    let homes = homes(f);
    if homes.iter().any(|(n, _)| *n != ext.name) {
        let all = homes
            .iter()
            .map(|(n, a)| format!("{n} {a}"))
            .collect::<Vec<_>>()
            .join(", ");
        out.push(Finding::new(
            "multi_homed",
            Severity::Info,
            format!(
                "this node has addresses on several interfaces; weftd uses {} ({})",
                ext.name, lease.public_ip
            ),
            all,
            "if other nodes cannot reach this one, pin the interface with --iface=<name or address> (or --iface-can-reach=<a peer's address>)",
        ));
    }
    for p in &st.peers {
        let Some(ip) = peer_ip(p) else { continue };
        let best = best_route(&f.routes, IpNet::from(ip));
        let Some(oif) = best.and_then(|r| r.oif) else {
            continue;
        };
        if oif != ext.index {
            out.push(Finding::new(
                "wrong_iface",
                Severity::Error,
                format!(
                    "traffic to peer {ip} leaves through {}, not {} whose address weftd published: the path is asymmetric and replies (or the peer's rp_filter) drop it",
                    link_name(f, Some(oif)),
                    ext.name
                ),
                format!("best route for {ip}: {}", show_route(f, best)),
                format!(
                    "start weftd with --iface={} (the interface the other nodes reach), or fix the route to {ip}",
                    link_name(f, Some(oif))
                ),
            ));
        }
    }
    out
}

/// Strict reverse-path filtering on the interfaces overlay traffic uses.
pub fn rp_filter(f: &Facts) -> Vec<Finding> {
    let all = f.rp_filter.get("all").copied().unwrap_or(0);
    let mut names: Vec<String> = ext_link(f).map(|l| l.name.clone()).into_iter().collect();
    if let Some(st) = status(f) {
        names.extend(weft_links(f, st).iter().map(|l| l.name.clone()));
    }
    let strict: Vec<String> = names
        .iter()
        .filter(|n| all.max(f.rp_filter.get(*n).copied().unwrap_or(0)) == 1)
        .cloned()
        .collect();
    if strict.is_empty() {
        return Vec::new();
    }
    let asymmetric = interface(f).iter().any(|x| x.id == "wrong_iface");
    vec![Finding::new(
        "rp_filter_strict",
        if asymmetric {
            Severity::Error
        } else {
            Severity::Warning
        },
        if asymmetric {
            "strict reverse-path filtering with an asymmetric path: packets arriving on an interface the reply would not leave by are dropped"
        } else {
            "strict reverse-path filtering on the overlay's interfaces: any asymmetric path (a second interface, policy routing) drops packets silently"
        },
        format!(
            "rp_filter = 1 (the larger of conf/all = {all} and the interface's) on {}",
            strict.join(", ")
        ),
        "sysctl -w net.ipv4.conf.all.rp_filter=2 and net.ipv4.conf.<iface>.rp_filter=2 (loose), kept in /etc/sysctl.d/",
    )]
}
