//! `weft doctor`: checks this node's setup and its weftd, and prints each
//! problem found with its evidence and the fix.
//!
//! Gathering and judging are apart: [`facts::gather`] is the command's only
//! I/O (read-only: `/proc/sys`, netlink dumps, `iptables -S FORWARD`, the
//! subnet file, the CNI directories, the status socket), and every check is
//! a pure function from [`facts::Facts`] to [`Finding`]s ([`checks::CHECKS`]),
//! unit-tested table-driven. A finding has a stable `id` (scripts match on
//! it), a severity, a message in plain words, the evidence it rests on, and
//! the fix.
//!
//! Exit codes: 0 no error finding (warnings and notes may be printed); 1 an
//! error finding; 3 weftd did not answer on its status socket (the report
//! is still printed: the host checks do not need it); 2 usage.

pub mod checks;
mod csum;
pub mod facts;
mod gso;
mod nft;
mod overlay;
mod peers;
mod policy;
mod wg;

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;

use super::{CliError, DEFAULT_SUBNET_FILE, print, print_json, status_socket};

/// How bad a finding is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    /// Pod traffic breaks (or will) until fixed.
    Error,
    /// Works now, breaks in a common situation.
    Warning,
    /// Worth knowing (a choice weftd made, a check that could not run).
    Info,
}

/// One problem (or note) found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// A stable identifier (e.g. `ip_forward_off`).
    pub id: &'static str,
    /// How bad it is.
    pub severity: Severity,
    /// What is wrong, in plain words.
    pub message: String,
    /// What was seen.
    pub evidence: String,
    /// How to fix it.
    pub fix: String,
}

impl Finding {
    /// A finding.
    pub fn new(
        id: &'static str,
        severity: Severity,
        message: impl Into<String>,
        evidence: impl Into<String>,
        fix: impl Into<String>,
    ) -> Finding {
        Finding {
            id,
            severity,
            message: message.into(),
            evidence: evidence.into(),
            fix: fix.into(),
        }
    }
}

/// `weft doctor`.
#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// weftd's --subnet-file (its status socket lives next to it).
    #[arg(long, value_name = "FILE")]
    subnet_file: Option<PathBuf>,
    /// The status socket (default: weft-status.sock next to --subnet-file).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// The CNI config directory (the kubelet's).
    #[arg(long, value_name = "DIR", default_value = "/etc/cni/net.d")]
    cni_conf_dir: PathBuf,
    /// The CNI plugin directory.
    #[arg(long, value_name = "DIR", default_value = "/opt/cni/bin")]
    cni_bin_dir: PathBuf,
    /// Skip a check by name (repeatable; e.g. `cni` where the CNI
    /// directories are not visible, as inside weft's pod).
    #[arg(long, value_name = "CHECK")]
    skip: Vec<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// `weft doctor`.
pub fn run(a: &DoctorArgs) -> Result<(), CliError> {
    let file = a
        .subnet_file
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_SUBNET_FILE));
    let socket = a.socket.clone().unwrap_or_else(|| status_socket(&file));
    let cni = facts::CniFactsOpt {
        conf_dir: a.cni_conf_dir.clone(),
        bin_dir: a.cni_bin_dir.clone(),
    };
    if let Some(bad) = a
        .skip
        .iter()
        .find(|s| !checks::CHECKS.iter().any(|(n, _)| n == s))
    {
        let names: Vec<&str> = checks::CHECKS.iter().map(|(n, _)| *n).collect();
        return Err(CliError::usage(format!(
            "--skip {bad}: no such check (checks: {})",
            names.join(", ")
        )));
    }
    let f = facts::gather(&file, &socket, &cni);
    let findings = checks::run_except(&f, &a.skip);
    let errors = findings
        .iter()
        .filter(|x| x.severity == Severity::Error)
        .count();
    let warnings = findings
        .iter()
        .filter(|x| x.severity == Severity::Warning)
        .count();
    if a.json {
        print_json(&serde_json::json!({
            "checks": checks::CHECKS
                .iter()
                .map(|(n, _)| *n)
                .filter(|n| !a.skip.iter().any(|s| s == n))
                .collect::<Vec<_>>(),
            "errors": errors,
            "warnings": warnings,
            "findings": findings,
        }))?;
    } else {
        print(&text(&f, &findings, errors, warnings))?;
    }
    if f.daemon.is_err() {
        return Err(CliError::unreachable(format!(
            "weftd did not answer on {}",
            socket.display()
        )));
    }
    if errors > 0 {
        return Err(CliError::failed(format!("{errors} problem(s) found")));
    }
    Ok(())
}

/// The report as text.
fn text(f: &facts::Facts, findings: &[Finding], errors: usize, warnings: usize) -> String {
    let mut out = String::new();
    match &f.daemon {
        Ok(st) => {
            let lease = st.lease.as_ref().map_or("no lease".to_string(), |l| {
                format!(
                    "lease {} on {}",
                    l.subnet.as_deref().unwrap_or("-"),
                    l.public_ip
                )
            });
            out.push_str(&format!(
                "weftd pid {}: {lease}, backend {} ({}), {} peer(s)\n",
                st.pid,
                st.backend.name,
                st.backend.dataplane,
                st.peers.len()
            ));
        }
        Err(_) => out.push_str("weftd: not answering\n"),
    }
    for x in findings {
        let sev = match x.severity {
            Severity::Error => "ERROR",
            Severity::Warning => "WARN",
            Severity::Info => "NOTE",
        };
        out.push_str(&format!("{sev:<5} [{}] {}\n", x.id, x.message));
        out.push_str(&format!("      evidence: {}\n", x.evidence));
        if !x.fix.is_empty() {
            out.push_str(&format!("      fix: {}\n", x.fix));
        }
    }
    if errors + warnings == 0 {
        out.push_str(&format!(
            "no problems found ({} checks)\n",
            checks::CHECKS.len()
        ));
    } else {
        out.push_str(&format!("{errors} error(s), {warnings} warning(s)\n"));
    }
    out
}

#[cfg(test)]
mod tests;
