//! A TCP proxy for tests: forwards every connection it accepts to a port
//! on this process's loopback, and fails like a server does on demand: it
//! cuts every connection (a dying server), or, for the connection that
//! sends a given byte string, swallows every reply from then on (a stalled
//! server, whose client times out while its request did land). When the
//! upstream is down, connections are accepted and closed at once. Stops
//! on drop, cutting what it forwards.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

/// A running proxy (see the module docs).
pub struct TcpProxy {
    shared: Arc<Shared>,
    port: u16,
    thread: Option<JoinHandle<()>>,
}

#[derive(Default)]
struct Shared {
    stop: AtomicBool,
    /// Both sockets of every forwarded connection, to cut them.
    conns: Mutex<Vec<TcpStream>>,
    /// Armed by [`TcpProxy::swallow_replies_after`].
    needle: Mutex<Option<Vec<u8>>>,
}

impl TcpProxy {
    /// Accepts on `listener` (bound wherever the caller chose, e.g. inside
    /// a namespace) and forwards to `127.0.0.1:<upstream>`.
    pub fn start(listener: TcpListener, upstream: u16) -> TcpProxy {
        let port = listener.local_addr().expect("proxy address").port();
        listener.set_nonblocking(true).expect("nonblocking");
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        let thread = std::thread::spawn(move || {
            while !s.stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((down, _)) => {
                        let _ = down.set_nonblocking(false);
                        s.forward(down, upstream);
                    }
                    // Nothing to accept yet (or a transient error).
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
        });
        TcpProxy {
            shared,
            port,
            thread: Some(thread),
        }
    }

    /// The port it listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Cuts every connection forwarded so far (what a dying server does) and
    /// disarms [`TcpProxy::swallow_replies_after`]: the client's next
    /// connection works both ways.
    pub fn cut(&self) {
        *lock(&self.shared.needle) = None;
        for c in lock(&self.shared.conns).drain(..) {
            let _ = c.shutdown(Shutdown::Both);
        }
    }

    /// From the next client bytes containing `needle` on, that connection's
    /// replies are dropped: it stays open and silent, like a stalled server.
    pub fn swallow_replies_after(&self, needle: &[u8]) {
        *lock(&self.shared.needle) = Some(needle.to_vec());
    }
}

impl Drop for TcpProxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        self.cut();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Shared {
    fn forward(self: &Arc<Self>, down: TcpStream, upstream: u16) {
        let Ok(up) =
            TcpStream::connect_timeout(&([127, 0, 0, 1], upstream).into(), Duration::from_secs(1))
        else {
            let _ = down.shutdown(Shutdown::Both);
            return;
        };
        let clones = (|| Ok::<_, std::io::Error>((down.try_clone()?, up.try_clone()?)))();
        let Ok((down2, up2)) = clones else {
            return;
        };
        {
            let mut c = lock(&self.conns);
            c.retain(|s| s.peer_addr().is_ok());
            if let (Ok(a), Ok(b)) = (down.try_clone(), up.try_clone()) {
                c.push(a);
                c.push(b);
            }
        }
        let silent = Arc::new(AtomicBool::new(false));
        let (s, quiet) = (self.clone(), silent.clone());
        std::thread::spawn(move || s.upstream(down, up, &quiet));
        std::thread::spawn(move || pipe(up2, down2, &silent));
    }

    /// Client to server: forwards everything; marks the connection silent
    /// before forwarding the bytes that complete the needle, so that no
    /// byte of their reply gets through.
    fn upstream(&self, mut from: TcpStream, mut to: TcpStream, silent: &AtomicBool) {
        let mut buf = [0u8; 16 * 1024];
        // The stream's last bytes, to find a needle split across reads.
        let mut tail = Vec::new();
        while let Ok(n @ 1..) = from.read(&mut buf) {
            let mut needle = lock(&self.needle);
            if let Some(want) = needle.as_deref() {
                tail.extend_from_slice(&buf[..n]);
                let found = tail.windows(want.len()).any(|w| w == want);
                tail.drain(..tail.len().saturating_sub(want.len()));
                if found {
                    silent.store(true, Ordering::SeqCst);
                    *needle = None;
                }
            }
            drop(needle);
            if to.write_all(&buf[..n]).is_err() {
                break;
            }
        }
        let _ = to.shutdown(Shutdown::Both);
        let _ = from.shutdown(Shutdown::Both);
    }
}

/// Server to client: forwards until the connection goes silent, then reads
/// and drops.
fn pipe(mut from: TcpStream, mut to: TcpStream, silent: &AtomicBool) {
    let mut buf = [0u8; 16 * 1024];
    while let Ok(n @ 1..) = from.read(&mut buf) {
        if !silent.load(Ordering::SeqCst) && to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs `f` on a thread that has entered network namespace `ns` (a path,
/// `/var/run/netns/<name>`).
pub fn in_netns<T: Send>(ns: &str, f: impl FnOnce() -> T + Send) -> T {
    use std::os::fd::AsRawFd;
    std::thread::scope(|s| {
        s.spawn(move || {
            let file = std::fs::File::open(ns).unwrap_or_else(|e| panic!("open {ns}: {e}"));
            // SAFETY: setns on an fd we own, for this thread only; no memory is involved.
            let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {ns}: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("netns thread panicked")
    })
}

/// A [`TcpProxy`] from `127.0.0.1:<port>` inside the namespace at `ns` to a
/// port on this process's own loopback: lets daemons in node namespaces
/// reach the test's etcd. Stops on drop.
pub fn ns_proxy(ns: &str, port: u16, upstream: u16) -> TcpProxy {
    let listener = in_netns(ns, move || {
        TcpListener::bind(("127.0.0.1", port)).expect("bind proxy in netns")
    });
    TcpProxy::start(listener, upstream)
}
