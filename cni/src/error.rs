//! The plugin's error type and its mapping to CNI error codes.
//!
//! Contract: [`Error::to_cni`] is the only place that assigns CNI codes. The
//! error is printed as CNI error JSON on **stdout** (as Go skel does and
//! libcni reads), with the network's `cniVersion` when known, and the process
//! exits 1. Codes used:
//!
//! | code | meaning |
//! |---|---|
//! | 1 | incompatible CNI version (also: verb not allowed by the network's version) |
//! | 2 | unsupported field (`delegate.name`, `delegate.ipam`) |
//! | 4 | invalid or missing environment variables, unknown `CNI_COMMAND` |
//! | 5 | I/O failure (stdin, data dir, spawning a delegate, writing stdout) |
//! | 6 | stdin cannot be decoded |
//! | 7 | invalid network config (name, delegate type, routes, malformed subnet.env, delegate not installed) |
//! | 11 | try again later: subnet.env does not exist yet (flanneld not ready) |
//! | 50 | STATUS: not ready (no usable subnet.env, or a delegate is not installed) |
//! | 100 | plugin specific: CHECK found no usable saved delegate config |
//! | 101 | routed mode: weftd has no free address left |
//! | 102 | routed mode: CHECK found the datapath or the allocation differs |
//! | 103 | routed mode: the attachment or the pod's interface name already exists |
//!
//! Routed mode otherwise: weftd unreachable, or its state unusable → 11; a
//! request weftd calls invalid → 7; netns, netlink and sysctl failures → 5;
//! an unknown `mode` → 2.
//! | 999 | internal: a delegate printed an unusable result or an error without a code |
//!
//! A delegate's own CNI error is passed through with its code, msg and
//! details, as flannel does.

use std::io;

use serde::Serialize;
use serde_json::Value;
use weft_compat::ipam::ErrorKind;
use weft_compat::subnet_env::plugin::SubnetEnvError;

use crate::config::ConfigError;
use crate::delegate::DelegateError;
use crate::exec::ExecError;
use crate::routed::{ClientError, RoutedError};
use crate::store::StoreError;
use crate::version::VersionError;

/// Plugin-specific code: CHECK found no usable saved delegate config.
pub const CODE_NO_SAVED_CONFIG: u32 = 100;
/// Routed mode: no free address.
pub const CODE_NO_ADDRESS: u32 = 101;
/// Routed mode: CHECK failed.
pub const CODE_CHECK_FAILED: u32 = 102;
/// Routed mode: already exists.
pub const CODE_EXISTS: u32 = 103;
/// Go's `ErrInternal`.
pub const CODE_INTERNAL: u32 = 999;

/// Everything that can make a verb fail.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Required `CNI_*` variables are not set.
    #[error("required env variables [{}] missing", .0.join(","))]
    MissingEnv(Vec<&'static str>),
    /// A `CNI_*` variable has an invalid value (skel's texts).
    #[error("{msg}")]
    InvalidEnv {
        /// What is wrong.
        msg: &'static str,
        /// The value or a hint.
        details: String,
    },
    /// `CNI_COMMAND` is not a verb we know.
    #[error("unknown CNI_COMMAND: {0}")]
    UnknownCommand(String),
    /// stdin could not be read.
    #[error("error reading from stdin: {0}")]
    Stdin(#[source] io::Error),
    /// stdin is not a valid flannel network config.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The network config has no name.
    #[error("missing network name")]
    MissingName,
    /// The network name has characters CNI forbids.
    #[error("invalid characters found in network name")]
    InvalidName(String),
    /// The network's `cniVersion` does not fit.
    #[error(transparent)]
    Version(#[from] VersionError),
    /// subnet.env could not be loaded (flannel's ADD text).
    #[error(
        "failed to load flannel 'subnet.env' file: {0}. Check the flannel pod log for this node."
    )]
    SubnetEnv(#[source] SubnetEnvError),
    /// The delegate config could not be built.
    #[error(transparent)]
    Delegate(#[from] DelegateError),
    /// A delegate could not be run, or failed.
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// The data dir could not be used.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// CHECK: the container has no saved delegate config.
    #[error(
        "no saved delegate config for container {container_id} ({path}); was it added by this plugin?"
    )]
    NoSavedConfig {
        /// The container.
        container_id: String,
        /// Where the config should be.
        path: String,
    },
    /// CHECK: the saved delegate config is unusable.
    #[error("saved delegate config {path} is corrupt: {reason}")]
    CorruptSavedConfig {
        /// The file.
        path: String,
        /// What is wrong.
        reason: String,
    },
    /// STATUS: the plugin cannot serve ADD yet.
    #[error("flannel network not ready: {0}")]
    NotReady(#[source] Box<Error>),
    /// GC: every error met while collecting (GC continues past failures).
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Gc(Vec<Error>),
    /// The result could not be written to stdout.
    #[error("failed to write result: {0}")]
    Output(#[source] io::Error),
    /// Routed mode failed.
    #[error(transparent)]
    Routed(#[from] RoutedError),
}

/// A CNI error object, ready to print.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CniError {
    /// The network's version, when known.
    #[serde(rename = "cniVersion", skip_serializing_if = "Option::is_none")]
    pub cni_version: Option<String>,
    /// The CNI error code.
    pub code: u32,
    /// The message.
    pub msg: String,
    /// Extra detail.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub details: String,
}

// === impl CniError ===

impl CniError {
    /// Go skel's rendering: indented JSON and a newline.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let mut ser = serde_json::Serializer::with_formatter(
            &mut out,
            serde_json::ser::PrettyFormatter::with_indent(b"    "),
        );
        // Serializing plain strings and integers into a Vec cannot fail.
        let _ = self.serialize(&mut ser);
        out.push(b'\n');
        out
    }
}

// === impl Error ===

impl Error {
    /// Maps the error to its CNI code, message and details.
    pub fn to_cni(&self, cni_version: Option<&str>) -> CniError {
        let msg = self.to_string();
        let (code, details) = match self {
            Error::MissingEnv(_) | Error::UnknownCommand(_) => (4, String::new()),
            Error::InvalidEnv { details, .. } => (4, details.clone()),
            Error::Stdin(_) | Error::Store(_) | Error::Output(_) => (5, String::new()),
            Error::Config(ConfigError::UnknownMode { value }) => (2, format!("mode={value}")),
            Error::Config(_) => (6, String::new()),
            Error::MissingName => (7, String::new()),
            Error::InvalidName(name) => (7, name.clone()),
            Error::Version(v @ VersionError::Invalid(_)) => (6, v.details()),
            Error::Version(v) => (1, v.details()),
            Error::SubnetEnv(e) => match e {
                SubnetEnvError::Open { .. } if e.is_not_found() => (11, String::new()),
                SubnetEnvError::Open { .. } | SubnetEnvError::Read { .. } => (5, String::new()),
                _ => (7, String::new()),
            },
            Error::Delegate(d) => match d {
                DelegateError::NameSet { value } => {
                    (2, format!("delegate.name={}", compact(value)))
                }
                DelegateError::IpamSet { value } => {
                    (2, format!("delegate.ipam={}", compact(value)))
                }
                DelegateError::TypeNotString | DelegateError::Routes(_) => (7, String::new()),
            },
            Error::Exec(e) => match e {
                ExecError::InvalidName(_) | ExecError::NotFound { .. } => (7, String::new()),
                ExecError::Spawn { .. } => (5, String::new()),
                ExecError::BadOutput { .. } => (CODE_INTERNAL, String::new()),
                ExecError::Plugin(p) => {
                    let code = if p.code == 0 { CODE_INTERNAL } else { p.code };
                    return CniError {
                        cni_version: cni_version.map(str::to_string),
                        code,
                        msg: p.msg.clone(),
                        details: p.details.clone(),
                    };
                }
            },
            Error::NoSavedConfig { .. } | Error::CorruptSavedConfig { .. } => {
                (CODE_NO_SAVED_CONFIG, String::new())
            }
            Error::NotReady(_) => (50, String::new()),
            Error::Routed(e) => (routed_code(e), String::new()),
            Error::Gc(errors) => match errors.first() {
                Some(first) => (first.to_cni(None).code, String::new()),
                None => (CODE_INTERNAL, String::new()),
            },
        };
        CniError {
            cni_version: cni_version.map(str::to_string),
            code,
            msg,
            details,
        }
    }
}

/// The CNI code of a routed-mode failure (part of [`Error::to_cni`]).
fn routed_code(e: &RoutedError) -> u32 {
    match e {
        RoutedError::Ipam(ClientError::Unreachable { .. }) => 11,
        RoutedError::Ipam(ClientError::Protocol { .. }) => CODE_INTERNAL,
        RoutedError::Ipam(ClientError::Refused { kind, .. }) => match kind {
            ErrorKind::Exhausted => CODE_NO_ADDRESS,
            ErrorKind::Invalid => 7,
            ErrorKind::Unavailable | ErrorKind::Unknown => 11,
        },
        RoutedError::Netns { .. } | RoutedError::Netlink(_) | RoutedError::Sysctl { .. } => 5,
        RoutedError::Exists(_) => CODE_EXISTS,
        RoutedError::Check(_) => CODE_CHECK_FAILED,
        RoutedError::Teardown(errors) => errors.first().map_or(CODE_INTERNAL, routed_code),
    }
}

fn compact(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

#[cfg(test)]
mod tests;
