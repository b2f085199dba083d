//! weftd: flanneld's main loop (spec §9.4), on any [`Registry`].
//!
//! Start-up: config → external interface → backend lease attributes → lease
//! → backend devices → host rules → subnet.env (then `/readyz` turns 200).
//! Then one loop: lease events become backend changes, the lease is renewed
//! before it expires, backends reconcile every period, and SIGTERM/SIGINT end
//! it cleanly. Losing the own lease ends the daemon with exit 0, as flanneld
//! does (`Lease has been revoked. Shutting down daemon.`): the supervisor
//! (DaemonSet, systemd) restarts it and it takes a lease again, preferring
//! the subnet in subnet.env.

mod blackhole;
pub mod flags;
pub mod healthz;
pub mod node_lock;
mod run;
mod stores;

pub use run::run;
