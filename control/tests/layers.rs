//! Control's layering, checked over the module tree's imports (as
//! `engine/tests/layers.rs` checks the engine's): no circle in the import
//! graph (`farm-studio look control`).
//!
//! - `view/` (the status model, `Dataplane`, the published snapshots) is the
//!   neutral ground: it names none of the modules that publish or read it;
//! - `status/` and `metrics/` both read `view/` and never each other (nor
//!   the backends or the daemon);
//! - `backend/` never names the daemon, metrics or the CLI;
//! - no traffic driver names another (the factory, `traffic/mod.rs`, cleans
//!   up the other driver's rules), and the daemon's main loop does not reach
//!   back into its start-up (`run.rs`).
//!
//! Test files (`tests.rs`, `*_tests.rs`) may import what they test from.

use std::path::{Path, PathBuf};

/// (directory or file under `src/`, the `crate::` modules it may not name).
const RULES: [(&str, &[&str]); 5] = [
    (
        "view",
        &[
            "backend", "daemon", "status", "metrics", "cli", "traffic", "store", "subnet", "kube",
        ],
    ),
    ("status", &["metrics", "backend", "daemon", "cli"]),
    ("metrics", &["status", "backend", "daemon", "cli"]),
    ("backend", &["daemon", "metrics", "cli"]),
    ("lease", &["backend", "daemon", "status", "metrics", "view"]),
];

/// (file under `src/`, a sibling module it may not name through `super::`).
const SIBLINGS: [(&str, &str); 3] = [
    ("traffic/iptables.rs", "nftables"),
    ("traffic/nftables.rs", "iptables"),
    ("daemon/main_loop.rs", "run"),
];

fn rust_files(path: &Path, out: &mut Vec<PathBuf>) {
    if path.is_file() {
        out.push(path.to_path_buf());
        return;
    }
    for e in std::fs::read_dir(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())) {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn is_test_file(p: &Path) -> bool {
    p.file_stem()
        .and_then(|s| s.to_str())
        .is_some_and(|s| s == "tests" || s.ends_with("_tests"))
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The top-level modules `src` names through `prefix` (`crate::`,
/// `super::`), with `use crate::{a, b::c}` groups opened.
fn named(src: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find(prefix) {
        rest = &rest[i + prefix.len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push(ident(group[start..j].trim()).to_string());
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(ident(group[start..j].trim()).to_string());
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(ident(rest).to_string());
        }
    }
    out
}

#[test]
fn the_neutral_view_and_each_side_import_no_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    let mut files = 0;
    for (place, forbidden) in RULES {
        let mut list = Vec::new();
        rust_files(&src.join(place), &mut list);
        for f in list.into_iter().filter(|f| !is_test_file(f)) {
            files += 1;
            let text = std::fs::read_to_string(&f).expect("source");
            for m in named(&text, "crate::") {
                if forbidden.contains(&m.as_str()) {
                    bad.push(format!("{} names crate::{m}", f.display()));
                }
            }
        }
    }
    for (file, sibling) in SIBLINGS {
        let text = std::fs::read_to_string(src.join(file)).expect("source");
        if named(&text, "super::").iter().any(|m| m == sibling) {
            bad.push(format!("{file} names super::{sibling}"));
        }
    }
    assert!(files > 30, "only {files} files checked");
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

#[test]
fn the_scanner_sees_grouped_and_nested_imports() {
    let src = "use crate::{view::Status, backend::{A, B}, lease};\nlet x = crate::daemon::f(super::run::g);";
    assert_eq!(
        named(src, "crate::"),
        ["view", "backend", "lease", "daemon"]
    );
    assert_eq!(named(src, "super::"), ["run"]);
}
