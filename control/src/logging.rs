//! Log set-up shared by the binaries: structured logs on stderr (as flanneld,
//! whose klog always writes to stderr), text or JSON.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. `verbosity` is klog's `-v`: 0-3 → info,
/// 4-9 → debug, 10+ → trace. `RUST_LOG` overrides it.
pub fn init(verbosity: u32, format: &str) {
    let level = match verbosity {
        0..=3 => "info",
        4..=9 => "debug",
        _ => "trace",
    };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(level));
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if format == "json" {
        let _ = b.json().try_init();
    } else {
        let _ = b.with_target(false).try_init();
    }
}
