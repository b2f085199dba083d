//! Batched UDP: `sendmmsg` with an optional `UDP_SEGMENT` (GSO) control
//! message per message, and `recvmmsg` with `UDP_GRO`.
//!
//! Messages point into one caller-owned arena; the `mmsghdr`/`iovec`/control
//! arrays are built on the stack per call (nothing is allocated).

use std::io::{self, IoSlice};
use std::mem::{size_of, zeroed};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::mmsg;

const SOL_UDP: libc::c_int = 17;
const UDP_SEGMENT: libc::c_int = 103;
const UDP_GRO: libc::c_int = 104;

pub use super::mmsg::BATCH;

/// Sets `IP_MTU_DISCOVER` to `IP_PMTUDISC_PROBE` on an IPv4 UDP socket: DF
/// on every datagram, and the route's cached path MTU ignored, so a datagram
/// larger than the path is lost instead of fragmented or refused locally
/// (what packetization-layer path-MTU probes need, RFC 8899).
pub fn set_pmtu_probe(fd: RawFd) -> io::Result<()> {
    mmsg::setsockopt_int(
        fd,
        libc::IPPROTO_IP,
        libc::IP_MTU_DISCOVER,
        libc::IP_PMTUDISC_PROBE,
    )
}

/// One datagram (or GSO train) to send: `arena[start..start + len]` to `dst`.
#[derive(Debug, Clone, Copy)]
pub struct TxMsg {
    /// Destination.
    pub dst: SocketAddr,
    /// Offset in the arena.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// GSO segment size; 0 sends one plain datagram.
    pub segment: u16,
}

/// One datagram (or GSO train) gathered from several buffers:
/// `iovs[first..first + pieces]` of [`Udp::send_gathered`] to `dst`.
#[derive(Debug, Clone, Copy)]
pub struct IovMsg {
    /// Destination.
    pub dst: SocketAddr,
    /// Its first piece in the iovec list.
    pub first: usize,
    /// Its number of pieces.
    pub pieces: usize,
    /// Length in bytes (the pieces' sum).
    pub len: usize,
    /// GSO segment size; 0 (or `len` or more) sends one plain datagram.
    pub segment: u16,
}

/// Messages per `sendmmsg` of [`Udp::send_gathered`] (a 64 KiB
/// super-packet is one to three trains, or one datagram per segment
/// without UDP GSO): small, so that the headers built per call stay cheap.
pub const GATHER_BATCH: usize = 16;

/// One received datagram (or GRO train) in slot `i` of the receive arena.
#[derive(Debug, Clone, Copy)]
pub struct RxMeta {
    /// Outer source address.
    pub src: IpAddr,
    /// Outer source port.
    pub src_port: u16,
    /// Bytes received.
    pub len: usize,
    /// Segment size when the kernel coalesced several datagrams (`UDP_GRO`), else `len`.
    pub stride: usize,
}

impl Default for RxMeta {
    fn default() -> Self {
        RxMeta {
            src: IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            src_port: 0,
            len: 0,
            stride: 0,
        }
    }
}

/// A UDP socket of the engine.
#[derive(Debug)]
pub struct Udp {
    fd: OwnedFd,
}

impl Udp {
    /// Binds `addr`. `reuse_port` lets every worker bind the same port; `buf`
    /// bytes of send and receive buffer are forced (`SO_*BUFFORCE`, falling back
    /// to the capped `SO_*BUF`).
    pub fn bind(
        addr: SocketAddr,
        reuse_port: bool,
        nonblocking: bool,
        buf: usize,
    ) -> io::Result<Self> {
        let domain = if addr.is_ipv4() {
            Domain::IPV4
        } else {
            Domain::IPV6
        };
        let s = Socket::new(domain, Type::DGRAM.cloexec(), Some(Protocol::UDP))?;
        if addr.is_ipv6() {
            s.set_only_v6(true)?;
        }
        if reuse_port {
            s.set_reuse_port(true)?;
        }
        s.set_nonblocking(nonblocking)?;
        mmsg::force_buffers(&s, buf)?;
        s.bind(&SockAddr::from(addr))?;
        Ok(Udp { fd: s.into() })
    }

    /// Raw descriptor (for poll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Attaches a classic BPF program to this socket's `SO_REUSEPORT` group
    /// (`SO_ATTACH_REUSEPORT_CBPF`): it runs on the UDP payload and returns the
    /// index of the receiving socket in bind order (out of range: the kernel
    /// falls back to its hash).
    pub fn attach_reuseport_cbpf(&self, prog: &[libc::sock_filter]) -> io::Result<()> {
        mmsg::attach_cbpf(self.fd.as_raw_fd(), libc::SO_ATTACH_REUSEPORT_CBPF, prog)
    }

    /// Enables `UDP_GRO`; returns whether the kernel accepted it.
    pub fn enable_gro(&self) -> bool {
        mmsg::setsockopt_int(self.fd.as_raw_fd(), SOL_UDP, UDP_GRO, 1).is_ok()
    }

    /// Sends `msgs` (at most [`BATCH`]) with one `sendmmsg`. Returns how many
    /// were sent; an error refers to `msgs[0]`.
    pub fn send_batch(&self, msgs: &[TxMsg], arena: &[u8]) -> io::Result<usize> {
        let n = msgs.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero is a valid value for these plain C structs.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_in6; BATCH] = unsafe { zeroed() };
        let mut iovs = mmsg::NO_IOVECS;
        let mut ctrl = [[0u64; 4]; BATCH];
        for (i, m) in msgs[..n].iter().enumerate() {
            let slice = &arena[m.start..m.start + m.len];
            iovs[i] = libc::iovec {
                iov_base: slice.as_ptr() as *mut libc::c_void,
                iov_len: slice.len(),
            };
            let namelen = write_sockaddr(&mut names[i], m.dst);
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_in6).cast();
            h.msg_namelen = namelen;
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            if m.segment != 0 && usize::from(m.segment) < m.len {
                set_segment(h, &mut ctrl[i], m.segment);
            }
        }
        mmsg::send(self.fd.as_raw_fd(), &mut hdrs, n)
    }

    /// Sends up to [`GATHER_BATCH`] of `msgs`, each gathered from its pieces
    /// of `iovs`, with one `sendmmsg` (`UDP_SEGMENT` for trains). Returns
    /// how many were sent; an error refers to `msgs[0]`. A message whose
    /// range lies outside `iovs` ends the batch before it (`InvalidInput` if first).
    pub fn send_gathered(&self, msgs: &[IovMsg], iovs: &[IoSlice<'_>]) -> io::Result<usize> {
        // SAFETY: all-zero is a valid value for these plain C structs.
        let mut hdrs: [libc::mmsghdr; GATHER_BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_in6; GATHER_BATCH] = unsafe { zeroed() };
        let mut ctrl = [[0u64; 4]; GATHER_BATCH];
        let mut n = 0;
        for (i, m) in msgs.iter().take(GATHER_BATCH).enumerate() {
            let Some(pieces) = iovs.get(m.first..m.first + m.pieces) else {
                break;
            };
            let namelen = write_sockaddr(&mut names[i], m.dst);
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_in6).cast();
            h.msg_namelen = namelen;
            // `IoSlice` is ABI compatible with `iovec` (std guarantees it on
            // Unix); the kernel only reads through this pointer.
            h.msg_iov = pieces.as_ptr().cast::<libc::iovec>().cast_mut();
            h.msg_iovlen = pieces.len();
            if m.segment != 0 && usize::from(m.segment) < m.len {
                set_segment(h, &mut ctrl[i], m.segment);
            }
            n += 1;
        }
        if n == 0 {
            return if msgs.is_empty() {
                Ok(0)
            } else {
                Err(io::ErrorKind::InvalidInput.into())
            };
        }
        let cnt = libc::c_uint::try_from(n).unwrap_or(0);
        // The first `n` headers point at live names, iovecs (borrowed from
        // `iovs` for this call) and control buffers on this stack frame.
        let sent = super::syscall!(sendmmsg(self.fd.as_raw_fd(), hdrs.as_mut_ptr(), cnt, 0))?;
        Ok(usize::try_from(sent).unwrap_or(0))
    }

    /// Receives up to `meta.len()` datagrams into `arena`, slot `i` at
    /// `i * slot`. Returns how many were received (0 on EAGAIN).
    pub fn recv_batch(
        &self,
        arena: &mut [u8],
        slot: usize,
        meta: &mut [RxMeta],
    ) -> io::Result<usize> {
        let n = meta.len().min(BATCH).min(arena.len() / slot.max(1));
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero is a valid value for these plain C structs.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_storage; BATCH] = unsafe { zeroed() };
        let mut iovs = mmsg::NO_IOVECS;
        let mut ctrl = [[0u64; 8]; BATCH];
        mmsg::point_at_slots(arena, slot, n, &mut hdrs, &mut iovs);
        for i in 0..n {
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_storage).cast();
            h.msg_namelen =
                libc::socklen_t::try_from(size_of::<libc::sockaddr_storage>()).unwrap_or(0);
            h.msg_control = ctrl[i].as_mut_ptr().cast();
            h.msg_controllen = size_of::<[u64; 8]>();
        }
        let got = mmsg::recv(self.fd.as_raw_fd(), &mut hdrs, n)?;
        for i in 0..got {
            let len = hdrs[i].msg_len as usize;
            let mut stride = len;
            let h = &hdrs[i].msg_hdr;
            // SAFETY: the kernel filled msg_control/msg_controllen; the CMSG macros stay within it.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(h);
                while !c.is_null() {
                    if (*c).cmsg_level == SOL_UDP && (*c).cmsg_type == UDP_GRO {
                        let v = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<libc::c_int>());
                        stride = usize::try_from(v).unwrap_or(len);
                    }
                    c = libc::CMSG_NXTHDR(h, c);
                }
            }
            let (src, src_port) = read_sockaddr(&names[i]);
            meta[i] = RxMeta {
                src,
                src_port,
                len,
                stride: stride.max(1),
            };
        }
        Ok(got)
    }
}

fn write_sockaddr(out: &mut libc::sockaddr_in6, addr: SocketAddr) -> libc::socklen_t {
    match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_in6 (28 bytes) is larger than sockaddr_in (16 bytes) and both are plain data.
            unsafe {
                std::ptr::write_unaligned(
                    (out as *mut libc::sockaddr_in6).cast::<libc::sockaddr_in>(),
                    sin,
                )
            };
            libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap_or(16)
        }
        SocketAddr::V6(a) => {
            out.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            out.sin6_port = a.port().to_be();
            out.sin6_flowinfo = a.flowinfo();
            out.sin6_addr = libc::in6_addr {
                s6_addr: a.ip().octets(),
            };
            out.sin6_scope_id = a.scope_id();
            libc::socklen_t::try_from(size_of::<libc::sockaddr_in6>()).unwrap_or(28)
        }
    }
}

fn read_sockaddr(s: &libc::sockaddr_storage) -> (IpAddr, u16) {
    match libc::c_int::from(s.ss_family) {
        libc::AF_INET => {
            // SAFETY: ss_family says this storage holds a sockaddr_in.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            (
                IpAddr::V4(Ipv4Addr::from(a.sin_addr.s_addr.to_ne_bytes())),
                u16::from_be(a.sin_port),
            )
        }
        libc::AF_INET6 => {
            // SAFETY: ss_family says this storage holds a sockaddr_in6.
            let a = unsafe { &*(s as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            let ip = Ipv6Addr::from(a.sin6_addr.s6_addr);
            // A v4-mapped source can only come from a dual-stack socket; report it as v4.
            (
                ip.to_ipv4_mapped().map_or(IpAddr::V6(ip), IpAddr::V4),
                u16::from_be(a.sin6_port),
            )
        }
        _ => (IpAddr::V4(Ipv4Addr::UNSPECIFIED), 0),
    }
}

/// Points `h`'s control data at `ctrl` holding one `UDP_SEGMENT` cmsg of
/// `segment` bytes (the kernel splits the message into datagrams of that
/// size). `ctrl` must outlive the send that reads `h`.
fn set_segment(h: &mut libc::msghdr, ctrl: &mut [u64; 4], segment: u16) {
    h.msg_control = ctrl.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    h.msg_controllen = unsafe { libc::CMSG_SPACE(2) } as usize;
    // SAFETY: msg_control points to 32 zeroed bytes, enough for CMSG_SPACE(2) = 24.
    unsafe {
        let c = libc::CMSG_FIRSTHDR(h);
        (*c).cmsg_level = SOL_UDP;
        (*c).cmsg_type = UDP_SEGMENT;
        (*c).cmsg_len = libc::CMSG_LEN(2) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<u16>(), segment);
    }
}
