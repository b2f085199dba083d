//! flannel's `subnet.env`, read exactly as the flannel CNI plugin's
//! `loadFlannelSubnetEnv` reads it (cni-plugin `flannel.go`).
//!
//! Contract:
//! - Lines are split at `\n` (a trailing `\r` is dropped) and then at the first
//!   `=`. Keys are matched exactly (no trimming, no quotes, no `export`);
//!   unknown lines are ignored; a repeated key replaces the earlier value.
//! - `FLANNEL_NETWORK` / `FLANNEL_IPV6_NETWORK` are comma lists of CIDRs,
//!   deduplicated in order; `FLANNEL_SUBNET` / `FLANNEL_IPV6_SUBNET` are one
//!   CIDR each. Every CIDR goes through Go's `net.ParseCIDR`, so the stored
//!   value is the network (`10.1.17.1/24` → `10.1.17.0/24`).
//! - `FLANNEL_MTU` is a decimal `uint32`; `FLANNEL_IPMASQ` is true iff it is
//!   exactly `true`.
//! - A file lacking a group of keys fails with
//!   `<file> is missing FLANNEL_NETWORK, FLANNEL_IPV6_NETWORK, ...`, listing
//!   only the missing groups, as flannel does.
//! - A known key without `=` is an error (flannel panics on it); a line longer
//!   than 64 KiB is `bufio.Scanner: token too long`, as in Go.

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};

use ipnet::IpNet;

use crate::goio::io_error_text;
use crate::gonet::{self, CidrError};

/// Go's `bufio.MaxScanTokenSize`: the longest line the scanner accepts.
const MAX_LINE: u64 = 64 * 1024;

/// The values flannel's plugin uses from `subnet.env`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubnetEnv {
    /// `FLANNEL_NETWORK`: the cluster's IPv4 networks (deduplicated).
    pub networks: Vec<IpNet>,
    /// `FLANNEL_SUBNET`, as a network: this node's IPv4 pod subnet.
    pub subnet: Option<IpNet>,
    /// `FLANNEL_IPV6_NETWORK`: the cluster's IPv6 networks (deduplicated).
    pub ipv6_networks: Vec<IpNet>,
    /// `FLANNEL_IPV6_SUBNET`, as a network: this node's IPv6 pod subnet.
    pub ipv6_subnet: Option<IpNet>,
    /// `FLANNEL_MTU`.
    pub mtu: u32,
    /// `FLANNEL_IPMASQ`: whether flanneld masquerades pod traffic itself.
    pub ipmasq: bool,
}

/// Why `subnet.env` could not be used; texts follow Go's.
#[derive(Debug, thiserror::Error)]
pub enum SubnetEnvError {
    /// The file could not be opened.
    #[error("open {path}: {}", io_error_text(.source))]
    Open {
        /// The path as configured.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The file could not be read.
    #[error("read {path}: {}", io_error_text(.source))]
    Read {
        /// The path as configured.
        path: String,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// A line exceeds Go's scanner limit.
    #[error("bufio.Scanner: token too long")]
    TokenTooLong,
    /// A known key has no `=value` (flannel would panic here).
    #[error("{key} has no value")]
    NoValue {
        /// The key.
        key: String,
    },
    /// A network or subnet is not a CIDR.
    #[error(transparent)]
    Cidr(#[from] CidrError),
    /// `FLANNEL_MTU` is not a decimal uint32.
    #[error("strconv.ParseUint: parsing {value:?}: {}", if *.out_of_range { "value out of range" } else { "invalid syntax" })]
    Mtu {
        /// The value as written.
        value: String,
        /// Whether it was digits but too large.
        out_of_range: bool,
    },
    /// Required keys are absent.
    #[error("{path} is missing {missing}")]
    Missing {
        /// The path as configured.
        path: String,
        /// The missing key groups, comma separated.
        missing: String,
    },
}

impl SubnetEnvError {
    /// Whether the error means "flanneld has not written the file yet".
    pub fn is_not_found(&self) -> bool {
        matches!(self, SubnetEnvError::Open { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }
}

/// Loads and parses the file at `path`.
pub fn load(path: &str) -> Result<SubnetEnv, SubnetEnvError> {
    let file = File::open(path).map_err(|source| SubnetEnvError::Open {
        path: path.to_string(),
        source,
    })?;
    parse(path, file)
}

/// Parses `subnet.env` content read from `input`; `path` is only used in
/// messages.
pub fn parse(path: &str, input: impl Read) -> Result<SubnetEnv, SubnetEnvError> {
    let mut reader = BufReader::new(input);
    let mut acc = Accumulator::default();
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader)
            .take(MAX_LINE)
            .read_until(b'\n', &mut line)
            .map_err(|source| SubnetEnvError::Read {
                path: path.to_string(),
                source,
            })?;
        if n == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        } else if n as u64 == MAX_LINE {
            return Err(SubnetEnvError::TokenTooLong);
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        acc.line(&String::from_utf8_lossy(&line))?;
    }
    acc.finish(path)
}

/// The values seen so far; `None` means "key not present".
#[derive(Default)]
struct Accumulator {
    networks: Option<Vec<IpNet>>,
    subnet: Option<IpNet>,
    ipv6_networks: Option<Vec<IpNet>>,
    ipv6_subnet: Option<IpNet>,
    mtu: Option<u32>,
    ipmasq: Option<bool>,
}

// === impl Accumulator ===

impl Accumulator {
    fn line(&mut self, line: &str) -> Result<(), SubnetEnvError> {
        let (key, value) = match line.split_once('=') {
            Some((k, v)) => (k, Some(v)),
            None => (line, None),
        };
        let known = matches!(
            key,
            "FLANNEL_NETWORK"
                | "FLANNEL_SUBNET"
                | "FLANNEL_IPV6_NETWORK"
                | "FLANNEL_IPV6_SUBNET"
                | "FLANNEL_MTU"
                | "FLANNEL_IPMASQ"
        );
        if !known {
            return Ok(());
        }
        let value = value.ok_or_else(|| SubnetEnvError::NoValue {
            key: key.to_string(),
        })?;
        match key {
            "FLANNEL_NETWORK" => self.networks = Some(network_list(value)?),
            "FLANNEL_IPV6_NETWORK" => self.ipv6_networks = Some(network_list(value)?),
            "FLANNEL_SUBNET" => self.subnet = Some(gonet::parse_cidr(value)?.1),
            "FLANNEL_IPV6_SUBNET" => self.ipv6_subnet = Some(gonet::parse_cidr(value)?.1),
            "FLANNEL_MTU" => self.mtu = Some(parse_mtu(value)?),
            _ => self.ipmasq = Some(value == "true"),
        }
        Ok(())
    }

    fn finish(self, path: &str) -> Result<SubnetEnv, SubnetEnvError> {
        let networks = self.networks.unwrap_or_default();
        let ipv6_networks = self.ipv6_networks.unwrap_or_default();
        let mut missing: Vec<&str> = Vec::new();
        if networks.is_empty() && ipv6_networks.is_empty() {
            missing.extend(["FLANNEL_NETWORK", "FLANNEL_IPV6_NETWORK"]);
        }
        if self.subnet.is_none() && self.ipv6_subnet.is_none() {
            missing.extend(["FLANNEL_SUBNET", "FLANNEL_IPV6_SUBNET"]);
        }
        if self.mtu.is_none() {
            missing.push("FLANNEL_MTU");
        }
        if self.ipmasq.is_none() {
            missing.push("FLANNEL_IPMASQ");
        }
        match (self.mtu, self.ipmasq) {
            (Some(mtu), Some(ipmasq)) if missing.is_empty() => Ok(SubnetEnv {
                networks,
                subnet: self.subnet,
                ipv6_networks,
                ipv6_subnet: self.ipv6_subnet,
                mtu,
                ipmasq,
            }),
            _ => Err(SubnetEnvError::Missing {
                path: path.to_string(),
                missing: missing.join(", "),
            }),
        }
    }
}

/// A comma list of CIDRs, each reduced to its network, duplicates dropped.
fn network_list(value: &str) -> Result<Vec<IpNet>, CidrError> {
    let mut out: Vec<IpNet> = Vec::new();
    for item in value.split(',') {
        let (_, net) = gonet::parse_cidr(item)?;
        if !out.contains(&net) {
            out.push(net);
        }
    }
    Ok(out)
}

/// Go's `strconv.ParseUint(value, 10, 32)`.
fn parse_mtu(value: &str) -> Result<u32, SubnetEnvError> {
    let err = |out_of_range| SubnetEnvError::Mtu {
        value: value.to_string(),
        out_of_range,
    };
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err(false));
    }
    value.parse::<u32>().map_err(|_| err(true))
}

#[cfg(test)]
mod tests;
