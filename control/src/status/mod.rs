//! `weft status`: what a running weftd reports about itself: its lease, its
//! backend and dataplane (kernel or userspace, which offloads), its devices'
//! counters and every peer with its counters.
//!
//! - [`model`]: the JSON shape (fixed by a snapshot, see its docs; the model
//!   itself lives in the neutral [`crate::view`], which backends and metrics
//!   share);
//! - [`server`]: the root-only unix socket (`weft-status.sock` next to
//!   `--subnet-file`) and its client;
//! - [`render`]: the human-readable form;
//! - [`shape`]: the snapshot of the JSON shape and its checker.
//!
//! Contract: the socket answers from the latest published snapshots
//! ([`crate::view::Observer`]), never by asking weftd's main loop or its
//! backend, so it answers within milliseconds whatever they are doing; the
//! dataplane pays nothing for it.

pub mod render;
pub mod server;
pub mod shape;

pub use crate::view::model;
pub use crate::view::{BackendStatus, Counters, DeviceStatus, PeerStatus, Status};

#[cfg(test)]
pub(crate) mod tests;
