#![no_main]
//! `probe_msg`: see `targets::control::probe_msg` for the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::control::probe_msg(data));
