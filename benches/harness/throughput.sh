#!/usr/bin/env bash
# Throughput harness (root): iperf3 TCP pod-to-pod across two nodes (network
# namespaces on one veth), for raw veth, kernel vxlan set up as flannel does,
# weft flannel-UDP and weft userspace VXLAN (engine/examples/fwd), and
# WireGuard: wireguard-go + wg (Debian) vs weft's userspace WireGuard. Rounds are
# interleaved (every case once per round) and repeated; prints per-case medians
# and ratios to kernel vxlan and to raw veth.
#
#   cargo build --release -p weft-engine --examples
#   sudo benches/harness/throughput.sh            # REPS=3 DUR=10
#   REPS=5 DUR=5 CASES="kvxlan weft-vxlan" TESTS=tcp1 sudo -E benches/harness/throughput.sh
#
# Env: REPS, DUR, CASES (veth kvxlan weft-udp weft-vxlan wggo weft-wg), TESTS (tcp1 tcp4),
# WORKERS (fwd --workers, default 0 = one per CPU), FWD (forwarder binary),
# OUT (directory for results.tsv and logs; default a temp dir).
set -euo pipefail

REPS=${REPS:-3}
DUR=${DUR:-10}
CASES=${CASES:-"veth kvxlan weft-udp weft-vxlan wggo weft-wg"}
TESTS=${TESTS:-"tcp1 tcp4"}
WORKERS=${WORKERS:-0}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
FWD=${FWD:-${CARGO_TARGET_DIR:-$ROOT/target}/release/examples/fwd}
OUT=${OUT:-$(mktemp -d /tmp/weft-throughput.XXXXXX)}
P=wth
mkdir -p "$OUT/logs"
# WireGuard keys for the two nodes (both wireguard rows use them).
for n in 1 2; do
    [ -s "$OUT/wg$n.key" ] || (umask 077; wg genkey >"$OUT/wg$n.key")
    wg pubkey <"$OUT/wg$n.key" >"$OUT/wg$n.pub"
done

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
[ -x "$FWD" ] || { echo "no forwarder at $FWD: cargo build --release -p weft-engine --examples" >&2; exit 1; }

FWD_PIDS=()
teardown() {
    for p in "${FWD_PIDS[@]:-}"; do [ -n "$p" ] && kill -INT "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
    FWD_PIDS=()
    for n in 1 2; do ip netns pids $P-n$n 2>/dev/null | xargs -r kill 2>/dev/null || true; done
    for n in 1 2; do ip netns del $P-n$n 2>/dev/null || true; done
}
trap teardown EXIT INT TERM

base() {
    teardown
    for n in 1 2; do ip netns add $P-n$n; done
    ip link add $P-v1 netns $P-n1 type veth peer name $P-v2 netns $P-n2
    for n in 1 2; do
        local N="ip -n $P-n$n"
        $N link set lo up
        $N addr add 192.0.2.$n/24 dev $P-v$n
        $N link set $P-v$n up
        $N link add cni0 type bridge
        $N addr add 10.244.$n.1/24 dev cni0
        $N link set cni0 up
    done
}

start_fwd() { # node encap args...
    local n=$1; shift
    ip netns exec $P-n$n "$FWD" --workers "$WORKERS" "$@" >"$OUT/logs/fwd-$CASE-$ROUND-n$n.log" 2>&1 &
    FWD_PIDS+=($!)
    for _ in $(seq 50); do ip -n $P-n$n link show "$DEV" >/dev/null 2>&1 && return 0; sleep 0.1; done
    echo "forwarder on node $n did not create $DEV" >&2; return 1
}

setup() { # case
    base
    case $1 in
    veth) SRC=192.0.2.1; DST=192.0.2.2 ;;
    kvxlan)
        for n in 1 2; do
            m=$((3 - n)); N="ip -n $P-n$n"
            $N link add flannel.1 address 02:00:00:00:0$n:01 type vxlan id 1 local 192.0.2.$n dev $P-v$n dstport 8472 nolearning
            $N link set flannel.1 mtu 1450; $N addr add 10.244.$n.0/32 dev flannel.1; $N link set flannel.1 up
            $N route add 10.244.$m.0/24 via 10.244.$m.0 dev flannel.1 onlink
            $N neigh replace 10.244.$m.0 lladdr 02:00:00:00:0$m:01 dev flannel.1 nud permanent
            bridge -n $P-n$n fdb replace 02:00:00:00:0$m:01 dev flannel.1 dst 192.0.2.$m self permanent
        done
        SRC=10.244.1.1; DST=10.244.2.1 ;;
    weft-udp)
        DEV=flannel0
        for n in 1 2; do
            m=$((3 - n))
            start_fwd $n --tun flannel0 --encap udp --local 192.0.2.$n --tun-addr 10.244.$n.0 --mtu 1472 \
                --peer 10.244.$m.0/24=192.0.2.$m
            N="ip -n $P-n$n"
            $N addr add 10.244.$n.0/32 dev flannel0; $N link set flannel0 mtu 1472 up
            $N route add 10.244.0.0/16 dev flannel0
        done
        SRC=10.244.1.1; DST=10.244.2.1 ;;
    weft-vxlan)
        DEV=flannel.1
        for n in 1 2; do
            m=$((3 - n))
            start_fwd $n --tun flannel.1 --encap vxlan --local 192.0.2.$n --mac 02:00:00:00:0$n:01 --mtu 1450 \
                --peer 10.244.$m.0/24=192.0.2.$m,02:00:00:00:0$m:01
            N="ip -n $P-n$n"
            $N addr add 10.244.$n.0/32 dev flannel.1; $N link set flannel.1 mtu 1450 up
            $N route add 10.244.$m.0/24 via 10.244.$m.0 dev flannel.1 onlink
        done
        SRC=10.244.1.1; DST=10.244.2.1 ;;
    wggo)
        # Distinct device names: wireguard-go's UAPI socket (/var/run/wireguard/<dev>.sock)
        # lives on the shared filesystem, not in the network namespace.
        for n in 1 2; do
            m=$((3 - n)); N="ip -n $P-n$n"; D=wgh$n
            ip netns exec $P-n$n env WG_PROCESS_FOREGROUND=1 wireguard-go -f $D >"$OUT/logs/wggo-$ROUND-n$n.log" 2>&1 &
            FWD_PIDS+=($!)
            for _ in $(seq 50); do $N link show $D >/dev/null 2>&1 && break; sleep 0.1; done
            ip netns exec $P-n$n wg set $D private-key "$OUT/wg$n.key" listen-port 51820 \
                peer "$(cat "$OUT/wg$m.pub")" allowed-ips 10.244.$m.0/24 endpoint 192.0.2.$m:51820
            $N addr add 10.244.$n.0/32 dev $D; $N link set $D mtu 1420 up
            $N route add 10.244.0.0/16 dev $D scope link
        done
        SRC=10.244.1.1; DST=10.244.2.1 ;;
    weft-wg)
        DEV=flannel-wg
        for n in 1 2; do
            m=$((3 - n))
            start_fwd $n --tun flannel-wg --encap wireguard --local 192.0.2.$n --key "$(cat "$OUT/wg$n.key")" --mtu 1420 \
                --peer 10.244.$m.0/24=192.0.2.$m,"$(cat "$OUT/wg$m.pub")"
            N="ip -n $P-n$n"
            $N addr add 10.244.$n.0/32 dev flannel-wg; $N link set flannel-wg mtu 1420 up
            $N route add 10.244.0.0/16 dev flannel-wg scope link
        done
        SRC=10.244.1.1; DST=10.244.2.1 ;;
    *) echo "unknown case $1" >&2; exit 1 ;;
    esac
    ip netns exec $P-n1 ping -c 1 -W 5 -I $SRC $DST >/dev/null || { echo "$1: no connectivity" >&2; return 1; }
}

run_test() { # test -> prints Gbit/s
    local par=1
    [ "$1" = tcp4 ] && par=4
    ip netns exec $P-n2 iperf3 -s -1 -B $DST >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    local json="$OUT/logs/$CASE-$1-$ROUND.json"
    ip netns exec $P-n1 iperf3 -c $DST -B $SRC -J -t "$DUR" -P $par >"$json" 2>/dev/null || true
    wait $srv 2>/dev/null || true
    python3 - "$json" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
    print("%.3f" % (d["end"]["sum_received"]["bits_per_second"] / 1e9))
except Exception:
    print("nan")
PY
}

printf "case\ttest\tround\tgbps\n" >"$OUT/results.tsv"
echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
for ROUND in $(seq "$REPS"); do
    for CASE in $CASES; do
        setup "$CASE"
        for T in $TESTS; do
            g=$(run_test "$T")
            printf "%s\t%s\t%s\t%s\n" "$CASE" "$T" "$ROUND" "$g" >>"$OUT/results.tsv"
            echo "round $ROUND $CASE $T: $g Gbit/s" >&2
        done
        teardown
    done
done

python3 - "$OUT/results.tsv" "$CASES" "$TESTS" <<'PY'
import csv, statistics, sys
rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
cases, tests = sys.argv[2].split(), sys.argv[3].split()
med = {}
for c in cases:
    for t in tests:
        v = [float(r["gbps"]) for r in rows if r["case"] == c and r["test"] == t and r["gbps"] != "nan"]
        med[c, t] = (statistics.median(v), min(v), max(v), len(v)) if v else None
print("%-11s %-5s %9s %15s %5s %9s %9s %9s" % ("case", "test", "median", "min-max", "n", "/kvxlan", "/veth", "/wggo"))
for t in tests:
    for c in cases:
        m = med[c, t]
        if not m:
            print("%-11s %-5s %9s" % (c, t, "n/a")); continue
        def ratio(ref):
            r = med.get((ref, t))
            return "%9.2f" % (m[0] / r[0]) if r and r[0] > 0 else "%9s" % "-"
        print("%-11s %-5s %9.2f %7.2f-%-7.2f %5d %s %s %s" % (c, t, m[0], m[1], m[2], m[3], ratio("kvxlan"), ratio("veth"), ratio("wggo")))
PY
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" >&2
echo "results: $OUT/results.tsv" >&2
