//! weft's endpoint discovery messages (docs/nat.md), version 1: a node asks
//! a peer with a reachable address which address and port its datagram
//! came from, as STUN does, on the WireGuard backend's own port, so that
//! the NAT mapping it learns is the data path's. Parsed as untrusted input:
//! anything that reaches the port can send anything.
//!
//! Every message is one 48-byte UDP datagram:
//!
//! ```text
//!  0      1     2     3   4    5   6      8                 24    25     27               43     48
//!  | 0xd1 | 'W' | 'D' | v | k  | 0 | 0  0 | nonce (16)      | fam | port | address (16)   | 0 ... |
//! ```
//!
//! - Byte 0 is `0xd1`, which nothing else on a backend port starts with:
//!   WireGuard's first byte is its type, 1 to 4 (a little-endian u32), a
//!   VXLAN header's is its flags (0x08), a flannel-UDP payload is an IPv4
//!   or IPv6 header (0x4_ or 0x6_). The WireGuard receive path looks at a
//!   datagram's first byte only after WireGuard's own check refused it, so
//!   the data path pays nothing for this format.
//! - `v`: the version, 1; another version is refused and never answered.
//! - `k`: 1 request, 2 answer.
//! - Byte 5 is 0: the engine's reuseport steering program reads the owner
//!   worker from byte 5 of anything that is not a handshake response, so
//!   every discovery message reaches worker 0, the one that asks.
//! - `nonce`: 16 random bytes chosen by the asker, echoed in the answer; an
//!   answer whose nonce is not the outstanding one is ignored, so a sender
//!   off the path cannot forge one (it would have to guess 128 bits).
//! - `fam`, `port`, `address`: in an answer, the source the request came
//!   from as the answering node saw it: `fam` 4 (address in the first four
//!   bytes, the rest zero) or 6; big-endian port. A request carries zeros.
//!
//! A request and its answer have the same length, so answering a spoofed
//! request does not amplify it.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The length of every message.
pub const LEN: usize = 48;
/// The first byte of every message.
pub const FIRST: u8 = 0xd1;
/// The first four bytes of a version-1 message.
pub const MAGIC: [u8; 4] = [FIRST, b'W', b'D', VERSION];
/// The version this build speaks.
pub const VERSION: u8 = 1;

const REQUEST: u8 = 1;
const ANSWER: u8 = 2;

/// A parsed message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Disco {
    /// Where did this come from? (the asker's nonce)
    Request {
        /// The asker's nonce.
        nonce: [u8; 16],
    },
    /// It came from `seen`.
    Answer {
        /// The nonce of the request answered.
        nonce: [u8; 16],
        /// The request's source as the answering node saw it.
        seen: SocketAddr,
    },
}

/// Why a datagram is not a discovery message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum DiscoError {
    /// Not 48 bytes, or does not start with the magic bytes.
    #[error("not a discovery message")]
    NotDisco,
    /// Another version of the format.
    #[error("discovery version {0} (this build speaks 1)")]
    Version(u8),
    /// A reserved byte, the kind or the address family holds an impossible value.
    #[error("malformed discovery message")]
    Malformed,
}

/// Whether `d` may be a discovery message (its first byte): the one check
/// the receive path makes after WireGuard's own parser refused `d`.
#[inline]
pub fn maybe(d: &[u8]) -> bool {
    d.first() == Some(&FIRST)
}

impl Disco {
    /// Parses an untrusted datagram.
    pub fn parse(d: &[u8]) -> Result<Disco, DiscoError> {
        if d.len() != LEN || d[..3] != MAGIC[..3] {
            return Err(DiscoError::NotDisco);
        }
        if d[3] != VERSION {
            return Err(DiscoError::Version(d[3]));
        }
        if d[5..8] != [0, 0, 0] || d[43..].iter().any(|b| *b != 0) {
            return Err(DiscoError::Malformed);
        }
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&d[8..24]);
        let port = u16::from_be_bytes([d[25], d[26]]);
        let addr = &d[27..43];
        match (d[4], d[24]) {
            (REQUEST, 0) if port == 0 && addr.iter().all(|b| *b == 0) => {
                Ok(Disco::Request { nonce })
            }
            (ANSWER, 4) if addr[4..].iter().all(|b| *b == 0) => {
                let ip = Ipv4Addr::new(addr[0], addr[1], addr[2], addr[3]);
                let seen = SocketAddr::new(IpAddr::V4(ip), port);
                Ok(Disco::Answer { nonce, seen })
            }
            (ANSWER, 6) => {
                let mut a = [0u8; 16];
                a.copy_from_slice(addr);
                let seen = SocketAddr::new(IpAddr::V6(Ipv6Addr::from(a)), port);
                Ok(Disco::Answer { nonce, seen })
            }
            _ => Err(DiscoError::Malformed),
        }
    }

    /// Writes the message to the start of `out` and returns its length
    /// ([`LEN`]); `None` when `out` is shorter.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let out = out.get_mut(..LEN)?;
        out.fill(0);
        out[..4].copy_from_slice(&MAGIC);
        match *self {
            Disco::Request { nonce } => {
                out[4] = REQUEST;
                out[8..24].copy_from_slice(&nonce);
            }
            Disco::Answer { nonce, seen } => {
                out[4] = ANSWER;
                out[8..24].copy_from_slice(&nonce);
                out[25..27].copy_from_slice(&seen.port().to_be_bytes());
                match seen.ip() {
                    IpAddr::V4(a) => {
                        out[24] = 4;
                        out[27..31].copy_from_slice(&a.octets());
                    }
                    IpAddr::V6(a) => {
                        out[24] = 6;
                        out[27..43].copy_from_slice(&a.octets());
                    }
                }
            }
        }
        Some(LEN)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(m: Disco) {
        let mut b = [0xa5u8; 64];
        assert_eq!(m.write(&mut b), Some(LEN));
        assert_eq!(Disco::parse(&b[..LEN]), Ok(m));
        assert!(maybe(&b));
        assert_eq!(b[5], 0, "steered to worker 0");
    }

    #[test]
    fn messages_round_trip() {
        round_trip(Disco::Request { nonce: [7; 16] });
        round_trip(Disco::Answer {
            nonce: [9; 16],
            seen: "203.0.113.7:40001".parse().expect("addr"),
        });
        round_trip(Disco::Answer {
            nonce: [1; 16],
            seen: "[2001:db8::5]:51820".parse().expect("addr"),
        });
    }

    #[test]
    fn nothing_else_on_a_backend_port_is_taken_for_one() {
        // WireGuard types 1-4, VXLAN flags, IPv4 and IPv6 headers.
        for first in [1u8, 2, 3, 4, 0x08, 0x45, 0x60] {
            let mut b = [0u8; LEN];
            b[0] = first;
            assert!(!maybe(&b));
            assert_eq!(Disco::parse(&b), Err(DiscoError::NotDisco));
        }
    }

    #[test]
    fn bad_messages_are_errors() {
        let mut good = [0u8; LEN];
        Disco::Request { nonce: [3; 16] }.write(&mut good);
        assert_eq!(Disco::parse(&good[..47]), Err(DiscoError::NotDisco));
        let mut v2 = good;
        v2[3] = 2;
        assert_eq!(Disco::parse(&v2), Err(DiscoError::Version(2)));
        for (at, val) in [(4, 3u8), (5, 1), (24, 4), (30, 1), (47, 1)] {
            let mut b = good;
            b[at] = val;
            assert_eq!(Disco::parse(&b), Err(DiscoError::Malformed), "byte {at}");
        }
        let mut short = [0u8; 10];
        assert_eq!(Disco::Request { nonce: [0; 16] }.write(&mut short), None);
    }
}
