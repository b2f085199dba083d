//! The forwarders: one direction, one TUN to the other, until `stop`.
//!
//! Each loop reads until the queue is empty, then waits in `poll` (100 ms,
//! to see `stop`). Both implementations use the same non-blocking wait, so
//! only the read/write path differs.

use std::io::{self, IoSlice};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};

use tun_rs::{GROTable, IDEAL_BATCH_SIZE, SyncDevice, VIRTIO_NET_HDR_LEN};
use weft_engine::bench_tun::Queue;

/// Largest read: a 64 KiB super-packet behind its 10-byte virtio-net header.
const READ_LEN: usize = VIRTIO_NET_HDR_LEN + 65535;

/// What one direction did.
#[derive(Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Reads that returned a packet (a super-packet counts once).
    pub reads: u64,
    /// Failed reads or writes (what was read is dropped).
    pub errors: u64,
}

/// Waits until `fd` is readable or 100 ms have passed.
fn wait_readable(fd: RawFd) {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: `p` is one live pollfd and the count says one.
    unsafe { libc::poll(&mut p, 1, 100) };
}

/// weft's module: a read (a TSO super-packet with its virtio-net header when
/// offloads are on) is written unchanged to the other TUN; no segmentation
/// is needed from TUN to TUN. Works alike with and without offloads.
pub fn own(from: &Queue, to: &Queue, stop: &AtomicBool) -> Counts {
    let mut buf = vec![0u8; READ_LEN];
    let mut c = Counts::default();
    while !stop.load(Ordering::Relaxed) {
        match from.read(&mut buf) {
            Ok(Some(n)) => {
                c.reads += 1;
                if to.writev(&[IoSlice::new(&buf[..n])]).is_err() {
                    c.errors += 1;
                }
            }
            Ok(None) => wait_readable(from.raw_fd()),
            Err(_) => c.errors += 1,
        }
    }
    c
}

/// tun-rs with offloads, the wireguard-go way: `recv_multiple` splits a GSO
/// super-packet into MTU-sized segments (one read per call), `send_multiple`
/// re-coalesces them with its `GROTable` and writes the result.
pub fn tunrs_offload(from: &SyncDevice, to: &SyncDevice, mtu: usize, stop: &AtomicBool) -> Counts {
    let off = VIRTIO_NET_HDR_LEN;
    let full = off + mtu;
    let mut original = vec![0u8; READ_LEN];
    // GRO coalesces into a buffer only if its capacity holds the result
    // (`coalesce_tcp_packets`, `InsufficientCap`): 64 KiB each, as
    // wireguard-go's buffers; its docs' 1500-byte `Vec`s never coalesce.
    let mut bufs: Vec<Vec<u8>> = (0..IDEAL_BATCH_SIZE)
        .map(|_| {
            let mut b = Vec::with_capacity(2 * off + 65535);
            b.resize(full, 0);
            b
        })
        .collect();
    let mut sizes = vec![0usize; IDEAL_BATCH_SIZE];
    let mut gro = GROTable::default();
    let mut c = Counts::default();
    while !stop.load(Ordering::Relaxed) {
        match from.recv_multiple(&mut original, &mut bufs, &mut sizes, off) {
            Ok(n) => {
                c.reads += 1;
                // send_multiple takes each packet's length from its buffer.
                for (b, &len) in bufs.iter_mut().zip(&sizes).take(n) {
                    b.truncate(off + len);
                }
                if to.send_multiple(&mut gro, &mut bufs[..n], off).is_err() {
                    c.errors += 1;
                }
                // Back to full size for the next read (GRO may have grown or
                // swapped buffers). Within capacity: no allocation, but it
                // zero-fills up to `mtu` bytes per packet.
                for b in &mut bufs[..n] {
                    b.resize(full, 0);
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(from.as_raw_fd()),
            Err(_) => c.errors += 1,
        }
    }
    c
}

/// tun-rs without offloads: one `recv`, one `send` per packet.
pub fn tunrs_plain(from: &SyncDevice, to: &SyncDevice, stop: &AtomicBool) -> Counts {
    let mut buf = vec![0u8; READ_LEN];
    let mut c = Counts::default();
    while !stop.load(Ordering::Relaxed) {
        match from.recv(&mut buf) {
            Ok(n) => {
                c.reads += 1;
                if to.send(&buf[..n]).is_err() {
                    c.errors += 1;
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => wait_readable(from.as_raw_fd()),
            Err(_) => c.errors += 1,
        }
    }
    c
}
