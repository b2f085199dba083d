//! TUN device: `/dev/net/tun` ioctls, one file descriptor per queue.
//!
//! Opens `IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE` queues (non-blocking,
//! close-on-exec), optionally with `IFF_VNET_HDR`, then probes
//! `TUNSETOFFLOAD` from the widest offload set down to none. The device is not
//! persistent: it disappears when the last queue is closed. Addresses, MTU and
//! routes are the daemon's job (netlink), not ours; the transmit queue length
//! is ours (best effort, [`TXQUEUELEN`]): the kernel's default of 500 packets
//! overflows whenever a worker is descheduled for a few milliseconds while TCP
//! sends MTU-sized packets (after a loss its TSO bursts shrink), and the drops
//! feed back into more loss: a burst of over 100 000 retransmits in 8 s was
//! measured with 500.

use std::ffi::CStr;
use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use super::syscall;

const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const TUNSETOFFLOAD: libc::c_ulong = 0x4004_54d0;
const TUNSETVNETHDRSZ: libc::c_ulong = 0x4004_54d8;
const SIOCGIFHWADDR: libc::c_ulong = 0x8927;
const IFF_TUN: libc::c_short = 0x0001;
const IFF_TAP: libc::c_short = 0x0002;
const IFF_NO_PI: libc::c_short = 0x1000;
const IFF_VNET_HDR: libc::c_short = 0x4000;
const IFF_MULTI_QUEUE: libc::c_short = 0x0100;
const SIOCSIFTXQLEN: libc::c_ulong = 0x8943;

/// Transmit queue length (packets) set on the device after it is created.
pub const TXQUEUELEN: i32 = 5000;

/// `TUN_F_CSUM`: we accept packets with partial checksums.
pub const TUN_F_CSUM: u32 = 0x01;
/// `TUN_F_TSO4`.
pub const TUN_F_TSO4: u32 = 0x02;
/// `TUN_F_TSO6`.
pub const TUN_F_TSO6: u32 = 0x04;
/// `TUN_F_USO4` (Linux 6.2+): UDP super-packets (`GSO_UDP_L4`) over IPv4.
pub const TUN_F_USO4: u32 = 0x20;
/// `TUN_F_USO6` (Linux 6.2+): the same over IPv6.
pub const TUN_F_USO6: u32 = 0x40;

/// `TUN_F_UDP_TUNNEL_GSO` (Linux 6.17+): UDP-tunnel super-packets.
pub const TUN_F_UDP_TUNNEL_GSO: u32 = 0x80;
/// `TUN_F_UDP_TUNNEL_GSO_CSUM` (Linux 6.17+): the same with an outer checksum.
pub const TUN_F_UDP_TUNNEL_GSO_CSUM: u32 = 0x100;

/// `name` as `ifr_name`: `InvalidInput` unless it is shorter than
/// `IFNAMSIZ` and holds no NUL.
fn ifname(name: &str) -> io::Result<[libc::c_char; libc::IFNAMSIZ]> {
    if name.len() >= libc::IFNAMSIZ || name.as_bytes().contains(&0) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "bad interface name",
        ));
    }
    let mut out = [0; libc::IFNAMSIZ];
    for (d, s) in out.iter_mut().zip(name.as_bytes()) {
        *d = *s as libc::c_char;
    }
    Ok(out)
}

#[repr(C)]
struct IfReq {
    name: [libc::c_char; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

/// `struct ifreq` with the `int` member of its union (`ifr_qlen`).
#[repr(C)]
struct IfReqInt {
    name: [libc::c_char; libc::IFNAMSIZ],
    value: libc::c_int,
    _pad: [u8; 20],
}

/// Sets the transmit queue length of interface `name` (`SIOCSIFTXQLEN`).
pub fn set_txqueuelen(name: &str, len: i32) -> io::Result<()> {
    let mut req = IfReqInt {
        name: ifname(name)?,
        value: len,
        _pad: [0; 20],
    };
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM.cloexec(), None)?;
    syscall!(ioctl(
        sock.as_raw_fd(),
        SIOCSIFTXQLEN,
        &mut req as *mut IfReqInt
    ))
    .map(drop)
}

/// One TUN queue.
#[derive(Debug)]
pub struct Queue {
    fd: OwnedFd,
}

/// An opened multi-queue TUN device.
#[derive(Debug)]
pub struct Device {
    /// Queues, one per worker.
    pub queues: Vec<Queue>,
    /// The kernel's name for the device (`%d` templates resolved).
    pub name: String,
    /// Whether every read/write carries a `virtio_net_hdr`.
    pub vnet_hdr: bool,
    /// Accepted `TUN_F_*` offload flags.
    pub offload: u32,
}

fn open_queue(name: &str, flags: libc::c_short) -> io::Result<(Queue, String)> {
    let path = c"/dev/net/tun";
    let fd = syscall!(open(
        path.as_ptr(),
        libc::O_RDWR | libc::O_CLOEXEC | libc::O_NONBLOCK
    ))?;
    // SAFETY: `fd` was just returned by open() and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: ifname(name)?,
        flags,
        _pad: [0; 22],
    };
    syscall!(ioctl(fd.as_raw_fd(), TUNSETIFF, &mut req as *mut IfReq))?;
    // SAFETY: the kernel NUL-terminates ifr_name within IFNAMSIZ; the buffer is zero-initialised.
    let actual = unsafe { CStr::from_ptr(req.name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok((Queue { fd }, actual))
}

/// Opens `queues` queues of TUN device `name` (which may be a `%d` template).
/// With `want_offload`, tries `IFF_VNET_HDR` and then the offload sets
/// `CSUM|TSO4|TSO6|USO4|USO6` (only with `want_uso`: the caller segments UDP
/// super-packets too), `CSUM|TSO4|TSO6`, `CSUM` in that order, falling back to
/// plain packets.
pub fn open(name: &str, queues: usize, want_offload: bool, want_uso: bool) -> io::Result<Device> {
    let base = IFF_TUN | IFF_NO_PI | IFF_MULTI_QUEUE;
    let (first, actual, vnet_hdr) = match want_offload {
        true => match open_queue(name, base | IFF_VNET_HDR) {
            Ok((q, n)) => (q, n, true),
            Err(_) => {
                let (q, n) = open_queue(name, base)?;
                (q, n, false)
            }
        },
        false => {
            let (q, n) = open_queue(name, base)?;
            (q, n, false)
        }
    };
    let mut offload = 0;
    if vnet_hdr {
        let tso = TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6;
        let uso = if want_uso {
            tso | TUN_F_USO4 | TUN_F_USO6
        } else {
            tso
        };
        for set in [uso, tso, TUN_F_CSUM, 0] {
            if syscall!(ioctl(
                first.fd.as_raw_fd(),
                TUNSETOFFLOAD,
                libc::c_ulong::from(set)
            ))
            .is_ok()
            {
                offload = set;
                break;
            }
        }
    }
    // Best effort: without CAP_NET_ADMIN over the device the default stays.
    let _ = set_txqueuelen(&actual, TXQUEUELEN);
    let flags = if vnet_hdr { base | IFF_VNET_HDR } else { base };
    let mut qs = vec![first];
    for _ in 1..queues.max(1) {
        qs.push(open_queue(&actual, flags)?.0);
    }
    Ok(Device {
        queues: qs,
        name: actual,
        vnet_hdr,
        offload,
    })
}

/// A TAP for UDP-tunnel GSO writes (issue 32, [`crate::path::tap`]).
#[derive(Debug)]
pub struct TunnelTap {
    /// Queues, one per worker.
    pub queues: Vec<Queue>,
    /// The kernel's name for the device.
    pub name: String,
    /// Its MAC (frames are addressed to it).
    pub mac: [u8; 6],
}

/// Opens `queues` queues of TAP `name` with the 24-byte virtio-net header
/// and the UDP-tunnel GSO offloads; an error on a kernel without them
/// (before 6.17 `TUNSETOFFLOAD` refuses the bits with `EINVAL`).
pub fn open_tunnel_tap(name: &str, queues: usize) -> io::Result<TunnelTap> {
    let flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE;
    let (first, actual) = open_queue(name, flags)?;
    let sz: libc::c_int = 24;
    syscall!(ioctl(
        first.fd.as_raw_fd(),
        TUNSETVNETHDRSZ,
        &sz as *const libc::c_int
    ))?;
    let set =
        TUN_F_CSUM | TUN_F_TSO4 | TUN_F_TSO6 | TUN_F_UDP_TUNNEL_GSO | TUN_F_UDP_TUNNEL_GSO_CSUM;
    syscall!(ioctl(
        first.fd.as_raw_fd(),
        TUNSETOFFLOAD,
        libc::c_ulong::from(set)
    ))?;
    let mut qs = vec![first];
    for _ in 1..queues.max(1) {
        qs.push(open_queue(&actual, flags)?.0);
    }
    let mac = hwaddr(&actual)?;
    Ok(TunnelTap {
        queues: qs,
        name: actual,
        mac,
    })
}

/// The MAC of interface `name` (`SIOCGIFHWADDR`).
fn hwaddr(name: &str) -> io::Result<[u8; 6]> {
    #[repr(C)]
    struct IfReqAddr {
        name: [libc::c_char; libc::IFNAMSIZ],
        addr: libc::sockaddr,
        _pad: [u8; 8],
    }
    let mut req = IfReqAddr {
        name: ifname(name)?,
        addr: libc::sockaddr {
            sa_family: 0,
            sa_data: [0; 14],
        },
        _pad: [0; 8],
    };
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM.cloexec(), None)?;
    syscall!(ioctl(
        sock.as_raw_fd(),
        SIOCGIFHWADDR,
        &mut req as *mut IfReqAddr
    ))?;
    let mut mac = [0u8; 6];
    for (m, b) in mac.iter_mut().zip(req.addr.sa_data.iter()) {
        *m = *b as u8;
    }
    Ok(mac)
}

impl Queue {
    /// Raw descriptor (for poll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Reads one packet (with its vnet header when enabled). `Ok(None)` on EAGAIN.
    pub fn read(&self, buf: &mut [u8]) -> io::Result<Option<usize>> {
        match syscall!(read(
            self.fd.as_raw_fd(),
            buf.as_mut_ptr().cast(),
            buf.len()
        )) {
            Ok(n) => Ok(Some(usize::try_from(n).unwrap_or(0))),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Writes one packet gathered from `iov`.
    pub fn writev(&self, iov: &[IoSlice<'_>]) -> io::Result<usize> {
        let cnt = libc::c_int::try_from(iov.len()).unwrap_or(libc::c_int::MAX);
        // IoSlice is guaranteed ABI-compatible with `struct iovec` on Unix.
        let n = syscall!(writev(
            self.fd.as_raw_fd(),
            iov.as_ptr().cast::<libc::iovec>(),
            cnt
        ))?;
        Ok(usize::try_from(n).unwrap_or(0))
    }
}
