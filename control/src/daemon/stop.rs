//! The daemon's signals: SIGTERM and SIGINT end it; SIGHUP is installed
//! early, so that it never kills the daemon, and handed to the main loop.

use tokio::signal::unix::{SignalKind, signal};

/// SIGTERM / SIGINT (and SIGHUP, installed early so that it never kills
/// the daemon; the main loop takes it to switch the dataplane).
pub struct Stop {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    hup: Option<tokio::signal::unix::Signal>,
}

impl Stop {
    pub(super) fn install() -> anyhow::Result<Stop> {
        Ok(Stop {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            hup: Some(signal(SignalKind::hangup())?),
        })
    }

    /// The SIGHUP stream, for the main loop.
    pub(super) fn take_hup(&mut self) -> Option<tokio::signal::unix::Signal> {
        self.hup.take()
    }

    pub(super) async fn wait(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }

    /// Runs `f` unless a stop signal comes first (`None`).
    pub(super) async fn until<T>(&mut self, f: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::select! {
            v = f => Some(v),
            _ = self.wait() => None,
        }
    }
}
