#![no_main]
//! `store_file`: see `targets::control::store_file` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::control::store_file(data));
