//! What a lease written by hand (`weft leases put`) must satisfy before it
//! reaches the store: the key is aligned (its address is its subnet's first
//! one: `10.244.77.0-23` is not), each family's subnet lies inside the
//! network config's network and has its `SubnetLen` (what the allocator and
//! every node's routes assume), and the key has exactly the families the
//! network has. Reservations outside `SubnetMin..SubnetMax` are allowed:
//! those bounds only limit automatic allocation.

use ipnet::IpNet;

use crate::config::Config;
use crate::lease::SubnetKey;

/// Checks `key` against `cfg` (already through `check_network_config`);
/// the error says what is wrong and what would be right.
pub fn check_key(cfg: &Config, key: &SubnetKey) -> Result<(), String> {
    let v4 = Family {
        name: "IPv4",
        len_name: "SubnetLen",
        mine: key.v4.map(IpNet::V4),
        network: cfg.network.filter(|_| cfg.enable_ipv4).map(IpNet::V4),
        len: cfg.subnet_len,
    };
    let v6 = Family {
        name: "IPv6",
        len_name: "IPv6SubnetLen",
        mine: key.v6.map(IpNet::V6),
        network: cfg.ipv6_network.filter(|_| cfg.enable_ipv6).map(IpNet::V6),
        len: cfg.ipv6_subnet_len,
    };
    v4.check(key).and_then(|()| v6.check(key))
}

/// One address family of a key and of the network config.
struct Family {
    name: &'static str,
    len_name: &'static str,
    mine: Option<IpNet>,
    network: Option<IpNet>,
    len: u32,
}

impl Family {
    fn check(&self, key: &SubnetKey) -> Result<(), String> {
        let name = self.name;
        match (self.mine, self.network) {
            (Some(sn), Some(net)) => {
                if sn.addr() != sn.network() {
                    let aligned = sn.trunc();
                    return Err(format!(
                        "{key} is not aligned: a /{} starting at {} would be {}-{}",
                        sn.prefix_len(),
                        sn.addr(),
                        aligned.addr(),
                        aligned.prefix_len()
                    ));
                }
                if !net.contains(&sn) {
                    return Err(format!("{sn} lies outside the {name} network {net}"));
                }
                if u32::from(sn.prefix_len()) != self.len {
                    return Err(format!(
                        "{sn} is a /{}, the network's {name} subnets are /{} ({})",
                        sn.prefix_len(),
                        self.len,
                        self.len_name
                    ));
                }
                Ok(())
            }
            (Some(_), None) => Err(format!("{key} has an {name} subnet, the network has none")),
            (None, Some(net)) => Err(format!(
                "{key} has no {name} subnet, the network needs one in {net} (a.b.c.d-len[&ipv6-len])"
            )),
            (None, None) => Ok(()),
        }
    }
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
            ("10.9.0.0-24", "outside the IPv4 network 10.244.0.0/16"),
            (
                "10.244.76.0-23",
                "is a /23, the network's IPv4 subnets are /24",
            ),
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
