#![no_main]
//! `tun_tx`: see `targets::engine::tun_tx` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::engine::tun_tx(data));
