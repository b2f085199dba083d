#!/usr/bin/env bash
# Issue 32's probe of the kernel's UDP-tunnel GSO through a TAP (docs/performance.md,
# "let the kernel segment"): one write of a VXLAN super-packet, then what the
# peer namespace sees on its uplink and through a kernel vxlan device, first
# with the uplink's UDP-tunnel segmentation on (a veth passes the skb whole),
# then off with checksum offload off (the stack segments and sums; needs ethtool). Root; own namespaces; removed on exit.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
P=wtgso$$
A=${P}a B=${P}b
cleanup() { ip netns del "$A" 2>/dev/null || true; ip netns del "$B" 2>/dev/null || true; rm -f "/tmp/$P.fifo" "/tmp/$P.cap" "/tmp/$P.pcap"; }
trap cleanup EXIT
ip netns add "$A"; ip netns add "$B"
ip link add a0 netns "$A" type veth peer name b0 netns "$B"
ip -n "$A" addr add 192.0.2.1/24 dev a0; ip -n "$B" addr add 192.0.2.2/24 dev b0
ip -n "$A" link set a0 up; ip -n "$B" link set b0 up
ip -n "$B" link add vxlan0 type vxlan id 1 dstport 4789 local 192.0.2.2 dev b0
ip -n "$B" link set vxlan0 address 02:00:00:00:00:02 up
ip -n "$B" addr add 10.244.2.2/24 dev vxlan0
# the outer source is the node's own address, arriving on the TAP
ip netns exec "$A" sysctl -qw net.ipv4.ip_forward=1 net.ipv4.conf.all.rp_filter=0 \
  net.ipv4.conf.default.rp_filter=0 net.ipv4.conf.all.accept_local=1 net.ipv4.conf.default.accept_local=1

# One super-packet (10 segments) written through a new TAP; "udp" as $1:
# flannel-UDP's encapsulation instead of VXLAN.
write_one() {
  rm -f "/tmp/$P.fifo"; mkfifo "/tmp/$P.fifo"
  ip netns exec "$A" python3 "$here/tap_tunnel_gso.py" 10 0200000000aa "$@" < "/tmp/$P.fifo" &
  local writer=$!
  exec 7>"/tmp/$P.fifo"
  for _ in $(seq 50); do ip -n "$A" link show tap0 >/dev/null 2>&1 && break; sleep 0.1; done
  ip -n "$A" link set tap0 address 02:00:00:00:00:aa up
  ip netns exec "$A" sysctl -qw net.ipv4.conf.tap0.rp_filter=0 net.ipv4.conf.tap0.accept_local=1
  echo go >&7; exec 7>&-
  wait "$writer"
}
one() {
  ip netns exec "$B" timeout 6 tcpdump -i b0 -nn -v -c 40 udp port 4789 > "/tmp/$P.cap" 2>/dev/null &
  local dump=$!
  sleep 1
  ip netns exec "$B" nstat -n
  write_one
  wait "$dump" || true
  echo "  on b0: $(grep -c 'proto UDP' "/tmp/$P.cap") UDP datagrams, IP lengths: $(grep -o 'proto UDP (17), length [0-9]*' "/tmp/$P.cap" | awk '{print $NF}' | sort | uniq -c | tr '\n' ' ')inner TCP checksums tcpdump calls incorrect (still partial while offloaded): $(grep -c 'cksum.*incorrect' "/tmp/$P.cap" || true)"
  echo "  peer stack: $(ip netns exec "$B" nstat 2>/dev/null | awk '/UdpInDatagrams|TcpInSegs|TcpInCsumErrors|TcpOutRsts|IpExtInNoECTPkts/{printf "%s=%s ", $1, $2}')"
}
echo "uplink with tx-udp_tnl-segmentation (veth default):"; one
if command -v ethtool >/dev/null; then
  ip netns exec "$A" ethtool -K a0 tx-udp_tnl-segmentation off tx-udp_tnl-csum-segmentation off tx off >/dev/null
  echo "uplink without it or checksum offload (the stack segments and sums):"; one
  # flannel-UDP (IP in UDP, no inner Ethernet) through the same header, cut by the stack
  rm -f "/tmp/$P.pcap"
  ip netns exec "$B" timeout 6 tcpdump -i b0 -nn -w "/tmp/$P.pcap" -c 40 udp port 8285 2>/dev/null &
  dump=$!
  sleep 1
  write_one udp >/dev/null
  wait "$dump" || true
  echo "flannel-UDP (IP in UDP), uplink without the offload (the stack segments and sums):"
  python3 "$here/tap_tunnel_gso.py" --check "/tmp/$P.pcap"
  # the same skb across a veth that passes it whole, to a plain socket (flanneld's kind)
  ip netns exec "$A" ethtool -K a0 tx-udp_tnl-segmentation on tx-udp_tnl-csum-segmentation on tx on >/dev/null
  ip netns exec "$B" python3 "$here/tap_tunnel_gso.py" --recv 192.0.2.2 > "/tmp/$P.cap" &
  local_rcv=$!
  sleep 0.5
  write_one udp >/dev/null
  wait "$local_rcv"
  echo "flannel-UDP, uplink passing the skb whole, to a plain UDP socket on the peer (no UDP_GRO, as flanneld):"
  cat "/tmp/$P.cap"
else
  echo "(no ethtool: the software-segmentation cases are left out)"
fi
