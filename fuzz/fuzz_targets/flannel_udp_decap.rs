#![no_main]
//! `flannel_udp_decap`: see `targets::engine::flannel_udp_decap` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::engine::flannel_udp_decap(data));
