#!/usr/bin/env bash
# weft demo: a 3-node weft cluster on this machine (network namespaces on a
# shared underlay bridge, one weftd per node on the embedded lease store, two
# pods per node created by weft's CNI plugin), pod-to-pod pings across nodes
# and an iperf3 figure; everything is removed at the end, on Ctrl-C or error.
#
# Usage: sudo scripts/demo.sh [--backend vxlan|udp|wireguard|ipip|host-gw|alloc] [--dataplane userspace|kernel|auto] [--nodes N] [--pods N] [--iperf SECS]
set -euo pipefail
cd "$(dirname "$0")/.."
[[ $(id -u) -eq 0 ]] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }
scripts/deps.sh
echo "==> building weft (debug build; the first build takes a few minutes)" >&2
cargo build --quiet --workspace --bins
exec target/debug/weft demo "$@"
