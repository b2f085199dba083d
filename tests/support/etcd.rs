//! A real single-member etcd (Debian's `etcd-server`, `/usr/bin/etcd`) on
//! 127.0.0.1 with free ports and a temporary data directory, for tests.
//!
//! [`Etcd::start`] waits until `/health` reports healthy. [`Etcd::stop`] and
//! [`Etcd::start_again`] stop and restart the same member (same data dir and
//! ports) for fault tests. Dropping the value kills etcd and removes its data.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use crate::proc::Proc;

/// Where Debian installs etcd; `WEFT_ETCD` overrides it.
pub const ETCD_BIN: &str = "/usr/bin/etcd";
/// etcd's command-line client; `WEFT_ETCDCTL` overrides it.
pub const ETCDCTL_BIN: &str = "/usr/bin/etcdctl";

/// How long to wait for etcd to become healthy.
const START_TIMEOUT: Duration = Duration::from_secs(30);

/// A running (or stopped) etcd member owned by a test.
#[derive(Debug)]
pub struct Etcd {
    dir: tempfile::TempDir,
    client_port: u16,
    peer_port: u16,
    proc: Option<Proc>,
    starts: u32,
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

fn bin(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// Whether an etcd binary is installed (tests may skip without one).
pub fn available() -> bool {
    bin("WEFT_ETCD", ETCD_BIN).exists()
}

impl Etcd {
    /// Starts a fresh member and waits until it is healthy; panics (with the
    /// log) when it does not come up.
    pub fn start() -> Etcd {
        let dir = tempfile::Builder::new().prefix("weft-etcd-").tempdir().expect("tempdir");
        let mut e = Etcd { dir, client_port: free_port(), peer_port: free_port(), proc: None, starts: 0 };
        e.start_again();
        e
    }

    /// The client URL, `http://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.client_port
    }

    /// etcd's data directory (kept across [`Etcd::stop`] / [`Etcd::start_again`]).
    pub fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join(format!("etcd.{}.log", self.starts))
    }

    /// The log of the current (or last) run.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// Whether the member process is running.
    pub fn running(&mut self) -> bool {
        self.proc.as_mut().is_some_and(Proc::running)
    }

    /// (Re)starts the member on the same ports and data directory and waits
    /// until it is healthy. Does nothing when it is already running.
    pub fn start_again(&mut self) {
        if self.running() {
            return;
        }
        self.starts += 1;
        let client = self.endpoint();
        let peer = format!("http://127.0.0.1:{}", self.peer_port);
        let mut cmd = Command::new(bin("WEFT_ETCD", ETCD_BIN));
        cmd.arg("--name")
            .arg("weft-test")
            .arg("--data-dir")
            .arg(self.data_dir())
            .args(["--listen-client-urls", &client, "--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer, "--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("weft-test={peer}")])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"]);
        let log = self.log_path();
        self.proc = Some(Proc::spawn("etcd", cmd, &log));
        self.wait_healthy();
    }

    /// Stops the member (SIGTERM, then SIGKILL after 10 s); its data stays.
    pub fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.stop(libc::SIGTERM, Duration::from_secs(10));
        }
    }

    /// Kills the member at once (SIGKILL); its data stays.
    pub fn kill(&mut self) {
        self.proc = None; // Proc's Drop kills and reaps.
    }

    /// Blocks until `/health` answers `"health":"true"`; panics after 30 s.
    pub fn wait_healthy(&mut self) {
        let deadline = Instant::now() + START_TIMEOUT;
        loop {
            if self.healthy() {
                return;
            }
            assert!(self.running(), "etcd exited during start; log:\n{}", self.log());
            assert!(Instant::now() < deadline, "etcd not healthy after {START_TIMEOUT:?}; log:\n{}", self.log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One probe of `GET /health`.
    pub fn healthy(&self) -> bool {
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else { return false };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = format!("GET /health HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n", self.client_port);
        if s.write_all(req.as_bytes()).is_err() {
            return false;
        }
        let mut resp = String::new();
        let _ = s.read_to_string(&mut resp);
        resp.contains("\"health\":\"true\"")
    }

    /// Runs `etcdctl` (API v3) against this member; returns its output,
    /// success or not.
    pub fn etcdctl(&self, args: &[&str]) -> Output {
        Command::new(bin("WEFT_ETCDCTL", ETCDCTL_BIN))
            .env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()))
            .args(args)
            .output()
            .expect("run etcdctl")
    }

    /// Runs `etcdctl` and panics with its stderr on failure; returns stdout.
    pub fn etcdctl_ok(&self, args: &[&str]) -> String {
        let out = self.etcdctl(args);
        assert!(
            out.status.success(),
            "etcdctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// The temporary directory holding data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
