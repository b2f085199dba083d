#!/usr/bin/env python3
"""Writes ONE VXLAN-encapsulated TCP super-packet of N segments to a TAP with
a UDP-tunnel GSO virtio-net header (Linux 6.17+) and leaves the segmenting to
the kernel. Issue 32's "let the kernel segment" probe; driven by
tap_tunnel_gso.sh, which builds the namespaces. Not part of the engine.

argv: N (segments), the TAP's MAC (hex, 12 digits), optionally "udp" for
flannel-UDP's encapsulation (the inner IP packet right behind the UDP header,
port 8285) instead of VXLAN; reads one line from stdin after creating the TAP
(so the caller can set its sysctls) before writing.
`--check PCAP`: prints each captured flannel-UDP datagram's size and whether
its inner IP and TCP checksums are right. `--recv ADDR`: a plain UDP socket on
ADDR:8285, as flanneld's, prints the same for what it receives in 4 s."""
import fcntl, os, socket, struct, sys, time

TUNSETIFF, TUNSETOFFLOAD, TUNSETVNETHDRSZ = 0x400454CA, 0x400454D0, 0x400454D8
IFF_TAP, IFF_NO_PI, IFF_VNET_HDR = 0x2, 0x1000, 0x4000
TUN_F_CSUM, TUN_F_TSO4, TUN_F_TSO6 = 0x1, 0x2, 0x4
TUN_F_UDP_TUNNEL_GSO, TUN_F_UDP_TUNNEL_GSO_CSUM = 0x80, 0x100  # 6.17
GSO_TCPV4, GSO_UDP_TUNNEL_IPV4, F_NEEDS_CSUM = 0x01, 0x20, 0x01
MSS = 1398  # 1398 + 20 + 20 + 14 + 8 + 8 + 20 = 1488: fits a 1500 underlay


def csum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def ip4(src, dst, proto, plen):
    h = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + plen, 1, 0x4000, 64, proto, 0,
                    socket.inet_aton(src), socket.inet_aton(dst))
    return h[:10] + struct.pack("!H", ~csum(h) & 0xFFFF) + h[12:]


def main():
    if sys.argv[1] == "--check":
        return check(sys.argv[2])
    if sys.argv[1] == "--recv":
        return recv(sys.argv[2])
    n, tap_mac = int(sys.argv[1]), bytes.fromhex(sys.argv[2])
    udp_encap = sys.argv[3:] == ["udp"]
    fd = os.open("/dev/net/tun", os.O_RDWR)
    fcntl.ioctl(fd, TUNSETIFF, struct.pack("16sH", b"tap0", IFF_TAP | IFF_NO_PI | IFF_VNET_HDR))
    # the 24-byte virtio_net_hdr_v1_hash_tunnel carries the tunnel offsets
    fcntl.ioctl(fd, TUNSETVNETHDRSZ, struct.pack("i", 24))
    try:
        fcntl.ioctl(fd, TUNSETOFFLOAD, TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6
                    | TUN_F_UDP_TUNNEL_GSO | TUN_F_UDP_TUNNEL_GSO_CSUM)
    except OSError as e:
        sys.exit(f"TUNSETOFFLOAD with the UDP-tunnel bits: {e} (kernel older than 6.17?)")
    print("TAP accepts TUN_F_UDP_TUNNEL_GSO", flush=True)
    sys.stdin.readline()

    payload = bytes(i % 251 for i in range(n * MSS))
    isrc, idst = "10.244.1.2", "10.244.2.2"
    tcp_len = 20 + len(payload)
    pseudo = struct.pack("!4s4sBBH", socket.inet_aton(isrc), socket.inet_aton(idst), 0, 6, tcp_len)
    tcp = struct.pack("!HHIIBBHHH", 40000, 5201, 1, 1, 0x50, 0x18, 65535, csum(pseudo), 0)
    # inner: the peer vxlan device's MAC (02:..:02) from a pod-side MAC
    inner = ip4(isrc, idst, 6, tcp_len) + tcp + payload
    if udp_encap:  # flannel-UDP: no tunnel header, no inner Ethernet
        vxlan, port = b"", 8285
    else:  # inner: the peer vxlan device's MAC (02:..:02) from a pod-side MAC
        inner = bytes.fromhex("020000000002020000000001") + b"\x08\x00" + inner
        vxlan, port = struct.pack("!II", 0x08000000, 1 << 8), 4789  # VNI 1
    udp_len = 8 + len(vxlan) + len(inner)
    udp = struct.pack("!HHHH", 54321, port, udp_len, 0)
    frame = tap_mac + bytes.fromhex("0200000000bb") + b"\x08\x00" + ip4("192.0.2.1", "192.0.2.2", 17, udp_len) + udp + vxlan + inner
    outer_th = 14 + 20
    inner_nh = outer_th + 8 + len(vxlan) + (0 if udp_encap else 14)
    inner_th = inner_nh + 20
    vnet = struct.pack("<BBHHHHH", F_NEEDS_CSUM, GSO_TCPV4 | GSO_UDP_TUNNEL_IPV4, inner_th + 20, MSS, inner_th, 16, 0)
    vnet += struct.pack("<IHH", 0, 0, 0) + struct.pack("<HH", outer_th, inner_nh)
    wrote = os.write(fd, vnet + frame)
    print(f"wrote {wrote} bytes: one super-packet of {n} segments", flush=True)
    time.sleep(2)  # the TAP goes with this fd: let the stack take the skb first


def inner_ok(inner):
    """Whether a flannel-UDP payload's inner IP and TCP checksums are right."""
    ihl, tot = (inner[0] & 15) * 4, struct.unpack("!H", inner[2:4])[0]
    tcp = inner[ihl:tot]
    pseudo = inner[12:20] + struct.pack("!BBH", 0, 6, len(tcp))
    return csum(inner[:ihl]) == 0xFFFF and csum(pseudo + tcp) == 0xFFFF


def report(payloads):
    bad = 0
    for p in payloads:
        ok = inner_ok(p)
        bad += not ok
        print(f"  UDP payload {len(p)} bytes, inner IP and TCP checksums {'right' if ok else 'WRONG'}")
    print(f"  {len(payloads)} datagrams, {bad} with a wrong inner checksum")


def check(path):
    """Each flannel-UDP datagram of a pcap (Ethernet)."""
    d, off, got = open(path, "rb").read(), 24, []
    while off + 16 <= len(d):
        incl = struct.unpack("<I", d[off + 8:off + 12])[0]
        ip = d[off + 16 + 14:off + 16 + incl]
        off += 16 + incl
        got.append(ip[(ip[0] & 15) * 4 + 8:])
    report(got)


def recv(addr):
    """What a plain UDP socket (flanneld's kind: no UDP_GRO) receives."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((addr, 8285))
    s.settimeout(4)
    got = []
    try:
        while True:
            got.append(s.recv(70000))
    except socket.timeout:
        pass
    report(got)


if __name__ == "__main__":
    main()
