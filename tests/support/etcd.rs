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
    tls: Option<TlsFiles>,
}

/// PEM files for an etcd that requires TLS client certificates, made with the
/// `openssl` command: a CA, a server cert for IP 127.0.0.1 and a client cert.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The CA certificate (`--etcd-cafile`).
    pub ca: PathBuf,
    /// The server certificate.
    pub server_cert: PathBuf,
    /// The server key.
    pub server_key: PathBuf,
    /// A client certificate signed by the CA (`--etcd-certfile`).
    pub client_cert: PathBuf,
    /// Its key (`--etcd-keyfile`).
    pub client_key: PathBuf,
}

impl TlsFiles {
    /// Generates the files in `dir`; panics when `openssl` fails.
    pub fn generate(dir: &Path) -> TlsFiles {
        let p = |n: &str| dir.join(n);
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(dir)
                .output()
                .expect("run openssl");
            assert!(
                out.status.success(),
                "openssl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &["-keyout", "ca.key", "-out", "ca.crt", "-days", "2"],
                &["-subj", "/CN=weft-test-ca"],
            ]
            .concat(),
        );
        for (name, usage) in [("server", "serverAuth"), ("client", "clientAuth")] {
            let (key, csr, crt, ext) = (
                format!("{name}.key"),
                format!("{name}.csr"),
                format!("{name}.crt"),
                format!("{name}.ext"),
            );
            std::fs::write(
                p(&ext),
                format!("subjectAltName=IP:127.0.0.1\nextendedKeyUsage={usage}\n"),
            )
            .expect("write ext");
            openssl(
                &[
                    &["req"][..],
                    &ec,
                    &[
                        "-keyout",
                        &key,
                        "-out",
                        &csr,
                        "-subj",
                        &format!("/CN=weft-{name}"),
                    ],
                ]
                .concat(),
            );
            openssl(&[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &ext,
            ]);
        }
        TlsFiles {
            ca: p("ca.crt"),
            server_cert: p("server.crt"),
            server_key: p("server.key"),
            client_cert: p("client.crt"),
            client_key: p("client.key"),
        }
    }
}

/// A port that was free a moment ago on 127.0.0.1.
fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local addr").port()
}

fn bin(env: &str, default: &str) -> PathBuf {
    std::env::var_os(env).map_or_else(|| PathBuf::from(default), PathBuf::from)
}

/// Whether an etcd binary is installed (for tools; tests use [`require`]).
pub fn available() -> bool {
    bin("WEFT_ETCD", ETCD_BIN).exists()
}

/// The `weft_testenv` guard for etcd: `true` when installed; otherwise the
/// calling test is to skip (or, under CI, this fails it).
#[must_use = "return from the test when this is false (or use require_etcd!)"]
#[track_caller]
pub fn require() -> bool {
    weft_testenv::require_tool("etcd", bin("WEFT_ETCD", ETCD_BIN), "etcd-server")
}

impl Etcd {
    /// Starts a fresh member and waits until it is healthy; panics (with the
    /// log) when it does not come up.
    pub fn start() -> Etcd {
        Etcd::start_inner(false)
    }

    /// Like [`Etcd::start`], but clients must speak TLS and present a
    /// certificate signed by the generated CA (see [`Etcd::tls`]).
    pub fn start_tls() -> Etcd {
        Etcd::start_inner(true)
    }

    fn start_inner(tls: bool) -> Etcd {
        let dir = tempfile::Builder::new()
            .prefix("weft-etcd-")
            .tempdir()
            .expect("tempdir");
        let tls = tls.then(|| TlsFiles::generate(dir.path()));
        let mut e = Etcd {
            dir,
            client_port: free_port(),
            peer_port: free_port(),
            proc: None,
            starts: 0,
            tls,
        };
        e.start_again();
        e
    }

    /// The TLS files when started with [`Etcd::start_tls`].
    pub fn tls(&self) -> Option<&TlsFiles> {
        self.tls.as_ref()
    }

    /// The client URL, `http://127.0.0.1:<port>` (`https://` with TLS).
    pub fn endpoint(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client_port)
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
            .args([
                "--listen-client-urls",
                &client,
                "--advertise-client-urls",
                &client,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("weft-test={peer}")])
            .args(["--heartbeat-interval", "50", "--election-timeout", "500"])
            .args(["--logger", "zap", "--log-level", "warn"]);
        if let Some(t) = &self.tls {
            cmd.arg("--cert-file")
                .arg(&t.server_cert)
                .arg("--key-file")
                .arg(&t.server_key);
            cmd.arg("--trusted-ca-file")
                .arg(&t.ca)
                .arg("--client-cert-auth");
        }
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
            assert!(
                self.running(),
                "etcd exited during start; log:\n{}",
                self.log()
            );
            assert!(
                Instant::now() < deadline,
                "etcd not healthy after {START_TIMEOUT:?}; log:\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One probe of `GET /health` (`etcdctl endpoint health` with TLS).
    pub fn healthy(&self) -> bool {
        if self.tls.is_some() {
            return self
                .etcdctl(&["--command-timeout=2s", "endpoint", "health"])
                .status
                .success();
        }
        let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.client_port)) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let req = format!(
            "GET /health HTTP/1.0\r\nHost: 127.0.0.1:{}\r\n\r\n",
            self.client_port
        );
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
        let mut cmd = Command::new(bin("WEFT_ETCDCTL", ETCDCTL_BIN));
        cmd.env("ETCDCTL_API", "3")
            .arg(format!("--endpoints={}", self.endpoint()));
        if let Some(t) = &self.tls {
            cmd.arg("--cacert")
                .arg(&t.ca)
                .arg("--cert")
                .arg(&t.client_cert)
                .arg("--key")
                .arg(&t.client_key);
        }
        cmd.args(args).output().expect("run etcdctl")
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
