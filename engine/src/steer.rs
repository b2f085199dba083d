//! Flow steering for the flannel-UDP / VXLAN receive sockets: a classic BPF
//! program for the workers' `SO_REUSEPORT` group that picks the worker from a
//! symmetric hash of the *inner* flow (addresses xor, TCP/UDP ports xor).
//!
//! Why: without it the kernel picks the worker from the outer 4-tuple, whose
//! source port is one of the *sending* worker's sockets. A TCP flow's data and
//! its ACKs then land on workers that depend on which worker sent them, and
//! the TUN's automatic queue selection (it sends a flow to the queue that last
//! wrote it) moves the flow between workers while segments are in flight on
//! both. The receiver sees reordering; TCP answers with spurious fast
//! retransmits (bursts of tens of thousands per 5 s measured with two workers).
//! With the inner hash, both directions of a flow are received - and so
//! written to the TUN, and so read from it - by one worker on each node,
//! whatever the outer ports.
//!
//! The program sees the UDP payload. Inner IPv4 without the protocol's ports
//! (not TCP/UDP) hashes the addresses only; IPv6 hashes the last 32 bits of
//! each address plus the ports when the next header is TCP/UDP (no extension
//! headers). Anything else returns an out-of-range index: the kernel falls
//! back to its own hash.

/// Classic BPF instructions of [`program`].
pub const LEN: usize = 47;

/// The multiplier of [`mix`] (2^32 / golden ratio).
pub const GOLDEN: u32 = 0x9e37_79b1;

/// The final step of weft's flow hashes (this program and the IPIP steering
/// filter): fold the upper half into the lower, multiply, keep the upper
/// half, modulo `n`. The fields are combined with xor, which keeps entropy
/// where the fields have it, and Linux gives `connect()` *even* ephemeral
/// ports: with a plain xor-fold and `% n`, every TCP connection between two
/// pods hashed to the same worker when there were two (measured: four iperf3
/// streams on one thread, the other idle). The multiplication carries every
/// bit of the folded low half into the bits the modulo reads.
#[inline]
pub fn mix(h: u32, n: u32) -> u32 {
    ((h ^ (h >> 16)).wrapping_mul(GOLDEN) >> 16) % n.max(1)
}

/// The steering program for inner packets at `inner_offset` bytes into the
/// UDP payload (0 for flannel-UDP, the VXLAN + Ethernet headroom for VXLAN),
/// returning a worker index below `workers`.
pub fn program(inner_offset: usize, workers: usize) -> [libc::sock_filter; LEN] {
    let n = u32::try_from(workers.max(1)).unwrap_or(1);
    let o = u32::try_from(inner_offset).unwrap_or(0);
    let op = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    };
    use libc::{
        BPF_A, BPF_ABS, BPF_ALU, BPF_B, BPF_H, BPF_IND, BPF_JA, BPF_JEQ, BPF_JMP, BPF_K, BPF_LD,
        BPF_LDX, BPF_MEM, BPF_MISC, BPF_MOD, BPF_MSH, BPF_MUL, BPF_RET, BPF_RSH, BPF_ST, BPF_TAX,
        BPF_W, BPF_X, BPF_XOR,
    };
    let (lda_b, lda_h, lda_w) = (
        BPF_LD | BPF_B | BPF_ABS,
        BPF_LD | BPF_H | BPF_ABS,
        BPF_LD | BPF_W | BPF_ABS,
    );
    let (st, ldm, ldxm) = (BPF_ST, BPF_LD | BPF_W | BPF_MEM, BPF_LDX | BPF_W | BPF_MEM);
    let (tax, xor_x, jeq) = (
        BPF_MISC | BPF_TAX,
        BPF_ALU | BPF_XOR | BPF_X,
        BPF_JMP | BPF_JEQ | BPF_K,
    );
    [
        // 0: A = IP version.
        op(lda_b, 0, 0, o),
        op(BPF_ALU | BPF_RSH | BPF_K, 0, 0, 4),
        op(jeq, 0, 18, 4), // v4: 3, else 21
        // 3: IPv4. M0 = saddr ^ daddr.
        op(lda_w, 0, 0, o + 12),
        op(tax, 0, 0, 0),
        op(lda_w, 0, 0, o + 16),
        op(xor_x, 0, 0, 0),
        op(st, 0, 0, 0),
        op(lda_b, 0, 0, o + 9),
        op(jeq, 1, 0, 6),   // TCP: 11
        op(jeq, 0, 27, 17), // UDP: 11, else MIX (38)
        // 11: X = IHL * 4; M0 ^= sport ^ dport.
        op(BPF_LDX | BPF_B | BPF_MSH, 0, 0, o),
        op(BPF_LD | BPF_H | BPF_IND, 0, 0, o),
        op(st, 0, 0, 1),
        op(BPF_LD | BPF_H | BPF_IND, 0, 0, o + 2),
        op(ldxm, 0, 0, 1),
        op(xor_x, 0, 0, 0),
        op(ldxm, 0, 0, 0),
        op(xor_x, 0, 0, 0),
        op(st, 0, 0, 0),
        op(BPF_JMP | BPF_JA, 0, 0, 17), // MIX (38)
        // 21: IPv6, else FALLBACK (46). M0 = low words of saddr ^ daddr.
        op(jeq, 0, 24, 6),
        op(lda_w, 0, 0, o + 20),
        op(tax, 0, 0, 0),
        op(lda_w, 0, 0, o + 36),
        op(xor_x, 0, 0, 0),
        op(st, 0, 0, 0),
        op(lda_b, 0, 0, o + 6),
        op(jeq, 1, 0, 6),  // TCP: 30
        op(jeq, 0, 8, 17), // UDP: 30, else MIX (38)
        // 30: M0 ^= sport ^ dport.
        op(lda_h, 0, 0, o + 40),
        op(st, 0, 0, 1),
        op(lda_h, 0, 0, o + 42),
        op(ldxm, 0, 0, 1),
        op(xor_x, 0, 0, 0),
        op(ldxm, 0, 0, 0),
        op(xor_x, 0, 0, 0),
        op(st, 0, 0, 0),
        // 38: MIX: A = mix(M0, n) (see [`mix`]).
        op(ldm, 0, 0, 0),
        op(tax, 0, 0, 0),
        op(BPF_ALU | BPF_RSH | BPF_K, 0, 0, 16),
        op(xor_x, 0, 0, 0),
        op(BPF_ALU | BPF_MUL | BPF_K, 0, 0, GOLDEN),
        op(BPF_ALU | BPF_RSH | BPF_K, 0, 0, 16),
        op(BPF_ALU | BPF_MOD | BPF_K, 0, 0, n),
        op(BPF_RET | BPF_A, 0, 0, 0),
        // 46: FALLBACK: out of range, the kernel hashes.
        op(BPF_RET | BPF_K, 0, 0, u32::MAX),
    ]
}

#[cfg(test)]
#[path = "steer_tests.rs"]
mod tests;
