#![no_main]
//! `lease_attrs`: see `targets::control::lease_attrs` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::control::lease_attrs(data));
