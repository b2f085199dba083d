//! The kernel vxlan checksum-offload bug, as `weft doctor` sees it: UDP
//! datagrams dropped for bad checksums on this node (`InCsumErrors`), and
//! weft's devices with the offload off (the workaround,
//! [`crate::backend::vxlan::TxCsumOffload`]). Pure over [`Facts`]; the
//! counters' parser is here so that it is tested beside its judgement.

use super::facts::Facts;
use super::{Finding, Severity};

/// `Udp: InCsumErrors` of /proc/net/snmp plus `Udp6InCsumErrors` of
/// /proc/net/snmp6 (each counts when present; `None` when neither is).
pub fn in_csum_errors(snmp: &str, snmp6: &str) -> Option<u64> {
    let mut v4 = None;
    let mut lines = snmp.lines().filter(|l| l.starts_with("Udp: "));
    if let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        v4 = names
            .split_whitespace()
            .zip(values.split_whitespace())
            .find(|(n, _)| *n == "InCsumErrors")
            .and_then(|(_, v)| v.parse::<u64>().ok());
    }
    let v6 = snmp6.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        (w.next() == Some("Udp6InCsumErrors"))
            .then(|| w.next()?.parse::<u64>().ok())
            .flatten()
    });
    match (v4, v6) {
        (None, None) => None,
        (a, b) => Some(a.unwrap_or(0) + b.unwrap_or(0)),
    }
}

/// `udp_checksum_errors` and `vxlan_tx_csum_off`.
pub fn checksums(f: &Facts) -> Vec<Finding> {
    let mut out = Vec::new();
    if let Some(n) = f.udp_csum_errors.filter(|n| *n > 0) {
        out.push(Finding::new(
            "udp_checksum_errors",
            Severity::Warning,
            format!(
                "this node dropped {n} UDP datagram(s) for a bad checksum: if they were overlay packets, a peer's kernel vxlan device sends broken checksums (the vxlan checksum-offload bug: connections through Services or NodePorts stall for 63 s)"
            ),
            format!("InCsumErrors (Udp + Udp6) = {n} since boot (/proc/net/snmp, /proc/net/snmp6)"),
            "on the nodes that send to this one: weftd --vxlan-tx-checksum-offload=off (flannel's `ethtool -K flannel.1 tx-checksum-ip-generic off`, kept by weftd across restarts); if the counter no longer rises, the errors are old",
        ));
    }
    for dev in &f.tx_csum_off {
        out.push(Finding::new(
            "vxlan_tx_csum_off",
            Severity::Info,
            format!(
                "transmit checksum offload is off on {dev}: the workaround for the kernel vxlan checksum bug, paid in CPU per packet"
            ),
            format!("SIOCETHTOOL: tx-checksumming off on {dev}"),
            "nothing, if weftd's --vxlan-tx-checksum-offload=off set it on purpose; kernels from 5.7 do not need it (--vxlan-tx-checksum-offload=auto keeps the offload there)",
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SNMP: &str = "Udp: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdp: 10 0 3 12 0 0 3 0 0\nUdpLite: InDatagrams NoPorts InErrors OutDatagrams RcvbufErrors SndbufErrors InCsumErrors IgnoredMulti MemErrors\nUdpLite: 0 0 0 0 0 0 9 0 0\n";

    #[test]
    fn counts_both_families_and_only_udp() {
        assert_eq!(
            in_csum_errors(
                SNMP,
                "Udp6InErrors 1\nUdp6InCsumErrors 2\nUdpLite6InCsumErrors 7\n"
            ),
            Some(5)
        );
        assert_eq!(in_csum_errors(SNMP, ""), Some(3));
        assert_eq!(in_csum_errors("", "Udp6InCsumErrors 4\n"), Some(4));
        assert_eq!(in_csum_errors("", ""), None);
        assert_eq!(in_csum_errors("Udp: InCsumErrors\nUdp: x\n", "junk"), None);
    }
}
