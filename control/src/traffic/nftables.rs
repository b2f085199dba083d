//! The nftables driver (flannel's `NFTablesManager`, fl:pkg/trafficmngr/nftables).
//!
//! Tables `ip flannel-ipv4` and `ip6 flannel-ipv6` (both created by `init`, like flannel), base
//! chains `forward` (filter, priority filter) and `postrtg` (nat, priority srcnat). Every
//! install is one atomic `nft -f -` script: add table, add chain, flush chain, add rules; so
//! re-running it never duplicates anything and drops stale rules from an old Network/subnet.
//! `fully-random` is used unless `--ip-masq-fully-random-disable` is set or flannel's probe (a
//! check-mode transaction with `masquerade fully-random`) fails.
//!
//! **Better than flannel:** flannel never re-checks its nftables rules. Here
//! [`TrafficManager::ensure`] lists every installed chain (`nft list chain`) and compares it
//! with the listing captured right after installing; a missing table, chain or rule, or any
//! change inside flannel's chains, re-runs the chain's script. So the `--iptables-resync`
//! thread repairs nftables too.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{
    Error, Networks, Previous, Runner, TrafficManager, masq_plan,
    nft_rules::{self, NftChain},
    rules::Family,
};

/// flannel's nftables rules; see the module docs.
#[derive(Debug)]
pub struct NftablesManager {
    runner: Runner,
    random_fully_disable: bool,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    /// Result of the `fully-random` probe, once run.
    fully_random: Option<bool>,
    /// Every chain set up so far, with the `nft list chain` output right after installing it.
    installed: Vec<(NftChain, String)>,
}

// === impl NftablesManager ===

impl NftablesManager {
    /// A driver running `nft` through `runner`.
    pub fn new(runner: Runner, random_fully_disable: bool) -> Self {
        Self {
            runner,
            random_fully_disable,
            state: Mutex::default(),
        }
    }

    /// The chains set up so far (what `ensure` re-checks).
    pub fn installed(&self) -> Vec<NftChain> {
        self.lock()
            .installed
            .iter()
            .map(|(c, _)| c.clone())
            .collect()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn script(&self, payload: &str) -> Result<(), Error> {
        tracing::debug!(payload, "nft -f -");
        self.runner
            .run("nft", &["-f", "-"], Some(payload))
            .map(drop)
    }

    /// `nft list chain ...`; `None` when the table or chain does not exist.
    fn list(&self, args: &[&str]) -> Result<Option<String>, Error> {
        let out = self.runner.output("nft", args, None)?;
        Ok(out.success.then_some(out.stdout))
    }

    fn fully_random(&self, st: &mut State) -> bool {
        if self.random_fully_disable {
            return false;
        }
        *st.fully_random.get_or_insert_with(|| {
            let ok = self
                .runner
                .run("nft", &["-c", "-f", "-"], Some(&nft_rules::probe_payload()))
                .is_ok();
            if !ok {
                tracing::warn!("nftables: random fully unsupported");
            }
            ok
        })
    }

    fn install(&self, st: &mut State, chain: NftChain) -> Result<(), Error> {
        self.script(&chain.payload())?;
        // The fingerprint `ensure` compares against; the chain must exist now.
        let listing = self.runner.run("nft", &chain.list_args(), None)?;
        st.installed
            .retain(|(c, _)| !(c.family == chain.family && c.name == chain.name));
        st.installed.push((chain, listing));
        Ok(())
    }

    /// Deletes chain `name` of `family`'s table if it exists.
    fn remove_chain(
        &self,
        st: &mut State,
        family: Family,
        name: &'static str,
    ) -> Result<(), Error> {
        st.installed
            .retain(|(c, _)| !(c.family == family && c.name == name));
        if self
            .list(&nft_rules::chain_list_args(family, name))?
            .is_some()
        {
            self.script(&nft_rules::delete_chain_payload(family, name))?;
        }
        Ok(())
    }
}

impl TrafficManager for NftablesManager {
    fn name(&self) -> &'static str {
        "nftables"
    }

    fn init(&self) -> Result<(), Error> {
        tracing::info!("Starting flannel in nftables mode...");
        self.script(&nft_rules::init_payload())
    }

    fn setup_masq(
        &self,
        network: &Networks,
        subnet: &Networks,
        prev: Option<&Previous>,
    ) -> Result<(), Error> {
        let mut st = self.lock();
        for family in Family::ALL {
            // The flush in the chain script drops stale rules of a previous Network/subnet,
            // so `prev` only matters when a family was disabled since.
            let (cur, prev) = masq_plan(family, network, subnet, prev)?;
            match (cur.network, cur.subnet) {
                (Some(n), Some(s)) => {
                    let which = if family == Family::V4 { "ipv4" } else { "ipv6" };
                    tracing::info!("nftables: setting up masking rules ({which})");
                    let fully_random = self.fully_random(&mut st);
                    self.install(&mut st, nft_rules::masq_chain(n, s, fully_random))?;
                }
                _ if prev.is_some_and(|p| p.network.is_some()) => {
                    tracing::info!(
                        "nftables: {} masquerading is disabled now; deleting postrtg",
                        family.label()
                    );
                    self.remove_chain(&mut st, family, nft_rules::POSTRTG_CHAIN)?;
                }
                _ => {}
            }
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
                        "Changing default FORWARD chain policy to ACCEPT (ipv6)"
                    }
                );
                let dev = accept_in.filter(|_| family == Family::V4);
                self.install(&mut st, nft_rules::forward_chain(n, dev))?;
            }
        }
        Ok(())
    }

    fn ensure(&self) -> Result<bool, Error> {
        let mut st = self.lock();
        let (mut repaired, mut errors) = (false, Vec::new());
        for (chain, want) in st.installed.clone() {
            let result = self.list(&chain.list_args()).and_then(|got| {
                if got.as_deref() == Some(want.as_str()) {
                    return Ok(false);
                }
                tracing::info!("Some nftables rules are missing; deleting and recreating rules");
                self.install(&mut st, chain).map(|()| true)
            });
            match result {
                Ok(r) => repaired |= r,
                Err(e) => errors.push(e),
            }
        }
        Error::collect(errors).map(|()| repaired)
    }

    fn cleanup(&self) -> Result<(), Error> {
        tracing::info!("Cleaning-up nftables rules...");
        self.lock().installed.clear();
        let tables = match self.runner.run("nft", &["list", "tables"], None) {
            Ok(out) => nft_rules::parse_tables(&out),
            Err(e) if e.is_not_installed() => {
                tracing::debug!("nft not installed; nothing to clean: {e}");
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        match nft_rules::delete_tables_payload(&tables) {
            Some(payload) => self.script(&payload),
            None => Ok(()),
        }
    }
}
