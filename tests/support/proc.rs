//! Child processes that are killed when the test lets go of them.

use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running child process; killed (SIGKILL) and reaped on drop unless
/// stopped earlier. Its stderr goes to a file so that tests can read logs.
#[derive(Debug)]
pub struct Proc {
    child: Option<Child>,
    name: String,
    log: std::path::PathBuf,
}

impl Proc {
    /// Spawns `cmd`, sending stdout and stderr to `log`.
    pub fn spawn(name: &str, mut cmd: Command, log: &std::path::Path) -> Proc {
        let f = std::fs::File::create(log).expect("create log");
        let f2 = f.try_clone().expect("clone log fd");
        cmd.stdout(Stdio::from(f))
            .stderr(Stdio::from(f2))
            .stdin(Stdio::null());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {name}: {e}"));
        Proc {
            child: Some(child),
            name: name.to_string(),
            log: log.to_path_buf(),
        }
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map_or(0, Child::id)
    }

    /// The log written so far.
    pub fn log(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let _ = f.read_to_string(&mut s);
        }
        s
    }

    /// Whether the process is still running.
    pub fn running(&mut self) -> bool {
        match self.child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// Sends `signal` (e.g. libc::SIGTERM) and waits up to `timeout` for exit;
    /// returns the exit code (or 128+signal). Kills with SIGKILL on timeout.
    pub fn stop(&mut self, signal: i32, timeout: Duration) -> Option<i32> {
        let child = self.child.as_mut()?;
        let pid = i32::try_from(child.id()).ok()?;
        // SAFETY: sending a signal to our own child's pid; no memory is involved.
        unsafe { libc::kill(pid, signal) };
        let deadline = Instant::now() + timeout;
        loop {
            if let Ok(Some(st)) = child.try_wait() {
                self.child = None;
                use std::os::unix::process::ExitStatusExt;
                return st.code().or_else(|| st.signal().map(|s| 128 + s));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                self.child = None;
                panic!(
                    "{} did not exit within {timeout:?} after signal {signal}; log:\n{}",
                    self.name,
                    self.log()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Polls `f` every 50 ms until it returns `Some`, or panics with `what` after
/// `timeout`. For waiting on state, never for asserting speed.
pub fn wait_for<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    wait_for_or_show(what, timeout, f, String::new)
}

/// [`wait_for`], with `detail()` (read at the timeout, e.g. a daemon's log)
/// appended to the panic message.
pub fn wait_for_or_show<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Option<T>,
    detail: impl Fn() -> String,
) -> T {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}{}",
            detail()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    #[should_panic(expected = "waiting for the thing: the daemon's log")]
    fn a_timeout_shows_the_detail() {
        wait_for_or_show(
            "the thing",
            Duration::ZERO,
            || None::<()>,
            || ": the daemon's log".to_string(),
        );
    }
}
