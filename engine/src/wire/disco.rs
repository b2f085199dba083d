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
//!
//! Relays (docs/nat.md, "Relays") add two kinds of other lengths, parsed by
//! [`RelayMsg::parse`] (a 48-byte datagram is never one of them):
//!
//! ```text
//!  register (k 3, 64 bytes, node -> relay's relay port):
//!  0       4   5   6      8              40          48         64
//!  | magic | 3 | 0 | 0  0 | WG public key | counter BE | MAC (16) |
//!  ack (k 4, 32 bytes, relay -> node):
//!  0       4   5   6      8           16                      32
//!  | magic | 4 | 0 | 0  0 | counter BE | the registration's MAC |
//! ```
//!
//! The registration's MAC is a keyed BLAKE2s-128 over bytes 0..48 with a
//! key both ends derive from the static-static X25519 of the node's and the
//! relay's WireGuard keys (`path::wg::relay`), so only the holder of the
//! node's private key can register it. An ack echoes that MAC, which only
//! the two ends (and anyone on the path) know, and is half as long as a
//! registration: no amplification. Unknown kinds are ignored.
//!
//! The vxlan and udp backends (docs/nat.md, "vxlan and udp") add one more
//! kind, the NAT **keepalive** (k 7, exactly [`KEEPALIVE_LEN`] = 8 bytes:
//! the header alone), sent from the backend port to hold a NAT mapping
//! open. A receiver drops it without answering: it is no reflector.

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
const REGISTER: u8 = 3;
const ACK: u8 = 4;
const KEEPALIVE: u8 = 7;

/// The length of a NAT keepalive (the vxlan and udp backends).
pub const KEEPALIVE_LEN: usize = 8;

/// The NAT keepalive: the 8-byte header with kind 7.
pub const KEEPALIVE_MSG: [u8; KEEPALIVE_LEN] = [FIRST, b'W', b'D', VERSION, KEEPALIVE, 0, 0, 0];

/// Whether the untrusted datagram `d` is a NAT keepalive: exactly
/// [`KEEPALIVE_MSG`].
pub fn is_keepalive(d: &[u8]) -> bool {
    d.len() == KEEPALIVE_LEN && header(d) == Ok(KEEPALIVE)
}

/// The length of a relay registration.
pub const REGISTER_LEN: usize = 64;
/// The length of a relay's acknowledgement.
pub const ACK_LEN: usize = 32;
/// The bytes a registration's MAC covers.
pub const REGISTER_MACED: usize = 48;

/// A relay message (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelayMsg {
    /// A node asks a relay to forward to and from its source address.
    Register {
        /// The node's WireGuard public key.
        key: [u8; 32],
        /// Grows with every new registration (the node's Unix milliseconds).
        counter: u64,
        /// Keyed BLAKE2s-128 of bytes 0..48.
        mac: [u8; 16],
    },
    /// The relay took registration `counter` whose MAC was `mac`.
    Ack {
        /// The registration's counter.
        counter: u64,
        /// The registration's MAC.
        mac: [u8; 16],
    },
}

/// The 8-byte header every message of the family shares (magic, version,
/// kind, three zero bytes), checked the same way for each: its kind byte.
pub(crate) fn header(d: &[u8]) -> Result<u8, DiscoError> {
    if d.len() < 8 || d[..3] != MAGIC[..3] {
        return Err(DiscoError::NotDisco);
    }
    if d[3] != VERSION {
        return Err(DiscoError::Version(d[3]));
    }
    if d[5..8] != [0, 0, 0] {
        return Err(DiscoError::Malformed);
    }
    Ok(d[4])
}

impl RelayMsg {
    /// Parses an untrusted datagram.
    pub fn parse(d: &[u8]) -> Result<RelayMsg, DiscoError> {
        let kind = header(d)?;
        let u64_at = |i: usize| {
            let mut b = [0u8; 8];
            b.copy_from_slice(&d[i..i + 8]);
            u64::from_be_bytes(b)
        };
        let mut mac = [0u8; 16];
        match (kind, d.len()) {
            (REGISTER, REGISTER_LEN) => {
                let mut key = [0u8; 32];
                key.copy_from_slice(&d[8..40]);
                mac.copy_from_slice(&d[48..64]);
                Ok(RelayMsg::Register {
                    key,
                    counter: u64_at(40),
                    mac,
                })
            }
            (ACK, ACK_LEN) => {
                mac.copy_from_slice(&d[16..32]);
                Ok(RelayMsg::Ack {
                    counter: u64_at(8),
                    mac,
                })
            }
            _ => Err(DiscoError::Malformed),
        }
    }

    /// Writes the message to the start of `out`; its length, `None` when
    /// `out` is shorter.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let len = match self {
            RelayMsg::Register { .. } => REGISTER_LEN,
            RelayMsg::Ack { .. } => ACK_LEN,
        };
        let out = out.get_mut(..len)?;
        out.fill(0);
        out[..4].copy_from_slice(&MAGIC);
        match *self {
            RelayMsg::Register { key, counter, mac } => {
                out[4] = REGISTER;
                out[8..40].copy_from_slice(&key);
                out[40..48].copy_from_slice(&counter.to_be_bytes());
                out[48..64].copy_from_slice(&mac);
            }
            RelayMsg::Ack { counter, mac } => {
                out[4] = ACK;
                out[8..16].copy_from_slice(&counter.to_be_bytes());
                out[16..32].copy_from_slice(&mac);
            }
        }
        Some(len)
    }
}

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
        if d.len() != LEN {
            return Err(DiscoError::NotDisco);
        }
        let kind = header(d)?;
        if d[43..].iter().any(|b| *b != 0) {
            return Err(DiscoError::Malformed);
        }
        let mut nonce = [0u8; 16];
        nonce.copy_from_slice(&d[8..24]);
        let port = u16::from_be_bytes([d[25], d[26]]);
        let addr = &d[27..43];
        match (kind, d[24]) {
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

    #[test]
    fn relay_messages_round_trip_and_are_never_discovery() {
        for m in [
            RelayMsg::Register {
                key: [5; 32],
                counter: 1_765_000_000_123,
                mac: [6; 16],
            },
            RelayMsg::Ack {
                counter: 77,
                mac: [8; 16],
            },
        ] {
            let mut b = [0xa5u8; 80];
            let n = m.write(&mut b).expect("room");
            assert_eq!(RelayMsg::parse(&b[..n]), Ok(m));
            assert!(maybe(&b));
            assert_eq!(b[5], 0, "steered to worker 0");
            assert_eq!(Disco::parse(&b[..n]), Err(DiscoError::NotDisco));
            // Any other length or kind is not one.
            assert!(RelayMsg::parse(&b[..n - 1]).is_err());
            let mut k = b;
            k[4] = 9;
            assert_eq!(RelayMsg::parse(&k[..n]), Err(DiscoError::Malformed));
        }
        let mut req = [0u8; LEN];
        Disco::Request { nonce: [1; 16] }.write(&mut req);
        assert!(
            RelayMsg::parse(&req).is_err(),
            "a request is not a relay message"
        );
        assert_eq!(RelayMsg::parse(&[1, 0, 0, 0]), Err(DiscoError::NotDisco));
    }

    #[test]
    fn a_keepalive_is_exactly_its_eight_bytes_and_nothing_else() {
        assert!(is_keepalive(&KEEPALIVE_MSG));
        assert!(maybe(&KEEPALIVE_MSG));
        assert_eq!(KEEPALIVE_MSG[5], 0, "steered to worker 0");
        assert!(Disco::parse(&KEEPALIVE_MSG).is_err());
        assert!(RelayMsg::parse(&KEEPALIVE_MSG).is_err());
        assert!(!is_keepalive(&KEEPALIVE_MSG[..7]));
        let mut long = [0u8; 9];
        long[..8].copy_from_slice(&KEEPALIVE_MSG);
        assert!(!is_keepalive(&long));
        for at in 0..KEEPALIVE_LEN {
            let mut b = KEEPALIVE_MSG;
            b[at] ^= 1;
            assert!(!is_keepalive(&b), "byte {at}");
        }
    }
}
