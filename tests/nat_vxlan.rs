//! Nodes behind NAT on the `vxlan` (userspace dataplane) and `udp`
//! backends (docs/nat.md, "vxlan and udp"), through real weftd daemons,
//! pods from weft's CNI plugin, in the topology of `weft_tests::nat`: node 1
//! public, nodes 2 and 3 each behind a Linux MASQUERADE router of its own.
//! With NAT traversal the two nodes behind NAT discover the endpoint their
//! NAT maps for the backend port, publish it, and send each other's
//! traffic there from that port: they punch through. A flushed NAT mapping
//! heals; forged discovery answers and forged VXLAN / flannel-UDP packets
//! from an off-path address move neither a path nor a published endpoint
//! (those encapsulations authenticate nothing: paths come from the lease
//! store only). Without the feature the pair never meets. The story is
//! `weft_tests::nat_story`'s, shared with WireGuard (tests/nat.rs). Times
//! are printed (`--nocapture`) and bounded generously.

use std::time::Duration;

use weft_tests::nat_story::{Story, never_meet, punch_through};

/// Bound on the first packet: discovery's first round (1 s), the 1 s
/// publish poll, the store watch and the peers' apply, keepalives sent at
/// once on the new table; measured 1.3-2.7 s. 30 s leaves a debug build on
/// a loaded 2-vCPU machine room without hiding a pair that only meets by a
/// 25 s keepalive's luck twice.
const FIRST: Duration = Duration::from_secs(30);

/// The answering side's next keepalive: at most 25 s (measured 10.7-15.8 s).
const ANSWERING_SIDE: Duration = Duration::from_secs(30);

#[test]
fn vxlan_nodes_behind_two_nats_punch_through_and_heal() {
    punch_through(&Story {
        backend: "vxlan",
        port: 8472,
        tag: "natvx",
        first: FIRST,
        answering_side: ANSWERING_SIDE,
    });
}

#[test]
fn udp_nodes_behind_two_nats_punch_through_and_heal() {
    punch_through(&Story {
        backend: "udp",
        port: 8285,
        tag: "natud",
        first: FIRST,
        answering_side: ANSWERING_SIDE,
    });
}

#[test]
fn without_nat_traversal_vxlan_nodes_behind_nat_do_not_meet() {
    never_meet("natvx0", "vxlan");
}
