#!/usr/bin/env bash
# Proves that scripts/deps.sh alone takes a bare Debian root to a full build,
# so a package that only this machine happens to have (libprotobuf-dev, which
# left the README failing on new machines while CI stayed green) fails here.
#
#   sudo scripts/fresh-machine-check.sh
#
# 1. mmdebstrap makes a throwaway Debian root (the host's release and mirrors)
#    holding minbase plus what every machine of this kind is built with and
#    weft does not install: build-essential, ca-certificates, curl, git.
# 2. In a private mount namespace (every mount vanishes with it) the checkout
#    is bound read-only at /src and the machine's Rust toolchain (~/.cargo,
#    ~/.rustup: not a Debian package, so not ours to install) at its own path.
# 3. Inside: scripts/deps.sh installs (it runs apt-get update itself), then
#    `cargo build --locked --workspace --bins` (the demo's build) in a fresh
#    target dir, then scripts/tools/build-cnitool.sh into a fresh tool cache
#    (the test tools' apt source + dpkg -x path). kube-apiserver's build uses
#    the same steps but takes ~15 min, so it is not repeated here.
# Services are never started in the root (policy-rc.d), nothing is installed
# on the host (but mmdebstrap itself), and the root is removed on any exit.
# Takes 4-6 min on 2 cores, most of it downloads and the build.
set -euo pipefail
cd "$(dirname "$0")/.."
SRC=$PWD
[[ $(id -u) -eq 0 ]] || { echo "fresh-machine-check: run as root (mmdebstrap, chroot)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || {
  apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null || {
    apt-get update -qq && apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null; }
}
. /etc/os-release
SUITE=${VERSION_CODENAME:?no VERSION_CODENAME in /etc/os-release}
# The host's own apt sources (deb822 or one-line form), so the root sees what
# a new machine's apt-get sees.
mirrors=()
if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
  while read -r uri suites; do
    for s in $suites; do mirrors+=("deb $uri $s main"); done
  done < <(awk '/^URIs:/{u=$2} /^Suites:/{$1=""; print u, $0}' /etc/apt/sources.list.d/debian.sources)
fi
[[ ${#mirrors[@]} -gt 0 ]] || mapfile -t mirrors < <(grep -h '^deb ' /etc/apt/sources.list 2>/dev/null)
[[ ${#mirrors[@]} -gt 0 ]] || { echo "fresh-machine-check: no apt sources found on the host" >&2; exit 1; }

ROOT=$(mktemp -d /var/tmp/weft-fresh.XXXXXX)
cleanup() {
  # Mounts live only in the unshared namespace, so nothing of the checkout or
  # the toolchain can be under $ROOT any more; refuse to delete if one is.
  if findmnt -rn -o TARGET | grep -q "^$ROOT"; then
    echo "fresh-machine-check: mounts left under $ROOT, not removing it" >&2; return
  fi
  rm -rf "$ROOT"
}
trap cleanup EXIT
t0=$(date +%s)
echo "==> fresh-machine-check: bare $SUITE root in $ROOT" >&2
mmdebstrap --quiet --variant=minbase --include=build-essential,ca-certificates,curl,git \
  --customize-hook='printf "#!/bin/sh\nexit 101\n" > "$1/usr/sbin/policy-rc.d"; chmod 0755 "$1/usr/sbin/policy-rc.d"' \
  "$SUITE" "$ROOT" "${mirrors[@]}"
t1=$(date +%s)

# The commands that run inside the root, after the mounts.
inner='set -euo pipefail
cd /src
echo "==> scripts/deps.sh" >&2
scripts/deps.sh
echo "==> cargo build --locked --workspace --bins" >&2
CARGO_TARGET_DIR=/tmp/target CARGO_INCREMENTAL=0 cargo build --quiet --locked --workspace --bins
ls -l /tmp/target/debug/weftd /tmp/target/debug/weft /tmp/target/debug/flannel >&2
echo "==> scripts/tools/build-cnitool.sh" >&2
WEFT_TOOLS=/tmp/tools scripts/tools/build-cnitool.sh >/tmp/cnitool.log 2>&1 ||
  { rc=$?; echo "build-cnitool.sh failed (exit $rc):" >&2; cat /tmp/cnitool.log >&2; exit 1; }
usage=$(/tmp/tools/bin/cnitool 2>&1 || true)   # no arguments: usage, exit 1
grep -q "cnitool add" <<<"$usage" || { echo "cnitool does not run: $usage" >&2; exit 1; }'

mounts="set -euo pipefail
mount -t proc proc '$ROOT/proc'
mount --rbind /dev '$ROOT/dev'
mount -t sysfs sysfs '$ROOT/sys'
mount -t tmpfs tmpfs '$ROOT/tmp'
cp /etc/resolv.conf '$ROOT/etc/resolv.conf'
mkdir -p '$ROOT/src' '$ROOT$HOME/.cargo' '$ROOT$HOME/.rustup'
mount --bind '$SRC' '$ROOT/src' && mount -o remount,bind,ro '$ROOT/src'
mount --bind '$HOME/.cargo' '$ROOT$HOME/.cargo'
mount --bind '$HOME/.rustup' '$ROOT$HOME/.rustup'"
# The root sees a clean environment: no CI variables, no host PATH entries.
unshare --mount --propagation private bash -c "$mounts
exec chroot '$ROOT' /usr/bin/env -i HOME='$HOME' TERM=dumb LANG=C.UTF-8 \
  PATH='$HOME/.cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  DEBIAN_FRONTEND=noninteractive bash -c '$inner'"
t2=$(date +%s)
echo "fresh-machine-check: passed (root $((t1 - t0)) s, deps + build + cnitool $((t2 - t1)) s)" >&2
