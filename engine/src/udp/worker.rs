//! One worker thread: a TUN queue, a receive socket (shared port via
//! `SO_REUSEPORT`) and [`SEND_SOCKETS`] send sockets on ephemeral ports.
//!
//! The loop alternates two budgeted steps and sleeps in `poll` only when both
//! found nothing:
//! - TUN -> UDP: up to [`TUN_BUDGET`] reads; each packet is routed, prepared,
//!   segmented (userspace GSO) into the TX arena with headroom, headed, and
//!   queued as `sendmmsg` messages whose equal-size runs become one
//!   `UDP_SEGMENT` train; the arena is flushed once it holds [`FLUSH_AT`]
//!   bytes, when full and at the end.
//! - UDP -> TUN: one `recvmmsg` (with `UDP_GRO` trains), decap + anti-spoofing
//!   ([`crate::antispoof`]) per segment, userspace GRO, one `writev` per
//!   (coalesced) packet.
//!
//! The peer table is loaded once per step. All buffers are allocated at start.

use std::io::IoSlice;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::antispoof;
use crate::encap::{Codec, DropReason};
use crate::idle::Idle;
use crate::path::rx;
use crate::path::tx::{self, Refusal};
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local, Shared};
use crate::sys::event::wait_readable;
use crate::sys::tun::Queue;
use crate::sys::udp::{BATCH, RxMeta, TxMsg, Udp};
use crate::tun_out::TunOut;
use crate::udp_tx;
use crate::wire::{ipv4, vnet};

/// Send sockets (= distinct outer source ports) per worker; flows are hashed onto them.
pub const SEND_SOCKETS: usize = 4;
/// TUN reads per step.
pub const TUN_BUDGET: usize = 64;
const TUN_BUF: usize = vnet::HEADER_LEN + 65536;
const TX_ARENA: usize = 1 << 20;
/// Queued bytes after which a TUN step sends before reading on: the arena
/// holds about 15 super-packets, and waiting for all of them delayed the
/// first while the peer's worker idled. WireGuard, where a super-packet
/// takes ~40 us to encrypt, gained 5 % in A-B runs; flannel-UDP and VXLAN,
/// within noise (+2-4 %).
pub(crate) const FLUSH_AT: usize = 128 << 10;
const TX_MSGS: usize = 256;
const RX_SLOT: usize = 65536;
const RX_SLOTS: usize = 32;

// Memory budget per worker, checked at compile time: TX arena + RX arena + TUN buffer.
const _: () = assert!(TX_ARENA + RX_SLOT * RX_SLOTS + TUN_BUF <= 4 << 20);
const _: () = assert!(RX_SLOTS <= BATCH);

/// Everything a worker needs, moved into its thread.
pub(crate) struct Worker {
    pub codec: Codec,
    pub tun: Queue,
    pub vnet_hdr: bool,
    pub rx: Udp,
    pub tx: Vec<Udp>,
    pub peers: Arc<ArcSwap<PeerTable>>,
    /// The anti-spoofing mode, read once per receive batch.
    pub anti_spoof: Arc<antispoof::Mode>,
    pub mtu: usize,
    pub icmp_src: Option<Ipv4Addr>,
    pub udp_gso: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub shared: Arc<Shared>,
    /// This worker's slot in per-peer counters.
    pub index: usize,
}

/// A queued message plus the send socket it leaves through.
#[derive(Clone, Copy)]
struct Queued {
    msg: TxMsg,
    sock: usize,
}

struct Buffers {
    tx: Vec<u8>,
    tx_pos: usize,
    msgs: Vec<Queued>,
    rx: Vec<u8>,
    meta: [RxMeta; RX_SLOTS],
    out: TunOut,
}

/// A worker's TUN step: up to [`TUN_BUDGET`] non-blocking reads into `buf`,
/// each handed to `each(buf, len)`, which returns why the packet was dropped,
/// if it was. Returns whether anything was read.
pub(crate) fn read_tun(
    tun: &Queue,
    buf: &mut [u8],
    ctr: &mut Local,
    mut each: impl FnMut(&mut [u8], usize, &mut Local) -> Result<(), DropReason>,
) -> bool {
    let mut any = false;
    for _ in 0..TUN_BUDGET {
        let n = match tun.read(buf) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(_) => {
                ctr.add(Ctr::IoError, 1);
                break;
            }
        };
        any = true;
        ctr.add(Ctr::TunReads, 1);
        if let Err(r) = each(buf, n, ctr) {
            ctr.drop(r, 1);
        }
    }
    any
}

impl Worker {
    pub(crate) fn run(self) {
        let mut tun_buf = vec![0; TUN_BUF];
        let mut b = Buffers {
            tx: vec![0; TX_ARENA],
            tx_pos: 0,
            msgs: Vec::with_capacity(TX_MSGS),
            rx: vec![0; RX_SLOT * RX_SLOTS],
            meta: [RxMeta::default(); RX_SLOTS],
            out: TunOut::new(self.vnet_hdr, self.mtu, 2 * RX_SLOT),
        };
        let mut ctr = Local::default();
        ctr.add(Ctr::PeerCounting, 1);
        let mut idle = Idle::new();
        while !self.stop.load(Ordering::Relaxed) {
            let a = self.tun_step(&mut tun_buf, &mut b, &mut ctr);
            let r = self.udp_step(&mut b, &mut ctr);
            ctr.publish(&self.shared);
            idle.end_round(a || r, || self.wait());
        }
    }

    fn wait(&self) {
        wait_readable([self.tun.raw_fd(), self.rx.raw_fd()], 100);
    }

    // === TUN -> UDP ===

    fn tun_step(&self, tun_buf: &mut [u8], b: &mut Buffers, ctr: &mut Local) -> bool {
        let peers = self.peers.load();
        let any = read_tun(&self.tun, tun_buf, ctr, |buf, n, ctr| {
            let r = self.on_tun_packet(b, buf, n, &peers, ctr);
            if b.tx_pos >= FLUSH_AT {
                self.flush_tx(b, ctr);
            }
            r
        });
        self.flush_tx(b, ctr);
        any
    }

    /// One TUN read `buf[..n]`: planned by [`tx::udp_plan`], written into
    /// the arena by [`tx::udp_write`] (after a flush if it does not fit), queued.
    fn on_tun_packet(
        &self,
        b: &mut Buffers,
        buf: &mut [u8],
        n: usize,
        peers: &PeerTable,
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let read = &mut buf[..n];
        let plan = match tx::udp_plan(&self.codec, peers, read, self.vnet_hdr, b.tx.len()) {
            Ok(p) => p,
            Err(r) => {
                if let Refusal::Unreachable { start } = r {
                    self.send_unreachable(&read[start..], ctr);
                }
                return Err(r.reason());
            }
        };
        if b.tx_pos + plan.need > b.tx.len() || b.msgs.len() + plan.datagrams > TX_MSGS {
            self.flush_tx(b, ctr);
        }
        let sock = (tx::flow_hash(&read[plan.pkt.start..]) as usize) % self.tx.len().max(1);
        let start = b.tx_pos;
        let out = tx::udp_write(&self.codec, &plan, read, &mut b.tx[start..])?;
        for i in 0..out.count() {
            let r = out.range(i);
            self.queue(b, plan.entry.dst, sock, start + r.start, r.len());
        }
        b.tx_pos += out.segs.total_len();
        if out.cut {
            ctr.add(Ctr::GsoSuperPackets, 1);
        }
        let (count, inner) = (out.count() as u64, out.inner_bytes() as u64);
        plan.entry.counters.add(self.index, true, count, inner);
        ctr.add(Ctr::TxPackets, count);
        ctr.add(Ctr::TxBytes, inner);
        Ok(())
    }

    /// Appends `tx[start..start+len]` to the last message when it extends an
    /// equal-size train on the same socket (UDP GSO), else starts a new one.
    fn queue(
        &self,
        b: &mut Buffers,
        dst: std::net::SocketAddr,
        sock: usize,
        start: usize,
        len: usize,
    ) {
        if self.udp_gso.load(Ordering::Relaxed)
            && let Some(last) = b.msgs.last_mut()
            && last.sock == sock
            && udp_tx::extend_train(&mut last.msg, dst, start, len)
        {
            return;
        }
        b.msgs.push(Queued {
            msg: udp_tx::single(dst, start, len),
            sock,
        });
    }

    fn flush_tx(&self, b: &mut Buffers, ctr: &mut Local) {
        let mut batch = [TxMsg {
            dst: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            start: 0,
            len: 0,
            segment: 0,
        }; BATCH];
        for (si, sock) in self.tx.iter().enumerate() {
            let mut n = 0;
            for q in b.msgs.iter().filter(|q| q.sock == si) {
                batch[n] = q.msg;
                n += 1;
                if n == BATCH {
                    udp_tx::send_all(sock, &batch[..n], &b.tx, &self.udp_gso, ctr);
                    n = 0;
                }
            }
            if n > 0 {
                udp_tx::send_all(sock, &batch[..n], &b.tx, &self.udp_gso, ctr);
            }
        }
        b.msgs.clear();
        b.tx_pos = 0;
    }

    /// flannel-UDP: ICMP net-unreachable back into the TUN for the unroutable `pkt`.
    fn send_unreachable(&self, pkt: &[u8], ctr: &mut Local) {
        let Some(src) = self.icmp_src else { return };
        let mut out = [0u8; 128];
        let Some(len) = ipv4::build_net_unreachable(src, pkt, &mut out) else {
            return;
        };
        let hdr = vnet::VnetHdr::default().to_bytes();
        let iov_v = [IoSlice::new(&hdr), IoSlice::new(&out[..len])];
        let iov = if self.vnet_hdr {
            &iov_v[..]
        } else {
            &iov_v[1..]
        };
        match self.tun.writev(iov) {
            Ok(_) => ctr.add(Ctr::IcmpSent, 1),
            Err(_) => ctr.add(Ctr::TunWriteError, 1),
        }
    }

    // === UDP -> TUN ===

    fn udp_step(&self, b: &mut Buffers, ctr: &mut Local) -> bool {
        let got = match self.rx.recv_batch(&mut b.rx, RX_SLOT, &mut b.meta) {
            Ok(0) => return false,
            Ok(g) => g,
            Err(_) => {
                ctr.add(Ctr::IoError, 1);
                return false;
            }
        };
        ctr.add(Ctr::UdpRecvs, 1);
        let peers = self.peers.load();
        let mode = self.anti_spoof.get();
        for i in 0..got {
            let m = b.meta[i];
            let base = i * RX_SLOT;
            let len = m.len.min(RX_SLOT);
            let entries = peers.endpoint_entries(m.src);
            if len == 0 {
                if let Err(r) = rx::udp(&self.codec, mode, &peers, entries, &mut []) {
                    ctr.drop(r, 1);
                }
                continue;
            }
            for seg in rx::train(len, m.stride) {
                let dgram = &mut b.rx[base + seg.start..base + seg.end];
                let d = match rx::udp(&self.codec, mode, &peers, entries, dgram) {
                    Ok(d) => d,
                    Err(r) => {
                        ctr.drop(r, 1);
                        continue;
                    }
                };
                let (start, plen) = (base + seg.start + d.inner.start, d.inner.len());
                if let Some(e) = d.from {
                    e.counters.add(self.index, false, 1, plen as u64);
                    if d.unexpected {
                        e.counters.unexpected(self.index, m.src);
                        ctr.add(Ctr::UnexpectedSource, 1);
                    }
                }
                ctr.add(Ctr::RxPackets, 1);
                ctr.add(Ctr::RxBytes, plen as u64);
                b.out.push(&self.tun, &mut b.rx, start, plen, ctr);
            }
        }
        b.out.flush(&self.tun, &mut b.rx, ctr);
        true
    }
}
