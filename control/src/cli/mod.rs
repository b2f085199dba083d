//! `weft`, the operator CLI: its grammar, its exit codes and the commands
//! (`bin/weft.rs` only calls [`main`]).
//!
//! Grammar (like `kubectl`/`etcdctl`): `weft <command> [<subcommand>]
//! [options]`; every option of a command works in any position after the
//! command's name (`weft leases --store-path D rm K` and `weft leases rm K
//! --store-path D` are the same), unknown or conflicting options are
//! refused, never ignored. Output meant for scripts is `--json` on stdout;
//! notes (which store was used, what a change means) go to stderr.
//!
//! Exit codes ([`Exit`]): 0 done; 1 failed or refused (weftd's own reason,
//! a missing lease, a store error); 2 usage (a bad or missing argument, an
//! invalid key or value, no store named); 3 unreachable (no weftd on the
//! socket, or the store did not answer).

mod dataplane;
mod demo;
pub mod doctor;
mod leases;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// Where the node's weftd keeps its files unless told otherwise.
pub const DEFAULT_SUBNET_FILE: &str = "/run/flannel/subnet.env";

/// `weft`'s exit codes (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Exit {
    /// Done.
    Ok = 0,
    /// Failed or refused.
    Failed = 1,
    /// A usage error.
    Usage = 2,
    /// weftd or the store could not be reached.
    Unreachable = 3,
}

/// A command's failure: the message and its exit code.
#[derive(Debug)]
pub struct CliError {
    /// The exit code.
    pub exit: Exit,
    /// What went wrong and how to fix it.
    pub message: String,
}

impl CliError {
    fn new(exit: Exit, message: impl Into<String>) -> CliError {
        CliError {
            exit,
            message: message.into(),
        }
    }

    /// A usage error.
    pub fn usage(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Usage, message)
    }

    /// A failure or refusal.
    pub fn failed(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Failed, message)
    }

    /// weftd or the store could not be reached.
    pub fn unreachable(message: impl Into<String>) -> CliError {
        CliError::new(Exit::Unreachable, message)
    }
}

/// The command line.
#[derive(Debug, Parser)]
#[command(
    name = "weft",
    about = "weft operator CLI",
    version,
    after_help = "Exit codes: 0 done, 1 failed or refused, 2 usage error, 3 weftd or the store unreachable."
)]
pub struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Build a local multi-node cluster in network namespaces, show pod
    /// traffic across nodes, and tear it down (needs root).
    Demo(demo::DemoArgs),
    /// Show or switch (live) the dataplane of this node's weftd.
    Dataplane(dataplane::DataplaneArgs),
    /// Show this node's weftd: lease, backend, dataplane, counters and peers.
    Status(dataplane::StatusArgs),
    /// List, write or delete the leases in a store.
    Leases(Box<leases::LeasesArgs>),
    /// Check this node's setup, its weftd and its peers; print each problem
    /// with its evidence and the fix (exit 1 on an error finding, 3 when
    /// weftd does not answer).
    Doctor(doctor::DoctorArgs),
}

/// The socket weftd serves status on for `subnet_file`.
fn status_socket(subnet_file: &std::path::Path) -> PathBuf {
    crate::status::server::socket_path(subnet_file)
}

/// Runs `weft` with the process's arguments; returns the exit code.
pub fn main() -> u8 {
    let cli = Cli::parse();
    crate::logging::init(0, "text");
    let res = match cli.cmd {
        Cmd::Demo(a) => demo::run(&a),
        Cmd::Dataplane(a) => dataplane::dataplane(&a),
        Cmd::Status(a) => dataplane::status(&a),
        Cmd::Doctor(a) => doctor::run(&a),
        Cmd::Leases(a) => match tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        {
            Ok(rt) => rt.block_on(leases::run(*a)),
            Err(e) => Err(CliError::failed(format!("cannot start a runtime: {e}"))),
        },
    };
    match res {
        Ok(()) => Exit::Ok as u8,
        Err(e) => {
            eprintln!("weft: {}", e.message);
            e.exit as u8
        }
    }
}

/// Writes `text` to stdout (a closed pipe is an error, not a panic).
fn print(text: &str) -> Result<(), CliError> {
    use std::io::Write;
    std::io::stdout()
        .write_all(text.as_bytes())
        .map_err(|e| CliError::failed(format!("stdout: {e}")))
}

/// `value` as pretty JSON and a newline, on stdout.
fn print_json(value: &serde_json::Value) -> Result<(), CliError> {
    let text =
        serde_json::to_string_pretty(value).map_err(|e| CliError::failed(format!("json: {e}")))?;
    print(&(text + "\n"))
}
