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
    /// as `Failed to check br_netfilter: <this>`, which starts with flannel's exact line; when
    /// loading the module was tried ([`super::ensure_br_netfilter`]), why that failed and the
    /// fix follow.
    #[error("stat {}: {reason}{}", path.display(), br_netfilter_fix(.load.as_deref()))]
    BrNetfilter {
        /// The `/proc/sys/net/bridge/...` path that was checked.
        path: PathBuf,
        /// Go-style reason, e.g. `no such file or directory`.
        reason: String,
        /// Why loading `br_netfilter` failed, if it was tried.
        load: Option<String>,
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

/// The tail of [`Error::BrNetfilter`] once loading the module was tried.
fn br_netfilter_fix(load: Option<&str>) -> String {
    let Some(why) = load else {
        return String::new();
    };
    format!(
        ": the br_netfilter module is not loaded and weftd could not load it ({why}). \
         Without it, traffic between pods on the node's bridge bypasses iptables and \
         Services break. Fix on the node: `modprobe br_netfilter`, and to load it at every \
         boot `echo br_netfilter > /etc/modules-load.d/br_netfilter.conf`"
    )
}
