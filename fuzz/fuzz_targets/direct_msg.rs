#![no_main]
//! `direct_msg`: see `targets::wg::direct_msg` for the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::wg::direct_msg(data));
