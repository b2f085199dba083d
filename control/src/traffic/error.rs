//! Errors of the traffic-rule drivers.

use std::{io, path::PathBuf};

use ipnet::IpNet;

/// Why installing, checking or removing host rules failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A firewall tool could not be started (usually: not installed).
    #[error("failed to run {program}: {source}")]
    Spawn {
        /// The program, e.g. `iptables-restore`.
        program: String,
        /// Why it could not be started.
        #[source]
        source: io::Error,
    },
    /// A firewall tool ran and reported failure.
    #[error("{command} failed ({status}): {stderr}")]
    Command {
        /// The command line, without its stdin payload.
        command: String,
        /// The exit status, e.g. `exit status: 1`.
        status: String,
        /// What the tool printed on stderr (trimmed).
        stderr: String,
    },
    /// `iptables --version` printed no `vX.Y.Z`.
    #[error("no iptables version found in string: {0}")]
    Version(String),
    /// A family has a Network but no lease subnet, so no masquerade rules can be built.
    #[error("no lease subnet for network {network}")]
    MissingSubnet {
        /// The family's Network.
        network: IpNet,
    },
    /// A `bridge-nf-call-*` file is absent: `br_netfilter` is not loaded. The daemon logs this
    /// as `Failed to check br_netfilter: <this>`, which gives flannel's exact line.
    #[error("stat {}: {reason}", path.display())]
    BrNetfilter {
        /// The `/proc/sys/net/bridge/...` path that was checked.
        path: PathBuf,
        /// Go-style reason, e.g. `no such file or directory`.
        reason: String,
    },
    /// Several independent steps failed (best-effort cleanup and resync keep going).
    #[error("{}", join(.0))]
    Multiple(Vec<Error>),
}

impl Error {
    /// True when the tool itself is not installed (cleanup treats that as nothing to clean).
    pub fn is_not_installed(&self) -> bool {
        matches!(self, Self::Spawn { source, .. } if source.kind() == io::ErrorKind::NotFound)
    }

    /// `Ok` for no errors, the error itself for one, [`Error::Multiple`] otherwise.
    pub(crate) fn collect(mut errors: Vec<Error>) -> Result<(), Error> {
        match errors.len() {
            0 => Ok(()),
            1 => Err(errors.remove(0)),
            _ => Err(Self::Multiple(errors)),
        }
    }
}

fn join(errors: &[Error]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
