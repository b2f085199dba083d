#!/bin/bash
# vm-run.sh -- run one command inside a throwaway Linux guest whose root is
# the HOST's root filesystem (read-only, with a tmpfs overlay for writes), on
# Debian's stock kernel with its full module tree, so kernel datapaths this
# machine's kernel lacks (ipip, wireguard, xfrm/esp, dummy, ...) can be tried
# by hand. The test kit (tests/support/vm.rs) boots the same guests itself,
# with a command agent instead of one command.
#
#   scripts/tools/setup-vm.sh              # once: fetch + unpack Debian packages
#   vm-run.sh [opts] -- COMMAND [ARGS...]  # exit status = COMMAND's
#
# opts:
#   --accel auto|kvm|tcg  auto = kvm, except tcg when /dev/kvm is missing or
#                       is PVM (/sys/module/kvm_pvm): a stock kernel does not
#                       get through early boot under PVM
#   --name NAME         hostname, default vm
#   --mem MB            default 1024
#   --net p2p:LPORT:RPORT[:ADDR/PFX]   one NIC (eth0, eth1, ... in order) that
#                       is a point-to-point L2 link to the guest started with
#                       the ports swapped; frames travel as UDP on 127.0.0.1
#                       (qemu -netdev dgram); repeatable
#   --share DIR         host DIR mounted writable at the same path (bypasses
#                       the overlay; use it for results and barriers); repeatable
#   --timeout SEC       default 300; on expiry exit 124
#   --keep              keep the run dir (console.log = guest kernel log)
#   -v                  print boot-to-command time and run dir on stderr
# Env knobs: VMT_KARGS (extra guest kernel args), VMT_CPUFLAGS (appended to
# -cpu host for --accel kvm, e.g. ",-cx16").
# The guest starts COMMAND in the host's current directory (when visible), as
# root, under bash, stdin /dev/null; stdout+stderr stream to ours.
# Exit 125: the guest never ran the command (see console.log).
# Env: VMT_HOME (default ${WEFT_TOOLS:-$HOME/.cache/weft-tools}/vm, made by
# setup-vm.sh) holds the unpacked packages; run dirs go to $VMT_HOME/run.
# Inside the guest: $VMT_RUN (run dir, writable), $VMT_NAME.
# Adapted from shared/recipes/vm/vm-run.sh (qemu only).
set -euo pipefail
VMT_HOME=${VMT_HOME:-${WEFT_TOOLS:-$HOME/.cache/weft-tools}/vm}
H=$VMT_HOME
die() { echo "vm-run: $*" >&2; exit 125; }

accel=auto name=vm mem="" timeout=300 keep=0 verbose=0
nets=() shares=()
while [ $# -gt 0 ]; do
  case $1 in
    --setup) exec "$(dirname "${BASH_SOURCE[0]}")/../setup-vm.sh" ;;
    --accel) accel=$2; shift 2 ;;
    --name) name=$2; shift 2 ;;
    --mem) mem=$2; shift 2 ;;
    --net) nets+=("$2"); shift 2 ;;
    --share) shares+=("$(realpath "$2")"); shift 2 ;;
    --timeout) timeout=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    -v) verbose=1; shift ;;
    --) shift; break ;;
    *) die "unknown option $1 (see the header of $0)" ;;
  esac
done
[ $# -gt 0 ] || die "no command given"
[ -f "$H/initramfs.gz" ] || die "run scripts/tools/setup-vm.sh first"

RUN=$(mktemp -d "$H/run/$name.XXXXXX" 2>/dev/null || { mkdir -p "$H/run"; mktemp -d "$H/run/$name.XXXXXX"; })
pid=""
cleanup() {
  if [ -n "$pid" ]; then pkill -KILL -P "$pid" 2>/dev/null; kill -KILL "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; fi
  [ $keep = 1 ] || rm -rf "$RUN"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# the command, run by bash in the guest
{ printf 'cd %q 2>/dev/null || cd /\n' "$PWD"; printf 'exec'; printf ' %q' "$@"; printf '\n'; } > "$RUN/cmd"
# host mounts other than the ones the guest replaces: hidden in the guest
findmnt -rn -o TARGET | grep -v -E '^/$|^/(proc|sys|dev|run|tmp)(/|$)' | sort -u > "$RUN/hide" || true
printf '%s\n' "${shares[@]}" | grep . > "$RUN/shares" || true
: > "$RUN/net"

out=/dev/ttyS1
cat > "$RUN/stage2.sh" <<EOF
#!/bin/sh
# PID 1 in the guest's final root
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TERM=dumb
export VMT_RUN='$RUN' VMT_NAME='$name'
hostname '$name'; ip link set lo up
while read dev addr; do ip link set "\$dev" up; [ -z "\$addr" ] || ip addr add "\$addr" dev "\$dev"; done < '$RUN/net'
stty -F $out raw -echo 2>/dev/null
echo "vmt: boot-to-command \$(cut -d' ' -f1 /proc/uptime)s" > /dev/console
sh=/bin/bash; [ -x \$sh ] || sh=/bin/sh
\$sh '$RUN/cmd' </dev/null >$out 2>&1
echo \$? > '$RUN/rc'
sync; echo o > /proc/sysrq-trigger; sleep 30
EOF

i=0; netargs=()
for n in "${nets[@]}"; do
  IFS=: read -r kind lp rp addr <<<"$n"
  [ "$kind" = p2p ] || die "--net $n: only p2p:LPORT:RPORT[:ADDR] is supported"
  mac=$(printf '52:54:00:%02x:%02x:%02x' $i $((lp >> 8 & 255)) $((lp & 255)))
  echo "eth$i $addr" >> "$RUN/net"
  netargs+=(-netdev "dgram,id=n$i,local.type=inet,local.host=127.0.0.1,local.port=$lp,remote.type=inet,remote.host=127.0.0.1,remote.port=$rp"
            -device "virtio-net-pci,netdev=n$i,mac=$mac,romfile=")
  i=$((i + 1))
done

QEMU=$(command -v qemu-system-x86_64 || echo "$H/qemu/usr/bin/qemu-system-x86_64")
export LD_LIBRARY_PATH="$H/qemu/usr/lib/x86_64-linux-gnu:$H/qemu/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ $accel = auto ]; then
  if [ -w /dev/kvm ] && [ ! -e /sys/module/kvm_pvm ]; then accel=kvm; else accel=tcg; fi
fi
if [ $accel = kvm ]; then acc=(-accel kvm -cpu "host${VMT_CPUFLAGS:-}"); else acc=(-accel tcg -cpu max); fi
shareargs=(); i=0
for s in "${shares[@]}"; do shareargs+=(-virtfs "local,path=$s,mount_tag=share$i,security_model=none"); i=$((i + 1)); done
timeout -k 5 "$timeout" "$QEMU" -L "$H/qemu/usr/share/qemu" -L "$H/qemu/usr/share/seabios" \
  "${acc[@]}" -smp 1 -m "${mem:-1024}" -display none -nodefaults -no-user-config -no-reboot \
  -kernel "$H/kernel/vmlinux" -initrd "$H/initramfs.gz" \
  -append "console=ttyS0 ${VMT_KARGS:-} panic=-1 cryptomgr.notests=1 vmt_run=$RUN vmt_mods=$H/kernel" \
  -virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap" \
  -virtfs "local,path=$RUN,mount_tag=vmtrun,security_model=none" "${shareargs[@]}" "${netargs[@]}" \
  -serial "file:$RUN/console.log" -chardev stdio,id=out,signal=off -serial chardev:out \
  </dev/null 2>"$RUN/qemu.err" &
pid=$!
set +e
{ wait $pid; } 2>/dev/null; qrc=$?; pid=""
set -e
[ $verbose = 1 ] && echo "vm-run: $name qemu/$accel: $(grep -ao 'vmt: boot-to-command [0-9.]*s' "$RUN/console.log" | head -1), run dir $RUN" >&2
if [ -s "$RUN/rc" ]; then exit "$(cat "$RUN/rc")"; fi
case $qrc in 124|137) echo "vm-run: $name: timed out after ${timeout}s" >&2; exit 124 ;; esac
echo "vm-run: $name: guest ended without running the command (exit $qrc); console tail:" >&2
tail -n 20 "$RUN/console.log" >&2 || true; cat "$RUN/qemu.err" 2>/dev/null | tail -n 5 >&2 || true
exit 125
