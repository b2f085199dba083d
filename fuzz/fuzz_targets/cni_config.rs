#![no_main]
//! `cni_config`: see `targets::cni::cni_config` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::cni::cni_config(data));
