#![no_main]
//! `subnet_env`: see `targets::control::subnet_env` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::control::subnet_env(data));
