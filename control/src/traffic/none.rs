//! The `none` driver: installs nothing, records every call.
//!
//! Used on nodes that manage their own firewall, and as the test double for code that drives
//! a [`TrafficManager`] (the daemon's call order, the resync loop).

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{Error, Networks, Previous, TrafficManager};

/// One recorded [`TrafficManager`] call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Call {
    /// `init()`.
    Init,
    /// `setup_masq(network, subnet, prev)`.
    SetupMasq {
        /// Cluster networks.
        network: Networks,
        /// Lease subnets.
        subnet: Networks,
        /// Previous subnet.env values.
        prev: Option<Previous>,
    },
    /// `setup_forward(network, accept_in)`.
    SetupForward {
        /// Cluster networks.
        network: Networks,
        /// The device whose forwarded packets are accepted.
        accept_in: Option<String>,
    },
    /// `ensure()`.
    Ensure,
    /// `cleanup()`.
    Cleanup,
}

/// A driver that does nothing; see the module docs.
#[derive(Debug, Default)]
pub struct NoneManager {
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    calls: Vec<Call>,
    /// How many of the next `ensure()` calls report a repair.
    missing: usize,
}

// === impl NoneManager ===

impl NoneManager {
    /// A driver with no recorded calls.
    pub fn new() -> Self {
        Self::default()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    /// Makes the next `n` `ensure()` calls report that they repaired something.
    pub fn report_missing(&self, n: usize) {
        self.lock().missing = n;
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn record(&self, call: Call) {
        self.lock().calls.push(call);
    }
}

impl TrafficManager for NoneManager {
    fn name(&self) -> &'static str {
        "none"
    }

    fn init(&self) -> Result<(), Error> {
        self.record(Call::Init);
        Ok(())
    }

    fn setup_masq(
        &self,
        network: &Networks,
        subnet: &Networks,
        prev: Option<&Previous>,
    ) -> Result<(), Error> {
        self.record(Call::SetupMasq {
            network: *network,
            subnet: *subnet,
            prev: prev.copied(),
        });
        Ok(())
    }

    fn setup_forward(&self, network: &Networks, accept_in: Option<&str>) -> Result<(), Error> {
        self.record(Call::SetupForward {
            network: *network,
            accept_in: accept_in.map(String::from),
        });
        Ok(())
    }

    fn ensure(&self) -> Result<bool, Error> {
        let mut st = self.lock();
        st.calls.push(Call::Ensure);
        let repaired = st.missing > 0;
        st.missing = st.missing.saturating_sub(1);
        Ok(repaired)
    }

    fn cleanup(&self) -> Result<(), Error> {
        self.record(Call::Cleanup);
        Ok(())
    }
}
