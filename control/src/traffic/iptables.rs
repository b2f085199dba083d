//! The iptables driver (flannel's `IPTablesManager`, fl:pkg/trafficmngr/iptables).
//!
//! Per family it runs `iptables`/`ip6tables` and `iptables-restore`/`ip6tables-restore`.
//! Every install is one `iptables-restore --noflush -w` transaction per table that creates or
//! flushes the flannel chain, deletes every existing copy of the jump and re-appends the jump and
//! the rules (so the jump ends up last in `POSTROUTING`/`FORWARD`, after kube-proxy's jumps,
//! and no duplicates survive). `--random-fully` is used when the tool is at least 1.6.2
//! (go-iptables `HasRandomFully`) and `--ip-masq-fully-random-disable` is not set.
//!
//! Differences from flannel, all deliberate: the chain is flushed inside the transaction
//! instead of by a separate `iptables -F`; [`TrafficManager::ensure`] compares `iptables -S`
//! listings (two processes per chain instead of one `-C` per rule, and it also catches
//! reordered or foreign rules); [`TrafficManager::cleanup`] removes `FLANNEL-FWD` from the
//! *filter* table (flannel looks in nat) and deletes the jumps first so `-X` succeeds.

use std::sync::{Mutex, MutexGuard, PoisonError};

use ipnet::IpNet;

use super::{
    Error, Networks, Previous, Runner, TrafficManager, masq_plan,
    rules::{self, ChainRules, FWD_CHAIN, Family, POSTRTG_CHAIN},
};

/// flannel's iptables rules; see the module docs.
#[derive(Debug)]
pub struct IptablesManager {
    runner: Runner,
    random_fully_disable: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Probed tool capabilities, indexed by [`idx`].
    caps: [Option<Caps>; 2],
    /// Every chain set up so far; [`TrafficManager::ensure`] re-checks these.
    installed: Vec<ChainRules>,
}

#[derive(Clone, Copy, Debug)]
struct Caps {
    wait: bool,
    restore_wait: bool,
    random_fully: bool,
}

fn idx(family: Family) -> usize {
    match family {
        Family::V4 => 0,
        Family::V6 => 1,
    }
}

// === impl IptablesManager ===

impl IptablesManager {
    /// A driver running its tools through `runner`.
    pub fn new(runner: Runner, random_fully_disable: bool) -> Self {
        Self {
            runner,
            random_fully_disable,
            state: Mutex::default(),
        }
    }

    /// The chains set up so far (what `ensure` re-checks).
    pub fn installed(&self) -> Vec<ChainRules> {
        self.lock().installed.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn caps(&self, st: &mut State, family: Family) -> Result<Caps, Error> {
        if let Some(caps) = st.caps[idx(family)] {
            return Ok(caps);
        }
        let text = self.runner.run(family.iptables(), &["--version"], None)?;
        let v =
            rules::parse_version(&text).ok_or_else(|| Error::Version(text.trim().to_string()))?;
        let caps = Caps {
            wait: rules::has_wait(v),
            restore_wait: rules::has_restore_wait(v),
            random_fully: rules::has_random_fully(v),
        };
        tracing::debug!(family = family.label(), ?v, ?caps, "probed iptables");
        st.caps[idx(family)] = Some(caps);
        Ok(caps)
    }

    /// `iptables -t table -S chain`; `None` if the chain does not exist.
    fn list(
        &self,
        caps: Caps,
        family: Family,
        table: &str,
        chain: &str,
    ) -> Result<Option<String>, Error> {
        let mut args = vec!["-t", table, "-S", chain];
        if caps.wait {
            args.insert(0, "-w");
        }
        let out = self.runner.output(family.iptables(), &args, None)?;
        Ok(out.success.then_some(out.stdout))
    }

    /// Like [`Self::list`] for a built-in chain, which must exist.
    fn list_builtin(
        &self,
        caps: Caps,
        family: Family,
        table: &str,
        chain: &str,
    ) -> Result<String, Error> {
        let mut args = vec!["-t", table, "-S", chain];
        if caps.wait {
            args.insert(0, "-w");
        }
        self.runner.run(family.iptables(), &args, None)
    }

    fn restore(&self, caps: Caps, family: Family, payload: &str) -> Result<(), Error> {
        let args: &[&str] = if caps.restore_wait {
            &["--noflush", "-w"]
        } else {
            &["--noflush"]
        };
        tracing::debug!(family = family.label(), payload, "iptables-restore");
        self.runner
            .run(family.iptables_restore(), args, Some(payload))
            .map(drop)
    }

    /// flannel's `ipTablesBootstrap`, as one transaction.
    fn apply(&self, caps: Caps, cr: &ChainRules) -> Result<(), Error> {
        let builtin = self.list_builtin(caps, cr.family, cr.table, cr.builtin)?;
        self.restore(caps, cr.family, &cr.apply_payload(&builtin))?;
        tracing::info!("bootstrap done");
        Ok(())
    }

    fn is_intact(&self, caps: Caps, cr: &ChainRules) -> Result<bool, Error> {
        let builtin = self.list_builtin(caps, cr.family, cr.table, cr.builtin)?;
        let chain = self.list(caps, cr.family, cr.table, cr.chain)?;
        Ok(cr.is_intact(&builtin, chain.as_deref()))
    }

    fn install(&self, st: &mut State, cr: ChainRules) -> Result<(), Error> {
        let caps = self.caps(st, cr.family)?;
        self.apply(caps, &cr)?;
        forget(st, cr.family, cr.chain);
        st.installed.push(cr);
        Ok(())
    }

    /// Deletes the rules of `old` that exist (flannel's `teardownIPTables`).
    fn teardown(&self, caps: Caps, old: &ChainRules) -> Result<(), Error> {
        let builtin = self.list_builtin(caps, old.family, old.table, old.builtin)?;
        let chain = self.list(caps, old.family, old.table, old.chain)?;
        match old.teardown_payload(&builtin, chain.as_deref()) {
            Some(payload) => self.restore(caps, old.family, &payload),
            None => Ok(()),
        }
    }

    /// Deletes `chain` and every jump to it from `builtin`.
    fn remove_chain(
        &self,
        st: &mut State,
        family: Family,
        table: &str,
        builtin: &str,
        chain: &'static str,
    ) -> Result<(), Error> {
        let caps = self.caps(st, family)?;
        let listing = self.list_builtin(caps, family, table, builtin)?;
        let exists = self.list(caps, family, table, chain)?.is_some();
        forget(st, family, chain);
        match rules::delete_chain_payload(table, builtin, chain, &listing, exists) {
            Some(payload) => self.restore(caps, family, &payload),
            None => Ok(()),
        }
    }

    fn setup_masq_family(
        &self,
        st: &mut State,
        family: Family,
        network: &Networks,
        subnet: &Networks,
        prev: Option<&Previous>,
    ) -> Result<(), Error> {
        let (cur, prev) = masq_plan(family, network, subnet, prev)?;
        let random = |caps: Caps| caps.random_fully && !self.random_fully_disable;
        if let Some(p) = prev
            && (p.network, p.subnet) != (cur.network, cur.subnet)
            && let (Some(pn), Some(ps)) = (p.network, p.subnet)
        {
            tracing::info!(
                "Current network or subnet ({}, {}) is not equal to previous one ({pn}, {ps}), trying to recycle old iptables rules",
                show(cur.network),
                show(cur.subnet),
            );
            let caps = self.caps(st, family)?;
            self.teardown(caps, &rules::masq_rules(pn, ps, random(caps)))?;
        }
        match (cur.network, cur.subnet) {
            (Some(n), Some(s)) => {
                tracing::info!(
                    "{}",
                    if family == Family::V4 {
                        "Setting up masking rules"
                    } else {
                        "Setting up masking rules for IPv6"
                    }
                );
                let caps = self.caps(st, family)?;
                self.install(st, rules::masq_rules(n, s, random(caps)))
            }
            // The family was masqueraded before and is disabled now: drop its chain.
            _ if prev.is_some_and(|p| p.network.is_some()) => {
                tracing::info!(
                    "{} masquerading is disabled now; deleting {POSTRTG_CHAIN}",
                    family.label()
                );
                self.remove_chain(st, family, "nat", "POSTROUTING", POSTRTG_CHAIN)
            }
            _ => Ok(()),
        }
    }
}

/// Stops re-checking `chain` of `family`.
fn forget(st: &mut State, family: Family, chain: &str) {
    st.installed
        .retain(|c| !(c.family == family && c.chain == chain));
}

fn show(net: Option<IpNet>) -> String {
    net.map_or_else(|| "<none>".to_string(), |n| n.to_string())
}

impl TrafficManager for IptablesManager {
    fn name(&self) -> &'static str {
        "iptables"
    }

    fn init(&self) -> Result<(), Error> {
        tracing::info!("Starting flannel in iptables mode...");
        let mut st = self.lock();
        self.caps(&mut st, Family::V4).map(drop)
    }

    fn setup_masq(
        &self,
        network: &Networks,
        subnet: &Networks,
        prev: Option<&Previous>,
    ) -> Result<(), Error> {
        let mut st = self.lock();
        for family in Family::ALL {
            self.setup_masq_family(&mut st, family, network, subnet, prev)?;
        }
        Ok(())
    }

    fn setup_forward(&self, network: &Networks, accept_in: Option<&str>) -> Result<(), Error> {
        let mut st = self.lock();
        for family in Family::ALL {
            if let Some(n) = network.get(family) {
                tracing::info!(
                    "{}",
                    if family == Family::V4 {
                        "Changing default FORWARD chain policy to ACCEPT"
                    } else {
                        "IPv6: Changing default FORWARD chain policy to ACCEPT"
                    }
                );
                let dev = accept_in.filter(|_| family == Family::V4);
                self.install(&mut st, rules::forward_rules(n, dev))?;
            }
        }
        Ok(())
    }

    fn ensure(&self) -> Result<bool, Error> {
        let mut st = self.lock();
        let (mut repaired, mut errors) = (false, Vec::new());
        for cr in st.installed.clone() {
            let result = self.caps(&mut st, cr.family).and_then(|caps| {
                if self.is_intact(caps, &cr)? {
                    return Ok(false);
                }
                tracing::info!("Some iptables rules are missing; deleting and recreating rules");
                self.apply(caps, &cr).map(|()| true)
            });
            match result {
                Ok(r) => repaired |= r,
                Err(e) => errors.push(e),
            }
        }
        Error::collect(errors).map(|()| repaired)
    }

    fn cleanup(&self) -> Result<(), Error> {
        tracing::info!("Cleaning-up iptables rules...");
        let mut st = self.lock();
        let mut errors = Vec::new();
        for family in Family::ALL {
            for (table, builtin, chain) in [
                ("nat", "POSTROUTING", POSTRTG_CHAIN),
                ("filter", "FORWARD", FWD_CHAIN),
            ] {
                match self.remove_chain(&mut st, family, table, builtin, chain) {
                    Ok(()) => {}
                    Err(e) if e.is_not_installed() => {
                        tracing::debug!(
                            "{} not installed; nothing to clean: {e}",
                            family.iptables()
                        );
                        break;
                    }
                    Err(e) => {
                        tracing::warn!("could not clean-up {chain} ({}): {e}", family.label());
                        errors.push(e);
                    }
                }
            }
        }
        Error::collect(errors)
    }
}
