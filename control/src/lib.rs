//! weft's control plane.
//!
//! Everything that decides *what* the dataplane should do lives here: flannel's
//! network config, subnet leases and their stores, `subnet.env`, the backends'
//! kernel programming, host firewall rules and the `weftd` daemon itself.
//!
//! **Architecture invariant:** nothing in this crate reads or writes packet
//! bytes. The userspace dataplane is driven only through `weft_engine`'s
//! control handle (peer tables, start/stop).
#![forbid(unsafe_code)]

pub mod backend;
pub mod cli;
pub mod config;
pub mod daemon;
pub mod demo;
pub mod iface;
pub mod ipam;
pub mod kube;
pub mod lease;
pub mod lockfile;
pub mod logging;
pub mod metrics;
pub mod netlink;
pub mod probe;
pub mod secret;
pub mod status;
pub mod store;
pub mod subnet;
pub mod traffic;
pub mod view;

/// The flannel and Go contracts this crate shares with the CNI plugin
/// (`weft-compat`), re-exported so that users of this crate's API (tests,
/// fuzz targets) name the same types.
pub use weft_compat as compat;
/// Go-rules JSON decoding, at its former path (`crate::gojson`).
pub use weft_compat::gojson;
