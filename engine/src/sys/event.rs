//! An `eventfd` used to wake a worker sleeping in `poll` (cross-worker handoff).

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
