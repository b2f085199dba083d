#![no_main]
//! `vxlan_backend_data`: see `targets::control::vxlan_backend_data` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::control::vxlan_backend_data(data));
