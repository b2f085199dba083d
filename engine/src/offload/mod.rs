//! Userspace offloads between the TUN's TCP super-packets and MTU-sized wire packets.

pub mod gro;
pub mod gso;
