//! The probe's wire format, version 1 (docs/probes.md), parsed as untrusted
//! input: anything that reaches the probe port can send anything.
//!
//! Every message is one UDP datagram with a 24-byte header, big-endian:
//!
//! ```text
//!  0        4    5    6        8                16               24
//!  | "WFPR" | v  | k  | size   | seq            | stamp          | padding (probes only)
//! ```
//!
//! - `v`: the version, 1. A datagram of another version is refused (and
//!   never answered), so a newer weftd can change the layout.
//! - `k`: 1 probe, 2 ack.
//! - `size`: 0 in a probe; in an ack, the length of the probe datagram it
//!   acknowledges (what path-MTU probing learns: that many bytes passed).
//! - `seq`: the prober's sequence number, echoed.
//! - `stamp`: the prober's clock (nanoseconds of its own monotonic clock),
//!   echoed: the prober computes the round trip from its own clock only.
//!
//! A probe may carry zero padding up to any size (path-MTU probes); an ack
//! is exactly 24 bytes, never larger than the probe it answers, so the
//! responder cannot amplify a spoofed probe.

/// The header (and an ack's) length.
pub const HEADER: usize = 24;
/// The first four bytes of every message.
pub const MAGIC: [u8; 4] = *b"WFPR";
/// The version this build speaks.
pub const VERSION: u8 = 1;

/// What kind of message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A probe: answer it with an ack.
    Probe,
    /// An ack of a probe of `size` bytes.
    Ack {
        /// The acknowledged probe's datagram length.
        size: u16,
    },
}

/// A parsed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Msg {
    /// Probe or ack.
    pub kind: Kind,
    /// The prober's sequence number.
    pub seq: u64,
    /// The prober's send time (its own clock, echoed).
    pub stamp: u64,
}

/// Why a datagram is not a probe message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the header.
    #[error("short datagram ({0} bytes, the header is 24)")]
    Short(usize),
    /// Not weft's magic.
    #[error("not a weft probe (bad magic)")]
    Magic,
    /// Another version.
    #[error("probe version {0} (this weftd speaks 1)")]
    Version(u8),
    /// An unknown kind.
    #[error("unknown probe message kind {0}")]
    Kind(u8),
    /// An ack with padding, or a probe with a size.
    #[error("malformed probe message")]
    Malformed,
}

impl Msg {
    /// Parses one datagram.
    pub fn parse(b: &[u8]) -> Result<Msg, WireError> {
        let Some(h) = b.get(..HEADER) else {
            return Err(WireError::Short(b.len()));
        };
        if h[..4] != MAGIC {
            return Err(WireError::Magic);
        }
        if h[4] != VERSION {
            return Err(WireError::Version(h[4]));
        }
        let size = u16::from_be_bytes([h[6], h[7]]);
        let kind = match h[5] {
            1 if size == 0 => Kind::Probe,
            2 if b.len() == HEADER => Kind::Ack { size },
            1 | 2 => return Err(WireError::Malformed),
            k => return Err(WireError::Kind(k)),
        };
        let mut seq = [0u8; 8];
        seq.copy_from_slice(&h[8..16]);
        let mut stamp = [0u8; 8];
        stamp.copy_from_slice(&h[16..24]);
        Ok(Msg {
            kind,
            seq: u64::from_be_bytes(seq),
            stamp: u64::from_be_bytes(stamp),
        })
    }

    /// Writes the message into `out`: the header, then (a probe) zero
    /// padding up to `out.len()`; returns the datagram's length (an ack: 24).
    /// `out` must hold at least [`HEADER`] bytes.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let (k, size, len) = match self.kind {
            Kind::Probe => (1u8, 0u16, out.len()),
            Kind::Ack { size } => (2u8, size, HEADER),
        };
        let h = out.get_mut(..len)?;
        if len < HEADER {
            return None;
        }
        h[..4].copy_from_slice(&MAGIC);
        h[4] = VERSION;
        h[5] = k;
        h[6..8].copy_from_slice(&size.to_be_bytes());
        h[8..16].copy_from_slice(&self.seq.to_be_bytes());
        h[16..24].copy_from_slice(&self.stamp.to_be_bytes());
        h[HEADER..].fill(0);
        Some(len)
    }

    /// The ack of this probe, received as a datagram of `len` bytes.
    pub fn ack(&self, len: usize) -> Msg {
        Msg {
            kind: Kind::Ack {
                size: u16::try_from(len).unwrap_or(u16::MAX),
            },
            seq: self.seq,
            stamp: self.stamp,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn probe(seq: u64) -> Msg {
        Msg {
            kind: Kind::Probe,
            seq,
            stamp: 0x0102_0304_0506_0708,
        }
    }

    #[test]
    fn round_trip() {
        let mut buf = [0xffu8; 100];
        let n = probe(7).write(&mut buf).expect("test fixture");
        assert_eq!(n, 100);
        assert_eq!(Msg::parse(&buf).expect("test fixture"), probe(7));
        assert!(buf[HEADER..].iter().all(|b| *b == 0));
        let ack = probe(7).ack(100);
        let n = ack.write(&mut buf).expect("test fixture");
        assert_eq!(n, HEADER);
        assert_eq!(Msg::parse(&buf[..n]).expect("test fixture"), ack);
        assert_eq!(ack.kind, Kind::Ack { size: 100 });
        assert_eq!(probe(1).write(&mut [0u8; 23]), None);
    }

    #[test]
    fn refuses_what_is_not_a_v1_message() {
        let mut good = [0u8; HEADER];
        probe(1).write(&mut good).expect("test fixture");
        type Edit<'a> = &'a dyn Fn(&mut Vec<u8>);
        let cases: &[(Edit, WireError)] = &[
            (&|b| b.truncate(23), WireError::Short(23)),
            (&|b| b.clear(), WireError::Short(0)),
            (&|b| b[0] = b'X', WireError::Magic),
            (&|b| b[4] = 2, WireError::Version(2)),
            (&|b| b[4] = 0, WireError::Version(0)),
            (&|b| b[5] = 3, WireError::Kind(3)),
            (&|b| b[5] = 0, WireError::Kind(0)),
            (&|b| b[7] = 1, WireError::Malformed),
            (
                &|b| {
                    b[5] = 2;
                    b.push(0);
                },
                WireError::Malformed,
            ),
        ];
        for (i, (edit, want)) in cases.iter().enumerate() {
            let mut b = good.to_vec();
            edit(&mut b);
            assert_eq!(Msg::parse(&b), Err(*want), "case {i}");
        }
    }

    /// Fuzz-style: every prefix, every single-byte change and pseudo-random
    /// datagrams parse to a message or an error, never a panic, and what
    /// parses writes back to the same header.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let mut good = [0u8; 64];
        probe(u64::MAX).write(&mut good).expect("test fixture");
        for n in 0..good.len() {
            let _ = Msg::parse(&good[..n]);
        }
        for i in 0..good.len() {
            for v in [0u8, 1, 2, 0x7f, 0x80, 0xff] {
                let mut b = good;
                b[i] = v;
                if let Ok(m) = Msg::parse(&b) {
                    let mut out = [0u8; 64];
                    let n = m.write(&mut out).expect("test fixture");
                    assert_eq!(out[..HEADER], b[..HEADER]);
                    assert!(n == 64 || n == HEADER);
                }
            }
        }
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..20_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let len = (x % 80) as usize;
            let mut b: Vec<u8> = (0..len).map(|i| (x >> (i % 8 * 8)) as u8).collect();
            if x & 1 == 0 && len >= 6 {
                b[..4].copy_from_slice(&MAGIC);
                b[4] = VERSION;
                b[5] = (x >> 40) as u8 % 3;
            }
            let _ = Msg::parse(&b);
        }
    }
}
