//! weft's flannel-compatible CNI plugin, installed as `flannel`.
//!
//! A synchronous "meta plugin": it reads flannel's network config and the
//! node's `subnet.env`, builds the delegate (bridge + host-local) config
//! exactly as flannel's plugin does, saves it per container and runs the
//! delegate. Beyond flannel it implements CHECK, GC and STATUS for real.
//!
//! Entry point contract: [`Command::load`] decodes the invocation once; each
//! verb lives in its own module; any error is mapped to a CNI code in
//! [`Error::to_cni`] and printed as CNI error JSON on stdout (exit 1). Logs
//! go to stderr.

#![forbid(unsafe_code)]

mod add;
mod check;
mod command;
mod config;
mod del;
mod delegate;
mod error;
mod exec;
mod gc;
mod gocompat;
mod status;
mod store;
mod subnet_env;
mod version;

use std::io::{self, Write};
use std::process::ExitCode;

use crate::command::Command;
use crate::error::Error;

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

/// Runs one verb.
fn run(cmd: Command, out: &mut dyn Write) -> Result<(), Error> {
    match cmd {
        Command::Add(req) => add::add(&req, out),
        Command::Del(req) => del::del(&req),
        Command::Check(req) => check::check(&req),
        Command::Gc(req) => gc::gc(&req),
        Command::Status(req) => status::status(&req),
        Command::Version { requested } => {
            let reply = version::reply(requested.as_deref());
            serde_json::to_writer(&mut *out, &reply).map_err(|e| Error::Output(e.into()))?;
            out.write_all(b"\n")
                .and_then(|()| out.flush())
                .map_err(Error::Output)
        }
    }
}

/// Writes one log line to stderr (the runtime's log).
pub(crate) fn log(msg: &str) {
    let _ = writeln!(io::stderr(), "flannel (weft): {msg}");
}
