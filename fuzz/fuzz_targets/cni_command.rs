#![no_main]
//! `cni_command`: see `targets::cni::cni_command` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::cni::cni_command(data));
