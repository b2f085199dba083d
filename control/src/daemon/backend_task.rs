//! The backend's own task: the one owner of the running backend (an actor).
//!
//! The main loop sends it [`Work`] (a batch of peer changes, the reconcile
//! tick, a rebuild after its device was deleted, a dataplane switch) and
//! receives a [`Done`] for each; one item is in flight at a time (the loop
//! keeps everything else: changes accumulate in its backlog, see
//! [`super::backlog`], so the next batch is computed from the newest
//! state). Whatever the backend awaits (netlink, charon, an engine start or
//! stop, `Dual`'s retries and rollback during a switch) waits here, never in
//! the loop, which keeps renewing the lease, following the watch and
//! serving the CLI. After each item the task publishes the backend's
//! [`crate::view::BackendView`], so readers see devices as they are without
//! asking it anything. When the loop drops its end the task tears the
//! backend down and ends.

use std::time::Duration;

use tokio::sync::mpsc;

use super::backlog::Outgoing;
use crate::backend::dataplane_ctl::{self, SwitchOutcome};
use crate::backend::{ApplyError, BackendError, Batch, DataplaneChoice, Switch};
use crate::lease::Lease;
use crate::view::BackendPublisher;

/// What the task is asked to do.
#[derive(Debug)]
pub enum Work {
    /// Apply a batch of peer changes.
    Apply(Outgoing),
    /// Restore state that went missing (the periodic tick).
    Reconcile,
    /// Rebuild the backend on this lease ([`Switch::rebuild`]: its device
    /// was deleted); the loop replays every peer afterwards.
    Rebuild(Lease),
    /// Switch the dataplane.
    Switch(DataplaneChoice),
}

/// What became of a [`Work`] item.
#[derive(Debug)]
pub enum Done {
    /// The batch, and what failed in it.
    Applied(Outgoing, Result<(), ApplyError>),
    /// The reconcile's outcome.
    Reconciled(Result<(), BackendError>),
    /// The rebuild's outcome.
    Rebuilt(Result<(), BackendError>),
    /// The switch's outcome.
    Switched(SwitchOutcome),
}

/// The loop's end of the task.
#[derive(Debug)]
pub struct BackendTask {
    name: &'static str,
    work: Option<mpsc::Sender<Work>>,
    done: mpsc::Receiver<Done>,
    busy: bool,
    task: tokio::task::JoinHandle<()>,
}

impl BackendTask {
    /// Starts the task owning `backend` (set up), publishing its view on
    /// `publish`. `apply_delay` is a test hook (`--test-apply-delay-ms`): a
    /// wait before each batch, as a slow kernel would make.
    pub fn spawn(
        backend: Box<dyn Switch>,
        publish: BackendPublisher,
        apply_delay: Duration,
    ) -> BackendTask {
        let name = backend.name();
        let (work_tx, work_rx) = mpsc::channel(1);
        let (done_tx, done_rx) = mpsc::channel(1);
        let task = tokio::spawn(run(backend, work_rx, done_tx, publish, apply_delay));
        BackendTask {
            name,
            work: Some(work_tx),
            done: done_rx,
            busy: false,
            task,
        }
    }

    /// The backend's name.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// Whether an item is in flight.
    pub fn is_busy(&self) -> bool {
        self.busy
    }

    /// Hands the idle task `w`.
    ///
    /// # Panics
    /// When an item is already in flight (the loop sends one at a time).
    pub fn send(&mut self, w: Work) -> Result<(), TaskGone> {
        assert!(!self.busy, "one item at a time");
        let tx = self.work.as_ref().ok_or(TaskGone)?;
        match tx.try_send(w) {
            Ok(()) => {
                self.busy = true;
                Ok(())
            }
            Err(mpsc::error::TrySendError::Closed(_)) => Err(TaskGone),
            Err(mpsc::error::TrySendError::Full(_)) => unreachable!("capacity 1, one in flight"),
        }
    }

    /// The outcome of the item in flight (pending forever when none is, so
    /// that it can sit in a `select!`).
    pub async fn done(&mut self) -> Result<Done, TaskGone> {
        if !self.busy {
            return std::future::pending().await;
        }
        let d = self.done.recv().await.ok_or(TaskGone)?;
        self.busy = false;
        Ok(d)
    }

    /// Ends the task: the item in flight completes, then the backend is torn
    /// down (best effort) and the task returns.
    pub async fn finish(mut self) {
        self.work = None;
        self.done.close();
        if let Err(e) = self.task.await {
            tracing::error!("the backend task failed: {e}");
        }
    }
}

/// The backend task ended (it panicked).
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the backend task ended unexpectedly")]
pub struct TaskGone;

async fn run(
    mut backend: Box<dyn Switch>,
    mut work: mpsc::Receiver<Work>,
    done: mpsc::Sender<Done>,
    publish: BackendPublisher,
    apply_delay: Duration,
) {
    publish.publish(backend.view());
    while let Some(w) = work.recv().await {
        let d = match w {
            Work::Apply(out) => {
                if !apply_delay.is_zero() {
                    tokio::time::sleep(apply_delay).await;
                }
                let batch = Batch {
                    changes: &out.changes,
                    snapshot: out.snapshot,
                };
                let r = backend.apply(batch).await;
                Done::Applied(out, r)
            }
            Work::Reconcile => Done::Reconciled(backend.reconcile().await),
            Work::Rebuild(lease) => Done::Rebuilt(backend.rebuild(&lease).await),
            Work::Switch(to) => Done::Switched(dataplane_ctl::switch(backend.as_mut(), to).await),
        };
        publish.publish(backend.view());
        if done.send(d).await.is_err() {
            break;
        }
    }
    backend.teardown().await;
}
