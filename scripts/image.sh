#!/bin/bash
# Builds weft's node image offline, with no registry and no container engine: the workspace's release
# binaries (cargo build --release) and Debian packages alone (the machine's own apt lists; the .debs are
# cached), laid out as scripts/image/layout says, the same layout deploy/Dockerfile builds for people
# with a registry (tests/k8s_image.rs checks that the two agree).
#
#   scripts/image.sh [--ref NAME:TAG] [--out FILE] [--no-build] [--bin-dir DIR]
#       weft's image (default ghcr.io/weft-project/weft:v0.1.0, the image deploy/kube-flannel.yml runs)
#       into FILE (default target/image/weft.tar). --no-build: use the release binaries as they are;
#       --bin-dir: take the binaries from DIR (e.g. target/debug, as the tests do), no build.
#   scripts/image.sh --test-images DIR
#       the two images the real-cluster tests need besides weft's: DIR/pause.tar (weft.local/pause:1,
#       a static C pause, the CRI sandbox image) and DIR/busybox.tar (weft.local/busybox:1)
#
# The tarball is both an OCI image layout and a docker-archive (what `docker save` writes since
# Docker 25): `ctr -n k8s.io images import FILE`, `docker load -i FILE`, `podman load -i FILE` and
# `skopeo copy oci-archive:FILE ...` take it. Reproducible: same binaries and package versions give
# the same bytes (sorted entries, owner 0:0, mtimes SOURCE_DATE_EPOCH or 0); the package versions used
# are in the image at /usr/share/weft/image-packages and printed at the end.
# Needs: root or unprivileged user namespaces (a chroot runs the layout's setup and checks inside the
# image), python3, apt-get, dpkg-deb, strip (binutils), gcc for --test-images. Cost: ~5 s with the .debs
# cached (${WEFT_TOOLS:-~/.cache/weft-tools}/image-debs, ~25 MB), plus the release build.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
LAYOUT=$REPO/scripts/image/layout
W=${WEFT_TOOLS:-$HOME/.cache/weft-tools}
DEBS=$W/image-debs
REF=ghcr.io/weft-project/weft:v0.1.0
OUT=$REPO/target/image/weft.tar
BUILD=1 TEST_IMAGES= BIN_DIR=$REPO/target/release
while (($#)); do
  case $1 in
    --ref) REF=$2; shift 2 ;;
    --out) OUT=$(realpath -m "$2"); shift 2 ;;
    --no-build) BUILD=; shift ;;
    --bin-dir) BIN_DIR=$(realpath "$2"); BUILD=; shift 2 ;;
    --test-images) TEST_IMAGES=$(realpath -m "$2"); shift 2 ;;
    -h|--help) sed -n '2,26p' "$0"; exit 0 ;;
    *) echo "image.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
# Packages only maintainer scripts need (dpkg -x never runs them) or that flannel's image lacks too.
SKIP=debconf,cdebconf,perl-base,perl,adduser,passwd,init-system-helpers,usrmerge,usr-is-merged,dpkg,tar,
SKIP+=sysvinit-utils,lsb-base,libc-bin,debianutils,install-info,strongswan-starter,libpam-modules,
SKIP+=libpam-modules-bin,libpam-runtime,util-linux-extra,login,mount
layout() { sed -e 's/#.*//' "$LAYOUT" | awk -v k="$1" '$1 == k { $1 = ""; sub(/^ /, ""); print }'; }
in_root() {  # COMMAND... run inside the image root $R
  if [[ $(id -u) == 0 ]]; then chroot "$R" "$@"; else unshare --user --map-root-user chroot "$R" "$@"; fi
}

# The .debs of PACKAGES and their closure, downloaded once into $DEBS; prints their paths.
fetch_debs() {
  mkdir -p "$DEBS"
  local list pv name ver file
  # The closure, resolved once per package set and state of the apt lists (apt-cache is slow).
  local key
  key=$( { printf '%s\n' "$SKIP" "$@"; stat -c '%n %Y %s' /var/lib/apt/lists/*Packages* 2>/dev/null; } | sha256sum | cut -c1-16)
  if [[ -s $DEBS/.closure-$key ]]; then
    list=$(cat "$DEBS/.closure-$key")
  else
    list=$(python3 "$REPO/scripts/image/debs.py" --skip "$SKIP" "$@") && [[ -n $list ]] || return 1
    local tmpf; tmpf=$(mktemp "$DEBS/.closure.XXXXXX")
    printf '%s\n' "$list" > "$tmpf" && mv "$tmpf" "$DEBS/.closure-$key"
  fi
  (
    flock 9
    cd "$DEBS"
    local want=()
    for pv in $list; do
      name=${pv%%=*} ver=${pv#*=}
      file=$(ls "${name}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
      [[ -n $file ]] || want+=("$pv")
    done
    if ((${#want[@]})); then
      echo "image.sh: downloading ${#want[@]} package(s) into $DEBS" >&2
      apt-get download -q -o APT::Sandbox::User=root "${want[@]}" >&2
    fi
  ) 9>"$DEBS/.lock"
  for pv in $list; do
    name=${pv%%=*} ver=${pv#*=}
    file=$(ls "$DEBS/${name}_${ver//:/%3a}_"*.deb 2>/dev/null | head -1 || true)
    [[ -n $file ]] || { echo "image.sh: $pv not downloaded into $DEBS" >&2; return 1; }
    echo "$file"
  done
}
# fetch_debs into the array debs, failing the script when it fails
get_debs() { local f; f=$(mktemp); fetch_debs "$@" > "$f" || { rm -f "$f"; exit 1; }; mapfile -t debs < "$f"; rm -f "$f"; }

# Unpacks the .debs into $R as one merged-/usr root (bookworm's layout), without docs.
unpack() {
  local d
  for d in "$@"; do dpkg-deb -x "$d" "$R"; done
  for d in bin sbin lib lib64; do
    if [[ -d $R/$d && ! -L $R/$d ]]; then
      mkdir -p "$R/usr/$d"
      cp -a "$R/$d/." "$R/usr/$d/"
      rm -rf "${R:?}/$d"
    fi
    ln -sfn "usr/$d" "$R/$d"
  done
  rm -rf "$R"/usr/share/{doc,man,info,locale,lintian,bug,bash-completion,zsh} "$R"/etc/logcheck
  mkdir -p "$R"/{etc,tmp,proc,sys,dev,run,root,var/lib,var/log}
  chmod 1777 "$R/tmp"
  ln -sfn /run "$R/var/run"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' > "$R/etc/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' > "$R/etc/group"
  # busybox's applets for what no package brought (cp, ln, grep, ...; sh too in the test image)
  local ap
  for ap in $("$R/usr/bin/busybox" --list-full); do
    ap=${ap#usr/}; ap=${ap##*/}
    [[ -e $R/usr/bin/$ap || -e $R/usr/sbin/$ap || -L $R/usr/bin/$ap || -L $R/usr/sbin/$ap ]] || ln -s busybox "$R/usr/bin/$ap"
  done
}

R=$(mktemp -d "${TMPDIR:-/var/tmp}/weft-image.XXXXXX")
[[ -n ${WEFT_IMAGE_KEEP:-} ]] && echo "image.sh: keeping the image root $R" >&2 || trap 'rm -rf "$R"' EXIT

if [[ -n $TEST_IMAGES ]]; then
  mkdir -p "$TEST_IMAGES"
  get_debs busybox-static
  mkdir -p "$R/pause" "$R/bb"
  gcc -Os -static -o "$R/pause/pause" "$REPO/scripts/image/pause.c"
  strip "$R/pause/pause"
  python3 "$REPO/scripts/image/mkimg.py" weft.local/pause:1 "$R/pause" "$TEST_IMAGES/pause.tar" --entrypoint '["/pause"]'
  TOP=$R; R=$TOP/bb
  unpack "${debs[@]}"
  python3 "$REPO/scripts/image/mkimg.py" weft.local/busybox:1 "$R" "$TEST_IMAGES/busybox.tar" --cmd '["sh"]'
  R=$TOP
  exit 0
fi

# 1. the release binaries
mapfile -t bins < <(layout bin | awk '{print $1, $2}' | sort -u)
if [[ -n $BUILD ]]; then
  args=(); for b in "${bins[@]}"; do read -r crate bin <<<"$b"; args+=(-p "$crate" --bin "$bin"); done
  cargo build --release --locked "${args[@]}"
fi
# 2. the packages, plus what debian:bookworm-slim gives the Dockerfile's build: dash as /bin/sh (busybox's
#    own sh would run its applets, e.g. its `ip`, ahead of the real tools in PATH) and busybox-static for
#    the small tools (cp, ln, grep, ...)
mapfile -t pkgs < <(layout deb | awk '{print $1}')
get_debs "${pkgs[@]}" dash busybox-static
unpack "${debs[@]}"
mkdir -p "$R/usr/share/weft"
for d in "${debs[@]}"; do dpkg-deb -f "$d" Package Version | awk -F': ' '{ printf "%s%s", (NR > 1 ? "=" : ""), $2 } END { print "" }'; done |
  LC_ALL=C sort > "$R/usr/share/weft/image-packages"
# 3. the binaries and files, where the layout puts them
while read -r crate bin dest; do
  mkdir -p "$R$(dirname "$dest")"
  strip -o "$R$dest" "$BIN_DIR/$bin"
done < <(layout bin)
while read -r src dest mode; do
  install -D -m "$mode" "$REPO/$src" "$R$dest"
done < <(layout file)
# 4. setup and checks inside the image
cp "$LAYOUT" "$R/tmp/layout"; cp "$REPO/scripts/image/apply.sh" "$R/tmp/apply.sh"
in_root /bin/sh /tmp/apply.sh /tmp/layout setup
in_root /bin/sh /tmp/apply.sh /tmp/layout check
rm -f "$R/tmp/layout" "$R/tmp/apply.sh"
# 5. the tarball
mkdir -p "$(dirname "$OUT")"
python3 "$REPO/scripts/image/mkimg.py" "$REF" "$R" "$OUT" --entrypoint '["/opt/bin/flanneld"]' \
  --label "org.opencontainers.image.source=weft scripts/image.sh"
echo "image.sh: $(wc -l < "$R/usr/share/weft/image-packages") Debian packages, $(du -sh "$R" | cut -f1) unpacked"
