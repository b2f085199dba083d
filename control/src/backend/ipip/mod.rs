//! The `ipip` backend: what its two dataplanes share. [`kernel`] runs it on
//! the kernel's ipip driver, [`userspace`] on weft's engine (a raw IPIP
//! socket) with the same wire format and lease; [`super::dual`] switches
//! between them.

pub mod kernel;
pub mod userspace;

/// The device name, the same on both paths (so routes and tools see one name).
pub const DEVICE: &str = "flannel.ipip";
