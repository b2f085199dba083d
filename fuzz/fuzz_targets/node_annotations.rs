#![no_main]
//! `node_annotations`: see `targets::control::node_annotations` for the input format and the oracles.

use libfuzzer_sys::fuzz_target;

#[allow(dead_code)]
#[path = "../targets/mod.rs"]
mod targets;

fuzz_target!(|data: &[u8]| targets::control::node_annotations(data));
