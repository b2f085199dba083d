#!/usr/bin/env bash
# TUN-to-TUN A-B of weft's own TUN module against tun-rs (README.md beside
# this file). Runs own and tunrs interleaved (the order alternates by round)
# in every offload mode, then prints medians and min-max per case.
#
#   sudo benches/tun_ab/run.sh                      # 5 rounds x 5 s, offload on and off
#   ROUNDS=7 SECS=10 MODES=on MTU=9000 sudo -E benches/tun_ab/run.sh
#
# Before each run it waits while /tmp/BENCH_QUIET exists (another harness is
# measuring), and while others keep the machine busy (more than QUIET_CORES
# cores over 2 s; at most QUIET_TRIES checks, 7 s each). Makes two
# namespaces tunab-$$-a/-b, removed on exit.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
SECS=${SECS:-5}
MODES=${MODES:-"on off"}
MTU=${MTU:-1500}
QUIET_CORES=${QUIET_CORES:-0.3}
QUIET_TRIES=${QUIET_TRIES:-30}
here=$(cd "$(dirname "$0")" && pwd)
out=${OUT:-$(mktemp /tmp/tun_ab.XXXXXX)}

cargo build --release --quiet --manifest-path "$here/Cargo.toml"
bin=$here/target/release/tun_ab

A=tunab-$$-a
B=tunab-$$-b
cleanup() {
    for ns in "$A" "$B"; do
        # iperf3 left behind by an interrupted run (only ours live there).
        ip netns pids "$ns" 2>/dev/null | xargs -r kill 2>/dev/null || true
        ip netns del "$ns" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'exit 130' INT TERM
ip netns add "$A"
ip netns add "$B"

# Busy cores of the whole machine over 2 s (/proc/stat).
busy_cores() {
    local a b
    a=$(head -1 /proc/stat)
    sleep 2
    b=$(head -1 /proc/stat)
    awk -v a="$a" -v b="$b" -v hz="$(getconf CLK_TCK)" 'BEGIN {
        split(a, x); split(b, y)
        s = 0; split("2 3 4 7 8 9", f, " ")  # user nice system irq softirq steal
        for (i in f) s += y[f[i]] - x[f[i]]
        printf "%.2f", s / hz / 2 }'
}

# Sets $busy; gives up waiting after QUIET_TRIES checks (the run records
# $busy, so a run on a busy machine shows as one).
wait_quiet() {
    local n=0
    while [ -e /tmp/BENCH_QUIET ]; do
        echo "# /tmp/BENCH_QUIET exists: waiting" >&2
        sleep 10
    done
    while :; do
        busy=$(busy_cores)
        awk -v b="$busy" -v q="$QUIET_CORES" 'BEGIN { exit !(b <= q) }' && break
        n=$((n + 1))
        [ "$n" -ge "$QUIET_TRIES" ] && break
        echo "# others busy ($busy cores, load $(cut -d' ' -f1-3 /proc/loadavg)): waiting" >&2
        sleep 5
    done
}

echo "# $(date -u +%FT%TZ) $(uname -r), $(nproc) CPUs, ${ROUNDS} rounds x ${SECS} s, MTU ${MTU}; raw: $out" | tee -a "$out"
for r in $(seq 1 "$ROUNDS"); do
    order="own tunrs"
    [ $((r % 2)) -eq 0 ] && order="tunrs own"
    for mode in $MODES; do
        for impl in $order; do
            wait_quiet
            line=$("$bin" "$impl" --ns-a "$A" --ns-b "$B" --offload "$mode" --secs "$SECS" --mtu "$MTU")
            echo "round=$r $line idle_busy=$busy load1=$(cut -d' ' -f1 /proc/loadavg)" | tee -a "$out"
        done
    done
done

python3 - "$out" <<'EOF'
import statistics, sys
runs = [dict(kv.split("=", 1) for kv in l.split() if "=" in kv)
        for l in open(sys.argv[1]) if l.startswith("round=")]
def cell(rs, k):
    v = sorted(float(r[k]) for r in rs)
    return statistics.median(v), f"{statistics.median(v):.3f} [{v[0]:.3f}-{v[-1]:.3f}]"
keys = ["gbps", "fwd_cores_per_gbps", "fwd_user_cores_per_gbps", "machine_cores_per_gbps"]
print("\n| offload | impl | runs | Gbit/s | forwarder cores/Gbit/s | of which user | machine cores/Gbit/s |")
print("|---|---|---|---|---|---|---|")
for mode in dict.fromkeys(r["offload"] for r in runs):
    med = {}
    for impl in ("own", "tunrs"):
        rs = [r for r in runs if r["offload"] == mode and r["impl"] == impl]
        cells = [cell(rs, k) for k in keys]
        med[impl] = [c[0] for c in cells]
        print(f"| {mode} | {impl} | {len(rs)} | " + " | ".join(c[1] for c in cells) + " |")
    print(f"| {mode} | tunrs/own | | " + " | ".join(f"{t / o:.2f}" for t, o in zip(med["tunrs"], med["own"])) + " |")
loads = sorted(float(r["load1"]) for r in runs)
print(f"\nload1 after runs: {loads[0]}-{loads[-1]}; idle busy cores before runs: "
      f"{min(float(r['idle_busy']) for r in runs)}-{max(float(r['idle_busy']) for r in runs)}")
EOF
