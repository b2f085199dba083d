#!/usr/bin/env bash
# Throughput harness (root): two nodes in network namespaces joined by one
# veth (the underlay, 192.0.2.1/.2), one pod per node wired by weft's CNI
# plugin (flannel delegation: bridge cni0 + host-local, MTU from subnet.env),
# and iperf3 pod to pod for every case:
#
#   veth          node to node over the underlay, no overlay (the physical limit)
#   kvxlan        kernel vxlan programmed by hand exactly as flannel's vxlan backend does
#   wggo          wireguard-go + wg (Debian), flannel's wireguard layout
#   wggo-new      the same with the wireguard-go binary $WGGO_NEW (a newer build, made apart; never committed)
#   weft-udp      weftd, backend udp (userspace engine)
#   weft-vxlan    weftd, backend vxlan, --dataplane=userspace
#   weft-vxlan-tap  the same with --tunnel-gso=on (issue 32, experimental): TCP
#                 super-packets written whole to a TAP with UDP-tunnel GSO, the
#                 kernel segments them; the uplinks' tx-udp_tnl-segmentation off and
#                 GRO on, as a NIC without the offload (TAP_UPLINK_TNL_GSO=1 leaves
#                 the veth as it is: it carries the unsegmented skb to the peer)
#   weft-udp-tap  weft-udp with --tunnel-gso=on on both nodes (flannel-UDP
#                 super-packets through the TAP; uplinks as for weft-vxlan-tap)
#   weft-kvxlan   weftd, backend vxlan, --dataplane=kernel
#   weft-wg       weftd, backend wireguard, --dataplane=userspace
#   weft-ipip     weftd, backend ipip, --dataplane=userspace
#   weft-hostgw   weftd, backend host-gw (kernel routes)
#
# Tests: tcp1 / tcp4 (iperf3 TCP, 1 and 4 streams, Gbit/s) and udp64 (64-byte
# UDP flood, delivered kpps); latency (sockperf ping-pong, 64-byte messages,
# UDP then TCP, one-way p50/p99/p99.9 in us): rr-idle, rr-busy (beside a fixed
# background load: one `nice -n 19` shell busy loop per node, two in all, one
# per vCPU here, as other pods using a node's CPU) and rr-bulk (beside one
# iperf3 TCP stream between the same pods); idle: no traffic, the daemons' CPU
# over DUR seconds (% of a core per node); gaps (weft cases only): pod 1 pings pod 2
# every 10 ms while node 2 changes path or restarts, one row per event with the
# longest gap between replies (ms) and the pings lost: gap-k2u / gap-u2k (a live
# switch with `weft dataplane set`, vxlan only: from the case's path to the other
# and back), gap-term (SIGTERM, then weftd started again at once) and gap-kill
# (SIGKILL, then the same), on the case's path. Every round runs every case once (rounds are
# interleaved, the case order rotates each round); REPS rounds. Per test the
# harness records machine CPU (/proc/stat) and the forwarding daemons' CPU
# (/proc/PID/stat of weftd or wireguard-go, both nodes), TCP retransmits and
# the nodes' UdpRcvbufErrors (/proc/net/snmp). At the end it prints medians,
# min-max, ratios to kernel vxlan and to veth, CPU per Gbit/s, and draws
# $OUT/throughput.png (python3-matplotlib).
#
#   sudo benches/harness/throughput.sh                       # REPS=3 DUR=10, builds release binaries
#   REPS=1 DUR=3 CASES="kvxlan weft-vxlan" TESTS=tcp1 sudo -E benches/harness/throughput.sh
#
# A-B: a case name with a suffix, weft-udp@new, runs that case with the
# binaries in $BIN_new (BIN_new=/tmp/new CASES="kvxlan weft-udp weft-udp@new").
#
# Env: REPS, DUR, CASES, TESTS (tcp1 tcp4 udp64 rr-idle rr-busy rr-bulk idle gaps), OUT (results directory,
# default a new /tmp/weft-throughput.*), BIN (directory with weftd, flannel and weft;
# default $CARGO_TARGET_DIR/release, built with cargo unless NO_BUILD=1),
# WEFTD_ARGS (extra weftd flags for every weft case), RR_TRACE=1 (rr tests:
# a 1 s tracefs capture per ping-pong and rrtrace.py's per-hop breakdown of it
# in $OUT/logs/*.wakeups), PYTHON (default /usr/bin/python3). For weft cases the
# rr tests also print, and keep in $OUT/logs/*.workers, the engine workers'
# sleeps and empty rounds polled per round trip and their poll backoffs
# (`weft status` counters before and after, both nodes).
# HALTPOLL_NS=N (guests with the cpuidle-haltpoll driver): for the run, an
# idle vCPU polls up to N ns before it halts (the haltpoll module's
# guest_halt_poll_ns, restored on exit). Latency on an idle machine swings
# with how fast the host wakes a halted vCPU (kernel vxlan's idle p50 was
# 15 us one day, 60 us the next, here); 200000 makes wake-ups fast and
# the same every run (p50 10-13 us), 0 leaves them to the host.
set -euo pipefail

REPS=${REPS:-3}
DUR=${DUR:-10}
CASES=${CASES:-"veth kvxlan wggo weft-udp weft-vxlan weft-kvxlan weft-wg weft-ipip weft-hostgw"}
TESTS=${TESTS:-"tcp1 tcp4 udp64"}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
BIN=${BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release}
BIN0=$BIN
OUT=${OUT:-$(mktemp -d /tmp/weft-throughput.XXXXXX)}
WEFTD_ARGS=${WEFTD_ARGS:-}
P=wth
CNI_DIR=/usr/lib/cni
# Debian's python3 (python3-matplotlib draws the chart), not a pyenv/venv one first in PATH.
PY=${PYTHON:-$([ -x /usr/bin/python3 ] && echo /usr/bin/python3 || echo python3)}

[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 1; }
for t in iperf3 sockperf wireguard-go wg python3 ip bridge; do
    command -v $t >/dev/null || { echo "missing $t (scripts/deps.sh installs it)" >&2; exit 1; }
done
[ -x $CNI_DIR/bridge ] && [ -x $CNI_DIR/host-local ] || { echo "missing CNI plugins in $CNI_DIR (containernetworking-plugins)" >&2; exit 1; }
if [ -z "${NO_BUILD:-}" ]; then
    (cd "$ROOT" && cargo build --release -p weft-control -p weft-cni --bins) >&2
fi
for b in weftd flannel weft; do
    [ -x "$BIN/$b" ] || { echo "no $b in $BIN: cargo build --release -p weft-control -p weft-cni --bins" >&2; exit 1; }
done
# RR_TRACE writes a tracefs instance: mount tracefs where a fresh machine has not.
if [ -n "${RR_TRACE:-}" ] && [ ! -d /sys/kernel/tracing/instances ]; then
    mount -t tracefs tracefs /sys/kernel/tracing ||
        { echo "RR_TRACE=1 needs tracefs at /sys/kernel/tracing (CONFIG_FTRACE)" >&2; exit 1; }
fi

# One run at a time on a machine (the namespace prefix is fixed): wait for any other.
exec 9>/run/lock/weft-throughput.lock
flock 9
while ip netns list | grep -q "^$P-"; do sleep 5; done

mkdir -p "$OUT/logs"
for n in 1 2; do
    [ -s "$OUT/wg$n.key" ] || (umask 077; wg genkey >"$OUT/wg$n.key")
    wg pubkey <"$OUT/wg$n.key" >"$OUT/wg$n.pub"
done

HALTPOLL=/sys/module/haltpoll/parameters/guest_halt_poll_ns
HALTPOLL_WAS=
if [ -n "${HALTPOLL_NS:-}" ]; then
    [ -w $HALTPOLL ] || { echo "HALTPOLL_NS needs the cpuidle-haltpoll driver ($HALTPOLL)" >&2; exit 1; }
    HALTPOLL_WAS=$(cat $HALTPOLL)
    echo "$HALTPOLL_NS" >$HALTPOLL
fi

DAEMON_PIDS=()
teardown() {
    # weftd first, with SIGTERM so that it removes what it programmed.
    for p in "${DAEMON_PIDS[@]:-}"; do [ -n "$p" ] && kill -TERM "$p" 2>/dev/null || true; done
    for p in "${DAEMON_PIDS[@]:-}"; do [ -n "$p" ] && timeout 10 tail --pid="$p" -f /dev/null 2>/dev/null || true; done
    DAEMON_PIDS=()
    for ns in $P-p1 $P-p2 $P-n1 $P-n2; do ip netns pids $ns 2>/dev/null | xargs -r kill -9 2>/dev/null || true; done
    for ns in $P-p1 $P-p2 $P-n1 $P-n2; do ip netns del $ns 2>/dev/null || true; done
    rm -rf "$OUT/work"
}
trap 'teardown; [ -z "$HALTPOLL_WAS" ] || echo "$HALTPOLL_WAS" >$HALTPOLL' EXIT
trap 'exit 130' INT TERM

base() {
    teardown
    mkdir -p "$OUT/work"
    for ns in $P-n1 $P-n2 $P-p1 $P-p2; do ip netns add $ns; done
    ip link add $P-v1 netns $P-n1 type veth peer name $P-v2 netns $P-n2
    for n in 1 2; do
        local N="ip -n $P-n$n"
        $N link set lo up
        $N addr add 192.0.2.$n/24 dev $P-v$n
        $N link set $P-v$n up
        ip -n $P-p$n link set lo up
        mkdir -p "$OUT/work/n$n"
        ip netns exec $P-n$n sysctl -qw net.ipv4.ip_forward=1
    done
}

subnet_env() { # node subnet mtu: what flanneld writes, for the hand-built cases
    printf 'FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=%s\nFLANNEL_MTU=%s\nFLANNEL_IPMASQ=false\n' "$2" "$3" \
        >"$OUT/work/n$1/subnet.env"
}

add_pod() { # node -> sets POD_IP<node>
    local n=$1 d="$OUT/work/n$1" out
    local conf="{\"cniVersion\":\"1.0.0\",\"name\":\"cbr0\",\"type\":\"flannel\",\"subnetFile\":\"$d/subnet.env\",\"dataDir\":\"$d/cni-flannel\",\"ipam\":{\"dataDir\":\"$d/cni-ipam\"},\"delegate\":{\"hairpinMode\":true,\"isDefaultGateway\":true}}"
    out=$(echo "$conf" | ip netns exec $P-n$n env CNI_COMMAND=ADD CNI_CONTAINERID=${P}pod$n CNI_NETNS=/var/run/netns/$P-p$n \
        CNI_IFNAME=eth0 CNI_PATH="$BIN:$CNI_DIR" "$BIN/flannel") || { echo "CNI ADD on node $n failed: $out" >&2; return 1; }
    local ip
    ip=$(echo "$out" | "$PY" -c 'import json,sys; print(json.load(sys.stdin)["ips"][0]["address"].split("/")[0])') \
        || { echo "CNI ADD on node $n: no address in $out" >&2; return 1; }
    eval "POD_IP$n=$ip"
}

start_node() { # node: (re)starts node's weftd on $DATAPLANE, its pid in DAEMON_PIDS[node-1]
    ip netns exec $P-n$1 env WIREGUARD_KEY_FILE="$OUT/work/n$1/wgkey" RUST_LOG=info ${WEFTD_ENV:-} "$BIN/weftd" \
        --store=embedded --store-path="$OUT/work/store" --net-config-path="$OUT/work/net-conf.json" \
        --subnet-file="$OUT/work/n$1/subnet.env" --iface=$P-v$1 --traffic-manager=none \
        --dataplane="$DATAPLANE" $WEFTD_ARGS >>"$OUT/logs/weftd-$CASE-$ROUND-n$1.log" 2>&1 &
    DAEMON_PIDS[$(($1 - 1))]=$!
}

start_weftd() { # backend-json dataplane
    local conf="{\"Network\":\"10.244.0.0/16\",\"Backend\":$1}"
    echo "$conf" >"$OUT/work/net-conf.json"
    DATAPLANE=$2
    for n in 1 2; do start_node $n; done
    for n in 1 2; do
        for _ in $(seq 300); do
            [ -s "$OUT/work/n$n/subnet.env" ] && break
            kill -0 "${DAEMON_PIDS[$((n - 1))]}" 2>/dev/null || break
            sleep 0.1
        done
        [ -s "$OUT/work/n$n/subnet.env" ] || { echo "$CASE: weftd on node $n did not start:" >&2; tail -5 "$OUT/logs/weftd-$CASE-$ROUND-n$n.log" >&2; return 1; }
    done
}

tap_forward() { # weft-vxlan-tap, weft-udp-tap: the nodes forward (a Kubernetes node does; weftd checks, never sets it)
    for n in 1 2; do ip netns exec $P-n$n sysctl -qw net.ipv4.ip_forward=1; done
}

tap_uplinks() { # weft-vxlan-tap, weft-udp-tap, after weftd took the TAP (--tunnel-gso=on checks the offload at start)
    # As across a NIC without UDP-tunnel segmentation: the sender's stack
    # cuts, the receiver's GRO (on for the veth: NAPI) coalesces again.
    [ "${TAP_UPLINK_TNL_GSO:-0}" = 1 ] && return 0
    for n in 1 2; do
        ip netns exec $P-n$n ethtool -K $P-v$n \
            tx-udp_tnl-segmentation off tx-udp_tnl-csum-segmentation off gro on >/dev/null
    done
}

setup() { # case[@variant]
    base
    WEFTD_ENV=
    SRC_NS=$P-p1; DST_NS=$P-p2
    BIN=$BIN0
    if [[ $1 == *@* ]]; then
        local v="BIN_${1#*@}"
        BIN=${!v:?"case $1 needs \$$v"}
    fi
    case ${1%@*} in
    veth) SRC_NS=$P-n1; DST_NS=$P-n2; POD_IP1=192.0.2.1; POD_IP2=192.0.2.2; return 0 ;;
    kvxlan)
        for n in 1 2; do
            m=$((3 - n)); N="ip -n $P-n$n"
            $N link add flannel.1 address 02:00:00:00:0$n:01 type vxlan id 1 local 192.0.2.$n dev $P-v$n dstport 8472 nolearning
            $N link set flannel.1 mtu 1450; $N addr add 10.244.$n.0/32 dev flannel.1; $N link set flannel.1 up
            $N route add 10.244.$m.0/24 via 10.244.$m.0 dev flannel.1 onlink
            $N neigh replace 10.244.$m.0 lladdr 02:00:00:00:0$m:01 dev flannel.1 nud permanent
            bridge -n $P-n$n fdb replace 02:00:00:00:0$m:01 dev flannel.1 dst 192.0.2.$m self permanent
            subnet_env $n 10.244.$n.1/24 1450
        done ;;
    wggo|wggo-new)
        # wggo-new: a newer wireguard-go than Debian's (WGGO_NEW, built apart; never committed).
        WG=wireguard-go; [ "${1%@*}" = wggo-new ] && WG=${WGGO_NEW:?"wggo-new needs WGGO_NEW=<a wireguard-go binary>"}
        # Distinct device names: wireguard-go's UAPI socket (/var/run/wireguard/<dev>.sock)
        # lives on the shared filesystem, not in the network namespace.
        for n in 1 2; do
            m=$((3 - n)); N="ip -n $P-n$n"; D=wgh$n
            ip netns exec $P-n$n env WG_PROCESS_FOREGROUND=1 LOG_LEVEL=error $WG -f $D >"$OUT/logs/${1%@*}-$ROUND-n$n.log" 2>&1 &
            DAEMON_PIDS+=($!)
            for _ in $(seq 50); do $N link show $D >/dev/null 2>&1 && break; sleep 0.1; done
            ip netns exec $P-n$n wg set $D private-key "$OUT/wg$n.key" listen-port 51820 \
                peer "$(cat "$OUT/wg$m.pub")" allowed-ips 10.244.$m.0/24 endpoint 192.0.2.$m:51820
            $N addr add 10.244.$n.0/32 dev $D; $N link set $D mtu 1420 up
            $N route add 10.244.$m.0/24 dev $D scope link
            subnet_env $n 10.244.$n.1/24 1420
        done ;;
    weft-udp) start_weftd '{"Type":"udp"}' userspace ;;
    weft-vxlan) start_weftd '{"Type":"vxlan"}' userspace ;;
    weft-vxlan-tap) WEFTD_ENV=WEFT_TUNNEL_GSO=on; tap_forward; start_weftd '{"Type":"vxlan"}' userspace && tap_uplinks ;;
    weft-udp-tap) WEFTD_ENV=WEFT_TUNNEL_GSO=on; tap_forward; start_weftd '{"Type":"udp"}' userspace && tap_uplinks ;;
    weft-kvxlan) start_weftd '{"Type":"vxlan"}' kernel ;;
    weft-wg) start_weftd '{"Type":"wireguard"}' userspace ;;
    weft-ipip) start_weftd '{"Type":"ipip"}' userspace ;;
    weft-hostgw) start_weftd '{"Type":"host-gw"}' auto ;;
    *) echo "unknown case $1" >&2; exit 1 ;;
    esac
    add_pod 1 && add_pod 2 || return 1
    # Peers are learned asynchronously: wait until the pods reach each other.
    for _ in $(seq 30); do
        ip netns exec $SRC_NS ping -c 1 -W 1 "$POD_IP2" >/dev/null 2>&1 && return 0
    done
    echo "$1: pod $POD_IP1 cannot reach pod $POD_IP2" >&2
    return 1
}

snap() { # prints: machine_busy_ticks machine_total_ticks daemon_ticks rcvbuf_errors
    local busy total d=0 r=0 p t
    read -r busy total < <(awk '/^cpu /{t=0; for(i=2;i<=NF;i++) t+=$i; print t-$5-$6, t}' /proc/stat)
    for p in "${DAEMON_PIDS[@]:-}"; do
        [ -n "$p" ] || continue
        # Threads of the process (utime+stime of the whole thread group are fields 14+15).
        t=$(awk '{sub(/.*\) /, ""); print $12 + $13}' /proc/"$p"/stat 2>/dev/null || echo 0)
        d=$((d + t))
    done
    for n in 1 2; do
        t=$(ip netns exec $P-n$n awk '/^Udp: [0-9]/{print $6}' /proc/net/snmp)
        r=$((r + t))
    done
    echo "$busy $total $d $r"
}

wctr() { # prints the weft workers' sleeps, empty rounds polled and poll backoffs, both nodes summed
    local n a=0 b=0 c=0 x y z
    for n in 1 2; do
        [ -S "$OUT/work/n$n/weft-status.sock" ] || continue
        read -r x y z < <("$BIN0/weft" status --subnet-file="$OUT/work/n$n/subnet.env" --json 2>/dev/null |
            "$PY" -c 'import json,sys
b = [d.get("batching") or {} for d in json.load(sys.stdin)["backend"]["devices"]]
print(*(sum(d.get(k, 0) for d in b) for k in ("sleeps", "poll_rounds", "poll_backoffs")))' ||
            echo 0 0 0)
        a=$((a + x)); b=$((b + y)); c=$((c + z))
    done
    echo "$a $b $c"
}

BURNERS=()
burn() { # start|stop: rr-busy's background load, one `nice -n 19` busy loop per node
    local n p
    if [ "$1" = start ]; then
        for n in 1 2; do
            ip netns exec $P-n$n nice -n 19 sh -c 'while :; do :; done' &
            BURNERS+=($!)
        done
    else
        for p in "${BURNERS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null && { wait "$p" 2>/dev/null || true; }; done
        BURNERS=()
    fi
}

row() { # file test s0 s1 t0 t1 -> appends one row to results.tsv and prints it
    "$PY" "$HERE/analyze.py" row "$1" "$CASE" "$2" "$ROUND" "$(nproc)" "$(getconf CLK_TCK)" "$5 $6" "$3" "$4" \
        "$(cut -d' ' -f1 /proc/loadavg)" >>"$OUT/results.tsv"
    tail -1 "$OUT/results.tsv" | awk -F'\t' '{printf "round %s %-15s %-12s %8s %s, machine %s cores, daemons %s cores, load %s\n", $3, $1, $2, $4, $5, $7, $8, $NF}' >&2
}

TR=/sys/kernel/tracing/instances/weft-rr
rr_trace() { # client-pid server-pid log: 1 s of scheduler and syscall events mid-test (RR_TRACE=1)
    local n t p
    mkdir -p $TR
    for e in sched/sched_waking sched/sched_switch raw_syscalls/sys_enter raw_syscalls/sys_exit; do
        [[ $e == raw* ]] && echo 'comm ~ "weft*" || comm == "sockperf"' >$TR/events/$e/filter
        echo 1 >$TR/events/$e/enable
    done
    { echo "$1 client"; echo "$2 server"
      for n in 1 2; do
          p=${DAEMON_PIDS[$((n - 1))]:-}
          [ -n "$p" ] && for t in /proc/$p/task/*; do echo "${t##*/} n$n"; done
      done; } >"$3.threads"
    sleep 1.5; echo >$TR/trace; echo 1 >$TR/tracing_on; sleep 1; echo 0 >$TR/tracing_on
    cp $TR/trace "$3.trace"
    echo 0 >$TR/events/enable
    "$PY" "$HERE/rrtrace.py" "$3.trace" "$3.threads" >"$3.wakeups" 2>&1 || true
}

wdelta() { # before after sockperf-log: the weft workers' idle counters per round trip, into log.workers
    local b a n
    read -r -a b <<<"$1"; read -r -a a <<<"$2"
    n=$(awk '/SentMessages=/{sub(/.*SentMessages=/, ""); print $1 + 0; exit}' "$3")
    [ "${n:-0}" -gt 0 ] && [ $((a[0] + a[1] + a[2])) -gt 0 ] || return 0
    awk -v n="$n" -v s=$((a[0] - b[0])) -v p=$((a[1] - b[1])) -v k=$((a[2] - b[2])) 'BEGIN {
        printf "workers, both nodes: %.2f sleeps and %.1f empty rounds polled per round trip; %d poll backoffs\n", s / n, p / n, k }' |
        tee "$3.workers" | sed 's/^/    /' >&2
}

run_rr() { # rr-idle|rr-busy|rr-bulk -> one row per protocol (rr-idle/udp, rr-idle/tcp)
    local su st srv= bulk= proto flag port log s0 s1 t0 t1 cl w0
    ip netns exec $DST_NS sockperf server -i "$POD_IP2" -p 11111 >/dev/null 2>&1 &
    su=$!
    ip netns exec $DST_NS sockperf server --tcp -i "$POD_IP2" -p 11112 >/dev/null 2>&1 &
    st=$!
    sleep 0.3
    [ "$1" = rr-busy ] && burn start
    if [ "$1" = rr-bulk ]; then
        ip netns exec $DST_NS iperf3 -s -1 -B "$POD_IP2" >/dev/null 2>&1 &
        srv=$!
        sleep 0.3
        ip netns exec $SRC_NS iperf3 -c "$POD_IP2" -B "$POD_IP1" -t $((2 * DUR + 10)) >"$OUT/logs/$CASE-$1-$ROUND-bulk.txt" 2>&1 &
        bulk=$!
        sleep 1
    fi
    for proto in udp tcp; do
        flag=; port=11111
        [ $proto = tcp ] && { flag=--tcp; port=11112; }
        log="$OUT/logs/$CASE-$1-$proto-$ROUND.txt"
        w0=$(wctr) # before the CPU snapshot: `weft status` and python are not the test's load
        s0=$(snap); t0=$(date +%s.%N)
        ip netns exec $SRC_NS sockperf ping-pong $flag -i "$POD_IP2" -p $port -m 64 -t "$DUR" >"$log" 2>&1 &
        cl=$!
        [ -n "${RR_TRACE:-}" ] && rr_trace $cl "$([ $proto = udp ] && echo $su || echo $st)" "$log"
        wait $cl || true
        s1=$(snap); t1=$(date +%s.%N)
        row "$log" "$1/$proto" "$s0" "$s1" "$t0" "$t1"
        wdelta "$w0" "$(wctr)" "$log"
    done
    for p in $bulk $srv $su $st; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    burn stop
}

gap_event() { # event: pings pod 1 -> pod 2 every 10 ms around one event on node 2; one gap-<event> row
    local log="$OUT/logs/$CASE-gap-$1-$ROUND.txt" ping env="$OUT/work/n2/subnet.env" p=${DAEMON_PIDS[1]}
    ip netns exec $SRC_NS ping -D -n -i 0.01 -W 1 "$POD_IP2" >"$log" 2>&1 &
    ping=$!
    sleep 1
    case $1 in
    k2u|u2k)
        "$BIN0/weft" dataplane set "$([ "$1" = k2u ] && echo userspace || echo kernel)" --subnet-file="$env" \
            >>"$log.cmd" 2>&1 || echo "$CASE: weft dataplane set failed ($1)" >&2 ;;
    term|kill)
        kill -"${1^^}" "$p" 2>/dev/null || true
        # Started again the moment it is gone, as a supervisor would (`tail --pid` polls once a second).
        for _ in $(seq 1000); do kill -0 "$p" 2>/dev/null || break; sleep 0.01; done
        start_node 2 ;;
    esac
    sleep 3
    kill -INT $ping 2>/dev/null || true
    wait $ping 2>/dev/null || true
    "$PY" "$HERE/analyze.py" gaprow "$log" "$CASE" "gap-$1" "$ROUND" "$(cut -d' ' -f1 /proc/loadavg)" >>"$OUT/results.tsv"
    tail -1 "$OUT/results.tsv" | awk -F'\t' '{printf "round %s %-15s %-12s longest gap %s ms, %s pings lost, load %s\n", $3, $1, $2, $4, $NF, $(NF-1)}' >&2
}

run_gaps() { # the case's events: a live switch away and back (vxlan), then SIGTERM and SIGKILL restarts
    case ${CASE%@*} in
    weft-kvxlan) gap_event k2u; gap_event u2k ;;
    weft-vxlan) gap_event u2k; gap_event k2u ;;
    weft-*) ;;
    *) return 0 ;; # not weft: nothing to switch or restart
    esac
    gap_event term
    gap_event kill
}

run_test() { # test -> appends one row (rr tests: two) to results.tsv
    case $1 in rr-*) run_rr "$1"; return ;; gaps) run_gaps; return ;; esac
    if [ "$1" = idle ]; then # no traffic: the daemons' CPU over DUR seconds
        local s0 s1 t0 t1
        sleep 2; s0=$(snap); t0=$(date +%s.%N); sleep "$DUR"; s1=$(snap); t1=$(date +%s.%N)
        row /dev/null idle "$s0" "$s1" "$t0" "$t1"
        return
    fi
    local args=(-t "$DUR")
    case $1 in
    tcp1) ;;
    tcp4) args+=(-P 4) ;;
    udp64) args+=(-u -b 0 -l 64) ;;
    *) echo "unknown test $1" >&2; exit 1 ;;
    esac
    ip netns exec $DST_NS iperf3 -s -1 -B "$POD_IP2" >/dev/null 2>&1 &
    local srv=$!
    sleep 0.3
    local json="$OUT/logs/$CASE-$1-$ROUND.json" s0 s1 t0 t1
    s0=$(snap); t0=$(date +%s.%N)
    ip netns exec $SRC_NS iperf3 -c "$POD_IP2" -B "$POD_IP1" -J "${args[@]}" >"$json" 2>/dev/null || true
    s1=$(snap); t1=$(date +%s.%N)
    wait $srv 2>/dev/null || true
    row "$json" "$1" "$s0" "$s1" "$t0" "$t1"
}

{
    echo "date: $(date -u +%FT%TZ)"
    echo "nproc: $(nproc)"
    echo "cpu: $(awk -F': ' '/model name/{print $2; exit}' /proc/cpuinfo)"
    echo "kernel: $(uname -r)"
    echo "load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
    echo "iperf3: $(iperf3 --version | head -1)"
    echo "sockperf: $(sockperf --version 2>&1 | head -1)"
    echo "rounds: $REPS, $DUR s per test"
    if [ -r $HALTPOLL ]; then echo "guest_halt_poll_ns: $(cat $HALTPOLL)"; fi
} | tee "$OUT/machine.txt" >&2
"$PY" "$HERE/analyze.py" header >"$OUT/results.tsv"
read -r -a case_list <<<"$CASES"
for ROUND in $(seq "$REPS"); do
    k=${#case_list[@]}
    for i in $(seq 0 $((k - 1))); do
        CASE=${case_list[$(((i + ROUND - 1) % k))]}
        if setup "$CASE"; then
            for T in $TESTS; do run_test "$T"; done
        else
            echo "round $ROUND $CASE: setup failed, skipped (logs in $OUT/logs)" >&2
        fi
        teardown
    done
done
echo "load average at end: $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUT/machine.txt" >&2

"$PY" "$HERE/analyze.py" summary "$OUT/results.tsv" "$CASES" "$TESTS" "$OUT/machine.txt" | tee "$OUT/summary.txt"
"$PY" "$HERE/analyze.py" chart "$OUT/results.tsv" "$CASES" "$TESTS" "$OUT/machine.txt" "$OUT/throughput.png" >&2 \
    || echo "no chart (python3-matplotlib missing?)" >&2
echo "results: $OUT/results.tsv, $OUT/summary.txt, $OUT/throughput.png" >&2
