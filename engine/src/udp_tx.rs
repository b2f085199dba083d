//! The UDP side of every UDP-based worker's transmit path (flannel-UDP,
//! VXLAN, WireGuard): queuing datagrams of the TX arena into `UDP_SEGMENT`
//! trains, and sending a batch with the fallbacks the kernel may force.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::encap::DropReason;
use crate::offload::gso::Gathered;
use crate::path::gather::MAX_GATHER_SEGS;
use crate::stats::{Ctr, Local};
use crate::sys::udp::{GATHER_BATCH, IovMsg, TxMsg, Udp};

pub(crate) use crate::encap::MAX_UDP_PAYLOAD;

/// Kernel limit on segments per `UDP_SEGMENT` train (UDP_MAX_SEGMENTS is 128 on new kernels).
pub(crate) const MAX_GSO_SEGS: usize = 64;

/// Whether the datagram `arena[start..start + len]` to `dst` can join the
/// train `m` (UDP GSO): it follows `m` in the arena, goes to the same
/// destination, `m` holds only whole segments, and it is no longer than one.
/// Extends `m` when it can.
pub(crate) fn extend_train(
    m: &mut TxMsg,
    dst: std::net::SocketAddr,
    start: usize,
    len: usize,
) -> bool {
    let seg = usize::from(m.segment);
    let joins = seg > 0
        && m.dst == dst
        && m.start + m.len == start
        && m.len.is_multiple_of(seg)
        && len <= seg
        && m.len + len <= MAX_UDP_PAYLOAD
        && m.len / seg < MAX_GSO_SEGS;
    if joins {
        m.len += len;
    }
    joins
}

/// A new message for `arena[start..start + len]` (a train of one, if it fits a segment size).
pub(crate) fn single(dst: std::net::SocketAddr, start: usize, len: usize) -> TxMsg {
    TxMsg {
        dst,
        start,
        len,
        segment: u16::try_from(len).unwrap_or(0),
    }
}

/// Sends `msgs` (pointing into `arena`) through `sock`, `sendmmsg` batch by
/// batch, counting calls and errors. A GSO train the egress device cannot
/// checksum (`EIO`) turns UDP GSO off for the engine (`udp_gso`) and is
/// resent datagram by datagram. A train whose segments exceed the path MTU
/// (`EMSGSIZE`, or `EINVAL` on some kernels: GSO segments are never
/// fragmented) is resent datagram by datagram too, which the kernel fragments like any other oversized
/// datagram; GSO stays on, as the next peer's path may be wider (a TUN MTU
/// set above what the underlay carries, e.g. flannel's −50 on an IPv6
/// underlay). `EMSGSIZE` for a lone datagram counts as an MTU drop.
pub(crate) fn send_all(
    sock: &Udp,
    msgs: &[TxMsg],
    arena: &[u8],
    udp_gso: &AtomicBool,
    ctr: &mut Local,
) {
    let mut i = 0;
    while i < msgs.len() {
        ctr.add(Ctr::UdpSends, 1);
        match sock.send_batch(&msgs[i..], arena) {
            Ok(0) => {
                ctr.add(Ctr::UdpSendError, (msgs.len() - i) as u64);
                return;
            }
            Ok(k) => i += k,
            Err(e) => {
                let m = msgs[i];
                if split_after(&e, usize::from(m.segment) < m.len, udp_gso, ctr) {
                    resend_split(sock, m, arena, ctr);
                }
                i += 1;
            }
        }
    }
}

/// Sends the gathered super-packet `g` to `dst` through `sock`: segment
/// `i` is `hdrs[g.header(i)]` + `ip[g.payload(i)]`, two iovecs; equal
/// segments form `UDP_SEGMENT` trains (at most [`MAX_GSO_SEGS`] and
/// [`MAX_UDP_PAYLOAD`] bytes each) while `udp_gso` holds, else one
/// datagram each. Errors take [`send_all`]'s fallbacks. Nothing is
/// allocated: the iovec and message lists live on the stack.
pub(crate) fn send_gathered(
    sock: &Udp,
    dst: SocketAddr,
    g: &Gathered,
    (hdrs, ip): (&[u8], &[u8]),
    udp_gso: &AtomicBool,
    ctr: &mut Local,
) {
    let count = g.count.min(MAX_GATHER_SEGS);
    let empty: &[u8] = &[];
    let mut iovs = [IoSlice::new(empty); 2 * MAX_GATHER_SEGS];
    for i in 0..count {
        let (h, p) = (g.header(i), g.payload(i));
        let (Some(h), Some(p)) = (hdrs.get(h), ip.get(p)) else {
            ctr.add(Ctr::UdpSendError, 1);
            return;
        };
        iovs[2 * i] = IoSlice::new(h);
        iovs[2 * i + 1] = IoSlice::new(p);
    }
    let stride = g.head + g.gso_size;
    let per_train = if udp_gso.load(Ordering::Relaxed) {
        (MAX_UDP_PAYLOAD / stride.max(1)).clamp(1, MAX_GSO_SEGS)
    } else {
        1
    };
    let iovs = &iovs[..2 * count];
    let none = IovMsg {
        dst,
        first: 0,
        pieces: 0,
        len: 0,
        segment: 0,
    };
    // Segments from `next` on are unsent; messages are made a batch at a time.
    let mut next = 0;
    while next < count {
        let mut msgs = [none; GATHER_BATCH];
        let (mut n, mut i) = (0, next);
        while n < GATHER_BATCH && i < count {
            let segs = per_train.min(count - i);
            msgs[n] = IovMsg {
                dst,
                first: 2 * i,
                pieces: 2 * segs,
                len: (i..i + segs).map(|j| g.head + g.payload(j).len()).sum(),
                segment: if segs > 1 {
                    u16::try_from(stride).unwrap_or(0)
                } else {
                    0
                },
            };
            n += 1;
            i += segs;
        }
        let end = |m: &IovMsg| (m.first + m.pieces) / 2;
        ctr.add(Ctr::UdpSends, 1);
        match sock.send_gathered(&msgs[..n], iovs) {
            Ok(0) => {
                ctr.add(Ctr::UdpSendError, 1);
                return;
            }
            Ok(k) => next = end(&msgs[k.min(n) - 1]),
            Err(e) => {
                let m = msgs[0];
                if split_after(&e, m.pieces > 2, udp_gso, ctr) {
                    resend_split_gathered(sock, m, iovs, ctr);
                }
                next = end(&m);
            }
        }
    }
}

/// Sends the gathered train `m` as separate datagrams (two pieces each).
/// The one policy for a message whose send failed with `e` (`train`: it
/// was a `UDP_SEGMENT` train): true when it is to be resent datagram by
/// datagram (EIO turns GSO off for good: the device cannot segment;
/// EMSGSIZE and EINVAL refuse the train, not its datagrams); otherwise the
/// message is counted, an MTU drop for EMSGSIZE, a send error else.
fn split_after(e: &std::io::Error, train: bool, udp_gso: &AtomicBool, ctr: &mut Local) -> bool {
    let code = e.raw_os_error();
    if train && code == Some(libc::EIO) {
        udp_gso.store(false, Ordering::Relaxed);
        return true;
    }
    if train && matches!(code, Some(libc::EMSGSIZE | libc::EINVAL)) {
        return true;
    }
    if code == Some(libc::EMSGSIZE) {
        ctr.drop(DropReason::Mtu, 1);
    } else {
        ctr.add(Ctr::UdpSendError, 1);
    }
    false
}

fn resend_split_gathered(sock: &Udp, m: IovMsg, iovs: &[IoSlice<'_>], ctr: &mut Local) {
    for first in (m.first..m.first + m.pieces).step_by(2) {
        let len = iovs
            .get(first..first + 2)
            .map_or(0, |p| p[0].len() + p[1].len());
        let one = [IovMsg {
            first,
            pieces: 2,
            len,
            segment: 0,
            ..m
        }];
        if sock.send_gathered(&one, iovs).is_err() {
            ctr.add(Ctr::UdpSendError, 1);
        }
    }
}

/// Sends the train `m` as separate datagrams.
fn resend_split(sock: &Udp, m: TxMsg, arena: &[u8], ctr: &mut Local) {
    let seg = usize::from(m.segment).max(1);
    let mut off = 0;
    while off < m.len {
        let len = seg.min(m.len - off);
        let one = [TxMsg {
            dst: m.dst,
            start: m.start + off,
            len,
            segment: 0,
        }];
        if sock.send_batch(&one, arena).is_err() {
            ctr.add(Ctr::UdpSendError, 1);
        }
        off += len;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dst(port: u16) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([192, 0, 2, 1], port))
    }

    /// A train of 1400-byte segments on a path of MTU 1280 (`lo` in a
    /// private namespace): the kernel refuses it with `EINVAL`; every
    /// datagram must still arrive (fragmented), and GSO stays on.
    #[test]
    fn trains_wider_than_the_path_mtu_are_resent_one_by_one() {
        if !weft_testenv::require_root() {
            return;
        }
        let got = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
            let ok = std::process::Command::new("ip")
                .args(["link", "set", "lo", "up", "mtu", "1280"])
                .status()
                .expect("ip");
            assert!(ok.success(), "ip link set lo");
            let lo = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
            let rx = std::net::UdpSocket::bind(lo).expect("bind rx");
            rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
                .expect("timeout");
            let tx = Udp::bind(lo, false, false, 1 << 20).expect("bind tx");
            let arena: Vec<u8> = (0..4 * 1400).map(|i| (i / 1400) as u8).collect();
            let to = rx.local_addr().expect("addr");
            let mut m = single(to, 0, 1400);
            for i in 1..4 {
                assert!(extend_train(&mut m, to, i * 1400, 1400));
            }
            let gso = AtomicBool::new(true);
            let mut ctr = Local::default();
            send_all(&tx, &[m], &arena, &gso, &mut ctr);
            let mut lens = Vec::new();
            let mut buf = [0u8; 2000];
            for _ in 0..4 {
                let n = rx.recv(&mut buf).expect("datagram");
                lens.push((n, buf[0]));
            }
            (
                lens,
                gso.load(Ordering::Relaxed),
                ctr.get(Ctr::UdpSendError),
            )
        })
        .join()
        .expect("thread");
        assert_eq!(got.0, vec![(1400, 0), (1400, 1), (1400, 2), (1400, 3)]);
        assert!(got.1, "GSO turned off");
        assert_eq!(got.2, 0, "send errors counted");
    }

    /// A gathered super-packet (header block + payload slice per segment)
    /// arrives as its segments: as one train on a wide path, and resent one
    /// by one when the path MTU (1280, `lo` in a private namespace) refuses
    /// the train; GSO stays on either way.
    #[test]
    fn gathered_segments_arrive_whole_and_in_order() {
        if !weft_testenv::require_root() {
            return;
        }
        let got = std::thread::spawn(|| {
            nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNET).expect("unshare netns");
            let mut out = Vec::new();
            for mtu in ["65536", "1280"] {
                let ok = std::process::Command::new("ip")
                    .args(["link", "set", "lo", "up", "mtu", mtu])
                    .status()
                    .expect("ip");
                assert!(ok.success(), "ip link set lo");
                let lo = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
                let rx = std::net::UdpSocket::bind(lo).expect("bind rx");
                rx.set_read_timeout(Some(std::time::Duration::from_secs(2)))
                    .expect("timeout");
                let tx = Udp::bind(lo, false, false, 1 << 20).expect("bind tx");
                let g = Gathered {
                    count: 4,
                    head: 100,
                    payload_start: 10,
                    end: 10 + 3 * 1300 + 700,
                    gso_size: 1300,
                };
                let hdrs: Vec<u8> = (0..400).map(|i| 0x80 | (i / 100) as u8).collect();
                let ip: Vec<u8> = (0..g.end).map(|i| ((i + 1290) / 1300) as u8).collect();
                let gso = AtomicBool::new(true);
                let mut ctr = Local::default();
                let to = rx.local_addr().expect("addr");
                send_gathered(&tx, to, &g, (&hdrs, &ip), &gso, &mut ctr);
                let mut buf = [0u8; 2000];
                for i in 0..4u8 {
                    let n = rx.recv(&mut buf).expect("datagram");
                    out.push((n, buf[0], buf[99], buf[100], buf[n - 1], i));
                }
                assert!(gso.load(Ordering::Relaxed), "GSO turned off");
                assert_eq!(ctr.get(Ctr::UdpSendError), 0, "send errors counted");
            }
            out
        })
        .join()
        .expect("thread");
        for mtu in got.chunks(4) {
            let want: Vec<_> = (0..4u8)
                .map(|i| {
                    let n = if i == 3 { 800 } else { 1400 };
                    (n, 0x80 | i, 0x80 | i, i + 1, i + 1, i)
                })
                .collect();
            assert_eq!(mtu, &want[..]);
        }
    }

    #[test]
    fn equal_datagrams_in_sequence_form_one_train() {
        let mut m = single(dst(1), 0, 100);
        assert!(extend_train(&mut m, dst(1), 100, 100));
        // A shorter last one joins and closes the train.
        assert!(extend_train(&mut m, dst(1), 200, 60));
        assert_eq!((m.len, m.segment), (260, 100));
        assert!(!extend_train(&mut m, dst(1), 260, 100));
    }

    #[test]
    fn gaps_longer_datagrams_and_other_peers_start_a_new_message() {
        let mut m = single(dst(1), 0, 100);
        assert!(
            !extend_train(&mut m, dst(1), 150, 100),
            "not adjacent in the arena"
        );
        assert!(
            !extend_train(&mut m, dst(1), 100, 101),
            "longer than the segment"
        );
        assert!(
            !extend_train(&mut m, dst(2), 100, 100),
            "another destination"
        );
        assert_eq!(m.len, 100);
    }

    #[test]
    fn trains_stop_at_the_segment_and_size_limits() {
        let mut m = single(dst(1), 0, 10);
        for i in 1..MAX_GSO_SEGS {
            assert!(extend_train(&mut m, dst(1), i * 10, 10));
        }
        assert!(
            !extend_train(&mut m, dst(1), MAX_GSO_SEGS * 10, 10),
            "64 segments at most"
        );
        let mut big = single(dst(1), 0, 30_000);
        assert!(extend_train(&mut big, dst(1), 30_000, 30_000));
        assert!(
            !extend_train(&mut big, dst(1), 60_000, 30_000),
            "over 65507 bytes"
        );
        // A datagram too long for a segment size never starts a train.
        let mut none = single(dst(1), 0, 70_000);
        assert_eq!(none.segment, 0);
        assert!(!extend_train(&mut none, dst(1), 70_000, 10));
    }
}
