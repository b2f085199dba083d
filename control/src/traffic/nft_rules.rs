//! flannel's nftables tables, chains and rules as text (pure; flannel-compat §8.2).
//!
//! flannel drives nftables through knftables; we write the same objects as `nft -f -` scripts.
//! Rules are kept in the form `nft list chain` prints them (`meta mark 0x00004000 return`, where
//! flannel's source says `0x4000`; the kernel holds the same expression either way), so
//! [`NftChain::listing`] reproduces flannel's e2e golden text (fl:e2e/rules.go
//! `expectedNftPostrouting` / `expectedNftForward`).

use ipnet::IpNet;

use super::rules::Family;

/// flannel's IPv4 table (family `ip`).
pub const IPV4_TABLE: &str = "flannel-ipv4";
/// flannel's IPv6 table (family `ip6`).
pub const IPV6_TABLE: &str = "flannel-ipv6";
/// The filter base chain on the forward hook.
pub const FORWARD_CHAIN: &str = "forward";
/// The nat base chain on the postrouting hook.
pub const POSTRTG_CHAIN: &str = "postrtg";
/// The chain of the `fully-random` probe (only ever used in check mode).
pub const PROBE_CHAIN: &str = "masqueradeTest";

/// `ip` or `ip6`: both the table family and the rule's address-match keyword.
pub fn nft_family(family: Family) -> &'static str {
    match family {
        Family::V4 => "ip",
        Family::V6 => "ip6",
    }
}

/// `flannel-ipv4` or `flannel-ipv6`.
pub fn table(family: Family) -> &'static str {
    match family {
        Family::V4 => IPV4_TABLE,
        Family::V6 => IPV6_TABLE,
    }
}

/// `add table ip flannel-ipv4 { comment "rules for flannel-ipv4" ; }` (flannel's `initTable`).
pub fn table_payload(family: Family) -> String {
    let (f, t) = (nft_family(family), table(family));
    format!("add table {f} {t} {{ comment \"rules for {t}\" ; }}\n")
}

/// flannel's `Init`: both tables, always.
pub fn init_payload() -> String {
    Family::ALL.iter().map(|f| table_payload(*f)).collect()
}

/// One of flannel's base chains with its rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NftChain {
    /// Table family.
    pub family: Family,
    /// `forward` or `postrtg`.
    pub name: &'static str,
    /// `type ... hook ... priority ...` as nft prints it.
    pub hook: &'static str,
    /// The chain comment.
    pub comment: &'static str,
    /// The rules, as nft prints them.
    pub rules: Vec<String>,
}

/// Chain `forward`: accept traffic from and to the Network, and from
/// device `accept_in` (see [`super::rules::forward_rules`]).
pub fn forward_chain(network: IpNet, accept_in: Option<&str>) -> NftChain {
    let family = Family::of(&network);
    let f = nft_family(family);
    let mut rules = vec![
        format!("{f} saddr {network} accept"),
        format!("{f} daddr {network} accept"),
    ];
    rules.extend(accept_in.map(|dev| format!("iifname \"{dev}\" accept")));
    NftChain {
        family,
        name: FORWARD_CHAIN,
        hook: "type filter hook forward priority filter",
        comment: "chain to accept flannel traffic",
        rules,
    }
}

/// Chain `postrtg`: flannel's `addMasqRules`. Note the fourth rule is `saddr != P daddr N`,
/// unlike iptables' `! -s N -d P` (flannel-compat §14; copied as is).
pub fn masq_chain(network: IpNet, subnet: IpNet, fully_random: bool) -> NftChain {
    let family = Family::of(&network);
    let (f, n, p) = (nft_family(family), network, subnet);
    let masq = if fully_random {
        "masquerade fully-random"
    } else {
        "masquerade"
    };
    NftChain {
        family,
        name: POSTRTG_CHAIN,
        hook: "type nat hook postrouting priority srcnat",
        comment: "chain to manage traffic masquerading by flannel",
        rules: vec![
            "meta mark 0x00004000 return".to_string(),
            format!("{f} saddr {p} {f} daddr {n} return"),
            format!("{f} saddr {n} {f} daddr {p} return"),
            format!("{f} saddr != {p} {f} daddr {n} return"),
            format!("{f} saddr {n} {f} daddr != {} {masq}", family.multicast()),
            format!("{f} saddr != {n} {f} daddr {n} {masq}"),
        ],
    }
}

// === impl NftChain ===

impl NftChain {
    /// The `nft -f -` script that (re)installs the chain atomically: table, chain, flush, rules.
    pub fn payload(&self) -> String {
        let (f, t, c) = (nft_family(self.family), table(self.family), self.name);
        let mut out = table_payload(self.family);
        out.push_str(&format!(
            "add chain {f} {t} {c} {{ {} ; comment \"{}\" ; }}\nflush chain {f} {t} {c}\n",
            self.hook, self.comment
        ));
        for rule in &self.rules {
            out.push_str(&format!("add rule {f} {t} {c} {rule}\n"));
        }
        out
    }

    /// What `nft list chain <family> <table> <chain>` prints when the chain is intact.
    pub fn listing(&self) -> String {
        let mut out = format!(
            "table {} {} {{\n\tchain {} {{\n\t\tcomment \"{}\"\n\t\t{}; policy accept;\n",
            nft_family(self.family),
            table(self.family),
            self.name,
            self.comment,
            self.hook
        );
        for rule in &self.rules {
            out.push_str(&format!("\t\t{rule}\n"));
        }
        out.push_str("\t}\n}\n");
        out
    }

    /// Arguments of `nft` that list this chain.
    pub fn list_args(&self) -> [&'static str; 5] {
        chain_list_args(self.family, self.name)
    }
}

/// Arguments of `nft` that list chain `name` of flannel's table for `family`.
pub fn chain_list_args(family: Family, name: &'static str) -> [&'static str; 5] {
    ["list", "chain", nft_family(family), table(family), name]
}

/// `delete chain ip flannel-ipv4 <name>`.
pub fn delete_chain_payload(family: Family, name: &str) -> String {
    format!(
        "delete chain {} {} {name}\n",
        nft_family(family),
        table(family)
    )
}

/// The check-mode transaction of flannel's `checkRandomfully`.
pub fn probe_payload() -> String {
    let (f, t, c) = ("ip", IPV4_TABLE, PROBE_CHAIN);
    format!(
        "{}add chain {f} {t} {c} {{ type nat hook postrouting priority srcnat ; \
         comment \"chain to test if masquerade random fully is supported\" ; }}\n\
         flush chain {f} {t} {c}\n\
         add rule {f} {t} {c} ip saddr != 127.0.0.1 masquerade fully-random\n",
        table_payload(Family::V4)
    )
}

/// flannel's tables present in `nft list tables` output.
pub fn parse_tables(listing: &str) -> Vec<Family> {
    Family::ALL
        .into_iter()
        .filter(|f| {
            let want = format!("table {} {}", nft_family(*f), table(*f));
            listing.lines().any(|l| l.trim() == want)
        })
        .collect()
}

/// Deletes the given flannel tables in one transaction (`None` when there are none).
pub fn delete_tables_payload(families: &[Family]) -> Option<String> {
    let out: String = families
        .iter()
        .map(|f| format!("delete table {} {}\n", nft_family(*f), table(*f)))
        .collect();
    (!out.is_empty()).then_some(out)
}
