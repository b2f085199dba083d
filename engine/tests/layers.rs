//! The engine's layering, checked over the module tree's imports: the
//! packet path (`path/`) and the codec layer (`encap/`, `wire/`,
//! `offload/`) never import a worker, the builder, a start-up module or the
//! I/O machinery. That keeps the import graph free of circles (`farm-studio
//! look engine`) and the per-packet logic callable from fuzz targets,
//! benches and `tests/pipeline.rs` without sockets.

use std::path::{Path, PathBuf};

/// Layers that must stay sans-IO.
const PURE: [&str; 4] = ["path", "encap", "wire", "offload"];
/// What they may not name (`crate::<module>`).
const FORBIDDEN: [&str; 10] = [
    "worker", "builder", "udp", "ipip", "wg", "udp_tx", "tun_out", "sys", "idle", "spare",
];

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.expect("entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn ident(s: &str) -> &str {
    let end = s
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    &s[..end]
}

/// The module a path starts with; the checksum loop (`sys::csum`, the one
/// `unsafe` computation without I/O) counts as its own.
fn module(path: &str) -> String {
    if path.starts_with("sys::csum") {
        return "sys::csum".into();
    }
    ident(path).to_string()
}

/// The top-level modules `src` names through `crate::`, with `use
/// crate::{a, b::c}` groups opened.
fn crate_paths(src: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = src;
    while let Some(i) = rest.find("crate::") {
        rest = &rest[i + "crate::".len()..];
        if let Some(group) = rest.strip_prefix('{') {
            let mut depth = 0;
            let mut start = 0;
            for (j, c) in group.char_indices() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => {
                        out.push(module(group[start..j].trim()));
                        break;
                    }
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        out.push(module(group[start..j].trim()));
                        start = j + 1;
                    }
                    _ => {}
                }
            }
        } else {
            out.push(module(rest));
        }
    }
    out
}

#[test]
fn the_packet_path_and_the_codecs_import_no_worker_builder_or_io() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut bad = Vec::new();
    let mut files = 0;
    for layer in PURE {
        let mut list = Vec::new();
        rust_files(&src.join(layer), &mut list);
        for f in list {
            files += 1;
            let text = std::fs::read_to_string(&f).expect("source");
            for m in crate_paths(&text) {
                if FORBIDDEN.contains(&m.as_str()) {
                    bad.push(format!("{} imports crate::{m}", f.display()));
                }
            }
        }
    }
    assert!(files > 20, "only {files} files under {PURE:?}");
    assert!(bad.is_empty(), "layering broken:\n{}", bad.join("\n"));
}

#[test]
fn the_scanner_sees_grouped_and_nested_imports() {
    let src = "use crate::{wire::ip, worker::{A, B}, sys};\nlet x = crate::builder::f(crate::sys::csum::x);";
    assert_eq!(
        crate_paths(src),
        ["wire", "worker", "sys", "builder", "sys::csum"]
    );
}
