//! The only place with `unsafe`: raw syscalls for the TUN device, batched UDP and raw IPIP,
//! a device's transmit checksum offload (ethtool), the run-time-dispatched AVX2
//! checksum loop and the clock state read for `weft doctor`.

pub mod clock;
pub mod csum;
pub mod ethtool;
pub mod event;
mod mmsg;
pub mod raw;
pub mod tun;
pub mod udp;

/// Calls a libc function returning -1 on error and converts it to `io::Result`.
macro_rules! syscall {
    ($fn:ident ( $($arg:expr),* $(,)? )) => {{
        #[allow(unused_unsafe)]
        // SAFETY: the caller passes arguments that are valid for this syscall
        // (live buffers with correct lengths, initialised structs).
        let res = unsafe { libc::$fn($($arg),*) };
        if res == -1 { Err(std::io::Error::last_os_error()) } else { Ok(res) }
    }};
}
pub(crate) use syscall;
