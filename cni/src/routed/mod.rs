//! Routed mode (`"mode": "routed"` in the flannel plugin's config): pods get
//! a /32 (and /128) on a veth, a link-local gateway and a host route, and
//! their addresses come from weftd's IPAM API instead of host-local. The
//! default mode stays flannel's bridge delegation.
//!
//! Contract, per verb:
//! - ADD: subnet.env (MTU, families) → fail early if the host veth already
//!   exists (a second ADD never damages the first) → forwarding on in the
//!   node → weftd allocates → [`datapath::create`]. Any failure after the
//!   allocation releases it and removes whatever was built; the *first*
//!   error is reported (never a success after a failed rollback).
//! - DEL: delete the host veth, release the address. The netns is not
//!   needed; missing veth or allocation is success; DEL twice succeeds. An
//!   unreachable weftd fails DEL (code 11), so the runtime retries rather
//!   than leaking the address.
//! - CHECK: the allocation exists (and matches `prevResult`'s addresses),
//!   and [`datapath::verify`] finds everything ADD built.
//! - GC: every allocation whose `(containerID, ifname)` is not valid is torn
//!   down and released; errors are collected, the sweep goes on.
//! - STATUS: subnet.env parses and weftd answers, else code 50.
//!
//! The IPAM socket is `ipamSocket` in the config, by default `weft.sock`
//! next to `subnetFile` (the stem-prefix rule weftd's `--ipam-socket`
//! default uses: `/run/flannel/subnet.env` → `/run/flannel/weft.sock`).
//!
//! Mixed modes on one node (a node moved between bridge and routed while it
//! has pods): every allocate and release names host-local's directory for
//! this network ([`host_local_dir`]), so weftd never hands out an address
//! host-local holds and leaves a host-local file for each of its own; DEL
//! and GC in either mode also take care of the pods made in the other one
//! (see `del.rs` and `gc.rs`).

mod client;
mod datapath;
mod nl;
mod result;

use std::fs::File;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use weft_compat::ipam::{self, Allocation};
use weft_compat::subnet_env::plugin::{self as subnet_env, SubnetEnv};

pub use client::ClientError;
pub use nl::NlError;

use crate::command::Request;
use crate::error::Error;
use client::Client;

/// Why a routed-mode verb failed.
#[derive(Debug, thiserror::Error)]
pub enum RoutedError {
    /// The IPAM API failed or refused.
    #[error(transparent)]
    Ipam(#[from] ClientError),
    /// The pod's network namespace cannot be opened.
    #[error("failed to open netns {path:?}: {source}")]
    Netns {
        /// `CNI_NETNS`.
        path: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A netlink request failed.
    #[error(transparent)]
    Netlink(#[from] NlError),
    /// The attachment (or the pod's interface name) already exists.
    #[error("{0}")]
    Exists(String),
    /// Forwarding could not be turned on.
    #[error("cannot enable forwarding ({path}): {source}")]
    Sysctl {
        /// The sysctl file.
        path: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// CHECK found a difference from what ADD built.
    #[error("routed datapath check failed: {0}")]
    Check(String),
    /// DEL/GC: several steps failed.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Teardown(Vec<RoutedError>),
}

/// host-local's directory for this network, where bridge mode's addresses
/// are kept: `<ipam.dataDir or /var/lib/cni/networks>/<name>` (what
/// host-local uses for the delegate config flannel builds); `None` when the
/// network's IPAM is not host-local or it has no usable name.
pub fn host_local_dir(conf: &crate::config::NetConf) -> Option<String> {
    let get = |k: &str| {
        conf.ipam
            .as_ref()
            .and_then(|m| m.get(k))
            .and_then(|v| v.as_str())
    };
    if get("type").is_some_and(|t| t != "host-local") {
        return None;
    }
    let name = conf.name.as_str();
    if name.is_empty() || name == "." || name == ".." || name.contains('/') {
        return None;
    }
    let data = get("dataDir")
        .filter(|d| d.starts_with('/'))
        .unwrap_or("/var/lib/cni/networks");
    Some(Path::new(data).join(name).to_string_lossy().into_owned())
}

/// The IPAM socket for `conf` (see the module docs).
fn socket(req: &Request) -> PathBuf {
    if let Some(s) = &req.conf.ipam_socket {
        return PathBuf::from(s);
    }
    ipam::default_socket(Path::new(&req.conf.subnet_file))
}

fn ips_of(a: &Allocation) -> Vec<IpAddr> {
    a.ipv4
        .map(IpAddr::V4)
        .into_iter()
        .chain(a.ipv6.map(IpAddr::V6))
        .collect()
}

/// ADD in routed mode.
pub fn add(req: &Request, out: &mut dyn Write) -> Result<(), Error> {
    let env = subnet_env::load(&req.conf.subnet_file).map_err(Error::SubnetEnv)?;
    let (id, ifname) = (&req.env.container_id, &req.env.ifname);
    let host_name = datapath::host_veth_name(id, ifname);
    let mut host = nl::Socket::open().map_err(RoutedError::from)?;
    if host.link(&host_name).map_err(RoutedError::from)?.is_some() {
        return Err(RoutedError::Exists(format!(
            "attachment {id}/{ifname} already exists (host veth {host_name})"
        ))
        .into());
    }
    let netns = File::open(&req.env.netns).map_err(|source| RoutedError::Netns {
        path: req.env.netns.clone(),
        source,
    })?;
    enable_forwarding(&env)?;
    let client = Client::new(socket(req));
    let host_local = host_local_dir(&req.conf);
    let alloc = client
        .allocate(id, ifname, host_local.as_deref())
        .map_err(RoutedError::from)?;
    let ips = ips_of(&alloc);
    let built =
        datapath::create(&mut host, &netns, &host_name, ifname, &ips, env.mtu).and_then(|a| {
            let r = result::build(
                &req.conf.cni_version,
                &a,
                ifname,
                &req.env.netns,
                &ips,
                env.mtu,
            );
            out.write_all(&r)
                .and_then(|()| out.flush())
                .map_err(|e| RoutedError::Check(format!("cannot print the result: {e}")))
        });
    if let Err(e) = built {
        // Undo in reverse; report the step's error, log the rollback's.
        if let Err(de) = datapath::remove(&mut host, &host_name) {
            crate::log(&format!("rollback: {de}"));
        }
        if let Err(re) = client.release(id, ifname, host_local.as_deref()) {
            crate::log(&format!("rollback: {re}"));
        }
        return Err(e.into());
    }
    Ok(())
}

/// Forwarding on in the node's namespace for the families in use (the
/// bridge plugin does it in bridge mode).
fn enable_forwarding(env: &SubnetEnv) -> Result<(), RoutedError> {
    let mut files = Vec::new();
    if env.subnet.is_some() {
        files.push("/proc/sys/net/ipv4/ip_forward");
    }
    if env.ipv6_subnet.is_some() {
        files.push("/proc/sys/net/ipv6/conf/all/forwarding");
    }
    for path in files {
        if std::fs::read(path).is_ok_and(|v| v.trim_ascii() == b"1") {
            continue;
        }
        std::fs::write(path, b"1").map_err(|source| RoutedError::Sysctl { path, source })?;
    }
    Ok(())
}

/// DEL in routed mode.
pub fn del(req: &Request) -> Result<(), Error> {
    let (id, ifname) = (&req.env.container_id, &req.env.ifname);
    let errors = teardown(req, &Client::new(socket(req)), id, ifname);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(RoutedError::Teardown(errors).into())
    }
}

/// DEL in bridge mode of a container with no saved delegate config: it may
/// have been added in routed mode before the node went back to bridge. Its
/// host veth, if there, is removed and its address released (weftd must
/// answer then); with no veth, weftd's allocation is released if weftd
/// answers, and nothing fails otherwise (there is no sign of a routed pod).
pub fn del_leftover(req: &Request) -> Result<(), Error> {
    let (id, ifname) = (&req.env.container_id, &req.env.ifname);
    let host_name = datapath::host_veth_name(id, ifname);
    let veth = nl::Socket::open()
        .and_then(|mut s| s.link(&host_name))
        .map_err(RoutedError::from)?
        .is_some();
    let client = Client::new(socket(req));
    if veth {
        crate::log(&format!(
            "{id}/{ifname}: added in routed mode (host veth {host_name}); removing it"
        ));
        let errors = teardown(req, &client, id, ifname);
        return match errors.is_empty() {
            true => Ok(()),
            false => Err(RoutedError::Teardown(errors).into()),
        };
    }
    match client.release(id, ifname, host_local_dir(&req.conf).as_deref()) {
        Ok(Some(a)) => crate::log(&format!(
            "{id}/{ifname}: released routed-mode address {:?}",
            ips_of(&a)
        )),
        Ok(None) => {}
        Err(e) => crate::log(&format!("{id}/{ifname}: not asking weftd ({e})")),
    }
    Ok(())
}

/// GC in bridge mode: routed-mode attachments the runtime no longer lists,
/// if weftd's IPAM answers (a node that was routed before); `Ok` when it
/// does not.
pub fn gc_leftover(req: &Request) -> Result<(), Error> {
    if Client::new(socket(req)).status().is_err() {
        return Ok(());
    }
    gc(req)
}

/// Removes the datapath and releases the address; returns the failures.
fn teardown(req: &Request, client: &Client, id: &str, ifname: &str) -> Vec<RoutedError> {
    let mut errors = Vec::new();
    let host_name = datapath::host_veth_name(id, ifname);
    match nl::Socket::open().and_then(|mut s| datapath::remove(&mut s, &host_name)) {
        Ok(true) => {}
        Ok(false) => crate::log(&format!(
            "{id}/{ifname}: host veth {host_name} already gone"
        )),
        Err(e) => errors.push(e.into()),
    }
    if let Err(e) = client.release(id, ifname, host_local_dir(&req.conf).as_deref()) {
        errors.push(e.into());
    }
    errors
}

/// CHECK in routed mode.
pub fn check(req: &Request) -> Result<(), Error> {
    let (id, ifname) = (&req.env.container_id, &req.env.ifname);
    let client = Client::new(socket(req));
    let alloc = client
        .list()
        .map_err(RoutedError::from)?
        .into_iter()
        .find(|a| a.container_id == *id && a.ifname == *ifname)
        .ok_or_else(|| RoutedError::Check(format!("weftd holds no address for {id}/{ifname}")))?;
    let ips = ips_of(&alloc);
    if let Some(prev) = &req.conf.prev_result {
        let listed = result::addresses(prev);
        for ip in &listed {
            if !ips.contains(ip) {
                return Err(RoutedError::Check(format!(
                    "prevResult address {ip} is not allocated to {id}/{ifname}"
                ))
                .into());
            }
        }
    }
    let netns = File::open(&req.env.netns).map_err(|source| RoutedError::Netns {
        path: req.env.netns.clone(),
        source,
    })?;
    let mut host = nl::Socket::open().map_err(RoutedError::from)?;
    datapath::verify(
        &mut host,
        &netns,
        &datapath::host_veth_name(id, ifname),
        ifname,
        &ips,
    )?;
    Ok(())
}

/// GC in routed mode.
pub fn gc(req: &Request) -> Result<(), Error> {
    let valid = req.conf.gc_attachments()?;
    let client = Client::new(socket(req));
    let mut errors = Vec::new();
    for a in client.list().map_err(RoutedError::from)? {
        if valid
            .iter()
            .any(|v| v.container_id == a.container_id && v.ifname == a.ifname)
        {
            continue;
        }
        let failed = teardown(req, &client, &a.container_id, &a.ifname);
        if failed.is_empty() {
            crate::log(&format!(
                "gc: released stale attachment {}/{}",
                a.container_id, a.ifname
            ));
        }
        errors.extend(failed.into_iter().map(Error::from));
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(Error::Gc(errors))
    }
}

/// STATUS in routed mode.
pub fn status(req: &Request) -> Result<(), Error> {
    let not_ready = |e: Error| Error::NotReady(Box::new(e));
    subnet_env::load(&req.conf.subnet_file).map_err(|e| not_ready(Error::SubnetEnv(e)))?;
    Client::new(socket(req))
        .status()
        .map_err(|e| not_ready(RoutedError::from(e).into()))
}
