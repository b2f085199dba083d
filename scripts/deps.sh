#!/usr/bin/env bash
# Installs the Debian packages weft's build, demo and tests need.
# Idempotent and quick when everything is present (no apt-get update then).
set -euo pipefail
PKGS=(
  protobuf-compiler libprotobuf-dev  # etcd-client's build script: protoc and the well-known .proto files
  etcd-server etcd-client    # a real etcd for the store tests
  containernetworking-plugins # real bridge, host-local, portmap in /usr/lib/cni
  iproute2 iputils-ping procps psmisc kmod
  iptables nftables
  iperf3 tcpdump curl openssl
  python3-matplotlib          # the throughput harness chart
  wireguard-go wireguard-tools
  strongswan-charon strongswan-swanctl libstrongswan-standard-plugins  # IPsec (charon over VICI)
  util-linux                 # setpriv (capability tests, charon pdeathsig)
)
missing=()
for p in "${PKGS[@]}"; do
  [[ -z "$p" ]] && continue
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
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
