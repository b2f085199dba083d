#!/bin/bash
# Builds the CNI project's reference runtime client `cnitool` offline, from Debian packages only:
# Debian bookworm's golang-github-appc-cni 1.1.2 source (libcni 1.1.2 = CNI spec 1.0.0) with the
# Go 1.19 toolchain from Debian debs, unpacked into a private cache (nothing is installed system-wide,
# nothing under /etc/apt is changed: private deb/deb-src lists made from the machine's own mirror are used).
#
# Output: ${WEFT_TOOLS:-$HOME/.cache/weft-tools}/bin/cnitool
# Idempotent: exits at once when the binary exists. Safe to run concurrently (flock).
# Cost: ~20 s on 2 cores and ~80 MB of downloads the first time; afterwards only the downloaded
# .debs and the source tarball stay in the cache (~70 MB), the unpacked toolchain is removed.
# This is the cnitool part of ../../../shared/recipes/build-test-tools.sh, reduced to what cnitool needs.
set -euo pipefail
W=${WEFT_TOOLS:-$HOME/.cache/weft-tools}
OUT=$W/bin/cnitool
if [[ -x $OUT ]]; then echo "$OUT present"; exit 0; fi
mkdir -p "$W/bin"
# One builder at a time; a second caller waits and then finds the binary.
exec 9>"$W/.build-cnitool.lock"
flock 9
if [[ -x $OUT ]]; then echo "$OUT present"; exit 0; fi

B=$W/cnitool-build                       # private work dir (not shared with other recipes)
mkdir -p "$B/debs" "$B/root" "$B/src" "$B/apt/lists/partial" "$B/apt/cache/archives/partial"
MIRROR=$("$(dirname "$0")/debian-mirror.sh")
printf 'deb %s bookworm main\ndeb-src %s bookworm main\n' "$MIRROR" "$MIRROR" > "$B/apt/sources.list"
APTOPTS=(-o "Dir::Etc::sourcelist=$B/apt/sources.list" -o Dir::Etc::sourceparts=/nonexistent
         -o "Dir::State::Lists=$B/apt/lists" -o "Dir::Cache=$B/apt/cache" -o Debug::NoLocking=1)

# 1. Go 1.19 toolchain and libcni sources (GOPATH layout under /usr/share/gocode), unpacked
#    (private package lists, so the machine's own apt state is neither needed nor touched)
have() { ls "$@" >/dev/null 2>&1; }
cd "$B/debs"
if ! have golang-1.19-go_*.deb golang-1.19-src_*.deb golang-github-appc-cni-dev_*.deb ||
   ! have "$B/src"/golang-github-appc-cni_*.orig.tar.*; then
  apt-get "${APTOPTS[@]}" update
fi
have golang-1.19-go_*.deb golang-1.19-src_*.deb golang-github-appc-cni-dev_*.deb ||
  apt-get "${APTOPTS[@]}" download golang-1.19-go golang-1.19-src golang-github-appc-cni-dev
for d in *.deb; do dpkg -x "$d" "$B/root"; done

# 2. the source package: cnitool/ is in the orig tarball but not in the -dev binary package
cd "$B/src"
have golang-github-appc-cni_*.orig.tar.* || apt-get "${APTOPTS[@]}" source --download-only golang-github-appc-cni
rm -rf golang-github-appc-cni-*/
tar xf golang-github-appc-cni_*.orig.tar.*
SRC=$(ls -d golang-github-appc-cni-*/ | head -1)

# 3. build in GOPATH mode against Debian's libcni (module mode needs ginkgo/gomega from the network)
export GOROOT=$B/root/usr/lib/go-1.19 PATH=$B/root/usr/lib/go-1.19/bin:$PATH GOCACHE=$B/gocache \
       GOPROXY=off GOFLAGS= GO111MODULE=off CGO_ENABLED=0 GOPATH=$B/root/usr/share/gocode
( cd "$SRC/cnitool" && go build -o "$OUT.tmp" ./cnitool.go )
mv -f "$OUT.tmp" "$OUT"
rm -rf "$B/gocache" "$B/root" "$B/src"/golang-github-appc-cni-*/
echo "built $OUT"
