//! What `weft doctor` reads of the node, gathered once (the only I/O of the
//! command) into [`Facts`], plain data that the checks judge without I/O.
//!
//! Everything is read-only: `/proc/sys` files, netlink dumps (links,
//! addresses, the main table, the policy rules and the tables they look
//! up, neighbour and fdb entries of weft's devices), `iptables -S
//! FORWARD`, `nft -j list ruleset`, the clock's NTP state (`adjtimex`),
//! the subnet file, the CNI conf and binary directories and the status
//! socket's snapshot. A fact that cannot be read is `None` (or an `Err`
//! with the reason), and the check that needs it says so instead of
//! guessing.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use weft_compat::subnet_env::SubnetEnv;

use crate::netlink::{Client, LinkKind, Netlink, Route, Rule, RuleDo};
use crate::status::model::Status;

/// One link as the checks need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LinkFact {
    /// Interface index.
    pub index: u32,
    /// Name.
    pub name: String,
    /// Administratively up.
    pub up: bool,
    /// MTU.
    pub mtu: u32,
    /// `vxlan`, `tun`, `bridge`, `wireguard`, ... (`""`: physical, loopback).
    pub kind: String,
}

/// A neighbour or fdb entry on one of weft's devices.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct L2Entry {
    /// The device's name.
    pub dev: String,
    /// Neighbour: the IP; fdb: the VTEP the MAC is sent to.
    pub ip: IpAddr,
    /// The MAC.
    pub mac: [u8; 6],
}

/// The CNI side of the node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CniFacts {
    /// The conf directory.
    pub conf_dir: PathBuf,
    /// Its `.conf`, `.conflist` and `.json` files in the order the kubelet
    /// tries them (by name), each parsed or with the parse error.
    pub confs: Option<Vec<(String, Result<serde_json::Value, String>)>>,
    /// The plugin directory.
    pub bin_dir: PathBuf,
    /// The executables in it (`None`: the directory cannot be read).
    pub bins: Option<BTreeSet<String>>,
}

/// Everything the checks look at.
#[derive(Debug, Clone)]
pub struct Facts {
    /// `net.ipv4.ip_forward`.
    pub ip_forward: Option<u8>,
    /// `net.bridge.bridge-nf-call-iptables` (`None`: br_netfilter not loaded).
    pub bridge_nf_call_iptables: Option<u8>,
    /// `net.ipv4.conf.<dev>.rp_filter` for `all` and every link.
    pub rp_filter: BTreeMap<String, u8>,
    /// Every link.
    pub links: Vec<LinkFact>,
    /// Every address with its link index.
    pub addrs: Vec<(u32, IpNet)>,
    /// The main table (IPv4).
    pub routes: Vec<Route>,
    /// The IPv4 policy-routing rules, by priority.
    pub rules: Vec<Rule>,
    /// The routes of each table a rule looks up (but main, local, default).
    pub tables: BTreeMap<u32, Vec<Route>>,
    /// Permanent neighbour entries of weft's kernel devices.
    pub neighs: Vec<L2Entry>,
    /// fdb entries of weft's kernel vxlan devices.
    pub fdbs: Vec<L2Entry>,
    /// Why netlink could not be read, if it could not.
    pub netlink_error: Option<String>,
    /// `iptables -S FORWARD` (`Err`: iptables missing or failed).
    pub forward: Result<Vec<String>, String>,
    /// `nft -j list ruleset` (`Err`: nft missing or failed).
    pub nft: Result<serde_json::Value, String>,
    /// The subnet file's path and contents (`Ok(None)`: missing).
    pub subnet_file: PathBuf,
    /// See `subnet_file`.
    pub subnet_env: Result<Option<SubnetEnv>, String>,
    /// The CNI config and plugins.
    pub cni: CniFacts,
    /// When the facts were gathered (seconds since the Unix epoch).
    pub now: u64,
    /// Whether the kernel's clock is NTP-synchronised (`Err`: unreadable).
    pub clock_synced: Result<bool, String>,
    /// weftd's status (`Err`: why the status socket did not answer).
    pub daemon: Result<Status, String>,
    /// UDP datagrams dropped for a bad checksum since boot (both families).
    pub udp_csum_errors: Option<u64>,
    /// weft's kernel vxlan devices whose transmit checksum offload is off.
    pub tx_csum_off: Vec<String>,
    /// The link carrying the lease's public IPv4 address and whether it
    /// has `tx-udp_tnl-segmentation` on (`None`: no such link, or its
    /// features unreadable); read only when a device uses the tunnel TAP.
    pub tunnel_uplink: Option<(String, bool)>,
}

/// Where the CNI config and plugins are looked for.
#[derive(Debug, Clone)]
pub struct CniFactsOpt {
    /// The conf directory (the kubelet's `--cni-conf-dir`).
    pub conf_dir: PathBuf,
    /// The plugin directory (`--cni-bin-dir`).
    pub bin_dir: PathBuf,
}

/// The kubelet's defaults.
impl Default for CniFactsOpt {
    fn default() -> Self {
        CniFactsOpt {
            conf_dir: PathBuf::from("/etc/cni/net.d"),
            bin_dir: PathBuf::from("/opt/cni/bin"),
        }
    }
}

fn sysctl(path: &str) -> Option<u8> {
    std::fs::read_to_string(Path::new("/proc/sys").join(path))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Reads the node: the only I/O of `weft doctor`.
pub fn gather(subnet_file: &Path, socket: &Path, cni: &CniFactsOpt) -> Facts {
    let mut f = Facts {
        ip_forward: sysctl("net/ipv4/ip_forward"),
        bridge_nf_call_iptables: sysctl("net/bridge/bridge-nf-call-iptables"),
        rp_filter: BTreeMap::new(),
        links: Vec::new(),
        addrs: Vec::new(),
        routes: Vec::new(),
        rules: Vec::new(),
        tables: BTreeMap::new(),
        neighs: Vec::new(),
        fdbs: Vec::new(),
        netlink_error: None,
        forward: forward_rules(),
        nft: nft_ruleset(),
        subnet_file: subnet_file.to_path_buf(),
        subnet_env: SubnetEnv::read(subnet_file).map_err(|e| e.to_string()),
        cni: cni_facts(cni),
        now: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
        clock_synced: weft_engine::clock_synchronised().map_err(|e| format!("adjtimex: {e}")),
        daemon: crate::status::server::query(socket, Duration::from_secs(5))
            .map_err(|e| e.to_string()),
        udp_csum_errors: super::csum::in_csum_errors(
            &std::fs::read_to_string("/proc/net/snmp").unwrap_or_default(),
            &std::fs::read_to_string("/proc/net/snmp6").unwrap_or_default(),
        ),
        tx_csum_off: Vec::new(),
        tunnel_uplink: None,
    };
    if let Err(e) = netlink_facts(&mut f) {
        f.netlink_error = Some(e);
    }
    f.tunnel_uplink = tunnel_uplink(&f);
    let mut names: Vec<String> = vec!["all".into()];
    names.extend(f.links.iter().map(|l| l.name.clone()));
    for n in names {
        if let Some(v) = sysctl(&format!("net/ipv4/conf/{n}/rp_filter")) {
            f.rp_filter.insert(n, v);
        }
    }
    f
}

/// [`Facts::tunnel_uplink`], from the links, addresses and status read:
/// the link weftd published the address of ([`super::overlay::ext_link`]).
fn tunnel_uplink(f: &Facts) -> Option<(String, bool)> {
    let st = f.daemon.as_ref().ok()?;
    let tap_used = st
        .backend
        .devices
        .iter()
        .any(|d| d.tunnel_gso.as_ref().is_some_and(|g| g.tap.is_some()));
    if !tap_used {
        return None;
    }
    let name = &super::overlay::ext_link(f)?.name;
    // A kernel without the feature's name has not got it (as weftd's check).
    let on = weft_engine::ethtool_feature(name, crate::backend::tunnel::gso::UPLINK_FEATURE)
        .ok()?
        .unwrap_or(false);
    Some((name.clone(), on))
}

/// Links, addresses, routes and the L2 entries of weft's devices.
fn netlink_facts(f: &mut Facts) -> Result<(), String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("cannot start a runtime: {e}"))?;
    let weft_devs: BTreeSet<String> = match &f.daemon {
        Ok(st) => st.backend.devices.iter().map(|d| d.name.clone()).collect(),
        Err(_) => BTreeSet::new(),
    };
    rt.block_on(async {
        let nl = Netlink::connect().map_err(|e| e.to_string())?;
        for d in nl.link_details().await.map_err(|e| e.to_string())? {
            let kind = match &d.kind {
                LinkKind::Vxlan(_) => "vxlan".to_string(),
                LinkKind::Ipip { .. } => "ipip".to_string(),
                LinkKind::Wireguard => "wireguard".to_string(),
                LinkKind::Tun => "tun".to_string(),
                LinkKind::Other(k) => k.clone(),
            };
            f.links.push(LinkFact {
                index: d.link.index,
                name: d.link.name.clone(),
                up: d.link.up,
                mtu: d.link.mtu,
                kind,
            });
        }
        f.addrs = nl
            .addrs()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|a| (a.index, a.net))
            .collect();
        f.routes = nl.routes_main(false).await.map_err(|e| e.to_string())?;
        f.rules = nl.rules(false).await.map_err(|e| e.to_string())?;
        for r in &f.rules {
            if let RuleDo::Table(t) = r.action
                && ![253, 254, 255].contains(&t)
                && !f.tables.contains_key(&t)
            {
                let routes = nl.routes_in(t, false).await.map_err(|e| e.to_string())?;
                f.tables.insert(t, routes);
            }
        }
        for l in f.links.iter().filter(|l| weft_devs.contains(&l.name)) {
            for n in nl.neighs(l.index).await.map_err(|e| e.to_string())? {
                f.neighs.push(L2Entry {
                    dev: l.name.clone(),
                    ip: n.ip,
                    mac: n.mac,
                });
            }
            if l.kind == "vxlan" {
                if weft_engine::tx_checksum(&l.name).is_ok_and(|on| !on) {
                    f.tx_csum_off.push(l.name.clone());
                }
                for e in nl.fdbs(l.index).await.map_err(|e| e.to_string())? {
                    f.fdbs.push(L2Entry {
                        dev: l.name.clone(),
                        ip: e.dst,
                        mac: e.mac,
                    });
                }
            }
        }
        Ok(())
    })
}

/// `iptables -S FORWARD` (the filter table; iptables-nft shows nft's view).
fn forward_rules() -> Result<Vec<String>, String> {
    let out = std::process::Command::new("iptables")
        .args(["-w", "5", "-S", "FORWARD"])
        .output()
        .map_err(|e| format!("cannot run iptables: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "iptables -S FORWARD failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect())
}

/// `nft -j list ruleset` (read only).
fn nft_ruleset() -> Result<serde_json::Value, String> {
    let out = std::process::Command::new("nft")
        .args(["-j", "list", "ruleset"])
        .output()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "nft -j list ruleset failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    serde_json::from_slice(&out.stdout).map_err(|e| format!("nft -j list ruleset: {e}"))
}

/// The CNI conf files (by name, as the kubelet orders them) and plugins.
fn cni_facts(o: &CniFactsOpt) -> CniFacts {
    let confs = std::fs::read_dir(&o.conf_dir).ok().map(|rd| {
        let mut names: Vec<String> = rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".conf") || n.ends_with(".conflist") || n.ends_with(".json"))
            .collect();
        names.sort();
        names
            .into_iter()
            .map(|n| {
                let v = std::fs::read(o.conf_dir.join(&n))
                    .map_err(|e| e.to_string())
                    .and_then(|b| serde_json::from_slice(&b).map_err(|e| e.to_string()));
                (n, v)
            })
            .collect()
    });
    let bins = std::fs::read_dir(&o.bin_dir).ok().map(|rd| {
        use std::os::unix::fs::PermissionsExt;
        rd.filter_map(|e| e.ok())
            .filter(|e| {
                std::fs::metadata(e.path())
                    .is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
            })
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()
    });
    CniFacts {
        conf_dir: o.conf_dir.clone(),
        confs,
        bin_dir: o.bin_dir.clone(),
        bins,
    }
}
