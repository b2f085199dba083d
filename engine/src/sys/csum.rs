//! Internet checksum inner loop with AVX2 (x86-64), chosen at run time.
//!
//! Not a syscall, but `unsafe` all the same: calling a
//! `#[target_feature(enable = "avx2")]` function is only sound once the CPU is
//! known to support it, which [`wide_sum`] checks (`is_x86_feature_detected!`
//! caches the answer in a static, so the check is one load per call).
//!
//! The loop adds native-order 32-bit words into 64-bit lanes: no carries to
//! propagate, so the compiler vectorises it (8 lanes, 32 bytes per step).
//! The sum of 32-bit words is congruent to the one's complement sum of the
//! 16-bit words modulo `0xffff`, so folding the result to 16 bits gives the
//! same checksum as the scalar loop in [`crate::wire::checksum`].

/// Sum of `data` as native-order 32-bit words (the tail zero-padded), unfolded;
/// `None` when the CPU has no AVX2 (the caller then uses its scalar loop).
/// Exact for inputs up to 4 GiB (every lane stays below 2^61).
#[cfg(target_arch = "x86_64")]
#[inline]
pub fn wide_sum(data: &[u8]) -> Option<u64> {
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU supports AVX2 (checked just above); the function
        // only reads `data` through safe slice operations.
        Some(unsafe { sum_avx2(data) })
    } else {
        None
    }
}

/// Without x86-64 there is no vector loop: the caller uses its scalar one.
#[cfg(not(target_arch = "x86_64"))]
#[inline]
pub fn wide_sum(_data: &[u8]) -> Option<u64> {
    None
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn sum_avx2(data: &[u8]) -> u64 {
    let word = |c: &[u8], i: usize| {
        u64::from(u32::from_ne_bytes([
            c[4 * i],
            c[4 * i + 1],
            c[4 * i + 2],
            c[4 * i + 3],
        ]))
    };
    let mut acc = [0u64; 8];
    let mut chunks = data.chunks_exact(32);
    for c in &mut chunks {
        for (i, a) in acc.iter_mut().enumerate() {
            *a += word(c, i);
        }
    }
    let rest = chunks.remainder();
    let mut tail = [0u8; 32];
    tail[..rest.len()].copy_from_slice(rest);
    for (i, a) in acc.iter_mut().enumerate() {
        *a += word(&tail, i);
    }
    acc.iter().sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_a_plain_word_sum() {
        let data: Vec<u8> = (0..2000u32)
            .map(|i| (i.wrapping_mul(197) ^ 0x5a) as u8)
            .collect();
        for len in [0, 1, 3, 31, 32, 33, 64, 100, 1448, 1449, 2000] {
            let Some(got) = wide_sum(&data[..len]) else {
                return; // no AVX2 here: nothing to compare
            };
            let mut padded = data[..len].to_vec();
            padded.resize(len.div_ceil(4) * 4, 0);
            let want: u64 = padded
                .chunks_exact(4)
                .map(|c| u64::from(u32::from_ne_bytes([c[0], c[1], c[2], c[3]])))
                .sum();
            assert_eq!(got, want, "len {len}");
        }
    }
}
