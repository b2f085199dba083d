//! WireGuard message views (the WireGuard paper, §5.4): every message starts
//! `type(8) reserved(24)`, little endian; then
//!
//! | type | message | length | fields |
//! |---|---|---|---|
//! | 1 | handshake initiation | 148 | sender 4..8, ephemeral, static, timestamp, MAC1 116..132, MAC2 132..148 |
//! | 2 | handshake response | 92 | sender 4..8, receiver 8..12, ephemeral, empty, MAC1 60..76, MAC2 76..92 |
//! | 3 | cookie reply | 64 | receiver 4..8, nonce 8..32, cookie 32..64 |
//! | 4 | transport data | ≥ 32 | receiver 4..8, counter 8..16, ciphertext + tag |
//!
//! [`Message::new_checked`] accepts exactly these lengths with zero reserved
//! bytes (as boringtun's parser and the kernel's `prepare_skb_header` do),
//! so no accessor of a checked message panics.

use super::{Field, WireError};

mod field {
    use super::Field;
    pub const TYPE: Field = 0..4;
    pub const SENDER: Field = 4..8;
    pub const RECEIVER_RESPONSE: Field = 8..12;
    pub const RECEIVER: Field = 4..8;
    pub const COUNTER: Field = 8..16;
}

/// Handshake initiation.
pub const INITIATION: u8 = 1;
/// Handshake response.
pub const RESPONSE: u8 = 2;
/// Cookie reply.
pub const COOKIE_REPLY: u8 = 3;
/// Transport data.
pub const DATA: u8 = 4;
/// Length of a handshake initiation.
pub const INITIATION_LEN: usize = 148;
/// Length of a handshake response.
pub const RESPONSE_LEN: usize = 92;
/// Length of a cookie reply.
pub const COOKIE_REPLY_LEN: usize = 64;
/// Bytes a data message adds to its plaintext (16 header + 16 tag).
pub const DATA_OVERHEAD: usize = 32;
/// Header bytes in front of a data message's ciphertext.
pub const DATA_HEADER_LEN: usize = 16;
/// Length of MAC1 and MAC2 (the last 32 bytes of a handshake message).
pub const MAC_LEN: usize = 16;

/// A view of a WireGuard message.
#[derive(Debug, Clone)]
pub struct Message<T: AsRef<[u8]>> {
    buffer: T,
}

impl<T: AsRef<[u8]>> Message<T> {
    /// Wraps a buffer without checks.
    pub const fn new_unchecked(buffer: T) -> Self {
        Message { buffer }
    }

    /// Wraps untrusted input: a known type with zero reserved bytes and the
    /// exact length of its type (data: at least the overhead).
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        if b.len() < 4 {
            return Err(WireError::Truncated);
        }
        if b[1..4] != [0, 0, 0] {
            return Err(WireError::Malformed);
        }
        let ok = match b[0] {
            INITIATION => b.len() == INITIATION_LEN,
            RESPONSE => b.len() == RESPONSE_LEN,
            COOKIE_REPLY => b.len() == COOKIE_REPLY_LEN,
            DATA => b.len() >= DATA_OVERHEAD,
            _ => return Err(WireError::Malformed),
        };
        if !ok {
            return Err(WireError::Truncated);
        }
        Ok(Message { buffer })
    }

    /// The message type.
    pub fn kind(&self) -> u8 {
        self.buffer.as_ref()[field::TYPE.start]
    }

    /// Whether this is a handshake message (initiation or response), which
    /// carries MAC1 and MAC2 in its last 32 bytes.
    pub fn is_handshake(&self) -> bool {
        matches!(self.kind(), INITIATION | RESPONSE)
    }

    /// The sender index (initiations and responses).
    pub fn sender(&self) -> u32 {
        le32(&self.buffer.as_ref()[field::SENDER])
    }

    /// The receiver index: our index the message is addressed to (responses,
    /// cookie replies, data); `None` for an initiation, which has none.
    pub fn receiver(&self) -> Option<u32> {
        let b = self.buffer.as_ref();
        match self.kind() {
            RESPONSE => Some(le32(&b[field::RECEIVER_RESPONSE])),
            COOKIE_REPLY | DATA => Some(le32(&b[field::RECEIVER])),
            _ => None,
        }
    }

    /// A data message's counter (the AEAD nonce).
    pub fn counter(&self) -> u64 {
        let b = &self.buffer.as_ref()[field::COUNTER];
        let mut c = [0u8; 8];
        c.copy_from_slice(b);
        u64::from_le_bytes(c)
    }

    /// A handshake message up to MAC1 (what MAC1 covers).
    pub fn until_mac1(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - 2 * MAC_LEN]
    }

    /// A handshake message up to MAC2 (what MAC2 covers).
    pub fn until_mac2(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[..b.len() - MAC_LEN]
    }

    /// A handshake message's MAC1.
    pub fn mac1(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[b.len() - 2 * MAC_LEN..b.len() - MAC_LEN]
    }

    /// A handshake message's MAC2.
    pub fn mac2(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        &b[b.len() - MAC_LEN..]
    }

    /// The whole message.
    pub fn as_bytes(&self) -> &[u8] {
        self.buffer.as_ref()
    }
}

fn le32(b: &[u8]) -> u32 {
    u32::from_le_bytes([b[0], b[1], b[2], b[3]])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_types_and_reserved_bytes_are_checked() {
        let mut init = [0u8; INITIATION_LEN];
        init[0] = INITIATION;
        init[4..8].copy_from_slice(&7u32.to_le_bytes());
        let m = Message::new_checked(&init[..]).expect("initiation");
        assert_eq!((m.kind(), m.sender(), m.receiver()), (1, 7, None));
        assert!(m.is_handshake());
        assert_eq!(m.until_mac1().len(), 116);
        assert_eq!(m.until_mac2().len(), 132);
        assert!(Message::new_checked(&init[..147]).is_err());
        init[2] = 1;
        assert_eq!(
            Message::new_checked(&init[..]).err(),
            Some(WireError::Malformed)
        );
        let mut resp = [0u8; RESPONSE_LEN];
        resp[0] = RESPONSE;
        resp[8..12].copy_from_slice(&0x1234_5678u32.to_le_bytes());
        let m = Message::new_checked(&resp[..]).expect("response");
        assert_eq!(m.receiver(), Some(0x1234_5678));
        let mut data = [0u8; 40];
        data[0] = DATA;
        data[4..8].copy_from_slice(&9u32.to_le_bytes());
        data[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
        let m = Message::new_checked(&data[..]).expect("data");
        assert_eq!((m.receiver(), m.counter()), (Some(9), u64::MAX));
        assert!(Message::new_checked(&data[..31]).is_err());
        for junk in [&[][..], &[4, 0, 0], &[5, 0, 0, 0], &[0; 148]] {
            assert!(Message::new_checked(junk).is_err());
        }
    }
}
