#!/usr/bin/env bash
# Installs the Debian packages weft's build, demo and tests need, then checks
# that each one brought the file weft uses from it (a package that installs but
# lacks the file, as protobuf-compiler without libprotobuf-dev's .proto files
# did, fails here and not deep inside a build).
# Idempotent and quick when everything is present (no apt-get update then).
#   scripts/deps.sh           install what is missing, then check
#   scripts/deps.sh --check   only check; exit 1 naming what is missing
# scripts/fresh-machine-check.sh proves this script alone takes a bare Debian
# root to a full build.
set -euo pipefail
# package                        the file weft needs from it (what for)
DEPS=(
  "protobuf-compiler             /usr/bin/protoc"                  # etcd-client's build script
  "libprotobuf-dev               /usr/include/google/protobuf/descriptor.proto" # protoc's well-known types
  "etcd-server                   /usr/bin/etcd"                    # a real etcd for the store tests
  "etcd-client                   /usr/bin/etcdctl"
  "containernetworking-plugins   /usr/lib/cni/bridge"              # bridge, host-local, portmap
  "iproute2                      /usr/sbin/ip"
  "iputils-ping                  /usr/bin/ping"
  "procps                        /usr/bin/pkill"
  "psmisc                        /usr/bin/killall"
  "kmod                          /usr/sbin/modprobe"
  "iptables                      /usr/sbin/iptables"
  "nftables                      /usr/sbin/nft"
  "iperf3                        /usr/bin/iperf3"
  "sockperf                      /usr/bin/sockperf"                # the throughput harness latency tests (rr-*)
  "tcpdump                       /usr/bin/tcpdump"
  "ethtool                       /usr/sbin/ethtool"                # uplink offloads (tests/tap_gso.rs, the harness)
  "curl                          /usr/bin/curl"
  "openssl                       /usr/bin/openssl"
  "python3-matplotlib            /usr/lib/python3/dist-packages/matplotlib" # the throughput harness chart
  "wireguard-go                  /usr/bin/wireguard-go"
  "wireguard-tools               /usr/bin/wg"
  "strongswan-charon             /usr/lib/ipsec/charon"            # IPsec (charon over VICI)
  "strongswan-swanctl            /usr/sbin/swanctl"
  "libstrongswan-standard-plugins /usr/lib/ipsec/plugins/libstrongswan-gcm.so"
  "util-linux                    /usr/bin/setpriv"                 # capability tests, charon pdeathsig
  "xz-utils                      /usr/bin/xz"                      # unpacking Debian source tarballs
  "containerd                    /usr/bin/containerd-shim-runc-v2" # the real-cluster tests' runtime (tests/support/k8s)
  "runc                          /usr/sbin/runc"
  "conntrack                     /usr/sbin/conntrack"              # kube-proxy
  "binutils                      /usr/bin/strip"                   # scripts/image.sh
  "gcc                           /usr/bin/gcc"                     # the static pause image (scripts/image.sh)
  "libc6-dev                     /usr/lib/x86_64-linux-gnu/libc.a"
  "python3                       /usr/bin/python3"                 # scripts/image/mkimg.py, debs.py
)

check() {
  local bad=() d
  for d in "${DEPS[@]}"; do
    read -r pkg file <<<"$d"
    [[ -e $file ]] || bad+=("$pkg ($file)")
  done
  if ((${#bad[@]})); then
    printf 'deps: missing after install: %s\n' "${bad[@]}" >&2
    return 1
  fi
}

[[ ${1:-} == --check ]] && { check; exit; }

missing=()
for d in "${DEPS[@]}"; do
  read -r pkg _ <<<"$d"
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "deps: missing Debian packages: ${missing[*]} (run as root to install them)" >&2
    exit 1
  fi
  echo "deps: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
check
