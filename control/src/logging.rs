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

/// An error and its causes on one line, each said once: `outer: cause:
/// root cause`, as anyhow's `{:#}` prints a chain, except that a cause whose
/// text the error before it already contains is left out. Many errors here
/// (and in dependencies) include their source in their own message and
/// also return it from `source()`, so a plain chain printed each cause
/// twice (`...: No such file or directory (os error 2): No such file or
/// directory (os error 2)`). What the binaries print for a fatal error.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = String::new();
    // The text the next cause is compared with: the last one printed (it
    // contains whatever it included of its own causes).
    let mut said = String::new();
    for e in std::iter::successors(Some(err), |e| e.source()) {
        let msg = e.to_string();
        if !out.is_empty() && said.contains(msg.as_str()) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&msg);
        said = msg;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::io;

    use super::error_chain;

    /// Says its source in its message and returns it from `source()`.
    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct Inclusive {
        path: &'static str,
        #[source]
        source: io::Error,
    }

    /// Leaves its source to the chain.
    #[derive(Debug, thiserror::Error)]
    #[error("reading {path}")]
    struct Exclusive {
        path: &'static str,
        #[source]
        source: io::Error,
    }

    fn enoent() -> io::Error {
        io::Error::from_raw_os_error(libc::ENOENT)
    }

    #[test]
    fn each_cause_once() {
        let e = anyhow::Error::new(Inclusive {
            path: "/run/flannel/weft-status.sock",
            source: enoent(),
        })
        .context("is weftd running?");
        assert_eq!(
            format!("{e:#}"),
            "is weftd running?: /run/flannel/weft-status.sock: No such file or directory (os error 2): No such file or directory (os error 2)",
            "anyhow's chain repeats the cause"
        );
        assert_eq!(
            error_chain(e.as_ref()),
            "is weftd running?: /run/flannel/weft-status.sock: No such file or directory (os error 2)"
        );
        // A source the message leaves out is still said.
        let e = anyhow::Error::new(Exclusive {
            path: "/x",
            source: enoent(),
        })
        .context("loading config");
        assert_eq!(
            error_chain(e.as_ref()),
            "loading config: reading /x: No such file or directory (os error 2)"
        );
        // One error alone, and a context that repeats nothing.
        assert_eq!(
            error_chain(&enoent()),
            "No such file or directory (os error 2)"
        );
        let e = anyhow::anyhow!("no lease").context("weftd");
        assert_eq!(error_chain(e.as_ref()), "weftd: no lease");
    }
}
