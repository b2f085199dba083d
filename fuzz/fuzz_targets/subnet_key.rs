#![no_main]
//! `subnet_key`: see `targets::control::subnet_key` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::control::subnet_key(data));
