#!/usr/bin/env bash
# weft demo: a 3-node cluster on this machine, on the embedded lease store.
#
# Each node is a network namespace on a shared underlay bridge (192.0.2.0/24,
# a documentation range, only inside these namespaces). One weftd runs per
# node; they share one embedded store directory, take distinct subnet leases
# and write their subnet.env. Everything is removed on exit, Ctrl-C or error.
#
# Usage: sudo scripts/demo.sh [--backend alloc] [--nodes N]
set -euo pipefail
cd "$(dirname "$0")/.."

BACKEND=alloc
NODES=3
while (($#)); do
  case "$1" in
    --backend) BACKEND=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1" >&2; exit 2 ;;
  esac
done
[[ $(id -u) -eq 0 ]] || { echo "demo: run as root (it creates network namespaces)" >&2; exit 1; }

scripts/deps.sh
echo "==> building weftd (debug build; the first build takes a few minutes)"
cargo build --quiet -p weft-control --bins
BIN=$PWD/target/debug

P=wdemo$$
WORK=$(mktemp -d /tmp/weft-demo.XXXXXX)
PIDS=()
cleanup() {
  set +e
  for pid in "${PIDS[@]}"; do kill "$pid" 2>/dev/null; done
  wait 2>/dev/null
  for i in $(seq 1 "$NODES"); do ip netns del "$P-n$i" 2>/dev/null; done
  ip netns del "$P-ul" 2>/dev/null
  rm -rf "$WORK"
  echo "==> cleaned up (namespaces $P-*, $WORK)"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

cat > "$WORK/net-conf.json" <<JSON
{
  "Network": "10.244.0.0/16",
  "Backend": { "Type": "$BACKEND" }
}
JSON
echo "==> net-conf.json:"; cat "$WORK/net-conf.json"

ip netns add "$P-ul"
ip -n "$P-ul" link add br0 type bridge
ip -n "$P-ul" link set br0 up
for i in $(seq 1 "$NODES"); do
  ns=$P-n$i
  ip netns add "$ns"
  ip -n "$ns" link set lo up
  ip link add eth0 netns "$ns" type veth peer name "p$i" netns "$P-ul"
  ip -n "$P-ul" link set "p$i" master br0 up
  ip -n "$ns" addr add "192.0.2.$i/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route add default via 192.0.2.254 dev eth0 onlink
  mkdir -p "$WORK/n$i"
  ip netns exec "$ns" "$BIN/weftd" \
      --store=embedded --store-path="$WORK/store" \
      --net-config-path="$WORK/net-conf.json" \
      --subnet-file="$WORK/n$i/subnet.env" \
      --healthz-ip=127.0.0.1 --healthz-port=8081 \
      >"$WORK/n$i/weftd.log" 2>&1 &
  PIDS+=($!)
done

echo "==> waiting for every node's subnet.env"
for i in $(seq 1 "$NODES"); do
  for _ in $(seq 1 100); do [[ -s $WORK/n$i/subnet.env ]] && break; sleep 0.1; done
  [[ -s $WORK/n$i/subnet.env ]] || { echo "node $i did not become ready; its log:"; cat "$WORK/n$i/weftd.log"; exit 1; }
done
for i in $(seq 1 "$NODES"); do
  echo "--- node $i (192.0.2.$i): /readyz says: $(ip netns exec "$P-n$i" curl -s http://127.0.0.1:8081/readyz 2>/dev/null || echo n/a)"
  cat "$WORK/n$i/subnet.env"
done
echo "==> leases in the embedded store ($WORK/store):"
"$BIN/weft" leases --store-path "$WORK/store"
echo "==> weftd log of node 1:"
sed -n '1,40p' "$WORK/n1/weftd.log" | cut -c1-200
