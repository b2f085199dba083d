//! What a lease written by hand (`weft leases put`) must satisfy before it
//! reaches the store: the key is aligned (its address is its subnet's first
//! one: `10.244.77.0-23` is not), each family's subnet lies inside the
//! network config's network and has its `SubnetLen` (what the allocator and
//! every node's routes assume), and the key has exactly the families the
//! network has. Reservations outside `SubnetMin..SubnetMax` are allowed:
//! those bounds only limit automatic allocation.

use crate::config::Config;
use crate::lease::SubnetKey;

/// Checks `key` against `cfg` (already through `check_network_config`);
/// the error says what is wrong and what would be right.
pub fn check_key(cfg: &Config, key: &SubnetKey) -> Result<(), String> {
    match (key.v4, cfg.enable_ipv4.then_some(cfg.network).flatten()) {
        (Some(v4), Some(net)) => {
            if v4.addr() != v4.network() {
                return Err(format!(
                    "{key} is not aligned: a /{} starting at {} would be {}-{}",
                    v4.prefix_len(),
                    v4.addr(),
                    v4.network(),
                    v4.prefix_len()
                ));
            }
            if !net.contains(&v4) {
                return Err(format!("{v4} lies outside the network {net}"));
            }
            if u32::from(v4.prefix_len()) != cfg.subnet_len {
                return Err(format!(
                    "{v4} is a /{}, the network's subnets are /{} (SubnetLen)",
                    v4.prefix_len(),
                    cfg.subnet_len
                ));
            }
        }
        (Some(_), None) => return Err(format!("{key} has an IPv4 subnet, the network has none")),
        (None, Some(net)) => {
            return Err(format!(
                "{key} has no IPv4 subnet, the network {net} needs one"
            ));
        }
        (None, None) => {}
    }
    match (
        key.v6,
        cfg.enable_ipv6.then_some(cfg.ipv6_network).flatten(),
    ) {
        (Some(v6), Some(net)) => {
            if v6.addr() != v6.network() {
                return Err(format!(
                    "{key} is not aligned: a /{} starting at {} would be {}",
                    v6.prefix_len(),
                    v6.addr(),
                    v6.trunc()
                ));
            }
            if !net.contains(&v6) {
                return Err(format!("{v6} lies outside the IPv6 network {net}"));
            }
            if u32::from(v6.prefix_len()) != cfg.ipv6_subnet_len {
                return Err(format!(
                    "{v6} is a /{}, the network's IPv6 subnets are /{} (IPv6SubnetLen)",
                    v6.prefix_len(),
                    cfg.ipv6_subnet_len
                ));
            }
        }
        (Some(_), None) => {
            return Err(format!("{key} has an IPv6 subnet, the network has none"));
        }
        (None, Some(net)) => {
            return Err(format!(
                "{key} has no IPv6 subnet, the dual-stack network needs one in {net} (a.b.c.d-len&ipv6-len)"
            ));
        }
        (None, None) => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        let mut c = crate::config::parse_config(text.as_bytes()).expect("parse");
        c.check_network_config().expect("check");
        c
    }

    #[test]
    fn hand_written_keys_must_fit_the_network() {
        let v4 = cfg(r#"{"Network":"10.244.0.0/16","SubnetMax":"10.244.63.0"}"#);
        let ok = |c: &Config, k: &str| check_key(c, &k.parse().expect("key"));
        assert_eq!(
            ok(&v4, "10.244.77.0-24"),
            Ok(()),
            "outside SubnetMax is a reservation"
        );
        for (key, want) in [
            (
                "10.244.77.0-23",
                "not aligned: a /23 starting at 10.244.77.0 would be 10.244.76.0-23",
            ),
            ("10.9.0.0-24", "outside the network 10.244.0.0/16"),
            ("10.244.76.0-23", "is a /23, the network's subnets are /24"),
            (
                "10.244.7.0-24&fd00::-64",
                "has an IPv6 subnet, the network has none",
            ),
        ] {
            let e = ok(&v4, key).expect_err(key);
            assert!(e.contains(want), "{key}: {e}");
        }
        let dual =
            cfg(r#"{"Network":"10.244.0.0/16","EnableIPv6":true,"IPv6Network":"fd00:10::/56"}"#);
        assert_eq!(ok(&dual, "10.244.7.0-24&fd00:10:0:7::-64"), Ok(()));
        for (key, want) in [
            ("10.244.7.0-24", "needs one in fd00:10::/56"),
            ("10.244.7.0-24&fd00:11::-64", "outside the IPv6 network"),
            ("10.244.7.0-24&fd00:10:0:7::1-64", "not aligned"),
        ] {
            let e = ok(&dual, key).expect_err(key);
            assert!(e.contains(want), "{key}: {e}");
        }
    }
}
