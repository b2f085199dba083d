//! `weft demo`: the arguments and their checks; the cluster is
//! [`crate::demo`]'s.

use clap::Args;

use super::CliError;

/// `weft demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Backend type.
    #[arg(long, default_value = "vxlan", value_parser = ["vxlan", "udp", "wireguard", "ipip", "host-gw", "alloc"])]
    backend: String,
    /// Number of nodes (1-50).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=50))]
    nodes: u8,
    /// Pods per node (1-20).
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u8).range(1..=20))]
    pods: u8,
    /// iperf3 seconds (0 skips it).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(0..=600))]
    iperf: u32,
    /// Dataplane. Default: userspace (weft's engine), auto for host-gw
    /// (kernel routes only).
    #[arg(long, value_parser = ["userspace", "kernel", "auto"])]
    dataplane: Option<String>,
    /// Extra weftd arguments (repeatable), e.g. --weftd-arg=--ip-masq.
    #[arg(long = "weftd-arg", allow_hyphen_values = true)]
    weftd_args: Vec<String>,
}

/// Runs the demo.
pub fn run(a: &DemoArgs) -> Result<(), CliError> {
    if !nix::unistd::geteuid().is_root() {
        return Err(CliError::failed(
            "demo: needs root (it makes network namespaces, veth pairs and TUN devices): run `sudo ./scripts/demo.sh` or `sudo weft demo`",
        ));
    }
    let opts = crate::demo::DemoOptions {
        backend: a.backend.clone(),
        nodes: a.nodes,
        pods: a.pods,
        iperf_secs: a.iperf,
        weftd_args: std::iter::once(format!(
            "--dataplane={}",
            a.dataplane
                .as_deref()
                .unwrap_or(crate::demo::default_dataplane(&a.backend))
        ))
        .chain(a.weftd_args.iter().cloned())
        .collect(),
    };
    match crate::demo::run(&opts) {
        Ok(true) => Ok(()),
        Ok(false) => Err(CliError::failed(
            "demo: some pods could not reach each other",
        )),
        Err(e) => Err(CliError::failed(format!(
            "demo: {}",
            crate::logging::error_chain(e.as_ref())
        ))),
    }
}
