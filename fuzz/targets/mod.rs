//! Fuzz target bodies, shared by the cargo-fuzz binaries (`fuzz/fuzz_targets/`)
//! and the corpus replay test (`tests/fuzz_corpus.rs`), so that CI replays
//! every committed corpus file through exactly the code libFuzzer runs.
//!
//! Contract of every body: it takes arbitrary bytes, calls the parser the way
//! production code does, and panics only when the parser panics or an oracle
//! fails (a round trip that does not return what went in, an output that the
//! matching decoder rejects, a checksum that does not verify). Bad input must
//! come back as an error, which the body ignores.
//!
//! The engine's checksums are not bypassed under `cfg(fuzzing)`: where a valid
//! checksum unlocks deeper code (GRO merges, the store's file checksum) the
//! harness computes it for the fuzzer, chosen by a flag bit of the input.

pub mod cni;
pub mod control;
pub mod engine;
pub mod wg;

/// A target's name (its `fuzz/corpus/<name>` directory) and body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, in the order of `fuzz/Cargo.toml`.
pub const ALL: &[Target] = &[
    ("vxlan_decap", engine::vxlan_decap),
    ("flannel_udp_decap", engine::flannel_udp_decap),
    ("gro", engine::gro),
    ("tun_tx", engine::tun_tx),
    ("ipip_decap", engine::ipip_decap),
    ("wg_input", wg::wg_input),
    ("disco_msg", wg::disco_msg),
    ("relay_msg", wg::relay_msg),
    ("direct_msg", wg::direct_msg),
    ("net_conf", control::net_conf),
    ("lease_attrs", control::lease_attrs),
    ("subnet_key", control::subnet_key),
    ("subnet_env", control::subnet_env),
    ("store_file", control::store_file),
    ("vxlan_backend_data", control::vxlan_backend_data),
    ("node_annotations", control::node_annotations),
    ("vici", control::vici),
    ("probe_msg", control::probe_msg),
    ("cni_command", cni::cni_command),
    ("cni_config", cni::cni_config),
];
