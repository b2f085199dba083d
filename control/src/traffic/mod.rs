//! Host traffic rules: flannel's masquerade and forward rules (flannel-compat §8).
//!
//! One small trait, [`TrafficManager`], with three drivers chosen in one place
//! ([`new_manager`]):
//!
//! - [`IptablesManager`]: chains `FLANNEL-POSTRTG` (nat) and `FLANNEL-FWD` (filter), jumps appended
//!   to `POSTROUTING`/`FORWARD`, for IPv4 (`iptables`) and IPv6 (`ip6tables`), applied with
//!   `iptables-restore --noflush -w`, one transaction per table;
//! - [`NftablesManager`] (`EnableNFTables`): tables `ip flannel-ipv4` / `ip6 flannel-ipv6`
//!   with base chains `postrtg` and `forward`;
//! - [`NoneManager`]: installs nothing and records every call. It is the test double and the
//!   driver for nodes that manage their own firewall.
//!
//! The rule text is produced by pure functions in [`rules`] (iptables) and [`nft_rules`]
//! (nftables); the commands run through one small [`Runner`].
//!
//! # Contract: call order in the daemon
//!
//! flannel's order (fl:main.go), which weftd must keep:
//!
//! 1. If nftables is off: [`ensure_br_netfilter`] (`/proc`, v6 flag; [`check_br_netfilter`]
//!    after trying `modprobe br_netfilter`); an error is fatal and is logged as
//!    `Failed to check br_netfilter: <error>`.
//! 2. Acquire the lease (backend registration).
//! 3. `let mgr = new_manager(Kind::from_config(enable_nftables), flags.random_fully_disable,
//!    Runner::new())`; log `Cleaning-up unused traffic manager rules`; [`cleanup_other`]
//!    (the factory's: best-effort, log a warning on error); `mgr.init()?`.
//! 4. If `--ip-masq`: read the previous `FLANNEL_NETWORK`/`FLANNEL_SUBNET` (and v6) from the old
//!    subnet.env into a [`Previous`], then `mgr.setup_masq(&network, &subnet, Some(&prev))`; an
//!    error is fatal (`Failed to setup masq rules, <error>`).
//! 5. Unless `--iptables-forward-rules=false`: `mgr.setup_forward(&network, accept_in)`.
//!    ([`install`] does 4 and 5 from a [`Flags`].)
//! 6. Only now write subnet.env (flannel-compat §7: the rules are in place first).
//! 7. [`spawn_resync`]`(mgr, flags.resync)`; keep the handle for the daemon's lifetime.
//!
//! Rules are not removed on exit (flannel does not either).
//!
//! **Invariant:** every driver is idempotent: setting up twice, or setting up after a crash,
//! leaves exactly one copy of every rule and one jump per chain.

mod br_netfilter;
mod error;
mod iptables;
pub mod nft_rules;
mod nftables;
mod none;
mod resync;
pub mod rules;
mod runner;
#[cfg(test)]
mod tests;

use std::{fmt, sync::Arc, time::Duration};

use ipnet::{Ipv4Net, Ipv6Net};

pub use self::{
    br_netfilter::{
        BRIDGE_NF_CALL_IP6TABLES, BRIDGE_NF_CALL_IPTABLES, check_br_netfilter, ensure_br_netfilter,
        modprobe_br_netfilter,
    },
    error::Error,
    iptables::IptablesManager,
    nftables::NftablesManager,
    none::{Call, NoneManager},
    resync::{MIN_PERIOD as MIN_RESYNC_PERIOD, ResyncHandle, resync_once, spawn_resync},
    runner::{Output, Runner},
};

/// One optional CIDR per address family: the cluster `Network`/`IPv6Network`, or this node's
/// lease subnet (network form, e.g. `10.244.1.0/24`). `None` means the family is disabled.
///
/// Host bits are ignored: every driver masks the values (`10.244.1.1/24` → `10.244.1.0/24`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Networks {
    /// The IPv4 CIDR, if IPv4 is enabled.
    pub v4: Option<Ipv4Net>,
    /// The IPv6 CIDR, if IPv6 is enabled.
    pub v6: Option<Ipv6Net>,
}

/// The values the previous subnet.env held (`FLANNEL_NETWORK`, `FLANNEL_SUBNET`,
/// `FLANNEL_IPV6_NETWORK`, `FLANNEL_IPV6_SUBNET`), used to delete stale masquerade rules when
/// the Network or the lease subnet changed. `FLANNEL_SUBNET=10.244.1.1/24` may be passed as is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Previous {
    /// Previous `FLANNEL_NETWORK` / `FLANNEL_IPV6_NETWORK`.
    pub network: Networks,
    /// Previous `FLANNEL_SUBNET` / `FLANNEL_IPV6_SUBNET`.
    pub subnet: Networks,
}

/// The flanneld flags that drive the traffic rules.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Flags {
    /// `--ip-masq`: install the masquerade rules.
    pub ip_masq: bool,
    /// `--ip-masq-fully-random-disable`: never use `--random-fully` / `fully-random`.
    pub random_fully_disable: bool,
    /// `--iptables-forward-rules` (default true): install the forward-accept rules.
    pub forward_rules: bool,
    /// `--iptables-resync` (default 5 s): period of [`spawn_resync`].
    pub resync: Duration,
    /// weft's tunnel TAP (`--tunnel-gso` not `off` on a vxlan node): IPv4 packets forwarded in
    /// from it are accepted with the forward rules. The TAP exists only while the userspace
    /// engine uses it; the rule matches nothing otherwise.
    pub accept_in: Option<&'static str>,
}

impl Default for Flags {
    fn default() -> Self {
        Self {
            ip_masq: false,
            random_fully_disable: false,
            forward_rules: true,
            resync: Duration::from_secs(5),
            accept_in: None,
        }
    }
}

/// Installs, checks and removes flannel's host rules.
///
/// Methods are synchronous (they run short-lived `iptables`/`nft` processes); call them from a
/// blocking context. Implementations serialise their own calls, so one manager can be shared
/// between the daemon and the resync thread.
pub trait TrafficManager: Send + Sync + fmt::Debug {
    /// `"iptables"`, `"nftables"` or `"none"`.
    fn name(&self) -> &'static str;

    /// Prepares the driver: probes tool versions (iptables) or creates both flannel tables
    /// (nftables, flannel's `Init`).
    fn init(&self) -> Result<(), Error>;

    /// Installs the masquerade rules for every family that has both a `network` and a `subnet`
    /// (only call this with `--ip-masq`). With `prev`, stale rules built from the previous
    /// values are deleted first when they differ; a family that was enabled in `prev` and is
    /// now disabled loses its masquerade chain. The rules are re-checked by [`Self::ensure`].
    fn setup_masq(
        &self,
        network: &Networks,
        subnet: &Networks,
        prev: Option<&Previous>,
    ) -> Result<(), Error>;

    /// Installs the forward-accept rules for every family that has a `network` (unless
    /// `--iptables-forward-rules=false`), with an accept for IPv4 packets forwarded in from
    /// device `accept_in` (weft's tunnel TAP, `--tunnel-gso`). The rules are re-checked by
    /// [`Self::ensure`].
    fn setup_forward(&self, network: &Networks, accept_in: Option<&str>) -> Result<(), Error>;

    /// Re-checks everything set up so far and re-applies whatever is missing or altered.
    /// Returns whether anything was repaired.
    fn ensure(&self) -> Result<bool, Error>;

    /// Removes every rule, chain and table this driver owns, for both families. Idempotent.
    fn cleanup(&self) -> Result<(), Error>;
}

/// Which driver to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// iptables / ip6tables (flannel's default).
    Iptables,
    /// nftables (`EnableNFTables: true`).
    Nftables,
    /// Install nothing (the node manages its own firewall; tests).
    None,
}

impl Kind {
    /// flannel's choice: `EnableNFTables` selects nftables, otherwise iptables.
    pub fn from_config(enable_nftables: bool) -> Self {
        if enable_nftables {
            Self::Nftables
        } else {
            Self::Iptables
        }
    }
}

/// The only place that names the drivers.
pub fn new_manager(
    kind: Kind,
    random_fully_disable: bool,
    runner: Runner,
) -> Arc<dyn TrafficManager> {
    match kind {
        Kind::Iptables => Arc::new(IptablesManager::new(runner, random_fully_disable)),
        Kind::Nftables => Arc::new(NftablesManager::new(runner, random_fully_disable)),
        Kind::None => Arc::new(NoneManager::new()),
    }
}

/// Removes the rules of the driver other than `kind`'s (flannel's startup `CleanUp` of the
/// unused traffic manager): with iptables active the nftables tables, with nftables active the
/// iptables chains and the jumps to them; nothing for [`Kind::None`]. Best-effort; missing
/// state is not an error. The factory does it, so that no driver names another.
pub fn cleanup_other(kind: Kind, random_fully_disable: bool, runner: Runner) -> Result<(), Error> {
    match kind {
        Kind::Iptables => NftablesManager::new(runner, random_fully_disable).cleanup(),
        Kind::Nftables => IptablesManager::new(runner, random_fully_disable).cleanup(),
        Kind::None => Ok(()),
    }
}

/// Steps 4 and 5 of the call order: masquerade rules if `flags.ip_masq`, forward rules if
/// `flags.forward_rules`. Call before writing subnet.env.
pub fn install(
    mgr: &dyn TrafficManager,
    flags: &Flags,
    network: &Networks,
    subnet: &Networks,
    prev: Option<&Previous>,
) -> Result<(), Error> {
    if flags.ip_masq {
        mgr.setup_masq(network, subnet, prev)?;
    }
    if flags.forward_rules {
        mgr.setup_forward(network, flags.accept_in)?;
    }
    Ok(())
}

/// Per-family view of [`Networks`] used by the drivers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct FamilyNets {
    family: rules::Family,
    network: Option<ipnet::IpNet>,
    subnet: Option<ipnet::IpNet>,
}

impl Networks {
    fn get(&self, family: rules::Family) -> Option<ipnet::IpNet> {
        match family {
            rules::Family::V4 => self.v4.map(|n| ipnet::IpNet::V4(n.trunc())),
            rules::Family::V6 => self.v6.map(|n| ipnet::IpNet::V6(n.trunc())),
        }
    }
}

/// Current and previous values of one family, for the drivers' `setup_masq`.
fn masq_plan(
    family: rules::Family,
    network: &Networks,
    subnet: &Networks,
    prev: Option<&Previous>,
) -> Result<(FamilyNets, Option<FamilyNets>), Error> {
    let cur = FamilyNets {
        family,
        network: network.get(family),
        subnet: subnet.get(family),
    };
    if let (Some(network), None) = (cur.network, cur.subnet) {
        return Err(Error::MissingSubnet { network });
    }
    let prev = prev.map(|p| FamilyNets {
        family,
        network: p.network.get(family),
        subnet: p.subnet.get(family),
    });
    Ok((cur, prev))
}
