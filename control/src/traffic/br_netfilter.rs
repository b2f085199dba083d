//! flannel's `br_netfilter` check (flannel-compat §8.3, checklist 28).
//!
//! With iptables (nftables off), flanneld refuses to start when bridged pod traffic would
//! bypass iptables: it stats `/proc/sys/net/bridge/bridge-nf-call-iptables` (and
//! `bridge-nf-call-ip6tables` with IPv6) and exits with
//! `Failed to check br_netfilter: stat <path>: no such file or directory`.
//!
//! weftd does better (flannel-compat §13.7, a recurring complaint since kubeadm 1.30 stopped
//! loading the module): [`ensure_br_netfilter`] first tries to load the module
//! (`modprobe br_netfilter`, which works where weftd has CAP_SYS_MODULE and the host's
//! modules) and only then fails, with flannel's line followed by why loading failed and the
//! exact fix.
//!
//! Why a missing module stays fatal for every backend instead of a warning for some: the
//! check is not about the backend. What needs `bridge-nf-call-iptables` is the CNI plugin's
//! bridge (`cni0`): traffic between two pods of one node is bridged, and without
//! br_netfilter it never reaches iptables, so kube-proxy's Service DNAT is not undone on the
//! reply path and Services fail (§13.7, flannel issues 2068 and 2166). That holds whichever
//! backend carries traffic between nodes, `alloc` and host-gw included, and weftd cannot tell
//! whether the node's pods use the bridge (only the CNI config says so). The cases flannel
//! exempts stay exempt: nftables mode, and `--traffic-manager=none` (no host rules at all).

use std::{io, path::Path};

use super::Error;

/// The IPv4 file, relative to the proc root.
pub const BRIDGE_NF_CALL_IPTABLES: &str = "sys/net/bridge/bridge-nf-call-iptables";
/// The IPv6 file, relative to the proc root.
pub const BRIDGE_NF_CALL_IP6TABLES: &str = "sys/net/bridge/bridge-nf-call-ip6tables";

/// Checks that the `bridge-nf-call-*` files exist under `proc_root` (`/proc` in the daemon;
/// injectable for tests). `ipv6` also checks the ip6tables file. Call only when nftables is off.
pub fn check_br_netfilter(proc_root: &Path, ipv6: bool) -> Result<(), Error> {
    let files: &[&str] = if ipv6 {
        &[BRIDGE_NF_CALL_IPTABLES, BRIDGE_NF_CALL_IP6TABLES]
    } else {
        &[BRIDGE_NF_CALL_IPTABLES]
    };
    for file in files {
        let path = proc_root.join(file);
        if let Err(e) = std::fs::metadata(&path) {
            return Err(Error::BrNetfilter {
                path,
                reason: go_reason(&e),
                load: None,
            });
        }
    }
    Ok(())
}

/// [`check_br_netfilter`], and if a file is missing, `load` (the daemon passes
/// [`modprobe_br_netfilter`]) and the check again. Returns whether the module had to be
/// loaded. If the files are still missing the error says why loading failed and how to fix
/// it (see the module docs).
pub fn ensure_br_netfilter(
    proc_root: &Path,
    ipv6: bool,
    load: &mut dyn FnMut() -> Result<(), String>,
) -> Result<bool, Error> {
    if check_br_netfilter(proc_root, ipv6).is_ok() {
        return Ok(false);
    }
    let loaded = load();
    match (check_br_netfilter(proc_root, ipv6), loaded) {
        (Ok(()), _) => Ok(true),
        (Err(Error::BrNetfilter { path, reason, .. }), loaded) => Err(Error::BrNetfilter {
            path,
            reason,
            load: Some(match loaded {
                Err(why) => why,
                Ok(()) => "modprobe succeeded but the files did not appear".to_string(),
            }),
        }),
        (Err(e), _) => Err(e),
    }
}

/// Runs `modprobe br_netfilter` (the kernel's own modprobe path from
/// `/proc/sys/kernel/modprobe`, else `modprobe` in `PATH`); `Err` says why it failed.
pub fn modprobe_br_netfilter() -> Result<(), String> {
    let program = std::fs::read_to_string("/proc/sys/kernel/modprobe")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && Path::new(s).exists())
        .unwrap_or_else(|| "modprobe".to_string());
    let out = std::process::Command::new(&program)
        .arg("br_netfilter")
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| format!("cannot run {program}: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stderr = stderr.trim();
    Err(if stderr.is_empty() {
        format!("`{program} br_netfilter` failed ({})", out.status)
    } else {
        format!("`{program} br_netfilter`: {stderr}")
    })
}

/// Go's lowercase errno text (`no such file or directory`), as flannel prints it.
fn go_reason(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(raw) => {
            let desc = nix::errno::Errno::from_raw(raw).desc();
            let mut chars = desc.chars();
            chars
                .next()
                .map_or_else(String::new, |c| c.to_lowercase().chain(chars).collect())
        }
        None => e.to_string(),
    }
}
