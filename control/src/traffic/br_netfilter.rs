//! flannel's `br_netfilter` check (flannel-compat §8.3, checklist 28).
//!
//! With iptables (nftables off), flanneld refuses to start when bridged pod traffic would
//! bypass iptables: it stats `/proc/sys/net/bridge/bridge-nf-call-iptables` (and
//! `bridge-nf-call-ip6tables` with IPv6) and exits with
//! `Failed to check br_netfilter: stat <path>: no such file or directory`.

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
            });
        }
    }
    Ok(())
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
