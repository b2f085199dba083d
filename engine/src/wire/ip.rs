//! A view of an IP packet of either version, for the steps that need its
//! addresses before they care which version it is (route lookup, source
//! checks, flow hashing).
//!
//! [`Packet::new_checked`] checks the version nibble and the fixed header
//! length only (20 or 40 bytes), not the lengths the header declares: a TUN
//! super-packet may carry total length 0 (BIG TCP), and the codecs and
//! segmenters check the rest. After it succeeds no accessor panics.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{WireError, ipv4, ipv6};

/// A view of an IPv4 or IPv6 packet.
#[derive(Debug, Clone, Copy)]
pub struct Packet<T: AsRef<[u8]>> {
    buffer: T,
    v6: bool,
}

impl<T: AsRef<[u8]>> Packet<T> {
    /// Wraps a buffer that holds at least a fixed IPv4 or IPv6 header.
    pub fn new_checked(buffer: T) -> Result<Self, WireError> {
        let b = buffer.as_ref();
        let v6 = match b.first().map(|v| v >> 4) {
            Some(4) if b.len() >= ipv4::HEADER_LEN => false,
            Some(6) if b.len() >= ipv6::HEADER_LEN => true,
            Some(4 | 6) | None => return Err(WireError::Truncated),
            Some(_) => return Err(WireError::Malformed),
        };
        Ok(Packet { buffer, v6 })
    }

    /// Wraps a buffer already checked (decapsulated packets): accessors may
    /// panic when it is shorter than its version's fixed header.
    pub fn new_unchecked(buffer: T) -> Self {
        let v6 = buffer.as_ref()[0] >> 4 == 6;
        Packet { buffer, v6 }
    }

    /// 4 or 6.
    pub fn version(&self) -> u8 {
        if self.v6 { 6 } else { 4 }
    }

    /// The source and destination address bytes, back to back (8 or 32 bytes).
    pub fn addr_bytes(&self) -> &[u8] {
        let b = self.buffer.as_ref();
        if self.v6 { &b[8..40] } else { &b[12..20] }
    }

    /// Source address.
    pub fn src(&self) -> IpAddr {
        let a = self.addr_bytes();
        if self.v6 {
            let mut s = [0; 16];
            s.copy_from_slice(&a[..16]);
            IpAddr::V6(Ipv6Addr::from(s))
        } else {
            IpAddr::V4(Ipv4Addr::new(a[0], a[1], a[2], a[3]))
        }
    }

    /// Destination address.
    pub fn dst(&self) -> IpAddr {
        let a = self.addr_bytes();
        if self.v6 {
            let mut d = [0; 16];
            d.copy_from_slice(&a[16..]);
            IpAddr::V6(Ipv6Addr::from(d))
        } else {
            IpAddr::V4(Ipv4Addr::new(a[4], a[5], a[6], a[7]))
        }
    }

    /// IPv4 protocol or IPv6 next header.
    pub fn protocol(&self) -> u8 {
        self.buffer.as_ref()[if self.v6 { 6 } else { 9 }]
    }

    /// Where the transport header starts (IHL * 4, or 40: extension headers are not parsed).
    pub fn header_len(&self) -> usize {
        if self.v6 {
            ipv6::HEADER_LEN
        } else {
            usize::from(self.buffer.as_ref()[0] & 0x0f) * 4
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_both_versions_and_refuses_short_or_unknown() {
        let mut v4 = [0u8; 20];
        v4[0] = 0x45;
        v4[9] = 6;
        v4[12..20].copy_from_slice(&[10, 0, 0, 1, 10, 0, 0, 2]);
        let p = Packet::new_checked(&v4[..]).expect("v4");
        assert_eq!((p.version(), p.protocol(), p.header_len()), (4, 6, 20));
        assert_eq!(p.src(), IpAddr::from([10, 0, 0, 1]));
        assert_eq!(p.dst(), IpAddr::from([10, 0, 0, 2]));
        let mut v6 = [0u8; 40];
        v6[0] = 0x60;
        v6[6] = 17;
        v6[23] = 1;
        v6[39] = 2;
        let p = Packet::new_checked(&v6[..]).expect("v6");
        assert_eq!((p.version(), p.protocol(), p.header_len()), (6, 17, 40));
        assert_eq!(p.src(), "::1".parse::<IpAddr>().expect("ip"));
        assert_eq!(p.dst(), "::2".parse::<IpAddr>().expect("ip"));
        assert_eq!(p.addr_bytes().len(), 32);
        assert!(Packet::new_checked(&v4[..19]).is_err());
        assert!(Packet::new_checked(&v6[..39]).is_err());
        assert!(Packet::new_checked(&[0x50u8; 40][..]).is_err());
        assert!(Packet::new_checked(&[][..]).is_err());
    }
}
