//! Replays every committed fuzz corpus (`fuzz/corpus/<target>/*`) through the
//! same target bodies the cargo-fuzz binaries run (`fuzz/targets/`), so a
//! seed or a once-crashing input that breaks again fails `cargo test`
//! without libFuzzer. Needs no root and no network.

use std::path::{Path, PathBuf};

#[allow(dead_code)]
#[path = "../fuzz/targets/mod.rs"]
mod targets;

fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fuzz/corpus")
        .join(target)
}

fn replay(target: &str) {
    let (_, body) = targets::ALL
        .iter()
        .find(|(name, _)| *name == target)
        .unwrap_or_else(|| panic!("no fuzz target {target}"));
    let dir = corpus_dir(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} has no corpus files", dir.display());
    for f in &files {
        let data = std::fs::read(f).unwrap_or_else(|e| panic!("{}: {e}", f.display()));
        if std::panic::catch_unwind(|| body(&data)).is_err() {
            panic!("fuzz target {target} fails on {}", f.display());
        }
    }
}

/// Every target listed in `fuzz/targets/mod.rs` has a test below and a corpus.
#[test]
fn every_target_has_a_replay_test_and_a_corpus() {
    let tested = [
        "vxlan_decap",
        "flannel_udp_decap",
        "gro",
        "tun_tx",
        "ipip_decap",
        "wg_input",
        "disco_msg",
        "relay_msg",
        "direct_msg",
        "net_conf",
        "lease_attrs",
        "subnet_key",
        "subnet_env",
        "store_file",
        "vxlan_backend_data",
        "node_annotations",
        "vici",
        "probe_msg",
        "cni_command",
        "cni_config",
    ];
    let all: Vec<&str> = targets::ALL.iter().map(|(n, _)| *n).collect();
    assert_eq!(all, tested);
    for t in &all {
        assert!(corpus_dir(t).is_dir(), "missing corpus for {t}");
    }
    // ... and a cargo-fuzz binary.
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz/Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest).expect("fuzz/Cargo.toml");
    let bins: Vec<&str> = manifest
        .split("[[bin]]")
        .skip(1)
        .filter_map(|b| b.lines().find_map(|l| l.strip_prefix("name = ")))
        .map(|n| n.trim_matches('"'))
        .collect();
    assert_eq!(
        bins, all,
        "fuzz/Cargo.toml [[bin]]s differ from fuzz/targets"
    );
}

macro_rules! replay_tests {
    ($($name:ident),* $(,)?) => {$(
        #[test]
        fn $name() {
            replay(stringify!($name));
        }
    )*};
}

replay_tests!(
    vxlan_decap,
    flannel_udp_decap,
    gro,
    tun_tx,
    ipip_decap,
    wg_input,
    disco_msg,
    relay_msg,
    direct_msg,
    net_conf,
    lease_attrs,
    subnet_key,
    subnet_env,
    store_file,
    vxlan_backend_data,
    node_annotations,
    vici,
    probe_msg,
    cni_command,
    cni_config,
);
