#!/usr/bin/env python3
"""Writes the seed corpus of every fuzz target (fuzz/corpus/<target>/seed-*).

Seeds are the real thing, built byte by byte: packets as a flannel VXLAN or
udp node puts them on the wire (correct IPv4 and TCP/UDP checksums, or partial
ones as a veth sender leaves them), virtio-net headers as the TUN hands over
TCP super-packets, and configs/leases/files as flannel and weftd write them.
Run from anywhere: `python3 fuzz/gen_corpus.py`. Inputs libFuzzer found and
that were worth keeping live next to the seeds under other names.
"""

import os
import struct

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus")
LOCAL_MAC = bytes([0x0E, 0x9A, 0x3C, 0x11, 0x22, 0x33])
PEER_MAC = bytes([0x0E, 0x9A, 0x3C, 0x44, 0x55, 0x66])


def write(target, name, data):
    d = os.path.join(ROOT, target)
    os.makedirs(d, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def csum_sum(b):
    if len(b) % 2:
        b += b"\0"
    s = sum(struct.unpack("!%dH" % (len(b) // 2), b))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return s


def csum(b):
    return (~csum_sum(b)) & 0xFFFF


def ip4(a):
    return bytes(int(x) for x in a.split("."))


def ip6(a):
    import ipaddress

    return ipaddress.IPv6Address(a).packed


def pseudo(src, dst, proto, length):
    return src + dst + struct.pack("!BBH", 0, proto, length) if len(src) == 4 else src + dst + struct.pack("!IxxxB", length, proto)


def l4(src, dst, proto, hdr, payload, csum_off, mode="valid"):
    """Transport segment with its checksum: valid, partial (pseudo sum) or zero."""
    seg = bytearray(hdr + payload)
    seg[csum_off : csum_off + 2] = b"\0\0"
    if mode == "valid":
        c = csum(pseudo(src, dst, proto, len(seg)) + bytes(seg))
        if proto == 17 and c == 0:
            c = 0xFFFF
        seg[csum_off : csum_off + 2] = struct.pack("!H", c)
    elif mode == "partial":
        seg[csum_off : csum_off + 2] = struct.pack("!H", csum_sum(pseudo(src, dst, proto, len(seg))))
    return bytes(seg)


def tcp_hdr(sport, dport, seq, ack, flags, opts=b""):
    doff = (20 + len(opts)) // 4
    return struct.pack("!HHIIBBHHH", sport, dport, seq, ack, doff << 4, flags, 502, 0, 0) + opts


def ipv4(src, dst, proto, l4seg, ttl=64, ident=0x1c46, df=True, options=b""):
    ihl = (20 + len(options)) // 4
    h = bytearray(struct.pack("!BBHHHBBH4s4s", 0x40 | ihl, 0, 20 + len(options) + len(l4seg), ident, 0x4000 if df else 0, ttl, proto, 0, src, dst) + options)
    h[10:12] = struct.pack("!H", csum(bytes(h)))
    return bytes(h) + l4seg


def ipv6(src, dst, nh, l4seg, hop=64):
    return struct.pack("!IHBB16s16s", 0x60000000, len(l4seg), nh, hop, src, dst) + l4seg


def tcp4(src, dst, seq, payload, flags=0x10, mode="valid", sport=43512, dport=5201, ack=0x1000, opts=b""):
    s, d = ip4(src), ip4(dst)
    return ipv4(s, d, 6, l4(s, d, 6, tcp_hdr(sport, dport, seq, ack, flags, opts), payload, 16, mode))


def tcp6(src, dst, seq, payload, flags=0x10, mode="valid", sport=43512, dport=5201, ack=0x1000):
    s, d = ip6(src), ip6(dst)
    return ipv6(s, d, 6, l4(s, d, 6, tcp_hdr(sport, dport, seq, ack, flags), payload, 16, mode))


def udp4(src, dst, payload, mode="valid", sport=53211, dport=53):
    s, d = ip4(src), ip4(dst)
    hdr = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    return ipv4(s, d, 17, l4(s, d, 17, hdr, payload, 6, mode))


def udp6(src, dst, payload, mode="valid", sport=53211, dport=53):
    s, d = ip6(src), ip6(dst)
    hdr = struct.pack("!HHHH", sport, dport, 8 + len(payload), 0)
    return ipv6(s, d, 17, l4(s, d, 17, hdr, payload, 6, mode))


def icmp4_echo(src, dst, seq=1):
    body = bytearray(struct.pack("!BBHHH", 8, 0, 0, 0x1234, seq) + bytes(range(56)))
    body[2:4] = struct.pack("!H", csum(bytes(body)))
    return ipv4(ip4(src), ip4(dst), 1, bytes(body))


def vxlan(inner, vni=1, dst=LOCAL_MAC, ethertype=None):
    if ethertype is None:
        ethertype = 0x86DD if inner[0] >> 4 == 6 else 0x0800
    return struct.pack("!B3xI", 0x08, vni << 8) + dst + PEER_MAC + struct.pack("!H", ethertype) + inner


def vnet(flags=0, gso_type=0, hdr_len=0, gso_size=0, csum_start=0, csum_offset=0):
    return struct.pack("<BBHHHH", flags, gso_type, hdr_len, gso_size, csum_start, csum_offset)


def payload(n, seed=0):
    return bytes((i * 7 + seed) & 0xFF for i in range(n))


A, B = "10.244.1.2", "10.244.2.3"
A6, B6 = "fc00:0:0:1::2", "fc00:0:0:2::3"
MSS_OPTS = b"\x02\x04\x05\x82\x04\x02\x08\x0a\x00\x01\x02\x03\x00\x00\x00\x00\x01\x03\x03\x07"


def engine():
    write("vxlan_decap", "icmp-echo", vxlan(icmp4_echo(A, B)))
    write("vxlan_decap", "tcp-syn-options", vxlan(tcp4(A, B, 1000, b"", flags=0x02, opts=MSS_OPTS)))
    write("vxlan_decap", "tcp6-data", vxlan(tcp6(A6, B6, 5000, payload(1000))))
    write("vxlan_decap", "tcp-gro-train-oversize", vxlan(tcp4(A, B, 7000, payload(4000), mode="partial")))
    write("vxlan_decap", "udp-partial-csum", vxlan(udp4(A, B, payload(100), mode="partial")))
    write("vxlan_decap", "wrong-vni", vxlan(icmp4_echo(A, B), vni=2))
    short = udp4(A, B, b"hi")
    write("vxlan_decap", "eth-padding", vxlan(short + b"\0" * (46 - len(short))))

    write("flannel_udp_decap", "icmp-echo", icmp4_echo(A, B))
    write("flannel_udp_decap", "tcp-partial-csum", tcp4(A, B, 42, payload(600), mode="partial"))
    write("flannel_udp_decap", "ttl-1", ipv4(ip4(A), ip4(B), 1, icmp4_echo(A, B)[20:], ttl=1))
    write("flannel_udp_decap", "tcp-oversize", tcp4(A, B, 42, payload(2500)))
    opts = b"\x94\x04\x00\x00"  # router alert
    write("flannel_udp_decap", "ip-options", ipv4(ip4(A), ip4(B), 17, udp4(A, B, b"x")[20:], options=opts))

    def rec(dgram, flags=0):
        return struct.pack("<HB", len(dgram), flags) + dgram

    flow = [tcp4(A, B, 1 + i * 1398, payload(1398, i), flags=0x18 if i == 3 else 0x10) for i in range(4)]
    other = tcp4("10.244.1.9", B, 77, payload(500), sport=40000)
    write("gro", "vxlan-flow-interleaved", b"\0" + rec(vxlan(flow[0])) + rec(vxlan(flow[1])) + rec(vxlan(other)) + rec(vxlan(flow[2])) + rec(vxlan(flow[3])))
    pflow = [tcp4(A, B, 1 + i * 1000, payload(1000, i), mode="zero") for i in range(3)]
    write("gro", "flannel-partial-flag", b"\x01" + b"".join(rec(p, 2) for p in pflow))
    f6 = [tcp6(A6, B6, 9 + i * 1200, payload(1200, i)) for i in range(3)]
    write("gro", "vxlan-ipv6-flow", b"\0" + b"".join(rec(vxlan(p)) for p in f6))
    write("gro", "oversize-single", b"\0" + rec(vxlan(tcp4(A, B, 5, payload(3000)))) + rec(vxlan(icmp4_echo(A, B))))
    bad = [tcp4(A, B, 1 + i * 800, payload(800, i), mode="zero") for i in range(3)]
    write("gro", "bad-csum-fixed-by-flag", b"\0" + b"".join(rec(vxlan(p), 1) for p in bad))

    wg_input()

    sp = tcp4(A, B, 100, payload(4000), flags=0x18, mode="partial")
    write("tun_tx", "gso-tcpv4-vxlan", b"\0" + vnet(1, 1, 40, 1398, 20, 16) + sp)
    sp6 = tcp6(A6, B6, 100, payload(3000), mode="partial")
    write("tun_tx", "gso-tcpv6-vxlan", b"\0" + vnet(1, 4, 60, 1378, 40, 16) + sp6)
    write("tun_tx", "gso-tcpv4-ecn-flannel", b"\x01" + vnet(1, 0x81, 40, 1400, 20, 16) + sp)
    write("tun_tx", "needs-csum-udp", b"\0" + vnet(1, 0, 0, 0, 20, 6) + udp4(A, B, payload(300), mode="partial"))
    write("tun_tx", "plain-icmp-flannel", b"\x01" + vnet() + icmp4_echo(A, B))
    # USO: UDP super-packets (GSO_UDP_L4) with the partial checksum the kernel leaves.
    usp = udp4(A, B, payload(3500), mode="partial")
    write("tun_tx", "gso-udpv4-uso-vxlan", b"\0" + vnet(1, 5, 28, 1000, 20, 6) + usp)
    write("tun_tx", "gso-udpv4-uso-flannel", b"\x01" + vnet(1, 5, 28, 1472, 20, 6) + usp)
    usp6 = udp6(A6, B6, payload(2500), mode="partial")
    write("tun_tx", "gso-udpv6-uso-vxlan", b"\0" + vnet(1, 5, 48, 1200, 40, 6) + usp6)
    write("tun_tx", "gso-udpv4-uso-last-short", b"\0" + vnet(1, 5, 28, 999, 20, 6) + udp4(A, B, payload(1000), mode="partial"))
    # IPIP (mode bit 1): TCP super-packet, a plain packet; flannel-UDP without a route.
    write("tun_tx", "ipip-gso-tcpv4", b"\x02" + vnet(1, 1, 40, 1398, 20, 16) + sp)
    write("tun_tx", "ipip-plain-icmp", b"\x02" + vnet() + icmp4_echo(A, B))
    write("tun_tx", "unreachable-flannel", b"\x01" + vnet() + icmp4_echo(A, "192.168.7.7"))


def wg_input():
    """Mode byte 0: a received datagram; 1: plaintexts node 1 sends
    (record `len | flags | pos | val | packet`, flag 8: from a roamed
    address); 2: a genuine initiation; 3: a TUN read with a vnet header."""

    def rec(pkt, flags=0, pos=0, val=0):
        return struct.pack("<HBHB", len(pkt), flags, pos, val) + pkt

    flow = [tcp4(A, B, 1 + i * 1380, payload(1380, i), flags=0x18 if i == 3 else 0x10) for i in range(4)]
    write("wg_input", "tcp-flow", b"\1" + b"".join(rec(p) for p in flow))
    f6 = [tcp6(A6, B6, 9 + i * 1200, payload(1200, i)) for i in range(2)]
    mixed = rec(f6[0]) + rec(icmp4_echo(A, B), 4, 20, 0x80) + rec(f6[1], 2, 40) + rec(b"") + rec(tcp4(B, A, 5, payload(100)))
    write("wg_input", "mixed-modified-keepalive-spoofed", b"\1" + mixed)
    padded = tcp4(A, B, 3, payload(200)) + b"\0" * 13
    wrong_len = bytearray(udp4(A, B, payload(64)))
    wrong_len[2:4] = struct.pack("!H", 30)
    write("wg_input", "padded-and-fixed-length", b"\1" + rec(padded) + rec(bytes(wrong_len), 1) + rec(bytes(wrong_len)))
    # IPv4 total lengths below the header: boringtun hands out 0 and 8 bytes.
    short = [bytearray(udp4(A, B, payload(8))) for _ in range(2)]
    short[0][2:4], short[1][2:4] = b"\0\0", b"\0\x08"
    write("wg_input", "ip-total-len-below-header", b"\1" + b"".join(rec(bytes(p)) for p in short))
    # Our id for the sender is 1: receiver index 1 << 8 | session.
    write("wg_input", "data-forged", b"\0" + struct.pack("<IIQ", 4, 1 << 8, 7) + payload(48))
    write("wg_input", "init-forged", b"\0" + struct.pack("<II", 1, 0xABC01) + payload(140))
    write("wg_input", "handshake", b"\2" + struct.pack("<BHB", 0, 0, 0))
    write("wg_input", "handshake-under-load", b"\2" + struct.pack("<BHB", 2, 0, 0))
    write("wg_input", "handshake-flip-static", b"\2" + struct.pack("<BHB", 1, 50, 1))
    write("wg_input", "handshake-mac2-only-under-load", b"\2" + struct.pack("<BHB", 3, 140, 1))
    write("wg_input", "roamed", b"\1" + rec(tcp4(A, B, 7, payload(300)), 8) + rec(tcp4(A, B, 307, payload(300)), 12, 30, 1))
    sp = tcp4(A, B, 1, payload(20000))
    write("wg_input", "tun-gso-tcpv4", b"\3" + vnet(1, 1, 40, 1368, 20, 16) + sp)
    write("wg_input", "tun-plain-udp", b"\3" + vnet() + udp4(A, B, payload(500)))


def fnv1a64(b):
    h = 0xCBF29CE484222325
    for x in b:
        h ^= x
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


LEASE_VXLAN = '{"PublicIP":"192.168.64.3","PublicIPv6":null,"BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}}'


def control():
    write("net_conf", "vxlan", '{\n  "Network": "10.244.0.0/16",\n  "Backend": {\n    "Type": "vxlan"\n  }\n}\n')
    write("net_conf", "dual-stack", '{"EnableIPv6":true,"Network":"10.244.0.0/16","IPv6Network":"fc00::/48","Backend":{"Type":"vxlan","VNI":4096,"Port":4789,"MTU":9000}}')
    write("net_conf", "udp-subnets", '{"Network":"10.5.0.0/16","SubnetLen":26,"SubnetMin":"10.5.1.0","SubnetMax":"10.5.20.192","Backend":{"Type":"udp","Port":8285}}')
    write("net_conf", "wireguard-v6only", '{"EnableIPv4":false,"EnableIPv6":true,"IPv6Network":"fd00:10::/56","IPv6SubnetLen":64,"Backend":{"Type":"wireguard","Mode":"separate","PersistentKeepaliveInterval":25}}')
    write("net_conf", "host-gw-nobackend", '{"network":"172.16.0.0/12","subnetlen":20}')
    write("net_conf", "ipsec", '{"Network":"10.10.0.0/16","Backend":{"Type":"ipsec","PSK":"0123456789abcdef0123456789abcdef","UDPEncap":true}}')

    write("lease_attrs", "vxlan", LEASE_VXLAN)
    write("lease_attrs", "udp", '{"PublicIP":"198.51.100.7","PublicIPv6":null,"BackendType":"udp"}')
    write("lease_attrs", "dual-stack", '{"PublicIP":"192.0.2.10","PublicIPv6":"2001:db8::10","BackendType":"vxlan","BackendData":{"VNI":1,"VtepMAC":"0e:9a:3c:11:22:33"},"BackendV6Data":{"VNI":1,"VtepMAC":"0e:9a:3c:11:22:34"}}')
    write("lease_attrs", "wireguard", '{"PublicIP":"203.0.113.5","PublicIPv6":null,"BackendType":"wireguard","BackendData":{"PublicKey":"dGhpcyBpcyBub3QgYSByZWFsIGtleSBhdCBhbGwgISE="}}')

    for n, k in [("v4", "10.244.1.0-24"), ("dual", "10.12.13.0-24&fd00:12:13::-56"), ("v6only", "0.0.0.0-0&fc00::-64"), ("prefixed", "flannel/10.244.9.0-24")]:
        write("subnet_key", n, k)

    write("subnet_env", "dual-stack", "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n")
    probe = b"WFPR" + bytes([1, 1]) + struct.pack("!HQQ", 0, 7, 123456789)
    write("probe_msg", "probe", probe)
    write("probe_msg", "probe-padded", probe + bytes(1400 - len(probe)))
    write("probe_msg", "ack", b"WFPR" + bytes([1, 2]) + struct.pack("!HQQ", 1400, 7, 123456789))
    nonce = bytes(range(16))
    write("disco_msg", "request", bytes([0xD1]) + b"WD" + bytes([1, 1, 0, 0, 0]) + nonce + bytes(24))
    write("disco_msg", "answer-v4", bytes([0xD1]) + b"WD" + bytes([1, 2, 0, 0, 0]) + nonce + bytes([4]) + struct.pack("!H", 40001) + bytes([203, 0, 113, 9]) + bytes(12 + 5))
    write("disco_msg", "answer-v6", bytes([0xD1]) + b"WD" + bytes([1, 2, 0, 0, 0]) + nonce + bytes([6]) + struct.pack("!H", 51820) + bytes([0x20, 1, 0xd, 0xb8]) + bytes(11) + bytes([5]) + bytes(5))
    write("disco_msg", "version-2", bytes([0xD1]) + b"WD" + bytes([2, 1, 0, 0, 0]) + nonce + bytes(24))
    write("disco_msg", "wireguard-data", bytes([4, 0, 0, 0]) + bytes(44))
    write("disco_msg", "keepalive", bytes([0xD1]) + b"WD" + bytes([1, 7, 0, 0, 0]))
    write("disco_msg", "vxlan-data", bytes([8, 0, 0, 0, 0, 0, 1, 0]) + bytes(40))
    magic = bytes([0xD1]) + b"WD" + bytes([1])
    write("relay_msg", "register-bad-mac", magic + bytes([3, 0, 0, 0]) + bytes(range(32)) + struct.pack("!Q", 1765000000123) + bytes(16))
    write("relay_msg", "ack", magic + bytes([4, 0, 0, 0]) + struct.pack("!Q", 7) + bytes(range(16)))
    write("relay_msg", "unknown-kind", magic + bytes([9, 0, 0, 0]) + bytes(40))
    write("relay_msg", "wg-initiation", bytes([1, 0, 0, 0]) + struct.pack("<I", 0x100) + bytes(140))
    write("relay_msg", "wg-response", bytes([2, 0, 0, 0]) + struct.pack("<II", 0x200, 0x100) + bytes(80))
    write("relay_msg", "wg-data", bytes([4, 0, 0, 0]) + struct.pack("<I", 0x200) + bytes(40))
    # Direct probes: valid ones between the target's keys [2; 32] (A) and
    # [3; 32] (the answering node), as Probe::new builds them (X25519 +
    # BLAKE2s, printed once from Rust), and a bad MAC.
    write("direct_msg", "probe-from-a", bytes.fromhex("d157440105000000ce8d3ad1ccb633ec7b70c17814a5c76ecd029685050d344745ba05870e587d590000000000000005f702d55229b05b2a987e1577e65ae00f"))
    write("direct_msg", "ack-from-a", bytes.fromhex("d157440106000000ce8d3ad1ccb633ec7b70c17814a5c76ecd029685050d344745ba05870e587d59000000000000000700b4cfddfcf4ffb30dcb040742bd3d2c"))
    write("direct_msg", "probe-bad-mac", magic + bytes([5, 0, 0, 0]) + bytes(range(32)) + struct.pack("!Q", 1765000000123) + bytes(16))
    write("direct_msg", "register", magic + bytes([3, 0, 0, 0]) + bytes(range(32)) + struct.pack("!Q", 1765000000123) + bytes(16))
    write("direct_msg", "ack-short", magic + bytes([6, 0, 0, 0]) + bytes(40))
    write("probe_msg", "version-2", b"WFPR" + bytes([2, 1]) + struct.pack("!HQQ", 0, 7, 1))
    write("subnet_env", "v4", "FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.7.1/24\nFLANNEL_MTU=1472\nFLANNEL_IPMASQ=false\n")
    write("subnet_env", "godotenv-quirks", "# written by hand\nexport FLANNEL_NETWORK='10.244.0.0/16'\nFLANNEL_SUBNET=\"10.244.3.1/24,bogus\"\nFLANNEL_MTU = 1450\r\nFLANNEL_IPMASQ=true # comment\n")

    body = "C " + '"{\\"Network\\":\\"10.244.0.0/16\\",\\"Backend\\":{\\"Type\\":\\"vxlan\\"}}"' + "\n"
    body += "L 10.244.1.0-24 1767225600000 " + LEASE_VXLAN + "\n"
    body += "L 10.244.2.0-24 - " + LEASE_VXLAN.replace("192.168.64.3", "192.168.64.4") + "\n"
    head = "weft-store 1 42 %d " % len(body.encode())
    full = head + "%016x\n" % fnv1a64((head + body).encode()) + body
    write("store_file", "full-file", b"\0" + full.encode())
    write("store_file", "body-only", b"\x55" + body.encode())
    write("store_file", "truncated", b"\0" + full.encode()[: len(full) - 30])

    write("vxlan_backend_data", "flannel", '{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}')
    write("vxlan_backend_data", "go-case-dashes", '{"vni":4096,"vtepmac":"C6-D2-32-6F-8F-44","Extra":[1,2]}')


def cni():
    conf = '{"cniVersion":"1.0.0","name":"cbr0","type":"flannel","delegate":{"hairpinMode":true,"isDefaultGateway":true}}'
    write("cni_command", "add", b"\0" + conf.encode())
    write("cni_command", "version", b"\x05" + b'{"cniVersion":"1.1.0"}')
    gc = '{"cniVersion":"1.1.0","name":"cbr0","type":"flannel","cni.dev/valid-attachments":[{"containerID":"abc","ifname":"eth0"}]}'
    write("cni_command", "gc", b"\x03" + gc.encode())
    write("cni_command", "env-override-bad-ifname", b"\x80" + b"CNI_IFNAME=eth0/x\nCNI_CONTAINERID=-bad\n\n" + conf.encode())
    prev = '{"cniVersion":"0.4.0","name":"cbr0","type":"flannel","prevResult":{"cniVersion":"0.4.0","ips":[{"version":"4","address":"10.244.1.5/24"}]}}'
    write("cni_command", "check-prevresult", b"\x02" + prev.encode())

    env = b"\0FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=true\n"
    write("cni_config", "default", conf.encode() + env)
    write("cni_config", "ipam-routes", b'{"cniVersion":"0.3.1","name":"n","ipam":{"routes":[{"dst":"192.168.0.0/16","gw":"10.244.1.1"}]},"runtimeConfig":{"portMappings":[{"hostPort":80,"containerPort":8080}]}}')
    write("cni_config", "dual-stack-env", conf.encode() + b"\0FLANNEL_NETWORK=10.244.0.0/16\nFLANNEL_SUBNET=10.244.1.1/24\nFLANNEL_IPV6_NETWORK=fc00::/48,fd00::/48\nFLANNEL_IPV6_SUBNET=fc00:0:0:1::1/64\nFLANNEL_MTU=1450\nFLANNEL_IPMASQ=false\n")
    write("cni_config", "delegate-bad", b'{"name":"n","delegate":{"type":7,"ipam":{}}}')


def node(name, cidrs, ann, v6=False):
    import json

    spec = {"podCIDR": cidrs[0], "podCIDRs": cidrs}
    return json.dumps({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "annotations": ann, "labels": {"kubernetes.io/hostname": name}}, "spec": spec, "status": {"addresses": [{"type": "InternalIP", "address": "192.0.2.11"}]}})


def kube():
    p = "flannel.alpha.coreos.com/"
    vx = {p + "backend-data": '{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:44"}', p + "backend-type": "vxlan", p + "kube-subnet-manager": "true", p + "public-ip": "192.0.2.11"}
    write("node_annotations", "flannel-vxlan", node("worker-1", ["10.244.1.0/24"], vx))
    dual = dict(vx)
    dual.update({p + "backend-v6-data": '{"VNI":1,"VtepMAC":"c6:d2:32:6f:8f:45"}', p + "public-ipv6": "2001:db8::11", p + "public-ip-overwrite": "198.51.100.11"})
    write("node_annotations", "dual-stack-overwrite", node("worker-2", ["10.244.2.0/24", "fc00:0:0:2::/64"], dual))
    hg = {p + "backend-data": "null", p + "backend-type": "host-gw", p + "kube-subnet-manager": "true", p + "public-ip": "203.0.113.4", p + "node-public-ip": "bogus"}
    write("node_annotations", "host-gw-null-data", node("worker-3", ["10.244.3.0/24"], hg))


def ipip_vici():
    outer = lambda inner, tos=0: ipv4(ip4("192.0.2.11"), ip4("192.0.2.12"), 4, inner, ttl=63)[:1] + bytes([tos]) + ipv4(ip4("192.0.2.11"), ip4("192.0.2.12"), 4, inner, ttl=63)[2:]
    write("ipip_decap", "icmp-echo", ipv4(ip4("192.0.2.11"), ip4("192.0.2.12"), 4, icmp4_echo(A, B), ttl=63))
    ect = bytearray(tcp4(A, B, 1, payload(3000)))
    ect[1] = 0x02  # ECT(0)
    ect[10:12] = b"\0\0"
    ect[10:12] = struct.pack("!H", csum(bytes(ect[:20])))
    write("ipip_decap", "ce-on-ect-oversize-tcp", outer(bytes(ect), tos=0x03))
    write("ipip_decap", "udp-partial", ipv4(ip4("192.0.2.11"), ip4("192.0.2.12"), 4, udp4(A, B, payload(64), mode="partial")))

    def name(n):
        return bytes([len(n)]) + n.encode()

    def kv(k, v):
        return b"\x03" + name(k) + struct.pack("!H", len(v)) + v.encode()

    def lst(k, items):
        return b"\x04" + name(k) + b"".join(b"\x05" + struct.pack("!H", len(i)) + i.encode() for i in items) + b"\x06"

    def sec(k, body):
        return b"\x01" + name(k) + body + b"\x02"

    child = sec("children", sec("weft", kv("mode", "tunnel") + lst("local_ts", ["10.244.1.0/24"]) + lst("remote_ts", ["10.244.2.0/24"])))
    conn = sec("weft-192.0.2.12", kv("version", "2") + lst("local_addrs", ["192.0.2.11"]) + lst("remote_addrs", ["192.0.2.12"]) + sec("local", kv("auth", "psk")) + child)
    write("vici", "load-conn-request", b"\x00" + name("load-conn") + conn)
    write("vici", "response-success", b"\x01" + kv("success", "yes"))
    write("vici", "event-ike-updown", b"\x07" + name("ike-updown") + kv("up", "yes") + sec("weft-192.0.2.12", kv("state", "ESTABLISHED")))
    write("vici", "event-register", b"\x03" + name("ike-updown"))


if __name__ == "__main__":
    engine()
    control()
    cni()
    kube()
    ipip_vici()
