//! Policy-routing rules and the routes of every table, read only (`ip rule
//! show`, `ip route show table all`): what `weft doctor` needs to tell
//! whether a rule sends the pod network to another table before the main
//! one.

use std::net::IpAddr;

use futures::TryStreamExt;
use ipnet::IpNet;
use rtnetlink::IpVersion;
use rtnetlink::packet_route::route::RouteAttribute;
use rtnetlink::packet_route::rule::{RuleAction, RuleAttribute, RuleFlags, RuleMessage};

use super::{Netlink, NetlinkError, req, route_from};
use crate::netlink::Route;

/// What a rule does with the packets it matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleDo {
    /// `lookup TABLE`.
    Table(u32),
    /// `blackhole`, `unreachable` or `prohibit`: the packet is dropped.
    Drop(&'static str),
    /// `goto`, `nop` or another action: nothing looked up here.
    Other,
}

/// One policy-routing rule (`ip rule show`), as far as the doctor needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// `pref`.
    pub priority: u32,
    /// The action.
    pub action: RuleDo,
    /// `from` (`None`: all).
    pub src: Option<IpNet>,
    /// `to` (`None`: all).
    pub dst: Option<IpNet>,
    /// `iif`.
    pub iif: Option<String>,
    /// Matches only marked packets, packets of some users, some ports or
    /// protocols, or leaving some device (`fwmark`, `uidrange`, `sport`,
    /// `dport`, `ipproto`, `oif`), or is inverted (`not`): not every pod
    /// packet to its `to`.
    pub narrowed: bool,
}

impl std::fmt::Display for Rule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: from ", self.priority)?;
        match self.src {
            Some(s) => write!(f, "{s}")?,
            None => f.write_str("all")?,
        }
        if let Some(d) = self.dst {
            write!(f, " to {d}")?;
        }
        if let Some(i) = &self.iif {
            write!(f, " iif {i}")?;
        }
        if self.narrowed {
            f.write_str(" (+ selectors)")?;
        }
        match self.action {
            RuleDo::Table(t) => write!(f, " lookup {t}"),
            RuleDo::Drop(a) => write!(f, " {a}"),
            RuleDo::Other => f.write_str(" (goto/nop)"),
        }
    }
}

fn net(a: IpAddr, len: u8) -> Option<IpNet> {
    (len > 0).then(|| IpNet::new(a, len).ok()).flatten()
}

fn rule_from(m: &RuleMessage) -> Rule {
    let mut r = Rule {
        priority: 0,
        action: RuleDo::Other,
        src: None,
        dst: None,
        iif: None,
        narrowed: m.header.flags.contains(RuleFlags::Invert),
    };
    let mut table = u32::from(m.header.table);
    for a in &m.attributes {
        match a {
            RuleAttribute::Priority(p) => r.priority = *p,
            RuleAttribute::Table(t) => table = *t,
            RuleAttribute::Source(s) => r.src = net(*s, m.header.src_len),
            RuleAttribute::Destination(d) => r.dst = net(*d, m.header.dst_len),
            RuleAttribute::Iifname(i) => r.iif = Some(i.clone()),
            RuleAttribute::FwMark(_)
            | RuleAttribute::UidRange(_)
            | RuleAttribute::Oifname(_)
            | RuleAttribute::IpProtocol(_)
            | RuleAttribute::SourcePortRange(_)
            | RuleAttribute::DestinationPortRange(_) => r.narrowed = true,
            _ => {}
        }
    }
    r.action = match m.header.action {
        RuleAction::ToTable => RuleDo::Table(table),
        RuleAction::Blackhole => RuleDo::Drop("blackhole"),
        RuleAction::Unreachable => RuleDo::Drop("unreachable"),
        RuleAction::Prohibit => RuleDo::Drop("prohibit"),
        _ => RuleDo::Other,
    };
    r
}

impl Netlink {
    /// `ip [-6] rule show`, in the kernel's order (by priority).
    pub async fn rules(&self, v6: bool) -> Result<Vec<Rule>, NetlinkError> {
        let v = if v6 { IpVersion::V6 } else { IpVersion::V4 };
        let msgs: Vec<RuleMessage> = self
            .handle
            .rule()
            .get(v)
            .execute()
            .try_collect()
            .await
            .map_err(req("ip rule show"))?;
        let mut rules: Vec<Rule> = msgs.iter().map(rule_from).collect();
        rules.sort_by_key(|r| r.priority);
        Ok(rules)
    }

    /// `ip [-6] route show table TABLE` for one table.
    pub async fn routes_in(&self, table: u32, v6: bool) -> Result<Vec<Route>, NetlinkError> {
        Ok(self
            .route_dump(v6)
            .await?
            .iter()
            .filter(|m| {
                let t = m
                    .attributes
                    .iter()
                    .find_map(|a| match a {
                        RouteAttribute::Table(t) => Some(*t),
                        _ => None,
                    })
                    .unwrap_or(u32::from(m.header.table));
                t == table
            })
            .filter_map(route_from)
            .collect())
    }
}
