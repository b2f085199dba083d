//! flannel's subnet key: `a.b.c.d-len`, or `a.b.c.d-len&<ipv6>-len6` for dual stack
//! (`MakeSubnetKey` / `ParseSubnetKey`, flannel pkg/subnet/subnet.go).
//!
//! Parsing follows flannel's regex `(\d+\.\d+.\d+.\d+)-(\d+)(?:&([a-f\d:]+)-(\d+))?$`
//! followed by Go's `net.ParseIP` and `strconv.ParseUint(len, 10, 5|7)`. Two
//! consequences are kept on purpose so both implementations agree on which keys
//! exist: the IPv6 part must be lower-case, and an IPv4 prefix length above 31
//! (an IPv6 one above 127) is rejected.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::str::FromStr;

use ipnet::{Ipv4Net, Ipv6Net};

/// A lease's key in a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SubnetKey {
    /// The IPv4 subnet (`0.0.0.0/0` is written when absent, as flannel does).
    pub v4: Option<Ipv4Net>,
    /// The IPv6 subnet, for dual-stack and IPv6 leases.
    pub v6: Option<Ipv6Net>,
}

/// A subnet key that flannel would not accept.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid subnet key {0:?}")]
pub struct InvalidSubnetKey(pub String);

impl fmt::Display for SubnetKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v4 = self
            .v4
            .unwrap_or_else(|| Ipv4Net::new_assert(Ipv4Addr::UNSPECIFIED, 0));
        write!(f, "{}-{}", v4.addr(), v4.prefix_len())?;
        if let Some(v6) = self.v6 {
            write!(f, "&{}-{}", v6.addr(), v6.prefix_len())?;
        }
        Ok(())
    }
}

impl FromStr for SubnetKey {
    type Err = InvalidSubnetKey;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || InvalidSubnetKey(s.to_string());
        let (v4_part, v6_part) = match s.split_once('&') {
            Some((a, b)) => (a, Some(b)),
            None => (s, None),
        };
        let (ip4, len4) = v4_part.rsplit_once('-').ok_or_else(bad)?;
        // The regex is not anchored at the start: the match begins where the
        // trailing run of digits and dots begins.
        let start = ip4
            .char_indices()
            .rev()
            .find(|(_, c)| !(c.is_ascii_digit() || *c == '.'))
            .map_or(0, |(i, c)| i + c.len_utf8());
        let ip4: Ipv4Addr = ip4[start..].parse().map_err(|_| bad())?;
        let len4 = parse_len(len4, 31).ok_or_else(bad)?;
        let v4 = Ipv4Net::new(ip4, len4).map_err(|_| bad())?;
        let v6 = match v6_part {
            None => None,
            Some(p) => {
                let (ip6, len6) = p.rsplit_once('-').ok_or_else(bad)?;
                if ip6.is_empty()
                    || !ip6
                        .chars()
                        .all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c) || c == ':')
                {
                    return Err(bad());
                }
                let ip6: Ipv6Addr = ip6.parse().map_err(|_| bad())?;
                let len6 = parse_len(len6, 127).ok_or_else(bad)?;
                Some(Ipv6Net::new(ip6, len6).map_err(|_| bad())?)
            }
        };
        // flannel writes an absent IPv4 subnet (an IPv6-only lease) as
        // 0.0.0.0-0; read it back as absent, so the node's own IPv6-only
        // lease (v4 None) matches its key.
        let v4 = (v4.prefix_len() != 0 || !v4.addr().is_unspecified()).then_some(v4);
        Ok(SubnetKey { v4, v6 })
    }
}

/// `strconv.ParseUint(s, 10, bits)`: ASCII digits only, at most `max`.
fn parse_len(s: &str, max: u8) -> Option<u8> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let v: u32 = s.parse().ok()?;
    u8::try_from(v).ok().filter(|v| *v <= max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(s: &str) -> Result<SubnetKey, InvalidSubnetKey> {
        s.parse()
    }

    #[test]
    fn round_trip_v4_and_dual_stack() {
        for s in [
            "10.12.13.0-24",
            "10.12.13.0-24&fd00:12:13::-56",
            "0.0.0.0-0&fc00::-64",
        ] {
            assert_eq!(key(s).expect(s).to_string(), s);
        }
    }

    #[test]
    fn an_ipv6_only_key_has_no_ipv4_subnet() {
        let k = key("0.0.0.0-0&fd00:10:244:100::-64").expect("v6-only key");
        assert_eq!(k.v4, None);
        assert_eq!(k.v6, Some("fd00:10:244:100::/64".parse().expect("v6 net")));
        let own = SubnetKey { v4: None, v6: k.v6 };
        assert_eq!(k, own, "the node's own IPv6-only lease matches its key");
    }

    #[test]
    fn non_ascii_before_the_address_is_not_a_panic() {
        // Found by the `subnet_key` fuzz target: a multi-byte character right
        // before the address made the prefix skip slice inside it.
        assert!(key("\u{7fb}..0-.0.05").is_err());
        assert_eq!(
            key("ß10.244.1.0-24").map(|k| k.to_string()),
            Ok("10.244.1.0-24".to_string())
        );
    }

    #[test]
    fn flannel_invalid_keys() {
        // flannel subnet_test.go TestSubnetNodeInvalid and the regex's quirks.
        for s in [
            "10.12.13.300-24",
            "10.12.13.0-24hi",
            "10.12.13.0-24&20011::-56",
            "10.12.13.0-",
            "10.12.13-24",
            "10.12.13.0-32",
            "10.12.13.0-24&FD00::-56",
            "10.12.13.0-24&fd00::-128",
            "",
        ] {
            assert!(key(s).is_err(), "{s} must be rejected");
        }
    }

    #[test]
    fn leading_garbage_is_skipped_like_the_unanchored_regex() {
        assert_eq!(
            key("x10.1.2.0-24").expect("match").to_string(),
            "10.1.2.0-24"
        );
    }
}
