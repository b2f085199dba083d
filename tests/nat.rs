//! Nodes behind NAT (docs/nat.md), through real weftd daemons on userspace
//! WireGuard, pods from weft's CNI plugin, in the topology of
//! `weft_tests::nat`: node 1 public, nodes 2 and 3 each behind a Linux
//! MASQUERADE router of its own. With NAT traversal the two nodes behind
//! NAT find their endpoints, publish them and punch through to each other
//! (the path is theirs: the public node relays nothing); a flushed NAT
//! mapping heals; forged answers and packets from an off-path address
//! redirect nothing. Without it the two cannot reach each other at all.
//! The story is `weft_tests::nat_story`'s, shared with vxlan and udp
//! (tests/nat_vxlan.rs). Times are printed (`--nocapture`) and bounded
//! generously.

use std::time::Duration;

use weft_tests::nat_story::{Story, never_meet, punch_through};

#[test]
fn nodes_behind_two_nats_punch_through_and_heal() {
    punch_through(&Story {
        backend: "wireguard",
        port: 51820,
        tag: "nat",
        // Discovery's first round, the publish poll, the store watch, the
        // peers' apply and a handshake (retried every 5 s when its first
        // initiation met a closed NAT); measured 5.3-6.0 s.
        first: Duration::from_secs(60),
        // The answering side's next keepalive (25 s) and its handshake;
        // measured 4.1-10.4 s.
        answering_side: Duration::from_secs(32),
    });
}

#[test]
fn without_nat_traversal_nodes_behind_nat_do_not_meet() {
    never_meet("nat0", "wireguard");
}
