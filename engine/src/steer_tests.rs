use super::*;

/// A classic BPF interpreter for the instructions [`program`] uses, with the
/// kernel's rule that an out-of-bounds load ends the program returning 0.
fn run(prog: &[libc::sock_filter], pkt: &[u8]) -> u32 {
    let (mut a, mut x, mut m) = (0u32, 0u32, [0u32; 16]);
    let load = |at: usize, size: usize| -> Option<u32> {
        let b = pkt.get(at..at + size)?;
        Some(b.iter().fold(0u32, |v, &y| (v << 8) | u32::from(y)))
    };
    let mut pc = 0;
    loop {
        let i = prog[pc];
        let code = u32::from(i.code);
        let k = i.k as usize;
        pc += 1;
        let class = code & 0x07;
        match class {
            c if c == libc::BPF_LD => {
                let size = match code & 0x18 {
                    s if s == libc::BPF_W => 4,
                    s if s == libc::BPF_H => 2,
                    _ => 1,
                };
                a = match code & 0xe0 {
                    md if md == libc::BPF_ABS => match load(k, size) {
                        Some(v) => v,
                        None => return 0,
                    },
                    md if md == libc::BPF_IND => match load(x as usize + k, size) {
                        Some(v) => v,
                        None => return 0,
                    },
                    md if md == libc::BPF_MEM => m[k],
                    _ => panic!("ld mode {code:#x}"),
                };
            }
            c if c == libc::BPF_LDX => {
                x = match code & 0xe0 {
                    md if md == libc::BPF_MSH => match load(k, 1) {
                        Some(v) => 4 * (v & 0x0f),
                        None => return 0,
                    },
                    md if md == libc::BPF_MEM => m[k],
                    _ => panic!("ldx mode {code:#x}"),
                };
            }
            c if c == libc::BPF_ST => m[k] = a,
            c if c == libc::BPF_MISC => x = a,
            c if c == libc::BPF_ALU => {
                let src = if code & 0x08 == libc::BPF_X { x } else { i.k };
                a = match code & 0xf0 {
                    o if o == libc::BPF_RSH => a >> src,
                    o if o == libc::BPF_XOR => a ^ src,
                    o if o == libc::BPF_MOD => a % src,
                    _ => panic!("alu {code:#x}"),
                };
            }
            c if c == libc::BPF_JMP => {
                if code & 0xf0 == libc::BPF_JA {
                    pc += k;
                } else {
                    pc += usize::from(if a == i.k { i.jt } else { i.jf });
                }
            }
            c if c == libc::BPF_RET => {
                return if code & 0x18 == libc::BPF_A { a } else { i.k };
            }
            _ => panic!("class {code:#x}"),
        }
    }
}

fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, sport: u16, dport: u16, ihl: u8) -> Vec<u8> {
    let hl = usize::from(ihl) * 4;
    let mut p = vec![0u8; hl + 20];
    p[0] = 0x40 | ihl;
    p[9] = proto;
    p[12..16].copy_from_slice(&src);
    p[16..20].copy_from_slice(&dst);
    p[hl..hl + 2].copy_from_slice(&sport.to_be_bytes());
    p[hl + 2..hl + 4].copy_from_slice(&dport.to_be_bytes());
    p
}

fn v6(src: [u8; 16], dst: [u8; 16], sport: u16, dport: u16) -> Vec<u8> {
    let mut p = vec![0u8; 60];
    p[0] = 0x60;
    p[6] = 6;
    p[8..24].copy_from_slice(&src);
    p[24..40].copy_from_slice(&dst);
    p[40..42].copy_from_slice(&sport.to_be_bytes());
    p[42..44].copy_from_slice(&dport.to_be_bytes());
    p
}

fn framed(off: usize, inner: &[u8]) -> Vec<u8> {
    let mut d = vec![0xeeu8; off];
    d.extend_from_slice(inner);
    d
}

#[test]
fn both_directions_of_a_flow_pick_the_same_worker() {
    for off in [0, crate::encap::VXLAN_HEADROOM] {
        for workers in [2, 3, 4, 7] {
            let prog = program(off, workers);
            for port in 40000..40200u16 {
                for proto in [6, 17] {
                    let there = framed(
                        off,
                        &v4([10, 244, 1, 2], [10, 244, 2, 3], proto, port, 5201, 5),
                    );
                    let back = framed(
                        off,
                        &v4([10, 244, 2, 3], [10, 244, 1, 2], proto, 5201, port, 5),
                    );
                    let w = run(&prog, &there);
                    assert!(w < workers as u32, "index {w} of {workers}");
                    assert_eq!(w, run(&prog, &back), "port {port} proto {proto}");
                }
                let mut s = [0u8; 16];
                s[0] = 0xfd;
                s[15] = 2;
                let mut d = s;
                d[15] = 3;
                d[14] = 1;
                let there = framed(off, &v6(s, d, port, 443));
                let back = framed(off, &v6(d, s, 443, port));
                let w = run(&prog, &there);
                assert!(w < workers as u32);
                assert_eq!(w, run(&prog, &back));
            }
        }
    }
}

#[test]
fn flows_spread_over_workers_and_ports_follow_the_header_length() {
    let prog = program(0, 4);
    let mut seen = [0usize; 4];
    for port in 40000..40400u16 {
        let w = run(
            &prog,
            &v4([10, 244, 1, 2], [10, 244, 2, 3], 6, port, 5201, 5),
        );
        seen[w as usize] += 1;
    }
    assert!(seen.iter().all(|&c| c > 40), "{seen:?}");
    // With IP options the ports move: still symmetric, still in range.
    let a = run(&prog, &v4([10, 0, 0, 1], [10, 0, 0, 2], 6, 1234, 80, 6));
    let b = run(&prog, &v4([10, 0, 0, 2], [10, 0, 0, 1], 6, 80, 1234, 6));
    assert_eq!(a, b);
    // ICMP: addresses only, whatever follows.
    let mut p = v4([10, 0, 0, 1], [10, 0, 0, 2], 1, 1, 2, 5);
    let w = run(&prog, &p);
    p[20..24].copy_from_slice(&[9, 9, 9, 9]);
    assert_eq!(w, run(&prog, &p));
}

#[test]
fn non_ip_falls_back_to_the_kernel_hash() {
    let prog = program(0, 2);
    assert_eq!(run(&prog, &[0x00; 64]), u32::MAX);
    assert_eq!(run(&prog, &[0x50; 64]), u32::MAX);
    // Too short: the kernel ends the program with 0, a valid index.
    assert_eq!(run(&prog, &[0x45, 0, 0]), 0);
}

#[test]
fn the_kernel_accepts_the_program() {
    use crate::sys::udp::Udp;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
    let s = Udp::bind(addr, true, true, 1 << 16).expect("bind a loopback socket");
    for off in [0, crate::encap::VXLAN_HEADROOM] {
        s.attach_reuseport_cbpf(&program(off, 3))
            .expect("SO_ATTACH_REUSEPORT_CBPF rejected the program");
    }
}
