//! Raw `IPPROTO_IPIP` sockets (AF_INET, SOCK_RAW, protocol 4) for the
//! userspace IPIP path: batched `sendmmsg` with per-message `IP_TTL` and
//! `IP_TOS` control messages, and `recvmmsg`.
//!
//! Contract:
//! - Sending: `IP_HDRINCL` is off, so the kernel builds the outer IPv4 header
//!   (protocol 4, source = the bound address, destination = the message's,
//!   ID and checksum). TTL and TOS come from each message's control data; DF
//!   follows the socket's `IP_MTU_DISCOVER` mode, which [`Raw::set_df`] flips
//!   between `IP_PMTUDISC_PROBE` (DF set) and `IP_PMTUDISC_INTERFACE` (DF
//!   clear). Both modes make the kernel refuse (`EMSGSIZE`) rather than
//!   fragment a packet larger than the egress interface MTU, so an oversize
//!   outer packet is never sent.
//! - Receiving: every raw IPIP socket gets a copy of every IPIP packet to its
//!   bound address (raw sockets are not load-balanced), and the copy starts
//!   at the *outer* IPv4 header. Callers that open several sockets attach a
//!   classic BPF filter ([`Raw::attach_filter`]) so that each packet is kept
//!   by one socket only, then [`Raw::drain`] what queued before the filter.
//!
//! Messages point into one caller-owned arena; the `mmsghdr`/`iovec`/control
//! arrays live on the stack per call (nothing is allocated).

use std::io;
use std::mem::{size_of, zeroed};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use socket2::{Domain, Protocol, SockAddr, Socket, Type};

use super::{mmsg, syscall};

/// IP protocol number of IPv4-in-IPv4.
pub const IPPROTO_IPIP: libc::c_int = 4;
pub use super::mmsg::BATCH;
/// `IP_PMTUDISC_PROBE`: set DF, use the interface MTU, never fragment locally.
const PMTUDISC_PROBE: libc::c_int = 3;
/// `IP_PMTUDISC_INTERFACE`: no DF, use the interface MTU, never fragment locally.
const PMTUDISC_INTERFACE: libc::c_int = 4;

/// One outer packet to send: payload `arena[start..start + len]` (the inner
/// IPv4 packet) to `dst` with outer `ttl` and `tos`.
#[derive(Debug, Clone, Copy)]
pub struct RawTx {
    /// Outer destination (the peer's public IP).
    pub dst: Ipv4Addr,
    /// Offset in the arena.
    pub start: usize,
    /// Length in bytes.
    pub len: usize,
    /// Outer TTL (1..=255).
    pub ttl: u8,
    /// Outer TOS byte.
    pub tos: u8,
}

/// A raw IPIP socket of the engine.
#[derive(Debug)]
pub struct Raw {
    fd: OwnedFd,
    df: std::cell::Cell<Option<bool>>,
}

impl Raw {
    /// Opens a non-blocking raw IPIP socket bound to `local` (received packets
    /// are only those addressed to it; sent ones leave from it), with `buf`
    /// bytes of forced send and receive buffer.
    pub fn open(local: Ipv4Addr, buf: usize) -> io::Result<Raw> {
        let s = Socket::new(
            Domain::IPV4,
            Type::RAW.cloexec(),
            Some(Protocol::from(IPPROTO_IPIP)),
        )?;
        s.set_nonblocking(true)?;
        mmsg::force_buffers(&s, buf)?;
        s.bind(&SockAddr::from(SocketAddr::V4(SocketAddrV4::new(local, 0))))?;
        let r = Raw {
            fd: s.into(),
            df: std::cell::Cell::new(None),
        };
        r.set_df(true)?;
        Ok(r)
    }

    /// Raw descriptor (for poll).
    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether outgoing packets carry DF (one `setsockopt` when it changes).
    pub fn set_df(&self, df: bool) -> io::Result<()> {
        if self.df.get() == Some(df) {
            return Ok(());
        }
        let mode = if df {
            PMTUDISC_PROBE
        } else {
            PMTUDISC_INTERFACE
        };
        mmsg::setsockopt_int(
            self.fd.as_raw_fd(),
            libc::IPPROTO_IP,
            libc::IP_MTU_DISCOVER,
            mode,
        )?;
        self.df.set(Some(df));
        Ok(())
    }

    /// Attaches a classic BPF socket filter (`SO_ATTACH_FILTER`); it runs on
    /// the packet from the outer IPv4 header on and returns 0 to drop.
    pub fn attach_filter(&self, prog: &[libc::sock_filter]) -> io::Result<()> {
        mmsg::attach_cbpf(self.fd.as_raw_fd(), libc::SO_ATTACH_FILTER, prog)
    }

    /// Discards everything queued so far (e.g. copies received before a filter).
    pub fn drain(&self) {
        let mut b = [0u8; 64];
        while syscall!(recv(
            self.fd.as_raw_fd(),
            b.as_mut_ptr().cast(),
            b.len(),
            libc::MSG_TRUNC
        ))
        .is_ok()
        {}
    }

    /// Sends `msgs` (at most [`BATCH`]) with one `sendmmsg`. Returns how many
    /// were sent; an error refers to `msgs[0]`.
    pub fn send_batch(&self, msgs: &[RawTx], arena: &[u8]) -> io::Result<usize> {
        let n = msgs.len().min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero is a valid value for these plain C structs.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        // SAFETY: as above.
        let mut names: [libc::sockaddr_in; BATCH] = unsafe { zeroed() };
        let mut iovs = mmsg::NO_IOVECS;
        // Two CMSG_SPACE(sizeof(int)) = 2 * 24 bytes per message (x86_64, aarch64).
        let mut ctrl = [[0u64; 6]; BATCH];
        // SAFETY: CMSG_SPACE only computes a size.
        let one = unsafe { libc::CMSG_SPACE(size_of::<libc::c_int>() as u32) } as usize;
        if 2 * one > size_of::<[u64; 6]>() {
            return Err(io::Error::from(io::ErrorKind::Unsupported));
        }
        for (i, m) in msgs[..n].iter().enumerate() {
            let Some(data) = arena.get(m.start..m.start + m.len) else {
                return Err(io::Error::from(io::ErrorKind::InvalidInput));
            };
            names[i] = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: 0,
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(m.dst.octets()),
                },
                sin_zero: [0; 8],
            };
            iovs[i] = libc::iovec {
                iov_base: data.as_ptr().cast_mut().cast(),
                iov_len: data.len(),
            };
            let h = &mut hdrs[i].msg_hdr;
            h.msg_name = (&mut names[i] as *mut libc::sockaddr_in).cast();
            h.msg_namelen = libc::socklen_t::try_from(size_of::<libc::sockaddr_in>()).unwrap_or(16);
            h.msg_iov = &mut iovs[i];
            h.msg_iovlen = 1;
            h.msg_control = ctrl[i].as_mut_ptr().cast();
            h.msg_controllen = 2 * one;
            // SAFETY: msg_control points to the 48 zeroed bytes of `ctrl[i]`, and
            // msg_controllen (checked above to fit) holds exactly two
            // CMSG_SPACE(sizeof(int)) slots, so both headers and their data lie within it.
            unsafe {
                let c = libc::CMSG_FIRSTHDR(h);
                (*c).cmsg_level = libc::IPPROTO_IP;
                (*c).cmsg_type = libc::IP_TTL;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c).cast::<libc::c_int>(),
                    libc::c_int::from(m.ttl),
                );
                let c = libc::CMSG_NXTHDR(h, c);
                (*c).cmsg_level = libc::IPPROTO_IP;
                (*c).cmsg_type = libc::IP_TOS;
                (*c).cmsg_len = libc::CMSG_LEN(size_of::<libc::c_int>() as u32) as usize;
                std::ptr::write_unaligned(
                    libc::CMSG_DATA(c).cast::<libc::c_int>(),
                    libc::c_int::from(m.tos),
                );
            }
        }
        mmsg::send(self.fd.as_raw_fd(), &mut hdrs, n)
    }

    /// Receives up to `lens.len()` packets into `arena`, packet `i` at
    /// `i * slot` (outer IPv4 header included), its length in `lens[i]`.
    /// Returns how many were received (0 on EAGAIN).
    pub fn recv_batch(
        &self,
        arena: &mut [u8],
        slot: usize,
        lens: &mut [usize],
    ) -> io::Result<usize> {
        let n = lens.len().min(BATCH).min(arena.len() / slot.max(1));
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: all-zero is a valid value for this plain C struct.
        let mut hdrs: [libc::mmsghdr; BATCH] = unsafe { zeroed() };
        let mut iovs = mmsg::NO_IOVECS;
        mmsg::point_at_slots(arena, slot, n, &mut hdrs, &mut iovs);
        let got = mmsg::recv(self.fd.as_raw_fd(), &mut hdrs, n)?;
        for i in 0..got {
            // A truncated packet (MSG_TRUNC in msg_flags) reports the slot size: decap rejects it.
            lens[i] = (hdrs[i].msg_len as usize).min(slot);
        }
        Ok(got)
    }
}
