#!/usr/bin/env bash
# weft's fuzz targets (fuzz/, a cargo-fuzz crate outside the workspace).
#
#   scripts/fuzz.sh build                  build every target (what CI runs)
#   scripts/fuzz.sh run <target> <secs> [libFuzzer flags...]
#                                          fuzz one target for <secs> seconds
#   scripts/fuzz.sh list                   the targets
#   scripts/fuzz.sh replay                 replay every committed corpus (cargo test)
#   scripts/fuzz.sh execs                  total execs per target from past runs
#
# `run` reads the committed seeds in fuzz/corpus/<target> but writes what it
# learns to $FUZZ_WORK/corpus/<target> (never into the repo), crashes to
# $FUZZ_WORK/artifacts/<target>/, its log to $FUZZ_WORK/logs/, and appends
# "<target> <execs> <secs> <date>" to $FUZZ_WORK/execs.tsv. A crash input worth
# keeping is copied into fuzz/corpus/<target>/ by hand once fixed: the replay
# test (tests/fuzz_corpus.rs) then guards it.
#
# Only stable rustc is needed: targets build with `--sanitizer none` (the fuzzed
# code is safe Rust; the sanitizers would need nightly's -Z flags) and with
# debug assertions, so integer overflow panics too. cargo-fuzz is installed
# from crates.io when missing.
#
# Environment: CARGO_TARGET_DIR (default target/fuzz), FUZZ_WORK
# (default target/fuzz-work), FUZZ_SANITIZER (default none; `address` needs
# RUSTC_BOOTSTRAP=1 or nightly), FUZZ_NO_BUILD=1 (`run` uses the last build).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$ROOT/target/fuzz}"
FUZZ_WORK="${FUZZ_WORK:-$ROOT/target/fuzz-work}"
SANITIZER="${FUZZ_SANITIZER:-none}"
CARGO_FUZZ_VERSION=0.13.2

die() {
    echo "fuzz.sh: $*" >&2
    exit 2
}

targets() {
    sed -n 's/^name = "\(.*\)"$/\1/p' "$ROOT/fuzz/Cargo.toml" | grep -v '^weft-fuzz$'
}

ensure_cargo_fuzz() {
    if ! cargo fuzz --version >/dev/null 2>&1; then
        cargo install --locked cargo-fuzz --version "$CARGO_FUZZ_VERSION"
    fi
}

fuzz_flags=(--fuzz-dir "$ROOT/fuzz" --sanitizer "$SANITIZER" --debug-assertions)

# Packet targets need room for TCP super-packets and GRO batches.
max_len() {
    case "$1" in
    vxlan_decap | flannel_udp_decap | gro | tun_tx | ipip_decap | wg_input) echo 20000 ;;
    *) echo 8192 ;;
    esac
}

cmd="${1:-}"
case "$cmd" in
build)
    ensure_cargo_fuzz
    cd "$ROOT"
    start=$SECONDS
    cargo fuzz build "${fuzz_flags[@]}"
    echo "fuzz.sh: built $(targets | wc -l) targets in $((SECONDS - start)) s"
    ;;
run)
    target="${2:-}"
    secs="${3:-}"
    [[ -n "$target" && "$secs" =~ ^[0-9]+$ ]] || die "usage: fuzz.sh run <target> <secs> [libFuzzer flags...]"
    targets | grep -qx "$target" || die "unknown target $target (see: fuzz.sh list)"
    shift 3
    ensure_cargo_fuzz
    mkdir -p "$FUZZ_WORK/corpus/$target" "$FUZZ_WORK/artifacts/$target" "$FUZZ_WORK/logs"
    log="$FUZZ_WORK/logs/$target-$(date +%Y%m%dT%H%M%S).log"
    cd "$ROOT"
    # New inputs go to the first directory only: the committed seeds stay as they are.
    dirs=("$FUZZ_WORK/corpus/$target" "$ROOT/fuzz/corpus/$target")
    # FUZZ_NO_BUILD=1 runs the binary of the last build (sources being edited
    # meanwhile do not trigger a rebuild).
    if [[ "${FUZZ_NO_BUILD:-0}" == 1 ]]; then
        runner=("$CARGO_TARGET_DIR/x86_64-unknown-linux-gnu/release/$target" "${dirs[@]}")
    else
        runner=(cargo fuzz run "${fuzz_flags[@]}" "$target" "${dirs[@]}" --)
    fi
    set +e
    "${runner[@]}" \
        -max_total_time="$secs" -max_len="$(max_len "$target")" -print_final_stats=1 \
        -artifact_prefix="$FUZZ_WORK/artifacts/$target/" "$@" 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    set -e
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    took=$(sed -n 's/^Done [0-9]* runs in \([0-9]*\) second.*/\1/p' "$log" | tail -1)
    printf '%s\t%s\t%s\t%s\t%s\n' "$target" "${execs:-0}" "${took:-$secs}" "$(date -Is)" "rc=$rc" >>"$FUZZ_WORK/execs.tsv"
    echo "fuzz.sh: $target: ${execs:-?} execs, exit $rc, log $log"
    exit "$rc"
    ;;
list)
    targets
    ;;
replay)
    cd "$ROOT"
    CARGO_TARGET_DIR="${REPLAY_TARGET_DIR:-$ROOT/target}" cargo test -p weft-tests --test fuzz_corpus
    ;;
execs)
    [[ -f "$FUZZ_WORK/execs.tsv" ]] || die "no runs recorded in $FUZZ_WORK/execs.tsv"
    awk -F'\t' '{e[$1]+=$2; s[$1]+=$3} END {for (t in e) printf "%-20s %12d execs %8d s\n", t, e[t], s[t]}' \
        "$FUZZ_WORK/execs.tsv" | sort
    ;;
*)
    die "usage: fuzz.sh build | run <target> <secs> [flags] | list | replay | execs"
    ;;
esac
