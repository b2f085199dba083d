//! Go's `net` address parsing, and flannel's IPv6 address text.
//!
//! Contracts:
//! - [`parse_ip`] is `net.ParseIP`: an IPv4 dotted quad (no leading zeros
//!   in an octet) or IPv6 text, no zone.
//! - [`parse_cidr`] is `net.ParseCIDR`: it returns the address as written
//!   and the *network* (host bits cleared). The prefix length is ASCII
//!   digits only (any number of leading zeros, as Go's `dtoi`; no sign, no
//!   spaces) and at most the family's bit length. Errors read
//!   `invalid CIDR address: <s>`.
//! - [`go_ip6_string`] is flannel's `ip.IP6.String()`.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;

/// A CIDR that Go's `net.ParseCIDR` rejects; the text is Go's
/// `*net.ParseError`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid CIDR address: {0}")]
pub struct CidrError(pub String);

/// Go's `net.ParseIP`: IPv4 dotted quad or IPv6 text, no zone.
pub fn parse_ip(s: &str) -> Option<IpAddr> {
    // Rust's parser, like Go's netip, rejects IPv4 octets with leading
    // zeros; zones are not addresses to `net.ParseIP`.
    if s.contains('%') {
        return None;
    }
    s.parse().ok()
}

/// Parses `s` like Go's `net.ParseCIDR`: returns `(address, network)`.
pub fn parse_cidr(s: &str) -> Result<(IpAddr, IpNet), CidrError> {
    let err = || CidrError(s.to_string());
    let (addr, len) = s.split_once('/').ok_or_else(err)?;
    let ip = parse_ip(addr).ok_or_else(err)?;
    if len.is_empty() || !len.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err());
    }
    let digits = len.trim_start_matches('0');
    let n: u32 = if digits.is_empty() {
        0
    } else {
        digits.parse().map_err(|_| err())?
    };
    let max = if ip.is_ipv4() { 32 } else { 128 };
    if n > max {
        return Err(err());
    }
    let prefix = u8::try_from(n).map_err(|_| err())?;
    let net = IpNet::new(ip, prefix).map_err(|_| err())?.trunc();
    Ok((ip, net))
}

/// Formats an IPv6 address the way Go's `ip.IP6.String()` (big-int based) does:
/// values in `[2^24, 2^32)` and IPv4-mapped addresses print as dotted quads.
pub fn go_ip6_string(addr: Ipv6Addr) -> String {
    let v = u128::from(addr);
    if (1 << 24..1 << 32).contains(&v) {
        return Ipv4Addr::from(v as u32).to_string();
    }
    match addr.to_ipv4_mapped() {
        Some(v4) => v4.to_string(),
        None => addr.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_cidr_returns_address_and_network() {
        let (ip, net) = parse_cidr("10.1.17.1/24").expect("valid");
        assert_eq!(ip.to_string(), "10.1.17.1");
        assert_eq!(net.to_string(), "10.1.17.0/24");
        let (_, net6) = parse_cidr("2001:cafe:42::1/64").expect("valid v6");
        assert_eq!(net6.to_string(), "2001:cafe:42::/64");
    }

    #[test]
    fn parse_cidr_accepts_leading_zeros_in_the_prefix() {
        for (s, want) in [
            ("10.0.0.0/08", "10.0.0.0/8"),
            ("10.3.0.0/016", "10.3.0.0/16"),
            // Go's dtoi takes any number of leading zeros.
            ("10.3.0.0/00016", "10.3.0.0/16"),
            ("10.3.0.0/000", "0.0.0.0/0"),
            ("fc00::/0000128", "fc00::/128"),
        ] {
            assert_eq!(parse_cidr(s).expect(s).1.to_string(), want, "{s}");
        }
    }

    #[test]
    fn parse_cidr_rejects_like_go() {
        for bad in [
            "",
            "10.0.0.0",
            "10.0.0.0/",
            "10.0.0.0/33",
            "10.0.0.0/-1",
            "10.0.0.0/+8",
            "10.0.0.0/ 8",
            " 10.3.0.0/16",
            "10.0.0.0/8 ",
            "010.0.0.0/8",
            "10.3.1/24",
            "x/8",
            "::1/129",
            "fe80::1%eth0/64",
            "10.0.0.0/99999999999999999999",
        ] {
            assert_eq!(parse_cidr(bad), Err(CidrError(bad.to_string())), "{bad:?}");
        }
        assert_eq!(CidrError("x".into()).to_string(), "invalid CIDR address: x");
    }

    #[test]
    fn parse_ip_is_go_parse_ip() {
        assert_eq!(parse_ip("10.3.1.0"), Some(IpAddr::from([10, 3, 1, 0])));
        assert!(matches!(parse_ip("::ffff:10.3.1.0"), Some(IpAddr::V6(_))));
        for bad in ["10.3.1", "010.3.1.0", "fc00::g", "fe80::1%eth0", ""] {
            assert_eq!(parse_ip(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn go_ip6_string_prints_small_and_mapped_values_as_ipv4() {
        let s = |t: &str| go_ip6_string(t.parse().expect("test address"));
        assert_eq!(s("fc00::1"), "fc00::1");
        assert_eq!(s("::ffff:10.0.0.1"), "10.0.0.1");
        assert_eq!(s("::a00:1"), "10.0.0.1");
        assert_eq!(s("::ff:ffff"), "::ff:ffff");
    }
}
