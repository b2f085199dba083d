#!/bin/sh
# apply.sh LAYOUT setup|check: runs the layout's `setup` or `check` commands inside the image root
# (scripts/image.sh: chroot ROOT /bin/sh; deploy/Dockerfile: a RUN step). POSIX sh (busybox, dash).
# Exits non-zero naming the first failing command.
set -eu
layout=$1 want=$2
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH
n=0
while IFS= read -r line; do
  line=${line%%#*}
  set -- $line
  [ $# -gt 0 ] || continue
  kind=$1; shift
  [ "$kind" = "$want" ] || continue
  n=$((n + 1))
  if ! "$@" >/dev/null 2>&1; then
    echo "image $want failed: $*" >&2
    "$@" >&2 || true
    exit 1
  fi
done < "$layout"
echo "image $want: $n command(s) ok"
