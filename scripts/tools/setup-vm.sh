#!/bin/bash
# Fetches what the VM test kit (tests/support/vm.rs, scripts/tools/vm/vm-run.sh)
# boots: Debian's stock kernel (linux-image-amd64, full module tree, so ipip,
# wireguard, esp4/xfrm and dummy exist), qemu-system-x86 plus only the shared
# libraries this machine lacks, and a static busybox for the initramfs.
# Nothing is installed: the packages are downloaded with `apt-get download`
# and unpacked with `dpkg -x` (installing qemu-system-x86 would remove a newer
# qemu-utils, a package conflict).
#
# Output: ${WEFT_TOOLS:-$HOME/.cache/weft-tools}/vm/ (outside the checkout):
#   kernel/vmlinux             uncompressed kernel (PVH boot skips the decompressor)
#   kernel/lib/modules/KVER/   its modules (depmod'ed), bind-mounted in the guests
#   qemu/                      unpacked qemu-system-x86_64 + libraries + firmware
#   initramfs.gz               busybox /init (see vm/mkinitramfs.sh)
#   .setup-done                stamp: the kernel version
# Idempotent: exits at once when the stamp and the files exist. Safe to run
# concurrently (flock). Cost the first time: ~760 MB of downloads (~450 MB
# kept after the .debs are removed), 1-3 minutes.
# Adapted from shared/recipes/vm/vm-run.sh --setup (qemu only, no UML).
set -euo pipefail
W=${WEFT_TOOLS:-$HOME/.cache/weft-tools}
H=$W/vm
D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
done_ok() {
  [[ -s $H/.setup-done && -s $H/kernel/vmlinux && -s $H/initramfs.gz ]] &&
    { [[ -x $H/qemu/usr/bin/qemu-system-x86_64 ]] || command -v qemu-system-x86_64 >/dev/null; }
}
if done_ok; then echo "$H present (kernel $(cat "$H/.setup-done"))"; exit 0; fi
mkdir -p "$H"
exec 9>"$W/.setup-vm.lock"
flock 9
if done_ok; then echo "$H present (kernel $(cat "$H/.setup-done"))"; exit 0; fi

die() { echo "setup-vm: $*" >&2; exit 1; }
cd "$H"
rm -f .setup-done
apt-cache show linux-image-amd64 >/dev/null 2>&1 || apt-get update -q >/dev/null
kpkg=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/{print $2; exit}')
[[ -n $kpkg ]] || die "cannot resolve linux-image-amd64"
# qemu-system-x86 and only the libraries this host lacks (what `apt-get
# install` would bring in), unpacked, not installed
qpkgs=""
command -v qemu-system-x86_64 >/dev/null ||
  qpkgs=$(apt-get install -s --no-install-recommends qemu-system-x86 2>/dev/null | awk '/^Inst /{print $2}')
rm -rf debs kernel qemu bb initramfs.gz
mkdir -p debs kernel qemu bb
# shellcheck disable=SC2086
(cd debs && apt-get download -q -o APT::Sandbox::User=root $kpkg $qpkgs busybox-static >/dev/null)
for d in debs/*.deb; do
  case ${d##*/} in
    linux-image-*) dpkg -x "$d" kernel ;;
    busybox-static_*) dpkg -x "$d" bb ;;
    *) dpkg -x "$d" qemu ;;
  esac
done
kver=$(ls kernel/lib/modules)
depmod -b "$H/kernel" "$kver"
# uncompressed vmlinux: booted via PVH, which skips the slow decompressor
off=$(LC_ALL=C grep -abo $'\xfd''7zXZ' kernel/boot/vmlinuz-"$kver" | head -1 | cut -d: -f1)
tail -c +$((off + 1)) kernel/boot/vmlinuz-"$kver" | xz -dc 2>/dev/null > kernel/vmlinux || true
[[ -s kernel/vmlinux ]] || die "could not extract vmlinux"
rm -f kernel/boot/vmlinuz-"$kver"
"$D/vm/mkinitramfs.sh" "$kver" "$H/kernel" bb/bin/busybox "$H/initramfs.gz"
rm -rf debs
echo "$kver" > .setup-done
echo "setup done: kernel $kver, $(du -sh "$H" | cut -f1) in $H"
