//! `subnet.env`: what weftd tells the CNI plugin (and anything else that sources
//! it) about the node's network (flannel pkg/subnet/subnet.go `WriteSubnetFile`,
//! main.go `ReadCIDRsFromSubnetFile`; spec §7).
//!
//! flannel reads the file in two ways, and so does weft: flanneld at
//! start-up (this module's [`SubnetEnv::parse`], forgiving) and the CNI
//! plugin on every call ([`plugin`], strict, with Go's error texts).
//!
//! Writing is exactly flannel's: the directory is created with mode 0755, the
//! file is written to a temporary file in the same directory, fsynced, renamed
//! over the target (readers see the old or the new file, never a torn one) and
//! has mode 0644 whatever the umask. Lines, in this order, only for the families
//! present, `\n` endings, no quotes:
//!
//! ```text
//! FLANNEL_NETWORK=10.244.0.0/16
//! FLANNEL_SUBNET=10.244.1.1/24
//! FLANNEL_IPV6_NETWORK=fc00::/48
//! FLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64
//! FLANNEL_MTU=1450
//! FLANNEL_IPMASQ=true
//! ```
//!
//! `FLANNEL_SUBNET` is the lease subnet's first address plus one with the lease's
//! prefix length; [`SubnetEnv::subnet`] holds the lease subnet itself.
//!
//! Reading follows flanneld's startup reader (godotenv + `ReadCIDRsFromSubnetFile`):
//! a missing file is `Ok(None)`; unparsable lines are skipped; a value may be a
//! comma-separated list, of which invalid CIDRs are skipped and exactly one valid
//! CIDR of the right family must remain, otherwise the field is `None`. CIDRs are
//! masked, so `FLANNEL_SUBNET=10.244.1.1/24` reads back as the lease subnet
//! `10.244.1.0/24`. Reading never fails on content, only on I/O.
//!
//! Files next to it ([`beside`]): weftd's sockets and the IPAM state live in
//! the subnet file's directory, named after its stem.

pub mod plugin;

use std::collections::HashMap;
use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::net::{Ipv4Addr, Ipv6Addr};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::gonet::{self, go_ip6_string};

/// Errors writing or reading subnet.env.
#[derive(Debug, thiserror::Error)]
pub enum SubnetEnvError {
    /// A file system operation failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What was being done (`create directory`, `write`, `rename`, `read`).
        op: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: io::Error,
    },
    /// A family has its network but no subnet, or the reverse.
    #[error("subnet.env needs both the {0} network and the {0} subnet")]
    Incomplete(&'static str),
}

/// The content of subnet.env.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetEnv {
    /// `FLANNEL_NETWORK` (IPv4 enabled).
    pub network: Option<Ipv4Net>,
    /// The node's IPv4 lease subnet (written as `FLANNEL_SUBNET` = first IP + 1).
    pub subnet: Option<Ipv4Net>,
    /// `FLANNEL_IPV6_NETWORK` (IPv6 enabled).
    pub ipv6_network: Option<Ipv6Net>,
    /// The node's IPv6 lease subnet (written as `FLANNEL_IPV6_SUBNET` = first IP + 1).
    pub ipv6_subnet: Option<Ipv6Net>,
    /// `FLANNEL_MTU` (0 when read from a file without a valid one).
    pub mtu: u32,
    /// `FLANNEL_IPMASQ` (false when read from a file without `true`).
    pub ipmasq: bool,
}

impl SubnetEnv {
    /// The exact file content.
    pub fn render(&self) -> Result<String, SubnetEnvError> {
        let mut out = String::new();
        match (self.network, self.subnet) {
            (Some(net), Some(sn)) => {
                let ip = Ipv4Addr::from(u32::from(sn.addr()).wrapping_add(1));
                out.push_str(&format!("FLANNEL_NETWORK={net}\n"));
                out.push_str(&format!("FLANNEL_SUBNET={ip}/{}\n", sn.prefix_len()));
            }
            (None, None) => {}
            _ => return Err(SubnetEnvError::Incomplete("IPv4")),
        }
        match (self.ipv6_network, self.ipv6_subnet) {
            (Some(net), Some(sn)) => {
                let ip = Ipv6Addr::from(u128::from(sn.addr()).wrapping_add(1));
                let net_ip = go_ip6_string(net.addr());
                out.push_str(&format!(
                    "FLANNEL_IPV6_NETWORK={net_ip}/{}\n",
                    net.prefix_len()
                ));
                out.push_str(&format!(
                    "FLANNEL_IPV6_SUBNET={}/{}\n",
                    go_ip6_string(ip),
                    sn.prefix_len()
                ));
            }
            (None, None) => {}
            _ => return Err(SubnetEnvError::Incomplete("IPv6")),
        }
        out.push_str(&format!("FLANNEL_MTU={}\n", self.mtu));
        out.push_str(&format!("FLANNEL_IPMASQ={}\n", self.ipmasq));
        Ok(out)
    }

    /// Writes the file atomically (see the module docs).
    pub fn write(&self, path: &Path) -> Result<(), SubnetEnvError> {
        let content = self.render()?;
        write_atomic(path, content.as_bytes(), 0o644)
    }

    /// Reads a subnet.env; `Ok(None)` when the file does not exist.
    pub fn read(path: &Path) -> Result<Option<SubnetEnv>, SubnetEnvError> {
        match fs::read(path) {
            Ok(bytes) => Ok(Some(SubnetEnv::parse(&String::from_utf8_lossy(&bytes)))),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(SubnetEnvError::Io {
                op: "read",
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Parses subnet.env text (never fails; see the module docs).
    pub fn parse(text: &str) -> SubnetEnv {
        let vars = parse_env(text);
        let get = |k: &str| vars.get(k).map(String::as_str);
        SubnetEnv {
            network: get("FLANNEL_NETWORK").and_then(single_ipv4_cidr),
            subnet: get("FLANNEL_SUBNET").and_then(single_ipv4_cidr),
            ipv6_network: get("FLANNEL_IPV6_NETWORK").and_then(single_ipv6_cidr),
            ipv6_subnet: get("FLANNEL_IPV6_SUBNET").and_then(single_ipv6_cidr),
            mtu: get("FLANNEL_MTU").and_then(|v| v.parse().ok()).unwrap_or(0),
            ipmasq: get("FLANNEL_IPMASQ") == Some("true"),
        }
    }
}

/// Converts a `FLANNEL_SUBNET` value to the lease subnet
/// (`10.244.1.1/24` → `10.244.1.0/24`); comma lists as in [`SubnetEnv::parse`].
pub fn lease_subnet_from_env(value: &str) -> Option<Ipv4Net> {
    single_ipv4_cidr(value)
}

/// Converts a `FLANNEL_IPV6_SUBNET` value to the lease subnet
/// (`fc00:0:0:1::1/64` → `fc00:0:0:1::/64`).
pub fn lease_ipv6_subnet_from_env(value: &str) -> Option<Ipv6Net> {
    single_ipv6_cidr(value)
}

/// Go's `net.ParseCIDR` over each comma-separated item (no trimming); exactly one
/// valid IPv4 CIDR must remain.
fn single_ipv4_cidr(value: &str) -> Option<Ipv4Net> {
    let mut found = value.split(',').filter_map(|item| match parse_cidr(item)? {
        IpNet::V4(net) => Some(net),
        IpNet::V6(_) => None,
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// Like [`single_ipv4_cidr`] for IPv6.
fn single_ipv6_cidr(value: &str) -> Option<Ipv6Net> {
    let mut found = value.split(',').filter_map(|item| match parse_cidr(item)? {
        IpNet::V6(net) => Some(net),
        IpNet::V4(_) => None,
    });
    let first = found.next()?;
    found.next().is_none().then_some(first)
}

/// Go's `net.ParseCIDR` (the network part), `None` on error.
fn parse_cidr(s: &str) -> Option<IpNet> {
    gonet::parse_cidr(s).ok().map(|(_, net)| net)
}

/// The file `name` next to `subnet_file`, prefixed with the subnet file's
/// stem unless that is `subnet`: `/run/flannel/subnet.env` → `/run/flannel/<name>`,
/// `/tmp/x/n1.env` → `/tmp/x/n1.<name>`, so that daemons sharing a
/// directory do not collide.
pub fn beside(subnet_file: &Path, name: &str) -> PathBuf {
    let stem = subnet_file
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let file = if stem.is_empty() || stem == "subnet" {
        name.to_string()
    } else {
        format!("{stem}.{name}")
    };
    subnet_file.with_file_name(file)
}

/// A godotenv-style reader: `KEY=VALUE` or `KEY: VALUE`, optional `export `,
/// `#` comments, single- or double-quoted values; the last duplicate wins and
/// lines that do not parse are skipped.
fn parse_env(text: &str) -> HashMap<String, String> {
    let mut vars = HashMap::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let line = line.strip_prefix("export ").map_or(line, str::trim_start);
        let Some(sep) = line.find(['=', ':']) else {
            continue;
        };
        let key = line[..sep].trim();
        if key.is_empty()
            || !key
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
        {
            continue;
        }
        if let Some(value) = parse_value(line[sep + 1..].trim_start()) {
            vars.insert(key.to_string(), value);
        }
    }
    vars
}

fn parse_value(raw: &str) -> Option<String> {
    if let Some(rest) = raw.strip_prefix('\'') {
        return rest.find('\'').map(|end| rest[..end].to_string());
    }
    if let Some(rest) = raw.strip_prefix('"') {
        let mut out = String::new();
        let mut chars = rest.chars();
        while let Some(c) = chars.next() {
            match c {
                '"' => return Some(out),
                '\\' => match chars.next()? {
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    other => out.push(other),
                },
                c => out.push(c),
            }
        }
        return None;
    }
    let value = raw.find(" #").map_or(raw, |i| &raw[..i]);
    Some(value.trim_end().to_string())
}

/// A suffix that no other write of this process uses, and that a leftover
/// file of an earlier process with the same pid is unlikely to have.
fn tmp_suffix() -> u64 {
    static SEQ: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    (u64::from(SEQ.fetch_add(1, Ordering::Relaxed)) << 32) | u64::from(nanos)
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> SubnetEnvError + use<> {
    let path = path.to_path_buf();
    move |source| SubnetEnvError::Io { op, path, source }
}

/// Writes `content` to `path` atomically with mode `mode` (umask ignored): temp
/// file in the same directory, fsync, rename, fsync of the directory.
fn write_atomic(path: &Path, content: &[u8], mode: u32) -> Result<(), SubnetEnvError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .map_err(io_err("create directory", dir))?;
    let name = path
        .file_name()
        .map_or_else(|| "subnet.env".into(), |n| n.to_string_lossy());
    let tmp = dir.join(format!(
        ".{name}.tmp{}.{}",
        std::process::id(),
        tmp_suffix()
    ));
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&tmp)
            .map_err(io_err("create", &tmp))?;
        f.set_permissions(fs::Permissions::from_mode(mode))
            .map_err(io_err("chmod", &tmp))?;
        f.write_all(content).map_err(io_err("write", &tmp))?;
        f.sync_all().map_err(io_err("fsync", &tmp))?;
        drop(f);
        fs::rename(&tmp, path).map_err(io_err("rename", path))
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
        return result;
    }
    // Make the rename durable; failure here does not undo the (visible) write.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(())
}

#[cfg(test)]
mod tests;
