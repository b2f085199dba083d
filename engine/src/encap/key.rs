//! WireGuard keys as `wg` and Go's `wgtypes.Key.String()` print them
//! (standard, padded base64). No import of the peer table: `peers.rs`
//! prints keys with it.

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Standard base64 with padding (44 characters), as `wg` and Go's
/// `wgtypes.Key.String()` print keys.
pub fn key_to_base64(key: &[u8; 32]) -> String {
    let mut out = String::with_capacity(44);
    for chunk in key.chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(B64[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Parses exactly 44 characters of standard, padded base64 encoding 32 bytes
/// (Go's `base64.StdEncoding`, which also tolerates non-zero trailing bits).
/// Any other input, including surrounding whitespace, is `None`.
pub fn key_from_base64(s: &str) -> Option<[u8; 32]> {
    let s = s.as_bytes();
    if s.len() != 44 || s[43] != b'=' {
        return None;
    }
    let val = |c: u8| B64.iter().position(|&x| x == c).map(|p| p as u32);
    let mut out = [0u8; 32];
    let mut o = 0;
    for q in s[..44].chunks(4) {
        let last = o + 3 > 32;
        let n = if last {
            (val(q[0])? << 18) | (val(q[1])? << 12) | (val(q[2])? << 6)
        } else {
            (val(q[0])? << 18) | (val(q[1])? << 12) | (val(q[2])? << 6) | val(q[3])?
        };
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        let take = if last { 2 } else { 3 };
        out[o..o + take].copy_from_slice(&bytes[..take]);
        o += take;
    }
    Some(out)
}
