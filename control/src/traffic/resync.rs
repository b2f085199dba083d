//! The periodic re-check of the host rules (`--iptables-resync`, default 5 s).
//!
//! flannel starts one goroutine per rule set that calls `ensureIPTables` every period. Here one
//! thread calls [`TrafficManager::ensure`] for everything the manager set up; the drivers log
//! flannel's `Some iptables rules are missing; deleting and recreating rules` before repairing.
//! It is a plain thread, not a tokio task, because the drivers block on child processes.

use std::{
    io,
    sync::{Arc, mpsc},
    thread,
    time::Duration,
};

use super::TrafficManager;

/// The shortest period the loop accepts (flannel would spin on 0).
pub const MIN_PERIOD: Duration = Duration::from_secs(1);

/// One re-check: calls `ensure` and logs a failure as flannel does
/// (`Failed to ensure iptables rules: ...`). Returns whether anything was repaired.
pub fn resync_once(mgr: &dyn TrafficManager) -> bool {
    match mgr.ensure() {
        Ok(repaired) => repaired,
        Err(e) => {
            tracing::error!("Failed to ensure {} rules: {e}", mgr.name());
            false
        }
    }
}

/// The running resync thread. Dropping it (or [`ResyncHandle::stop`]) stops the thread and
/// waits for the current check to finish.
#[derive(Debug)]
pub struct ResyncHandle {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<thread::JoinHandle<()>>,
}

/// Starts a thread that runs [`resync_once`] every `period` (at least [`MIN_PERIOD`]), the
/// first time one period from now. The thread inherits the caller's network namespace.
pub fn spawn_resync(mgr: Arc<dyn TrafficManager>, period: Duration) -> io::Result<ResyncHandle> {
    let period = period.max(MIN_PERIOD);
    let (stop, stopped) = mpsc::channel::<()>();
    let thread = thread::Builder::new()
        .name("traffic-resync".into())
        .spawn(move || {
            while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(period) {
                resync_once(mgr.as_ref());
            }
        })?;
    Ok(ResyncHandle {
        stop: Some(stop),
        thread: Some(thread),
    })
}

// === impl ResyncHandle ===

impl ResyncHandle {
    /// Stops the thread and waits for it.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!("traffic resync thread panicked");
        }
    }
}

impl Drop for ResyncHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}
