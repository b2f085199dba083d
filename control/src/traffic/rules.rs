//! flannel's iptables rules as text (pure; flannel-compat §8.1).
//!
//! Rules are kept as the exact lines `iptables -S` prints, e.g.
//! `-A FLANNEL-POSTRTG -s 10.244.1.0/24 -d 10.244.0.0/16 -m comment --comment "flanneld masq" -j RETURN`.
//! That one form serves three purposes: it is what flannel's e2e test compares, it is valid
//! `iptables-restore` input, and comparing it with an `iptables -S` listing tells whether the
//! rules are intact (a stricter check than flannel's per-rule `iptables -C`: it also catches
//! reordered or foreign rules inside flannel's chains).

use std::fmt::Write as _;

use ipnet::IpNet;

/// kube-proxy's masquerade mark; marked packets are left to kube-proxy (no double NAT).
pub const KUBE_PROXY_MARK: &str = "0x4000/0x4000";
/// Comment on every masquerade rule.
pub const MASQ_COMMENT: &str = "flanneld masq";
/// Comment on every forward rule.
pub const FORWARD_COMMENT: &str = "flanneld forward";
/// flannel's masquerade chain in the nat table.
pub const POSTRTG_CHAIN: &str = "FLANNEL-POSTRTG";
/// flannel's forward chain in the filter table.
pub const FWD_CHAIN: &str = "FLANNEL-FWD";

/// An address family.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// IPv4 (`iptables`, nft family `ip`).
    V4,
    /// IPv6 (`ip6tables`, nft family `ip6`).
    V6,
}

impl Family {
    /// Both families, v4 first (flannel's order).
    pub const ALL: [Family; 2] = [Family::V4, Family::V6];

    /// The family of `net`.
    pub fn of(net: &IpNet) -> Self {
        match net {
            IpNet::V4(_) => Self::V4,
            IpNet::V6(_) => Self::V6,
        }
    }

    /// `iptables` or `ip6tables`.
    pub fn iptables(self) -> &'static str {
        match self {
            Self::V4 => "iptables",
            Self::V6 => "ip6tables",
        }
    }

    /// `iptables-restore` or `ip6tables-restore`.
    pub fn iptables_restore(self) -> &'static str {
        match self {
            Self::V4 => "iptables-restore",
            Self::V6 => "ip6tables-restore",
        }
    }

    /// The multicast range that is never masqueraded.
    pub fn multicast(self) -> &'static str {
        match self {
            Self::V4 => "224.0.0.0/4",
            Self::V6 => "ff00::/8",
        }
    }

    /// `IPv4` or `IPv6`, for logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::V4 => "IPv4",
            Self::V6 => "IPv6",
        }
    }
}

/// One flannel chain, its rules and the jump to it from a built-in chain: the unit that is
/// applied, checked and deleted together.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChainRules {
    /// Which tool (`iptables`/`ip6tables`).
    pub family: Family,
    /// `nat` or `filter`.
    pub table: &'static str,
    /// `POSTROUTING` or `FORWARD`; the jump is appended at its end.
    pub builtin: &'static str,
    /// `FLANNEL-POSTRTG` or `FLANNEL-FWD`.
    pub chain: &'static str,
    /// The jump line, e.g. `-A POSTROUTING -m comment --comment "flanneld masq" -j FLANNEL-POSTRTG`.
    pub jump: String,
    /// The chain's rules in order.
    pub rules: Vec<String>,
}

/// flannel's masquerade rules (`masqRules` / `masqIP6Rules`) for Network `network` and lease
/// subnet `subnet` (both in network form, same family). `random_fully` appends
/// `--random-fully` to both MASQUERADE rules.
pub fn masq_rules(network: IpNet, subnet: IpNet, random_fully: bool) -> ChainRules {
    let family = Family::of(&network);
    let (n, p, c) = (
        network,
        subnet,
        format!("-m comment --comment \"{MASQ_COMMENT}\""),
    );
    let r = |spec: String| format!("-A {POSTRTG_CHAIN} {spec}");
    let masq = if random_fully {
        "MASQUERADE --random-fully"
    } else {
        "MASQUERADE"
    };
    ChainRules {
        family,
        table: "nat",
        builtin: "POSTROUTING",
        chain: POSTRTG_CHAIN,
        jump: format!("-A POSTROUTING {c} -j {POSTRTG_CHAIN}"),
        rules: vec![
            r(format!("-m mark --mark {KUBE_PROXY_MARK} {c} -j RETURN")),
            r(format!("-s {p} -d {n} {c} -j RETURN")),
            r(format!("-s {n} -d {p} {c} -j RETURN")),
            r(format!("! -s {n} -d {p} {c} -j RETURN")),
            r(format!("-s {n} ! -d {} {c} -j {masq}", family.multicast())),
            r(format!("! -s {n} -d {n} {c} -j {masq}")),
        ],
    }
}

/// flannel's forward rules (`forwardRules`) for Network `network`, and
/// weft's accept for packets forwarded in from device `accept_in` (the
/// tunnel TAP of `--tunnel-gso`, whose frames go from the node's address to
/// a peer node's: no Network rule matches them).
pub fn forward_rules(network: IpNet, accept_in: Option<&str>) -> ChainRules {
    let c = format!("-m comment --comment \"{FORWARD_COMMENT}\"");
    let mut rules = vec![
        format!("-A {FWD_CHAIN} -s {network} {c} -j ACCEPT"),
        format!("-A {FWD_CHAIN} -d {network} {c} -j ACCEPT"),
    ];
    rules.extend(accept_in.map(|dev| format!("-A {FWD_CHAIN} -i {dev} {c} -j ACCEPT")));
    ChainRules {
        family: Family::of(&network),
        table: "filter",
        builtin: "FORWARD",
        chain: FWD_CHAIN,
        jump: format!("-A FORWARD {c} -j {FWD_CHAIN}"),
        rules,
    }
}

// === impl ChainRules ===

impl ChainRules {
    /// What `iptables -t <table> -S <chain>` prints when the chain is intact.
    pub fn chain_listing(&self) -> String {
        let mut out = format!("-N {}\n", self.chain);
        for rule in &self.rules {
            out.push_str(rule);
            out.push('\n');
        }
        out
    }

    /// The `iptables-restore --noflush` transaction that (re)installs this chain, given the
    /// current `iptables -S <builtin>` listing. It creates or flushes the chain (`:CHAIN - [0:0]`
    /// flushes an existing user chain under `--noflush`), deletes every existing copy of the
    /// jump, then appends the jump and the rules: flannel's delete-then-re-append in one atomic
    /// step, which also removes duplicates and stale rules.
    pub fn apply_payload(&self, builtin_listing: &str) -> String {
        let mut out = format!("*{}\n:{} - [0:0]\n", self.table, self.chain);
        for _ in 0..count(builtin_listing, &self.jump) {
            push_line(&mut out, &to_delete(&self.jump));
        }
        push_line(&mut out, &self.jump);
        for rule in &self.rules {
            push_line(&mut out, rule);
        }
        out.push_str("COMMIT\n");
        out
    }

    /// Whether the listings show exactly one jump and exactly these rules in this order.
    /// `chain_listing` is `None` when the chain does not exist.
    pub fn is_intact(&self, builtin_listing: &str, chain_listing: Option<&str>) -> bool {
        let Some(chain_listing) = chain_listing else {
            return false;
        };
        let got: Vec<&str> = rule_lines(chain_listing).collect();
        count(builtin_listing, &self.jump) == 1 && got == self.rules
    }

    /// A transaction deleting every copy of this chain's rules (and of the jump) that the
    /// listings show, or `None` when there is nothing to delete (flannel's `teardownIPTables`,
    /// used for stale rules built from the previous subnet.env).
    pub fn teardown_payload(
        &self,
        builtin_listing: &str,
        chain_listing: Option<&str>,
    ) -> Option<String> {
        let mut body = String::new();
        for _ in 0..count(builtin_listing, &self.jump) {
            push_line(&mut body, &to_delete(&self.jump));
        }
        for rule in &self.rules {
            for _ in 0..chain_listing.map_or(0, |l| count(l, rule)) {
                push_line(&mut body, &to_delete(rule));
            }
        }
        (!body.is_empty()).then(|| format!("*{}\n{body}COMMIT\n", self.table))
    }
}

/// A transaction removing `chain` entirely: every rule in `builtin` that jumps (`-j`/`-g`) to
/// it, whatever its other matches, then `-F` and `-X` when the chain exists. `None` when there
/// is nothing to remove. Deleting the jumps first is what lets `-X` succeed.
pub fn delete_chain_payload(
    table: &str,
    builtin: &str,
    chain: &str,
    builtin_listing: &str,
    chain_exists: bool,
) -> Option<String> {
    let mut body = String::new();
    for line in rule_lines(builtin_listing) {
        let toks: Vec<&str> = line.split_whitespace().collect();
        let jumps = toks
            .windows(2)
            .any(|w| (w[0] == "-j" || w[0] == "-g") && w[1] == chain);
        if jumps && toks.get(1) == Some(&builtin) {
            push_line(&mut body, &to_delete(line));
        }
    }
    if chain_exists {
        let _ = write!(body, "-F {chain}\n-X {chain}\n");
    }
    (!body.is_empty()).then(|| format!("*{table}\n{body}COMMIT\n"))
}

/// `-A CHAIN spec` → `-D CHAIN spec`.
pub fn to_delete(line: &str) -> String {
    match line.strip_prefix("-A ") {
        Some(rest) => format!("-D {rest}"),
        None => line.to_string(),
    }
}

/// How many times `line` appears in an `iptables -S` listing.
pub fn count(listing: &str, line: &str) -> usize {
    listing.lines().filter(|l| l.trim_end() == line).count()
}

/// The `-A` lines of an `iptables -S` listing.
fn rule_lines(listing: &str) -> impl Iterator<Item = &str> {
    listing
        .lines()
        .map(str::trim_end)
        .filter(|l| l.starts_with("-A "))
}

fn push_line(out: &mut String, line: &str) {
    out.push_str(line);
    out.push('\n');
}

/// The first `vX.Y.Z` in `iptables --version` output, e.g. `iptables v1.8.9 (nf_tables)`.
pub fn parse_version(text: &str) -> Option<(u32, u32, u32)> {
    text.match_indices('v').find_map(|(i, _)| {
        let mut parts = text[i + 1..].splitn(3, '.');
        let major = parts.next()?.parse().ok()?;
        let minor = parts.next()?.parse().ok()?;
        let rest = parts.next()?;
        let end = rest
            .find(|c: char| !c.is_ascii_digit())
            .unwrap_or(rest.len());
        Some((major, minor, rest[..end].parse().ok()?))
    })
}

/// go-iptables `HasRandomFully`: `--random-fully` exists since iptables 1.6.2.
pub fn has_random_fully(version: (u32, u32, u32)) -> bool {
    version >= (1, 6, 2)
}

/// `iptables -w` exists since 1.4.20.
pub fn has_wait(version: (u32, u32, u32)) -> bool {
    version >= (1, 4, 20)
}

/// `iptables-restore --wait` exists since 1.6.2 (flannel's `ipTablesHasWaitSupport`).
pub fn has_restore_wait(version: (u32, u32, u32)) -> bool {
    version >= (1, 6, 2)
}
