#!/usr/bin/env bash
# Control-plane scale benchmark (root): N leases (default 5,000) in the store,
# then one weftd starts on it; prints the time until its peer table holds all
# N peers (host-gw: and the kernel holds all N routes) and weftd's peak RSS
# (VmHWM). Targets: <= 2 s and <= 64 MiB. Runs every STORE x BACKEND
# combination REPS times, each in a fresh network namespace (one veth,
# 192.0.2.1/24) with a fresh store (etcd on the namespace's loopback).
#
#   sudo benches/harness/scale.sh
#   N=1000 STORES=embedded BACKENDS="host-gw:auto" REPS=1 sudo -E benches/harness/scale.sh
#
# Env: N, REPS (default 3), STORES (embedded etcd), BACKENDS (type:dataplane,
# default "host-gw:auto vxlan:userspace vxlan:kernel"), OUT (results file,
# default /tmp/weft-scale.tsv), BIN (weftd and lease_bench; default
# $CARGO_TARGET_DIR/release, built with cargo unless NO_BUILD=1).
#
# MODE=churn (issue 33): N leases, then RATE lease changes per second (default
# 100) for SECS seconds (default 60) while `weft status` and /healthz are
# timed, each change's route is timed and the lease renewals' delays read
# (`lease_bench churn`); STORES defaults to etcd, BACKENDS to host-gw:auto.
# CHURN_SWITCH_SECS=K also switches the dataplane every K seconds (vxlan).
# BUILDS="before=DIR after=DIR" runs the weftd of each DIR in turn, one after
# the other within every round (interleaved: the machine's load hits them
# alike), all driven by $BIN's lease_bench:
#
#   MODE=churn BUILDS="before=/tmp/main/target/release after=target/release" REPS=3 \
#       NO_BUILD=1 sudo -E benches/harness/scale.sh
set -euo pipefail

MODE=${MODE:-scale}
if [ "$MODE" = churn ]; then
    STORES=${STORES:-etcd}
    BACKENDS=${BACKENDS:-host-gw:auto}
fi
RATE=${RATE:-100}
SECS=${SECS:-60}

N=${N:-5000}
REPS=${REPS:-3}
STORES=${STORES:-"embedded etcd"}
BACKENDS=${BACKENDS:-"host-gw:auto vxlan:userspace vxlan:kernel"}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
OUT=${OUT:-/tmp/weft-scale.tsv}
NS=wsc-$$

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
if [ -z "${NO_BUILD:-}" ]; then
    (cd "$ROOT" && cargo build --release -p weft-control --bins --example lease_bench) >&2
fi
for b in weftd examples/lease_bench; do
    [ -x "$BIN/$b" ] || { echo "no $b in $BIN: cargo build --release -p weft-control --bins --example lease_bench" >&2; exit 1; }
done
BUILDS=${BUILDS:-"this=$BIN"}
for b in $BUILDS; do
    [ -x "${b#*=}/weftd" ] || { echo "no weftd in ${b#*=} (BUILDS)" >&2; exit 1; }
done

cleanup() {
    ip netns pids $NS 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del $NS 2>/dev/null || true
}
fresh_ns() {
    cleanup
    ip netns add $NS
    ip -n $NS link set lo up
    ip -n $NS link add eth0 type veth peer name eth1
    ip -n $NS addr add 192.0.2.1/24 dev eth0
    ip -n $NS link set eth0 up
    ip -n $NS link set eth1 up
}
trap cleanup EXIT
trap 'exit 130' INT TERM

{
    echo "# date: $(date -u +%FT%TZ); nproc: $(nproc); cpu: $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo);" \
        "kernel: $(uname -r); load average: $(cut -d' ' -f1-3 /proc/loadavg)"
} | tee "$OUT" >&2
for r in $(seq "$REPS"); do
    for s in $STORES; do
        for b in $BACKENDS; do
            fresh_ns
            if [ "$MODE" = churn ]; then
                for build in $BUILDS; do
                    # Each build on a clean namespace: no routes left by the one before.
                    fresh_ns
                    if line=$(ip netns exec $NS "$BIN/examples/lease_bench" churn "$s" "$N" "${b%%:*}" "${b##*:}" "${build#*=}/weftd" eth0 "$RATE" "$SECS"); then
                        printf '%s\t%s\n' "$line" "build=${build%%=*}" | tee -a "$OUT"
                    else
                        echo "round $r $s $b ${build%%=*}: failed" >&2
                    fi
                done
            elif line=$(ip netns exec $NS "$BIN/examples/lease_bench" scale "$s" "$N" "${b%%:*}" "${b##*:}" "$BIN/weftd" eth0); then
                echo "$line" | tee -a "$OUT"
            else
                echo "round $r $s $b: failed" >&2
            fi
        done
    done
done
cleanup

if [ "$MODE" = churn ]; then
    python3 - "$OUT" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("churn\t"):
        continue
    f = line.rstrip("\n").split("\t")
    kv = dict(x.split("=", 1) for x in f[5:] if "=" in x)
    rows.setdefault((kv["build"], f[1], f[2], f[3], f[4]), []).append(kv)
keys = ["status_p50_ms", "status_p99_ms", "status_max_ms", "healthz_p99_ms", "healthz_max_ms",
        "route_p50_ms", "route_p99_ms", "route_max_ms", "renew_late_max_ms"]
if any("switch_max_ms" in r for runs in rows.values() for r in runs):
    keys += ["switch_p50_ms", "switch_max_ms"]
print("\n%-8s %-6s %-8s %-9s %6s " % ("build", "store", "backend", "dataplane", "leases")
      + " ".join("%14s" % k for k in keys) + "  (median of runs; goal: status/healthz p99 < 50 ms, route p99 < 1000 ms, no renewal late)")
for (build, store, backend, dp, n), runs in sorted(rows.items()):
    med = lambda k: statistics.median(float(r[k]) for r in runs)
    print("%-8s %-6s %-8s %-9s %6s " % (build, store, backend, dp, n)
          + " ".join("%14.1f" % med(k) for k in keys) + "  (%d runs)" % len(runs))
PY
    exit 0
fi

# Medians per combination.
python3 - "$OUT" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    if not line.startswith("scale\t"):
        continue
    f = line.rstrip("\n").split("\t")
    kv = dict(x.split("=", 1) for x in f[5:] if "=" in x)
    rows.setdefault((f[1], f[2], f[3], f[4]), []).append(kv)
print("\n%-9s %-8s %-10s %6s %9s %9s %9s %9s %10s  %s" % (
    "store", "backend", "dataplane", "leases", "lease_s", "peers_s", "routes_s", "done_s", "VmHWM_MiB", "target (<=2 s, <=64 MiB)"))
for (store, backend, dp, n), runs in rows.items():
    def med(k):
        v = [float(r[k]) for r in runs if r.get(k, "-") != "-"]
        return "%9.3f" % statistics.median(v) if v else "%9s" % "-"
    done = statistics.median(float(r["done_s"]) for r in runs)
    mib = statistics.median(float(r["vmhwm_mib"]) for r in runs)
    ok = "PASS" if done <= 2 and mib <= 64 else "FAIL"
    print("%-9s %-8s %-10s %6s %s %s %s %s %10.1f  %s (median of %d)" % (
        store, backend, dp, n, med("lease_s"), med("peers_s"), med("routes_s"), med("done_s"), mib, ok, len(runs)))
PY
