//! The `flannel` CNI plugin binary: decodes the invocation, runs the verb and
//! prints a CNI error object on failure (see the `weft_cni` crate docs).
//! All modules are declared in `lib.rs`; this file only wires stdin/stdout.

#![forbid(unsafe_code)]

use std::io::{self, Write};
use std::process::ExitCode;

use weft_cni::{Command, run};

fn main() -> ExitCode {
    let mut input = Vec::new();
    let mut stdout = io::stdout().lock();
    let result = Command::load(
        &|k| std::env::var(k).ok(),
        &mut io::stdin().lock(),
        &mut input,
    )
    .and_then(|cmd| run(cmd, &mut stdout));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let version = serde_json::from_slice::<serde_json::Value>(&input)
                .ok()
                .and_then(|v| {
                    v.get("cniVersion")
                        .and_then(|s| s.as_str().map(str::to_string))
                })
                .filter(|v| !v.is_empty());
            let _ = stdout.write_all(&e.to_cni(version.as_deref()).to_json());
            let _ = stdout.flush();
            ExitCode::FAILURE
        }
    }
}
