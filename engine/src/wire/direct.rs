//! Direct probes (docs/nat.md, "Back to direct"): two relayed nodes try the
//! direct path again, kinds 5 and 6 of the 0xd1 family
//! ([`crate::wire::disco`]). Parsed as untrusted input.
//!
//! Both kinds are one 64-byte datagram of the same layout:
//!
//! ```text
//!  0       4   5   6      8                40           48         64
//!  | magic | k | 0 | 0  0 | sender's WG key | counter BE | MAC (16) |
//! ```
//!
//! - `k`: 5 probe (a node to a relayed peer's endpoint, from its WireGuard
//!   port), 6 ack (the peer back to the probe's source: its own key, the
//!   probe's counter).
//! - The MAC is a keyed BLAKE2s-128 over bytes 0..48 with a key both ends
//!   derive from the static-static X25519 of their WireGuard keys
//!   (`path::wg::direct`); the kind byte is covered, so an ack is never a
//!   probe's MAC echoed.
//! - Byte 5 is 0, so the engine's steering sends both to worker 0.
//! - An ack is exactly as long as its probe: answering cannot amplify.

use super::disco::{DiscoError, MAGIC, header};

/// The length of a probe and of an ack.
pub const LEN: usize = 64;
/// The bytes the MAC covers.
pub const MACED: usize = 48;

const PROBE: u8 = 5;
const ACK: u8 = 6;

/// Which of the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Does the direct path work?
    Probe,
    /// It does: the probe's counter came here.
    Ack,
}

/// A direct probe or its ack (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectMsg {
    /// Probe or ack.
    pub kind: Kind,
    /// The sender's WireGuard public key.
    pub key: [u8; 32],
    /// The prober's counter (Unix milliseconds when it was built).
    pub counter: u64,
    /// Keyed BLAKE2s-128 of bytes 0..48.
    pub mac: [u8; 16],
}

impl DirectMsg {
    /// Parses an untrusted datagram.
    pub fn parse(d: &[u8]) -> Result<DirectMsg, DiscoError> {
        if d.len() != LEN {
            return Err(DiscoError::NotDisco);
        }
        let kind = match header(d)? {
            PROBE => Kind::Probe,
            ACK => Kind::Ack,
            _ => return Err(DiscoError::Malformed),
        };
        let mut key = [0u8; 32];
        key.copy_from_slice(&d[8..40]);
        let mut c = [0u8; 8];
        c.copy_from_slice(&d[40..48]);
        let mut mac = [0u8; 16];
        mac.copy_from_slice(&d[48..64]);
        Ok(DirectMsg {
            kind,
            key,
            counter: u64::from_be_bytes(c),
            mac,
        })
    }

    /// Writes the message to the start of `out`; [`LEN`], `None` when
    /// `out` is shorter.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let out = out.get_mut(..LEN)?;
        out.fill(0);
        out[..4].copy_from_slice(&MAGIC);
        out[4] = match self.kind {
            Kind::Probe => PROBE,
            Kind::Ack => ACK,
        };
        out[8..40].copy_from_slice(&self.key);
        out[40..48].copy_from_slice(&self.counter.to_be_bytes());
        out[48..64].copy_from_slice(&self.mac);
        Some(LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::disco::{Disco, RelayMsg, maybe};

    #[test]
    fn probes_round_trip_and_are_no_other_message() {
        for kind in [Kind::Probe, Kind::Ack] {
            let m = DirectMsg {
                kind,
                key: [4; 32],
                counter: 1_765_000_000_321,
                mac: [9; 16],
            };
            let mut b = [0xa5u8; 80];
            assert_eq!(m.write(&mut b), Some(LEN));
            assert_eq!(DirectMsg::parse(&b[..LEN]), Ok(m));
            assert!(maybe(&b));
            assert_eq!(b[5], 0, "steered to worker 0");
            assert!(Disco::parse(&b[..LEN]).is_err());
            assert!(RelayMsg::parse(&b[..LEN]).is_err(), "not a registration");
            assert!(DirectMsg::parse(&b[..LEN - 1]).is_err());
            for (at, val) in [(4, 3u8), (4, 7), (5, 1), (7, 1)] {
                let mut x = b;
                x[at] = val;
                assert_eq!(DirectMsg::parse(&x[..LEN]), Err(DiscoError::Malformed));
            }
            let mut v2 = b;
            v2[3] = 2;
            assert_eq!(DirectMsg::parse(&v2[..LEN]), Err(DiscoError::Version(2)));
        }
        // A registration (kind 3, also 64 bytes) is not a probe.
        let mut reg = [0u8; 64];
        (RelayMsg::Register {
            key: [1; 32],
            counter: 2,
            mac: [3; 16],
        })
        .write(&mut reg);
        assert_eq!(DirectMsg::parse(&reg), Err(DiscoError::Malformed));
        assert!(DirectMsg::parse(&[0xd1, b'W', b'D', 1]).is_err());
        assert_eq!(
            DirectMsg {
                kind: Kind::Ack,
                key: [0; 32],
                counter: 0,
                mac: [0; 16]
            }
            .write(&mut [0u8; 10]),
            None
        );
    }
}
