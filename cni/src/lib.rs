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
//!
//! The plugin binary (`main.rs`) is a thin shell around [`Command::load`] and
//! [`run`]; the decoding modules are public so that fuzz targets and tests
//! reach the same parsers the binary uses.

#![forbid(unsafe_code)]

mod add;
mod check;
pub mod command;
pub mod config;
mod del;
pub mod delegate;
pub mod error;
mod exec;
mod gc;
pub mod routed;
mod status;
mod store;
pub mod version;

use std::io::{self, Write};

/// The flannel and Go contracts the plugin shares with weftd
/// (`weft-compat`: Go's CIDR and JSON rules, the `subnet.env` reader in
/// [`compat::subnet_env::plugin`], the IPAM wire types), re-exported so that
/// users of this crate's API (fuzz targets, tests) name the same types.
pub use weft_compat as compat;

pub use crate::command::Command;
pub use crate::error::Error;

/// Runs one verb.
pub fn run(cmd: Command, out: &mut dyn Write) -> Result<(), Error> {
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
