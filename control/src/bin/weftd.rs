//! weftd, the node daemon: a drop-in for flanneld. See `weft_control::daemon`.

use weft_control::daemon::{self, flags::Flags};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let flags = match Flags::parse_from_env_and_args() {
        Ok(f) => f,
        Err(e) => e.exit(),
    };
    if let Err(e) = flags.conflicts(&args) {
        eprintln!("weftd: {e}");
        std::process::exit(2);
    }
    if flags.version {
        // flanneld prints its version to stderr.
        eprintln!("{}", env!("CARGO_PKG_VERSION"));
        return;
    }
    weft_control::logging::init(flags.verbosity, &flags.log_format);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            tracing::error!("cannot start runtime: {e}");
            std::process::exit(1);
        }
    };
    let code = match rt.block_on(daemon::run(flags, daemon::flags::etcd_explicit(&args))) {
        Ok(code) => code,
        Err(e) => {
            // Each cause once (see `error_chain`), not anyhow's `{:#}`.
            tracing::error!("{}", weft_control::logging::error_chain(e.as_ref()));
            1
        }
    };
    rt.shutdown_timeout(std::time::Duration::from_secs(2));
    std::process::exit(code);
}
