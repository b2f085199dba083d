//! Internet checksum (RFC 1071) helpers.
//!
//! All sums are 16-bit one's complement values carried in a `u32` in network
//! (big-endian) numeric order, folded to at most `0xffff`, so that callers can
//! combine partial sums with [`combine`] and finish with [`finish`]. The inner
//! loop reads 8 bytes at a time in native order; one's complement addition is
//! byte-order independent, so the folded result is converted once at the end.
//! Inputs of 128 bytes and more (payloads) go to the AVX2 loop in
//! `sys::csum` when the CPU has AVX2 (same result, about 3x faster).

use std::net::IpAddr;

/// One's complement sum of `data` (not complemented), folded to 16 bits.
///
/// An odd trailing byte is padded with zero as RFC 1071 requires. The result is
/// only meaningful when `data` starts at an even offset of the checksummed
/// region, which holds for every header and payload boundary we use.
#[inline]
pub fn sum(data: &[u8]) -> u32 {
    // Payload-sized inputs: the AVX2 loop when the CPU has it (~3x the scalar speed).
    if data.len() >= WIDE_MIN
        && let Some(acc) = crate::sys::csum::wide_sum(data)
    {
        return fold(acc);
    }
    let mut acc: u64 = 0;
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        // Four independent carry chains let the CPU overlap the additions.
        let w = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&c[i..i + 8]);
            u64::from_ne_bytes(b)
        };
        let (s0, c0) = w(0).overflowing_add(w(8));
        let (s1, c1) = w(16).overflowing_add(w(24));
        let (s, c2) = s0.overflowing_add(s1);
        let (a, c3) = acc.overflowing_add(s);
        // Up to four carries: adding them back can carry once more (then `a <= 3`).
        let carries = u64::from(c0) + u64::from(c1) + u64::from(c2) + u64::from(c3);
        let (a, c4) = a.overflowing_add(carries);
        acc = a + u64::from(c4);
    }
    let mut rest = chunks.remainder();
    while rest.len() >= 8 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&rest[..8]);
        let (a, c) = acc.overflowing_add(u64::from_ne_bytes(b));
        acc = a + u64::from(c);
        rest = &rest[8..];
    }
    let mut tail = [0u8; 8];
    tail[..rest.len()].copy_from_slice(rest);
    let (a, c) = acc.overflowing_add(u64::from_ne_bytes(tail));
    acc = a + u64::from(c);
    fold(acc)
}

/// Inputs at least this long go to the vector loop (shorter ones: headers).
const WIDE_MIN: usize = 128;

/// Folds a native-order 64-bit one's complement accumulator to 16 bits in network order.
#[inline]
fn fold(acc: u64) -> u32 {
    // Fold 64 -> 16 bits in native order, then convert to network order.
    let mut s = (acc & 0xffff_ffff) + (acc >> 32);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    s = (s & 0xffff) + (s >> 16);
    let native = u16::try_from(s & 0xffff).unwrap_or(0);
    u32::from(u16::from_be(native))
}

/// Adds two folded partial sums.
#[inline]
pub fn combine(a: u32, b: u32) -> u32 {
    let s = a + b;
    (s & 0xffff) + (s >> 16)
}

/// Complements a folded sum into the value stored in a checksum field.
#[inline]
pub fn finish(s: u32) -> u16 {
    !(u16::try_from(combine(s, 0) & 0xffff).unwrap_or(0))
}

/// Checksum field value for `data` (e.g. an IPv4 header with its checksum field zeroed).
#[inline]
pub fn checksum(data: &[u8]) -> u16 {
    finish(sum(data))
}

/// [`sum`] for an address (4 or 16 bytes): big-endian words added in a
/// register. Inlined with a constant length this is a handful of
/// instructions; the general loop paid a call and a variable-length tail
/// copy, twice per segment in userspace GSO and GRO.
#[inline]
fn word_sum(b: &[u8]) -> u32 {
    let mut acc: u32 = 0;
    let mut words = b.chunks_exact(2);
    for w in &mut words {
        acc += u32::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        acc += u32::from(*last) << 8;
    }
    // Up to 8 words of at most 0xffff (and any length below 64 Ki words): no overflow.
    acc = (acc & 0xffff) + (acc >> 16);
    (acc & 0xffff) + (acc >> 16)
}

/// Pseudo-header sum for IPv4 (RFC 793/768): addresses, protocol and L4 length.
#[inline]
pub fn pseudo_v4(src: &[u8], dst: &[u8], proto: u8, len: u32) -> u32 {
    let mut s = word_sum(src);
    s = combine(s, word_sum(dst));
    s = combine(s, u32::from(proto));
    combine(s, (len & 0xffff) + (len >> 16))
}

/// Pseudo-header sum for IPv6 (RFC 8200 §8.1).
#[inline]
pub fn pseudo_v6(src: &[u8], dst: &[u8], proto: u8, len: u32) -> u32 {
    pseudo_v4(src, dst, proto, len)
}

/// Pseudo-header sum from typed addresses (tests and slow paths).
pub fn pseudo(src: IpAddr, dst: IpAddr, proto: u8, len: u32) -> u32 {
    match (src, dst) {
        (IpAddr::V4(s), IpAddr::V4(d)) => pseudo_v4(&s.octets(), &d.octets(), proto, len),
        (IpAddr::V6(s), IpAddr::V6(d)) => pseudo_v6(&s.octets(), &d.octets(), proto, len),
        _ => 0,
    }
}

/// Incrementally updates checksum field `old_csum` when a 16-bit word changes
/// from `old` to `new` (RFC 1624, eqn. 3: `HC' = ~(~HC + ~m + m')`).
#[inline]
pub fn update16(old_csum: u16, old: u16, new: u16) -> u16 {
    let s = combine(u32::from(!old_csum), u32::from(!old));
    finish(combine(s, u32::from(new)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn word_sum_matches_sum() {
        for len in 0..=40usize {
            let d: Vec<u8> = (0..len)
                .map(|i| (i as u8).wrapping_mul(97).wrapping_add(200))
                .collect();
            assert_eq!(word_sum(&d), sum(&d), "len {len}");
        }
        assert_eq!(word_sum(&[0xff; 16]), sum(&[0xff; 16]));
    }

    fn reference(data: &[u8]) -> u32 {
        let mut s: u32 = 0;
        for c in data.chunks(2) {
            let w = if c.len() == 2 {
                u16::from_be_bytes([c[0], c[1]])
            } else {
                u16::from_be_bytes([c[0], 0])
            };
            s += u32::from(w);
            s = (s & 0xffff) + (s >> 16);
        }
        s
    }

    #[test]
    fn sum_matches_reference_for_all_lengths() {
        let data: Vec<u8> = (0..1600u32)
            .map(|i| (i.wrapping_mul(151) ^ 0xa5) as u8)
            .collect();
        for len in 0..data.len() {
            let a = sum(&data[..len]);
            let b = reference(&data[..len]);
            // 0x0000 and 0xffff are both zero in one's complement.
            assert!(
                a == b || (a.is_multiple_of(0xffff) && b.is_multiple_of(0xffff)),
                "len {len}: {a:#x} != {b:#x}"
            );
        }
    }

    #[test]
    fn end_around_carries_that_carry_again() {
        // Found by the `tun_tx` fuzz target: after a chunk summing to 1, an
        // all-ones chunk leaves `a = 2^64 - 3` plus three carries, which
        // overflowed (a panic in debug builds, a checksum off by one in release).
        let mut data = vec![0u8; 32];
        data[0] = 1;
        data.extend_from_slice(&[0xff; 64]);
        for len in [64, 96] {
            let (a, b) = (sum(&data[..len]), reference(&data[..len]));
            assert!(
                a == b || (a.is_multiple_of(0xffff) && b.is_multiple_of(0xffff)),
                "len {len}: {a:#x} != {b:#x}"
            );
        }
    }

    #[test]
    fn rfc1071_example() {
        // RFC 1071 §3 example: 00 01 f2 03 f4 f5 f6 f7 sums to ddf2.
        assert_eq!(
            sum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            0xddf2
        );
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
    }

    #[test]
    fn incremental_update_equals_recompute() {
        let mut hdr = [
            0x45u8, 0, 0, 60, 0x12, 0x34, 0x40, 0, 64, 6, 0, 0, 10, 0, 0, 1, 10, 0, 0, 2,
        ];
        let c = checksum(&hdr);
        hdr[10..12].copy_from_slice(&c.to_be_bytes());
        let old = u16::from_be_bytes([hdr[8], hdr[9]]);
        hdr[8] -= 1;
        let new = u16::from_be_bytes([hdr[8], hdr[9]]);
        let inc = update16(c, old, new);
        hdr[10..12].fill(0);
        assert_eq!(inc, checksum(&hdr));
    }
}
