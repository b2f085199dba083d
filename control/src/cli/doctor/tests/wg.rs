//! The WireGuard handshake check.

use super::super::checks;
use super::super::facts::Facts;
use super::super::wg::STALE;
use super::{healthy, status_mut};
use crate::view::ProbeStatus;

/// The healthy node as a userspace WireGuard node whose peer is `reachable`
/// and last handshook `ago` seconds before the facts were read.
fn wg(reachable: bool, ago: Option<u64>) -> Facts {
    let mut f = healthy();
    let now = f.now;
    let st = status_mut(&mut f);
    st.backend.name = "wireguard".into();
    let p = &mut st.peers[0];
    p.backend_type = "wireguard".into();
    p.device = Some("flannel-wg".into());
    p.last_handshake = ago.map(|a| now - a);
    p.probe = Some(ProbeStatus {
        reachable: Some(reachable),
        rtt_us: None,
        losses: if reachable { 0 } else { 3 },
        sent: 9,
        received: if reachable { 9 } else { 6 },
        pmtu: None,
    });
    f
}

fn found(f: &Facts) -> Vec<&'static str> {
    checks::run_except(
        f,
        &["devices".into(), "peer_routes".into(), "vxlan_l2".into()],
    )
    .into_iter()
    .map(|x| x.id)
    .collect()
}

#[test]
fn a_lost_peer_without_a_recent_handshake_is_named_with_the_clock() {
    for ago in [None, Some(STALE + 1), Some(3600)] {
        let f = wg(false, ago);
        assert_eq!(
            found(&f),
            ["peer_unreachable", "wg_handshake_failing"],
            "{ago:?}"
        );
    }
    let mut f = wg(false, None);
    f.clock_synced = Ok(false);
    let x = checks::run(&f);
    let h = x
        .iter()
        .find(|x| x.id == "wg_handshake_failing")
        .expect("the finding");
    assert!(h.evidence.contains("NOT synchronised"), "{h:#?}");
    assert!(h.evidence.contains("never"), "{h:#?}");
    assert!(h.fix.contains("clock"), "{h:#?}");
}

#[test]
fn a_recent_handshake_or_a_reachable_peer_is_no_handshake_finding() {
    // Lost, but the session renewed lately: the handshakes work (the
    // packets after them are lost), so only peer_unreachable.
    assert_eq!(found(&wg(false, Some(30))), ["peer_unreachable"]);
    assert!(found(&wg(true, None)).is_empty());
    assert!(found(&wg(true, Some(3600))).is_empty());
    // Not WireGuard: nothing to say about handshakes.
    let mut f = wg(false, None);
    status_mut(&mut f).backend.name = "vxlan".into();
    assert_eq!(found(&f), ["peer_unreachable"]);
}
