//! `weft dataplane [set MODE | reset]` and `weft status`: what the node's
//! weftd runs, read from (and switched through) its status socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};

use super::{CliError, DEFAULT_SUBNET_FILE, print, print_json, status_socket};
use crate::backend::DataplaneChoice;
use crate::backend::dataplane_ctl::client::{self, RequestError, Status};
use crate::status::server::{self, StatusError};

/// `weft dataplane`.
#[derive(Debug, Args)]
pub struct DataplaneArgs {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    node: NodeArgs,
}

/// Which weftd, and how to print; accepted before and after the subcommand.
#[derive(Debug, Clone, Default, Args)]
struct NodeArgs {
    /// weftd's --subnet-file (its status socket lives next to it).
    #[arg(long, value_name = "FILE")]
    subnet_file: Option<PathBuf>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

impl NodeArgs {
    fn merge(&self, after: &NodeArgs) -> Result<NodeArgs, CliError> {
        if self.subnet_file.is_some() && after.subnet_file.is_some() {
            return Err(CliError::usage("--subnet-file is given twice"));
        }
        Ok(NodeArgs {
            subnet_file: self.subnet_file.clone().or(after.subnet_file.clone()),
            json: self.json || after.json,
        })
    }
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Switch live to MODE, keeping the lease; answers once weftd has
    /// switched (or with weftd's reason if it refuses). The choice is kept
    /// across restarts while the backend and --dataplane stay the same.
    Set {
        /// The dataplane.
        #[arg(value_enum)]
        mode: Mode,
        /// Seconds to wait for weftd (a WireGuard switch to the kernel waits
        /// up to 40 s for the peers to accept the kernel's handshakes).
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout: u64,
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Switch back to weftd's --dataplane and forget the kept choice.
    Reset {
        /// Seconds to wait for weftd.
        #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout: u64,
        #[command(flatten)]
        node: NodeArgs,
    },
}

/// `weft dataplane set`'s modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Mode {
    /// The kernel when it can, else weft's userspace engine.
    Auto,
    /// Only the kernel.
    Kernel,
    /// Only weft's userspace engine.
    Userspace,
}

impl From<Mode> for DataplaneChoice {
    fn from(m: Mode) -> DataplaneChoice {
        match m {
            Mode::Auto => DataplaneChoice::Auto,
            Mode::Kernel => DataplaneChoice::Kernel,
            Mode::Userspace => DataplaneChoice::Userspace,
        }
    }
}

/// `weft status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// weftd's --subnet-file (the status socket lives next to it).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["socket", "http"])]
    subnet_file: Option<PathBuf>,
    /// The status socket (default: weft-status.sock next to --subnet-file).
    #[arg(long, conflicts_with = "http")]
    socket: Option<PathBuf>,
    /// Read from weftd's HTTP listener instead (`--healthz-ip:--healthz-port`, e.g. 127.0.0.1:8471).
    #[arg(long, value_name = "HOST:PORT")]
    http: Option<String>,
    /// Print JSON instead of text.
    #[arg(long)]
    json: bool,
}

/// A failed read of the node's weftd: unreachable (3) unless it answered
/// with an error (1).
fn no_daemon(what: &str, e: StatusError) -> CliError {
    match e {
        StatusError::Daemon(m) => CliError::failed(format!("weftd: {m}")),
        e => CliError::unreachable(format!("cannot reach weftd ({what}): {e}")),
    }
}

fn subnet_file(f: &Option<PathBuf>) -> &Path {
    f.as_deref().unwrap_or(Path::new(DEFAULT_SUBNET_FILE))
}

/// `weft dataplane ...`.
pub fn dataplane(a: &DataplaneArgs) -> Result<(), CliError> {
    let (node, want, timeout) = match &a.action {
        None => (a.node.clone(), None, 0),
        Some(Action::Set {
            mode,
            timeout,
            node,
        }) => (a.node.merge(node)?, Some(Some((*mode).into())), *timeout),
        Some(Action::Reset { timeout, node }) => (a.node.merge(node)?, Some(None), *timeout),
    };
    let file = subnet_file(&node.subnet_file);
    let Some(want) = want else {
        let st = Status::query(file, Duration::from_secs(10)).map_err(|e| {
            no_daemon(
                &format!("is it running with --subnet-file={}?", file.display()),
                e,
            )
        })?;
        return show(&st, node.json);
    };
    let done = client::request(file, want, Duration::from_secs(timeout)).map_err(|e| match e {
        RequestError::NoDaemon(..) => CliError::unreachable(e.to_string()),
        e => CliError::failed(e.to_string()),
    })?;
    if let Some(w) = &done.warning {
        eprintln!("weft: warning: {w}");
    }
    if node.json {
        return print_json(&serde_json::json!({
            "pid": done.status.pid,
            "backend": done.status.backend,
            "dataplane": done.status.dataplane,
            "requested": done.status.requested,
            "flag": done.flag,
            "persisted": done.persisted,
            "warning": done.warning,
        }));
    }
    show(&done.status, false)?;
    match &done.persisted {
        Some(p) => eprintln!(
            "kept in {p} across weftd restarts (while its backend and --dataplane={} stay); `weft dataplane reset` returns to --dataplane",
            done.flag
        ),
        None => eprintln!("weftd runs its --dataplane={} (nothing kept)", done.flag),
    }
    Ok(())
}

fn show(st: &Status, json: bool) -> Result<(), CliError> {
    if json {
        return print_json(&serde_json::json!({
            "pid": st.pid,
            "backend": st.backend,
            "dataplane": st.dataplane,
            "requested": st.requested,
        }));
    }
    print(&format!(
        "backend {} runs in the {} (requested: {}, weftd pid {})\n",
        st.backend, st.dataplane, st.requested, st.pid
    ))
}

/// `weft status`.
pub fn status(a: &StatusArgs) -> Result<(), CliError> {
    use crate::status::render;
    let timeout = Duration::from_secs(10);
    let st = match &a.http {
        Some(addr) => server::query_http(addr, timeout).map_err(|e| {
            no_daemon(
                &format!("is it running with --healthz-port and --healthz-ip for {addr}?"),
                e,
            )
        })?,
        None => {
            let file = subnet_file(&a.subnet_file);
            let socket = a.socket.clone().unwrap_or_else(|| status_socket(file));
            server::query(&socket, timeout).map_err(|e| {
                no_daemon(
                    &format!("is it running with --subnet-file={}?", file.display()),
                    e,
                )
            })?
        }
    };
    if a.json {
        let v = serde_json::to_value(&st).map_err(|e| CliError::failed(e.to_string()))?;
        return print_json(&v);
    }
    print(&render::text(&st))
}
