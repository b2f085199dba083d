//! The workload that never stops, all in this process on threads that
//! entered pod namespaces (no external tools):
//!
//! - an echo server in every pod (`:7000` request/response, `:7001` streams);
//! - per ordered pod pair in a cluster, a request loop: every 250 ms a new
//!   TCP connection (3 s connect timeout, so one lost SYN, retransmitted
//!   after 1 s, is not a failure), 16 bytes out, the same 16 back (3 s
//!   timeout); each outcome recorded with its time and, if it failed, the step;
//! - per unordered pod pair, one long-lived TCP stream: a 64-byte frame every
//!   100 ms, echoed; a reset or EOF is recorded as a break (and the stream
//!   reconnects so the run goes on), the longest time without an echo as a stall.
//!
//! Phantom-lease churn goes through the store and lives in the scheduler
//! loop ([`super::faults`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use super::now;

const REQ_PORT: u16 = 7000;
const STREAM_PORT: u16 = 7001;

/// A pod as the workload sees it.
#[derive(Debug, Clone)]
pub struct PodRef {
    /// Cluster index.
    pub cluster: usize,
    /// Node index in the cluster.
    pub node: usize,
    /// The pod namespace's path.
    pub ns: String,
    /// Its address.
    pub ip: String,
}

/// One request's outcome.
#[derive(Debug, Clone, Copy)]
pub struct Req {
    /// Sending pod and receiving pod (indices into [`Workload::pods`]).
    pub from: usize,
    /// See `from`.
    pub to: usize,
    /// When it started.
    pub t: f64,
    /// When its outcome was known (the echo, or the step that failed).
    pub end: f64,
    /// Whether the echo came back intact.
    pub ok: bool,
    /// The step that failed (`connect`, `write`, `reply`, `corrupt reply`).
    pub why: Option<&'static str>,
}

/// A long-lived stream's record.
#[derive(Debug, Clone, Default)]
pub struct StreamLog {
    /// The two pods.
    pub pods: (usize, usize),
    /// Breaks (reset, EOF, error): time and reason.
    pub breaks: Vec<(f64, String)>,
    /// Longest time without an echo, and when it ended.
    pub max_stall: (f64, f64),
    /// The last echo's time.
    pub last_echo: f64,
    /// Frames echoed.
    pub echoed: u64,
}

/// Everything the workload records.
#[derive(Debug, Default)]
pub struct Records {
    /// Every request.
    pub reqs: Vec<Req>,
    /// One per stream.
    pub streams: Vec<StreamLog>,
    /// Times this process (clients and echo servers alike) was not
    /// scheduled: (start, seconds) of every 100 ms sleep that overslept
    /// by more than [`STALL`] s. A diagnostic, not an excuse.
    pub stalls: Vec<(f64, f64)>,
}

/// An oversleep this long counts as a stall of the test process.
pub const STALL: f64 = 0.5;

/// Sleeps 100 ms at a time and records every oversleep beyond [`STALL`].
fn stall_probe(stop: &AtomicBool, rec: &Mutex<Records>) {
    while !stop.load(Ordering::Relaxed) {
        let t = now();
        std::thread::sleep(Duration::from_millis(100));
        let late = now() - t - 0.1;
        if late > STALL {
            eprintln!("chaos {t:8.1}s test process stalled {late:.1} s");
            rec.lock().expect("records").stalls.push((t, late));
        }
    }
}

/// The running workload; stops on drop.
pub struct Workload {
    /// What was recorded.
    pub rec: Arc<Mutex<Records>>,
    /// Stops the request loops and streams (first, so that no request is
    /// in flight when the servers go).
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    stop_servers: Arc<AtomicBool>,
    servers: Vec<JoinHandle<()>>,
}

fn enter(ns: &str) {
    let file = std::fs::File::open(ns).unwrap_or_else(|e| panic!("open {ns}: {e}"));
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET)
        .unwrap_or_else(|e| panic!("setns {ns}: {e}"));
}

fn addr(ip: &str, port: u16) -> SocketAddr {
    format!("{ip}:{port}").parse().expect("pod address")
}

impl Workload {
    /// Starts servers, request loops and streams for `pods`.
    pub fn start(pods: &[PodRef]) -> Workload {
        let stop = Arc::new(AtomicBool::new(false));
        let stop_servers = Arc::new(AtomicBool::new(false));
        let rec = Arc::new(Mutex::new(Records::default()));
        let mut threads = Vec::new();
        let mut servers = Vec::new();
        for p in pods {
            for port in [REQ_PORT, STREAM_PORT] {
                servers.push(serve(p, port, stop_servers.clone()));
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let (s, r) = (stop.clone(), rec.clone());
        threads.push(std::thread::spawn(move || stall_probe(&s, &r)));
        for (a, pa) in pods.iter().enumerate() {
            for (b, pb) in pods.iter().enumerate() {
                if a == b || pa.cluster != pb.cluster {
                    continue;
                }
                let (s, r, ns, to) = (
                    stop.clone(),
                    rec.clone(),
                    pa.ns.clone(),
                    addr(&pb.ip, REQ_PORT),
                );
                threads.push(std::thread::spawn(move || {
                    request_loop(&ns, to, a, b, &s, &r)
                }));
                if a < b {
                    let idx = {
                        let mut g = rec.lock().expect("records");
                        g.streams.push(StreamLog {
                            pods: (a, b),
                            last_echo: now(),
                            ..StreamLog::default()
                        });
                        g.streams.len() - 1
                    };
                    let (s, r, ns, to) = (
                        stop.clone(),
                        rec.clone(),
                        pa.ns.clone(),
                        addr(&pb.ip, STREAM_PORT),
                    );
                    threads.push(std::thread::spawn(move || {
                        stream_loop(&ns, to, idx, &s, &r)
                    }));
                }
            }
        }
        Workload {
            rec,
            stop,
            threads,
            stop_servers,
            servers,
        }
    }

    /// Stops every thread and returns what was recorded.
    pub fn stop(mut self) -> Records {
        self.halt();
        std::mem::take(&mut *self.rec.lock().expect("records"))
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.stop_servers.store(true, Ordering::Relaxed);
        for t in self.servers.drain(..) {
            let _ = t.join();
        }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.halt();
    }
}

fn serve(p: &PodRef, port: u16, stop: Arc<AtomicBool>) -> JoinHandle<()> {
    let (ns, a) = (p.ns.clone(), addr(&p.ip, port));
    std::thread::spawn(move || {
        enter(&ns);
        let l = TcpListener::bind(a).unwrap_or_else(|e| panic!("bind {a}: {e}"));
        l.set_nonblocking(true).expect("nonblocking");
        while !stop.load(Ordering::Relaxed) {
            match l.accept() {
                Ok((s, _)) => {
                    let st = stop.clone();
                    std::thread::spawn(move || echo(s, &st));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    })
}

fn echo(mut s: TcpStream, stop: &AtomicBool) {
    let _ = s.set_nonblocking(false);
    let _ = s.set_read_timeout(Some(Duration::from_secs(1)));
    let mut buf = [0u8; 4096];
    while !stop.load(Ordering::Relaxed) {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(n) => {
                if s.write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}

/// One exchange: `None` when it succeeded, else the step that failed.
fn one_request(to: SocketAddr, n: u64) -> Option<&'static str> {
    let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_secs(3)) else {
        return Some("connect");
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(3)));
    let msg = [n.to_be_bytes(), (!n).to_be_bytes()].concat();
    if s.write_all(&msg).is_err() {
        return Some("write");
    }
    let mut back = [0u8; 16];
    match s.read_exact(&mut back) {
        Ok(()) if back[..] == msg[..] => None,
        Ok(()) => Some("corrupt reply"),
        Err(_) => Some("reply"),
    }
}

fn request_loop(
    ns: &str,
    to: SocketAddr,
    from: usize,
    dst: usize,
    stop: &AtomicBool,
    rec: &Mutex<Records>,
) {
    enter(ns);
    let mut n = 0u64;
    while !stop.load(Ordering::Relaxed) {
        let t = now();
        let why = one_request(to, n);
        n += 1;
        rec.lock().expect("records").reqs.push(Req {
            from,
            to: dst,
            t,
            end: now(),
            ok: why.is_none(),
            why,
        });
        let spent = now() - t;
        std::thread::sleep(Duration::from_secs_f64((0.25 - spent).max(0.0)));
    }
}

fn stream_loop(ns: &str, to: SocketAddr, idx: usize, stop: &AtomicBool, rec: &Mutex<Records>) {
    enter(ns);
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
            std::thread::sleep(Duration::from_millis(500));
            continue;
        };
        let _ = s.set_read_timeout(Some(Duration::from_millis(100)));
        let reason = run_stream(&mut s, idx, stop, rec);
        if let Some(r) = reason {
            rec.lock().expect("records").streams[idx]
                .breaks
                .push((now(), r));
        }
    }
}

/// Runs one connection until it breaks (the reason) or the run stops (`None`).
fn run_stream(
    s: &mut TcpStream,
    idx: usize,
    stop: &AtomicBool,
    rec: &Mutex<Records>,
) -> Option<String> {
    let mut seq = 0u64;
    let mut pending: Vec<u8> = Vec::new();
    let mut expect = 0u64;
    let mut buf = [0u8; 4096];
    let mut next_write = 0.0;
    while !stop.load(Ordering::Relaxed) {
        if now() >= next_write {
            next_write = now() + 0.1;
            let mut frame = [0u8; 64];
            frame[..8].copy_from_slice(&seq.to_be_bytes());
            if let Err(e) = s.write_all(&frame) {
                return Some(format!("write: {e}"));
            }
            seq += 1;
        }
        match s.read(&mut buf) {
            Ok(0) => return Some("EOF".into()),
            Ok(n) => pending.extend_from_slice(&buf[..n]),
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(e) => return Some(format!("read: {e}")),
        }
        while pending.len() >= 64 {
            let got = u64::from_be_bytes(pending[..8].try_into().expect("8 bytes"));
            pending.drain(..64);
            if got != expect {
                return Some(format!("frame {got} where {expect} was due"));
            }
            expect += 1;
            let t = now();
            let mut g = rec.lock().expect("records");
            let st = &mut g.streams[idx];
            let stall = t - st.last_echo;
            if stall > st.max_stall.0 {
                st.max_stall = (stall, t);
            }
            st.last_echo = t;
            st.echoed += 1;
        }
    }
    None
}
