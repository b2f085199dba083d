#![no_main]
//! `wg_input`: see `targets::wg::wg_input` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::wg::wg_input(data));
