//! Sleeping until a descriptor is readable (every worker's idle wait), and
//! an `eventfd` used to wake a worker sleeping there (cross-worker handoff).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::syscall;

/// A non-blocking, close-on-exec `eventfd`.
#[derive(Debug)]
pub struct Event {
    fd: OwnedFd,
}

impl Event {
    /// Creates the eventfd.
    pub fn new() -> io::Result<Event> {
        let fd = syscall!(eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC))?;
        // SAFETY: `fd` was just returned by eventfd() and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Event { fd })
    }

    /// Raw descriptor (for poll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Makes the descriptor readable (errors are ignored: a full counter is still readable).
    pub fn notify(&self) {
        let one: u64 = 1;
        let _ = syscall!(write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8));
    }

    /// Resets the counter.
    pub fn clear(&self) {
        let mut v: u64 = 0;
        let _ = syscall!(read(self.fd.as_raw_fd(), (&mut v as *mut u64).cast(), 8));
    }
}

/// Waits up to `timeout_ms` until one of `fds` is readable; returns which are
/// (all false on timeout or error: the caller's loop simply tries again).
pub fn wait_readable<const N: usize>(fds: [RawFd; N], timeout_ms: i32) -> [bool; N] {
    let mut p = fds.map(|fd| libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    });
    let n = libc::nfds_t::try_from(N).unwrap_or(0);
    // SAFETY: `p` is a valid array of N pollfd structs for the duration of the call.
    unsafe { libc::poll(p.as_mut_ptr(), n, timeout_ms) };
    p.map(|x| x.revents != 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wait_readable_reports_the_notified_event_only() {
        let a = Event::new().expect("eventfd");
        let b = Event::new().expect("eventfd");
        assert_eq!(wait_readable([a.raw_fd(), b.raw_fd()], 0), [false, false]);
        b.notify();
        assert_eq!(wait_readable([a.raw_fd(), b.raw_fd()], 1000), [false, true]);
        b.clear();
        assert_eq!(wait_readable([a.raw_fd(), b.raw_fd()], 0), [false, false]);
    }
}
