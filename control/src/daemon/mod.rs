//! weftd: flanneld's main loop (spec §9.4), on any [`Registry`].
//!
//! Start-up (`run.rs`): config → external interface → backend lease
//! attributes → lease → backend devices → host rules → subnet.env. Then the
//! backend runs in its own task (`backend_task.rs`) and one loop
//! (`main_loop.rs`) that never waits for work: lease events become bounded
//! batches of backend changes (`backlog.rs`, the newest state wins), the
//! lease is renewed before it expires, backends reconcile every period, and
//! SIGTERM/SIGINT end it cleanly. Status, metrics and health read what the
//! loop and the task publish ([`crate::view`]); `/readyz` turns 200 once
//! subnet.env is written and the first lease snapshot is programmed. Losing the own lease ends the daemon with exit 0, as flanneld
//! does (`Lease has been revoked. Shutting down daemon.`): the supervisor
//! (DaemonSet, systemd) restarts it and it takes a lease again, preferring
//! the subnet in subnet.env.

mod backend_task;
mod backlog;
mod blackhole;
pub mod flags;
pub mod healthz;
mod main_loop;
mod nat;
pub mod node_lock;
mod run;
mod stop;
mod stores;

pub use run::run;
