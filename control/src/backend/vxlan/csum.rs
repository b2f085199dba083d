//! The kernel vxlan checksum-offload bug and weft's answer to it.
//!
//! On some kernels a vxlan device that offloads its transmit checksums sends
//! datagrams whose UDP checksum is wrong when the inner packet was NATed
//! on the way in (kube-proxy's SNAT of a NodePort or ClusterIP connection):
//! the receiver drops them (its `Udp: InCsumErrors` counter rises) and TCP
//! stalls for 63 s, the sum of its SYN retries (flannel#1279, #2152; calico#3145).
//! flannel forced the offload off in PR#1282, reverted it, and now only
//! documents `ethtool -K flannel.1 tx-checksum-ip-generic off` with a udev
//! rule to make it stick (flannel's troubleshooting.md). Calico turned it off
//! for every kernel in 2022 and back on above 5.7 in 2024 (calico#8746),
//! finding no kernel after 5.7 that needs it.
//!
//! weft applies the workaround itself, on its own device at every setup and
//! reconcile (so it survives a reboot and a recreated device, which the
//! ethtool command does not): `--vxlan-tx-checksum-offload=auto` (the
//! default) turns the offload off on kernels below 5.7 and leaves it to the
//! kernel above; `off` turns it off on every kernel (for a node whose peers
//! see `InCsumErrors` rise: `weft doctor` reports `udp_checksum_errors`);
//! `on` turns it back on. The cost of `off`: the vxlan device computes
//! checksums in software and loses TSO, so the host stack segments earlier.

use std::str::FromStr;

/// `--vxlan-tx-checksum-offload`: see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum TxCsumOffload {
    /// Off below kernel 5.7, else the kernel's default.
    #[default]
    Auto,
    /// On.
    On,
    /// Off (the workaround).
    Off,
}

/// The first kernel calico found without the bug (calico#8746).
const FIXED_IN: (u32, u32) = (5, 7);

impl TxCsumOffload {
    /// What to set on a kernel of `release` (`uname -r`): `Some(on)`, or
    /// `None` to leave the device as the kernel made it. An unreadable
    /// release counts as a new kernel.
    pub fn wanted(self, release: &str) -> Option<bool> {
        match self {
            TxCsumOffload::On => Some(true),
            TxCsumOffload::Off => Some(false),
            TxCsumOffload::Auto => {
                let mut parts = release
                    .split(|c: char| !c.is_ascii_digit())
                    .map(|p| p.parse::<u32>().ok());
                match (parts.next().flatten(), parts.next().flatten()) {
                    (Some(major), Some(minor)) if (major, minor) < FIXED_IN => Some(false),
                    _ => None,
                }
            }
        }
    }
}

impl FromStr for TxCsumOffload {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(TxCsumOffload::Auto),
            "on" | "true" => Ok(TxCsumOffload::On),
            "off" | "false" => Ok(TxCsumOffload::Off),
            _ => Err(format!("{s:?} is not one of auto, on, off")),
        }
    }
}

/// The running kernel's release (`uname -r`), empty when unreadable.
pub fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_turns_the_offload_off_below_5_7_only() {
        let a = TxCsumOffload::Auto;
        assert_eq!(a.wanted("4.19.0-27-amd64"), Some(false));
        assert_eq!(a.wanted("5.6.19"), Some(false));
        assert_eq!(a.wanted("3.10.0-1160.el7.x86_64"), Some(false));
        assert_eq!(a.wanted("5.7.0"), None);
        assert_eq!(a.wanted("6.18.1-cloud"), None);
        assert_eq!(a.wanted(""), None);
        assert_eq!(a.wanted("weird"), None);
        assert_eq!(TxCsumOffload::Off.wanted("6.18.1"), Some(false));
        assert_eq!(TxCsumOffload::On.wanted("4.19"), Some(true));
    }

    #[test]
    fn parses_the_flags_values_and_refuses_others() {
        assert_eq!("auto".parse(), Ok(TxCsumOffload::Auto));
        assert_eq!("off".parse(), Ok(TxCsumOffload::Off));
        assert_eq!("on".parse(), Ok(TxCsumOffload::On));
        assert!("maybe".parse::<TxCsumOffload>().is_err());
    }
}
