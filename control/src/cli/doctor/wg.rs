//! WireGuard handshakes: a peer the probes lose whose handshakes do not
//! complete either. WireGuard re-handshakes a session that carries traffic
//! every 2 minutes (REKEY_AFTER_TIME 120 s, retried every REKEY_TIMEOUT
//! 5 s), and weftd's probes (every 4-6 s, docs/probes.md) are such traffic,
//! so on a working path the last handshake is never older than ~131 s;
//! [`STALE`] leaves some slack over that. Only the userspace dataplane
//! reports handshake times (`last_handshake` in `weft status`); kernel
//! WireGuard peers are judged by `peer_unreachable` alone. A block in one
//! direction only may still show a recent handshake here (the engine counts
//! an initiation from the peer it answered, though no packet of that
//! session arrives): then only `peer_unreachable` reports.
//!
//! The fix names the causes in order: the port, the keys, and the clock.
//! The clock is a cause of its own: a handshake initiation carries a TAI64N
//! timestamp and the responder drops one not newer than the last it
//! accepted from that peer (replay protection), so a node whose wall clock
//! stepped backwards (no NTP, a bad RTC after a reboot) cannot handshake
//! until its clock passes the old time; the peer can still initiate, so
//! with weft's probes running both ways a stepped clock alone rarely stops
//! a pair (the same replay rule makes a switch from this engine to kernel
//! WireGuard wait `weft_engine::wg::BORINGTUN_TAI64_AHEAD`). This node's
//! clock discipline state (`adjtimex`) is part of the evidence; the peer's
//! must be read there.

use super::facts::Facts;
use super::{Finding, Severity};

/// A last handshake older than this (s) on a probed, unreachable peer has failed to renew.
pub const STALE: u64 = 140;

/// Unreachable WireGuard peers whose handshakes do not complete.
pub fn handshakes(f: &Facts) -> Vec<Finding> {
    let Some(st) = f.daemon.as_ref().ok() else {
        return Vec::new();
    };
    if st.backend.name != "wireguard" {
        return Vec::new();
    }
    let clock = match &f.clock_synced {
        Ok(true) => "synchronised (adjtimex)".to_string(),
        Ok(false) => "NOT synchronised (adjtimex: no NTP daemon disciplines it)".to_string(),
        Err(e) => format!("unknown ({e})"),
    };
    st.peers
        .iter()
        .filter(|p| p.device.is_some())
        .filter(|p| p.probe.as_ref().and_then(|x| x.reachable) == Some(false))
        .filter_map(|p| {
            let last = match p.last_handshake {
                None => "never since weftd started".to_string(),
                Some(t) if f.now.saturating_sub(t) > STALE => {
                    format!("{} s ago", f.now.saturating_sub(t))
                }
                Some(_) => return None,
            };
            Some(Finding::new(
                "wg_handshake_failing",
                Severity::Error,
                format!(
                    "no WireGuard handshake with peer {} ({}) completes: nothing is exchanged with it",
                    p.public_ip,
                    p.subnet.as_deref().unwrap_or("-")
                ),
                format!(
                    "last handshake: {last} (a working session renews every 2 min while the probes run); this node's clock: {clock}"
                ),
                "check, in this order: that UDP 51820 (or the network config's ListenPort) passes both ways between the nodes; that the peer's lease PublicKey (weft leases) is the key its weftd runs with (a key file replaced under a running weftd); the clocks (timedatectl or chronyc tracking on both): WireGuard drops an initiation older than the last one the peer accepted from that key, so a node whose clock stepped back starts no handshake until its clock passes the old time (the peer still can, when it has traffic); put both under NTP",
            ))
        })
        .collect()
}
