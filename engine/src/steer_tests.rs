use super::*;
use crate::test_util::run_cbpf as run;

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

/// Linux hands `connect()` even ephemeral ports, so the connections of one
/// client to one server differ in the upper 15 bits of one port only; they
/// must still use every worker (with a plain xor-fold and two workers they
/// all landed on worker 0, measured: four iperf3 streams on one thread).
#[test]
fn connections_with_even_source_ports_use_every_worker() {
    for (off, workers) in [(0, 2), (crate::encap::VXLAN_HEADROOM, 2), (0, 3), (0, 4)] {
        let prog = program(off, workers);
        let mut seen = vec![0usize; workers];
        for port in (40000..40400u16).step_by(2) {
            let p = framed(off, &v4([10, 244, 1, 2], [10, 244, 2, 3], 6, port, 5201, 5));
            seen[run(&prog, &p) as usize] += 1;
        }
        // The program computes `mix` of the xor of the flow's fields.
        let p = framed(
            off,
            &v4([10, 244, 1, 2], [10, 244, 2, 3], 6, 40002, 5201, 5),
        );
        let h = u32::from_be_bytes([10, 244, 1, 2])
            ^ u32::from_be_bytes([10, 244, 2, 3])
            ^ 40002
            ^ 5201;
        assert_eq!(run(&prog, &p), mix(h, workers as u32));
        let fair = 200 / workers;
        assert!(
            seen.iter().all(|&c| c > fair / 2),
            "{off} {workers}: {seen:?}"
        );
        // Four connections in a row (iperf3 -P 4) do not all share one worker.
        for first in (40000..40100u16).step_by(2) {
            let ws: Vec<u32> = (0..4)
                .map(|i| {
                    let p = framed(
                        off,
                        &v4([10, 244, 1, 2], [10, 244, 2, 3], 6, first + 2 * i, 5201, 5),
                    );
                    run(&prog, &p)
                })
                .collect();
            if workers == 2 {
                assert!(ws.iter().any(|&w| w != ws[0]), "ports from {first}: {ws:?}");
            }
        }
    }
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
