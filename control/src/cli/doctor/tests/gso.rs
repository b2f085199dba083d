//! The `--tunnel-gso` check.

use super::super::checks;
use super::super::facts::Facts;
use super::{healthy, status_mut};
use crate::view::TunnelGsoStatus;

/// The healthy node's device with `--tunnel-gso=mode`, the TAP in use or
/// not (`reason`), and the uplink's offload as doctor read it.
fn node(mode: &str, tap: bool, reason: Option<&str>, uplink: Option<bool>) -> Facts {
    let mut f = healthy();
    let d = &mut status_mut(&mut f).backend.devices[0];
    d.tunnel_gso = Some(TunnelGsoStatus {
        mode: mode.into(),
        tap: tap.then(|| "weft-gso0".to_string()),
        reason: reason.map(String::from),
    });
    f.tunnel_uplink = uplink.map(|on| ("eth0".to_string(), on));
    f
}

fn found(f: &Facts) -> Vec<(&'static str, String)> {
    checks::run(f)
        .into_iter()
        .map(|x| (x.id, format!("{} | {} | {}", x.message, x.evidence, x.fix)))
        .collect()
}

#[test]
fn the_tap_in_use_while_the_uplink_lost_its_offload_is_a_warning() {
    let f = found(&node("auto", true, None, Some(false)));
    assert_eq!(f.len(), 1, "{f:?}");
    let (id, text) = &f[0];
    assert_eq!(*id, "tunnel_gso_stack_segments");
    assert!(text.contains("uplink eth0 no longer segments"), "{text}");
    assert!(
        text.contains("ethtool -K eth0 tx-udp_tnl-segmentation on"),
        "{text}"
    );
    let w = checks::run(&node("on", true, None, Some(false)));
    assert_eq!(w[0].severity, super::Severity::Warning);
}

#[test]
fn the_tap_on_an_uplink_that_segments_and_off_are_fine() {
    assert!(found(&node("on", true, None, Some(true))).is_empty());
    assert!(found(&node("off", false, Some("off"), None)).is_empty());
    // An uplink doctor could not read says nothing either way.
    assert!(found(&node("auto", true, None, None)).is_empty());
}

#[test]
fn auto_on_the_sockets_is_a_note_with_weftds_reason() {
    let why =
        "uplink eth0 has no tx-udp_tnl-segmentation (the node's stack would segment: 2.3x the CPU)";
    let f = found(&node("auto", false, Some(why), None));
    assert_eq!(f.len(), 1, "{f:?}");
    assert_eq!(f[0].0, "tunnel_gso_unused");
    assert!(f[0].1.contains(why), "{}", f[0].1);
    let n = checks::run(&node("auto", false, Some(why), None));
    assert_eq!(n[0].severity, super::Severity::Info);
}
