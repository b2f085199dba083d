//! What the batched UDP and raw IPIP sockets share: socket options, a
//! classic BPF attach, and the `sendmmsg`/`recvmmsg` calls over
//! stack-allocated header arrays.

use std::io;
use std::mem::size_of;
use std::os::fd::{AsRawFd, RawFd};

use socket2::Socket;

use super::syscall;

/// Most messages per `sendmmsg`/`recvmmsg` call.
pub const BATCH: usize = 64;

/// An empty iovec array for one batch.
pub(super) const NO_IOVECS: [libc::iovec; BATCH] = [libc::iovec {
    iov_base: std::ptr::null_mut(),
    iov_len: 0,
}; BATCH];

/// `setsockopt` with an `int` value.
pub(super) fn setsockopt_int(
    fd: RawFd,
    level: libc::c_int,
    name: libc::c_int,
    v: libc::c_int,
) -> io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or(4);
    syscall!(setsockopt(
        fd,
        level,
        name,
        (&v as *const libc::c_int).cast(),
        len
    ))
    .map(drop)
}

/// Forces `buf` bytes of receive and send buffer (`SO_*BUFFORCE`, root
/// only), falling back to the `SO_*BUF` the kernel caps at `*mem_max`.
pub(super) fn force_buffers(s: &Socket, buf: usize) -> io::Result<()> {
    let fd = s.as_raw_fd();
    let b = libc::c_int::try_from(buf).unwrap_or(libc::c_int::MAX);
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, b).is_err() {
        s.set_recv_buffer_size(buf)?;
    }
    if setsockopt_int(fd, libc::SOL_SOCKET, libc::SO_SNDBUFFORCE, b).is_err() {
        s.set_send_buffer_size(buf)?;
    }
    Ok(())
}

/// Attaches the classic BPF program `prog` with `SOL_SOCKET` option `opt`
/// (`SO_ATTACH_FILTER`, `SO_ATTACH_REUSEPORT_CBPF`).
pub(super) fn attach_cbpf(
    fd: RawFd,
    opt: libc::c_int,
    prog: &[libc::sock_filter],
) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: u16::try_from(prog.len()).map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))?,
        filter: prog.as_ptr().cast_mut(),
    };
    let len = libc::socklen_t::try_from(size_of::<libc::sock_fprog>()).unwrap_or(16);
    syscall!(setsockopt(
        fd,
        libc::SOL_SOCKET,
        opt,
        (&fprog as *const libc::sock_fprog).cast(),
        len
    ))
    .map(drop)
}

/// Points `iovs[i]` at slot `i` (`slot` bytes at `i * slot`) of `arena` and
/// `hdrs[i]` at `iovs[i]`, for the first `n` slots.
pub(super) fn point_at_slots(
    arena: &mut [u8],
    slot: usize,
    n: usize,
    hdrs: &mut [libc::mmsghdr; BATCH],
    iovs: &mut [libc::iovec; BATCH],
) {
    for (i, chunk) in arena.chunks_exact_mut(slot).take(n.min(BATCH)).enumerate() {
        iovs[i] = libc::iovec {
            iov_base: chunk.as_mut_ptr().cast(),
            iov_len: chunk.len(),
        };
        let h = &mut hdrs[i].msg_hdr;
        h.msg_iov = &mut iovs[i];
        h.msg_iovlen = 1;
    }
}

/// One `sendmmsg` of the first `n` headers; returns how many were sent.
pub(super) fn send(fd: RawFd, hdrs: &mut [libc::mmsghdr; BATCH], n: usize) -> io::Result<usize> {
    let cnt = libc::c_uint::try_from(n.min(BATCH)).unwrap_or(0);
    let sent = syscall!(sendmmsg(fd, hdrs.as_mut_ptr(), cnt, 0))?;
    Ok(usize::try_from(sent).unwrap_or(0))
}

/// One non-blocking `recvmmsg` into the first `n` headers; returns how many
/// were filled (0 when nothing was queued).
pub(super) fn recv(fd: RawFd, hdrs: &mut [libc::mmsghdr; BATCH], n: usize) -> io::Result<usize> {
    let cnt = libc::c_uint::try_from(n.min(BATCH)).unwrap_or(0);
    match syscall!(recvmmsg(
        fd,
        hdrs.as_mut_ptr(),
        cnt,
        0,
        std::ptr::null_mut()
    )) {
        Ok(g) => Ok(usize::try_from(g).unwrap_or(0)),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(0),
        Err(e) => Err(e),
    }
}
