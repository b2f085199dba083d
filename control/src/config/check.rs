//! `CheckNetworkConfig` and the subnet arithmetic the lease allocator needs
//! (flannel pkg/subnet/config.go, pkg/subnet/etcd/local_manager.go).
//!
//! Arithmetic follows Go: IPv4 in wrapping `uint32`, IPv6 in unbounded big
//! integers (every result used here fits in `u128`).

use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use weft_compat::gonet::go_ip6_string;

use super::{Config, ConfigError};

/// The enabled address families (flannel `ipmatch.GetIPFamily`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpStack {
    /// IPv4 only.
    V4,
    /// IPv6 only.
    V6,
    /// Both.
    Dual,
}

impl Config {
    /// flannel's `CheckNetworkConfig`: computes the defaults and validates them.
    pub fn check_network_config(&mut self) -> Result<(), ConfigError> {
        if self.enable_ipv4 {
            self.check_ipv4()?;
        }
        if self.enable_ipv6 {
            self.check_ipv6()?;
        }
        Ok(())
    }

    fn check_ipv4(&mut self) -> Result<(), ConfigError> {
        let net = self
            .network
            .filter(|n| !(n.addr().is_unspecified() && n.prefix_len() == 0));
        let net = net.ok_or(ConfigError::NoNetwork)?;
        let prefix = u32::from(net.prefix_len());
        if self.subnet_len > 0 {
            if self.subnet_len > 30 {
                return Err(ConfigError::SubnetLenTooLong);
            }
            if self.subnet_len < prefix + 2 {
                return Err(ConfigError::TooFewSubnets);
            }
        } else if prefix > 28 {
            return Err(ConfigError::NetworkTooSmall);
        } else if prefix <= 22 {
            self.subnet_len = 24;
        } else {
            self.subnet_len = prefix + 2;
        }

        let size = 1u32 << (32 - self.subnet_len);
        let net_ip = u32::from(net.network());
        if self.subnet_min.is_unspecified() {
            self.subnet_min = Ipv4Addr::from(net_ip.wrapping_add(size));
        } else if !net.contains(&self.subnet_min) {
            return Err(ConfigError::SubnetMinOutOfRange);
        }
        if self.subnet_max.is_unspecified() {
            let next = net_ip.wrapping_add(1u32.checked_shl(32 - prefix).unwrap_or(0));
            self.subnet_max = Ipv4Addr::from(next.wrapping_sub(size));
        } else if !net.contains(&self.subnet_max) {
            return Err(ConfigError::SubnetMaxOutOfRange);
        }

        let mask = u32::MAX << (32 - self.subnet_len);
        if u32::from(self.subnet_min) & !mask != 0 {
            return Err(ConfigError::SubnetMinMisaligned(self.subnet_min));
        }
        if u32::from(self.subnet_max) & !mask != 0 {
            return Err(ConfigError::SubnetMaxMisaligned(self.subnet_max));
        }
        Ok(())
    }

    fn check_ipv6(&mut self) -> Result<(), ConfigError> {
        let net = self
            .ipv6_network
            .filter(|n| !(n.addr().is_unspecified() && n.prefix_len() == 0));
        let net = net.ok_or(ConfigError::NoIpv6Network)?;
        let prefix = u32::from(net.prefix_len());
        if self.ipv6_subnet_len > 0 {
            if self.ipv6_subnet_len > 126 {
                return Err(ConfigError::Ipv6SubnetLenTooLong);
            }
            if self.ipv6_subnet_len < prefix + 2 {
                return Err(ConfigError::TooFewSubnets);
            }
        } else if prefix > 124 {
            return Err(ConfigError::Ipv6NetworkTooSmall);
        } else if prefix <= 62 {
            self.ipv6_subnet_len = 64;
        } else {
            self.ipv6_subnet_len = prefix + 2;
        }

        let size = 1u128 << (128 - self.ipv6_subnet_len);
        let net_ip = u128::from(net.network());
        if is_unset6(self.ipv6_subnet_min) {
            self.ipv6_subnet_min = Some(Ipv6Addr::from(net_ip.wrapping_add(size)));
        } else if let Some(min) = self.ipv6_subnet_min
            && !net.contains(&min)
        {
            return Err(ConfigError::Ipv6SubnetMinOutOfRange);
        }
        if is_unset6(self.ipv6_subnet_max) {
            // Go: big-int Next() may be 2^128; the difference always fits.
            let next = net_ip.wrapping_add(1u128.checked_shl(128 - prefix).unwrap_or(0));
            self.ipv6_subnet_max = Some(Ipv6Addr::from(next.wrapping_sub(size)));
        } else if let Some(max) = self.ipv6_subnet_max
            && !net.contains(&max)
        {
            return Err(ConfigError::Ipv6SubnetMaxOutOfRange);
        }

        let host_bits = size - 1;
        let min = self.ipv6_subnet_min.unwrap_or(Ipv6Addr::UNSPECIFIED);
        if u128::from(min) & host_bits != 0 {
            return Err(ConfigError::Ipv6SubnetMinMisaligned(go_ip6_string(min)));
        }
        let max = self.ipv6_subnet_max.unwrap_or(Ipv6Addr::UNSPECIFIED);
        if u128::from(max) & host_bits != 0 {
            return Err(ConfigError::Ipv6SubnetMaxMisaligned(go_ip6_string(max)));
        }
        Ok(())
    }

    /// flannel `GetIPFamily(EnableIPv4, EnableIPv6)`.
    pub fn ip_family(&self) -> Result<IpStack, ConfigError> {
        match (self.enable_ipv4, self.enable_ipv6) {
            (true, false) => Ok(IpStack::V4),
            (false, true) => Ok(IpStack::V6),
            (true, true) => Ok(IpStack::Dual),
            (false, false) => Err(ConfigError::NoStack),
        }
    }

    /// Addresses per IPv4 subnet, `2^(32 - SubnetLen)` (meaningful after the check).
    pub fn subnet_size(&self) -> u64 {
        1u64 << (32 - self.subnet_len.min(32))
    }

    /// Addresses per IPv6 subnet, `2^(128 - IPv6SubnetLen)`; `None` for a length
    /// of 0 (unchecked config), whose size does not fit in `u128`.
    pub fn ipv6_subnet_size(&self) -> Option<u128> {
        1u128.checked_shl(128 - self.ipv6_subnet_len.min(128))
    }

    /// Every candidate IPv4 subnet, from SubnetMin to SubnetMax inclusive in
    /// SubnetLen steps (flannel's allocation walk). Empty when IPv4 is unchecked.
    pub fn subnet_candidates(&self) -> impl Iterator<Item = Ipv4Net> + use<> {
        let len = self.subnet_len;
        let ok = (1..=32).contains(&len);
        let step = self.subnet_size();
        let (min, max) = (
            u64::from(u32::from(self.subnet_min)),
            u64::from(u32::from(self.subnet_max)),
        );
        let mut next = ok.then_some(min);
        std::iter::from_fn(move || {
            let cur = next.filter(|c| *c <= max)?;
            next = cur.checked_add(step);
            let ip = Ipv4Addr::from(u32::try_from(cur).ok()?);
            Ipv4Net::new(ip, len as u8).ok()
        })
    }

    /// Every candidate IPv6 subnet, from IPv6SubnetMin to IPv6SubnetMax inclusive
    /// in IPv6SubnetLen steps. Empty when IPv6 is unchecked.
    pub fn ipv6_subnet_candidates(&self) -> impl Iterator<Item = Ipv6Net> + use<> {
        let len = self.ipv6_subnet_len;
        let step = if (1..=128).contains(&len) {
            self.ipv6_subnet_size()
        } else {
            None
        };
        let min = self.ipv6_subnet_min.map(u128::from);
        let max = self.ipv6_subnet_max.map_or(0, u128::from);
        let mut next = step.and(min);
        std::iter::from_fn(move || {
            let cur = next.filter(|c| *c <= max)?;
            next = step.and_then(|s| cur.checked_add(s));
            Ipv6Net::new(Ipv6Addr::from(cur), len as u8).ok()
        })
    }

    /// flannel `isSubnetConfigCompat`: SubnetMin <= IP <= SubnetMax and the
    /// prefix equals SubnetLen. `None` is Go's empty `0.0.0.0/0` (IPv6-only leases),
    /// which is compatible exactly when IPv4 is unconfigured.
    pub fn is_subnet_compatible(&self, subnet: Option<Ipv4Net>) -> bool {
        let sn = subnet.unwrap_or_else(|| Ipv4Net::new_assert(Ipv4Addr::UNSPECIFIED, 0));
        sn.addr() >= self.subnet_min
            && sn.addr() <= self.subnet_max
            && u32::from(sn.prefix_len()) == self.subnet_len
    }

    /// flannel `isIPv6SubnetConfigCompat`: with IPv6 disabled the lease must have
    /// no IPv6 subnet; otherwise IPv6SubnetMin <= IP <= IPv6SubnetMax and the
    /// prefix equals IPv6SubnetLen.
    pub fn is_ipv6_subnet_compatible(&self, subnet: Option<Ipv6Net>) -> bool {
        let sn = subnet.filter(|n| !(n.addr().is_unspecified() && n.prefix_len() == 0));
        if !self.enable_ipv6 {
            return sn.is_none();
        }
        let Some(sn) = sn else { return false };
        let min = self.ipv6_subnet_min.unwrap_or(Ipv6Addr::UNSPECIFIED);
        let max = self.ipv6_subnet_max.unwrap_or(Ipv6Addr::UNSPECIFIED);
        sn.addr() >= min && sn.addr() <= max && u32::from(sn.prefix_len()) == self.ipv6_subnet_len
    }

    /// Both checks, as flannel applies them to a lease it could reuse
    /// (the one held for our PublicIP, or the previous subnet from subnet.env).
    pub fn is_lease_compatible(
        &self,
        subnet: Option<Ipv4Net>,
        ipv6_subnet: Option<Ipv6Net>,
    ) -> bool {
        self.is_subnet_compatible(subnet) && self.is_ipv6_subnet_compatible(ipv6_subnet)
    }
}

fn is_unset6(v: Option<Ipv6Addr>) -> bool {
    v.is_none_or(|a| a.is_unspecified())
}
