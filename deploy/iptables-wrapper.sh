#!/bin/sh
# Picks the iptables backend (legacy or nft) the node already uses, the first
# time any iptables command runs in the container, like kubernetes-sigs'
# iptables-wrappers that flannel's image ships:
#   iptables-wrapper install   points iptables, ip6tables and their -save and
#                              -restore at this script (image build time);
#   <iptables-command> ARGS    decides once, switches the alternatives to
#                              the chosen backend and runs the real command.
# Decision: the backend holding kubelet's canary/hint chains, else the one
# with more rules, else nft.
set -eu
if [ "${1:-}" = "install" ]; then
  for c in iptables iptables-save iptables-restore ip6tables ip6tables-save ip6tables-restore; do
    ln -sf /usr/sbin/iptables-wrapper "/usr/sbin/$c"
  done
  exit 0
fi
count() { { "$1-save" 2>/dev/null || true; } | grep -c '^-' || true; }
hint() { { "$1-save" -t mangle 2>/dev/null || true; } | grep -q 'KUBE-IPTABLES-HINT\|KUBE-KUBELET-CANARY'; }
if hint iptables-nft || hint ip6tables-nft; then mode=nft
elif hint iptables-legacy || hint ip6tables-legacy; then mode=legacy
elif [ "$(count iptables-legacy)" -gt "$(count iptables-nft)" ]; then mode=legacy
else mode=nft
fi
for c in iptables ip6tables; do
  for s in "" -save -restore; do
    ln -sf "/usr/sbin/xtables-$mode-multi" "/usr/sbin/$c$s"
  done
done
exec "$0" "$@"
