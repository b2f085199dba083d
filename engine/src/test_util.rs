//! Packet builders shared by the unit tests (etherparse does the reference encoding).

use etherparse::PacketBuilder;

/// TCP timestamp option (NOP, NOP, TS) as Linux sends it.
pub const TS_OPTS: [u8; 12] = [1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 2];

/// An IPv4 TCP packet with ACK (+PSH when `psh`) and timestamp options.
pub fn tcp4(src: [u8; 4], dst: [u8; 4], seq: u32, payload: &[u8], psh: bool) -> Vec<u8> {
    let b = PacketBuilder::ipv4(src, dst, 64)
        .tcp(40000, 5201, seq, 502)
        .ack(77)
        .options_raw(&TS_OPTS);
    let b = match b {
        Ok(b) => b,
        Err(e) => panic!("options: {e:?}"),
    };
    let b = if psh { b.psh() } else { b };
    let mut out = Vec::new();
    b.write(&mut out, payload).expect("build");
    out
}

/// An IPv6 TCP packet with ACK and timestamp options.
pub fn tcp6(seq: u32, payload: &[u8], psh: bool) -> Vec<u8> {
    let src = [0xfd, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let dst = [0xfd, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1];
    let b = PacketBuilder::ipv6(src, dst, 64)
        .tcp(40000, 5201, seq, 502)
        .ack(77)
        .options_raw(&TS_OPTS);
    let b = match b {
        Ok(b) => b,
        Err(e) => panic!("options: {e:?}"),
    };
    let b = if psh { b.psh() } else { b };
    let mut out = Vec::new();
    b.write(&mut out, payload).expect("build");
    out
}

/// An IPv4 UDP packet.
pub fn udp4(src: [u8; 4], dst: [u8; 4], ttl: u8, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    PacketBuilder::ipv4(src, dst, ttl)
        .udp(1234, 5678)
        .write(&mut out, payload)
        .expect("build");
    out
}

/// Deterministic pseudo-random payload.
pub fn payload(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            (x & 0xff) as u8
        })
        .collect()
}

/// Asserts `pkt` is a valid TCP/IP packet (both checksums) and returns (seq, flags, payload).
pub fn check_tcp(pkt: &[u8]) -> (u32, u8, Vec<u8>) {
    let s = etherparse::SlicedPacket::from_ip(pkt).expect("parse");
    let Some(etherparse::TransportSlice::Tcp(t)) = s.transport else {
        panic!("not tcp")
    };
    match s.net {
        Some(etherparse::NetSlice::Ipv4(ip)) => {
            let h = ip.header().to_header();
            assert_eq!(
                h.calc_header_checksum(),
                h.header_checksum,
                "ipv4 header checksum"
            );
            let c = t.calc_checksum_ipv4(h.source, h.destination).expect("csum");
            assert_eq!(c, t.checksum(), "tcp checksum");
        }
        Some(etherparse::NetSlice::Ipv6(ip)) => {
            let h = ip.header().to_header();
            let c = t.calc_checksum_ipv6(h.source, h.destination).expect("csum");
            assert_eq!(c, t.checksum(), "tcp checksum");
        }
        _ => panic!("not ip"),
    }
    (
        t.sequence_number(),
        pkt_flags(t.slice()),
        t.payload().to_vec(),
    )
}

fn pkt_flags(tcp: &[u8]) -> u8 {
    tcp[13]
}

/// A classic BPF interpreter for the instructions weft's socket filters and
/// steering programs use; out-of-bounds loads abort with 0, as in the kernel.
pub fn run_cbpf(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
    let (mut a, mut x, mut m) = (0u32, 0u32, [0u32; 16]);
    let mut pc = 0;
    let load = |at: usize, size: usize| -> Option<u32> {
        let b = pkt.get(at..at.checked_add(size)?)?;
        Some(b.iter().fold(0u32, |acc, v| (acc << 8) | u32::from(*v)))
    };
    loop {
        let i = prog[pc];
        let code = u32::from(i.code);
        pc += 1;
        let k = i.k;
        let class = code & 0x07;
        match class {
            c if c == libc::BPF_LD || c == libc::BPF_LDX => {
                let size = match code & 0x18 {
                    s if s == libc::BPF_W => 4,
                    s if s == libc::BPF_H => 2,
                    _ => 1,
                };
                let v = match code & 0xe0 {
                    md if md == libc::BPF_ABS => load(k as usize, size),
                    md if md == libc::BPF_IND => load((x.wrapping_add(k)) as usize, size),
                    md if md == libc::BPF_LEN => Some(u32::try_from(pkt.len()).expect("len")),
                    md if md == libc::BPF_MEM => Some(m[k as usize]),
                    md if md == libc::BPF_IMM => Some(k),
                    md if md == libc::BPF_MSH => load(k as usize, 1).map(|b| 4 * (b & 0xf)),
                    md => panic!("mode {md:#x}"),
                };
                let Some(v) = v else { return 0 };
                if class == libc::BPF_LD {
                    a = v;
                } else {
                    x = v;
                }
            }
            c if c == libc::BPF_ST => m[k as usize] = a,
            c if c == libc::BPF_ALU => {
                let src = if code & libc::BPF_X != 0 { x } else { k };
                a = match code & 0xf0 {
                    o if o == libc::BPF_ADD => a.wrapping_add(src),
                    o if o == libc::BPF_XOR => a ^ src,
                    o if o == libc::BPF_RSH => a >> src,
                    o if o == libc::BPF_MOD => a % src,
                    o if o == libc::BPF_MUL => a.wrapping_mul(src),
                    o => panic!("alu {o:#x}"),
                };
            }
            c if c == libc::BPF_JMP => {
                let src = if code & libc::BPF_X != 0 { x } else { k };
                let taken = match code & 0xf0 {
                    o if o == libc::BPF_JA => true,
                    o if o == libc::BPF_JEQ => a == src,
                    o if o == libc::BPF_JGE => a >= src,
                    o if o == libc::BPF_JSET => a & src != 0,
                    o => panic!("jmp {o:#x}"),
                };
                pc += match code & 0xf0 {
                    o if o == libc::BPF_JA => k as usize,
                    _ => usize::from(if taken { i.jt } else { i.jf }),
                };
            }
            c if c == libc::BPF_RET => return if code & 0x18 == libc::BPF_A { a } else { k },
            c if c == libc::BPF_MISC => {
                if code & 0xf8 == libc::BPF_TAX {
                    x = a;
                } else {
                    a = x;
                }
            }
            c => panic!("class {c:#x}"),
        }
    }
}
