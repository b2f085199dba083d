//! One IPIP worker thread: a TUN queue and one raw IPIP socket (send and
//! receive; its BPF filter keeps this worker's share of the received flows).
//!
//! The loop alternates two budgeted steps and sleeps in `poll` only when both
//! found nothing:
//! - TUN -> raw: up to [`TUN_BUDGET`](crate::udp::worker::TUN_BUDGET) reads
//!   ([`read_tun`]); each IPv4 packet is routed, segmented (userspace GSO;
//!   raw IP has no kernel GSO) into the TX arena and queued as one
//!   `sendmmsg` message per segment with its outer TTL/TOS; the queue is
//!   flushed (DF messages first, then the others: DF is a socket mode) when
//!   full and at the end of the step.
//! - raw -> TUN: one `recvmmsg`, outer header stripped, anti-spoofing and
//!   decap per packet, userspace GRO, one `writev` per (coalesced) packet.
//!
//! The peer table is loaded once per step. All buffers are allocated at start.

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::encap::DropReason;
use crate::idle::Idle;
use crate::path::{rx, tx};
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local, Shared};
use crate::sys::event::wait_readable;
use crate::sys::raw::{BATCH, Raw, RawTx};
use crate::sys::tun::Queue;
use crate::tun_out::TunOut;
use crate::udp::worker::read_tun;
use crate::wire::vnet;

const TUN_BUF: usize = vnet::HEADER_LEN + 65536;
const TX_ARENA: usize = 1 << 20;
const TX_MSGS: usize = 1024;
const RX_SLOT: usize = 65536;
const RX_SLOTS: usize = 32;

// Memory budget per worker, checked at compile time: TX arena + RX arena + TUN buffer.
const _: () = assert!(TX_ARENA + RX_SLOT * RX_SLOTS + TUN_BUF <= 4 << 20);
const _: () = assert!(RX_SLOTS <= BATCH);

/// Everything an IPIP worker needs, moved into its thread.
pub(crate) struct IpipWorker {
    /// This worker's slot in per-peer counters.
    pub index: usize,
    pub tun: Queue,
    pub vnet_hdr: bool,
    pub sock: Raw,
    pub peers: Arc<ArcSwap<PeerTable>>,
    /// The anti-spoofing mode, read once per receive batch.
    pub anti_spoof: Arc<crate::antispoof::Mode>,
    pub mtu: usize,
    pub stop: Arc<AtomicBool>,
    pub shared: Arc<Shared>,
}

/// A queued message and whether it leaves with DF.
#[derive(Clone, Copy)]
struct Queued {
    msg: RawTx,
    df: bool,
}

struct Buffers {
    tx: Vec<u8>,
    tx_pos: usize,
    msgs: Vec<Queued>,
    rx: Vec<u8>,
    lens: [usize; RX_SLOTS],
    out: TunOut,
}

impl IpipWorker {
    pub(crate) fn run(self) {
        let mut tun_buf = vec![0; TUN_BUF];
        let mut b = Buffers {
            tx: vec![0; TX_ARENA],
            tx_pos: 0,
            msgs: Vec::with_capacity(TX_MSGS),
            rx: vec![0; RX_SLOT * RX_SLOTS],
            lens: [0; RX_SLOTS],
            out: TunOut::new(self.vnet_hdr, self.mtu, 2 * RX_SLOT),
        };
        let mut ctr = Local::default();
        ctr.add(Ctr::PeerCounting, 1);
        let mut idle = Idle::new();
        while !self.stop.load(Ordering::Relaxed) {
            let a = self.tun_step(&mut tun_buf, &mut b, &mut ctr);
            let r = self.raw_step(&mut b, &mut ctr);
            ctr.publish(&self.shared);
            idle.end_round(a || r, || self.wait());
        }
    }

    fn wait(&self) {
        wait_readable([self.tun.raw_fd(), self.sock.raw_fd()], 100);
    }

    // === TUN -> raw ===

    fn tun_step(&self, tun_buf: &mut [u8], b: &mut Buffers, ctr: &mut Local) -> bool {
        let peers = self.peers.load();
        let any = read_tun(&self.tun, tun_buf, ctr, |buf, n, ctr| {
            self.on_tun_packet(b, buf, n, &peers, ctr)
        });
        self.flush_tx(b, ctr);
        any
    }

    /// One TUN read `buf[..n]`: planned by [`tx::ipip_plan`], cut into the
    /// arena by [`tx::write`] (after a flush if it does not fit), queued.
    fn on_tun_packet(
        &self,
        b: &mut Buffers,
        buf: &mut [u8],
        n: usize,
        peers: &PeerTable,
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let read = &mut buf[..n];
        let (plan, dst, outer) = tx::ipip_plan(peers, read, self.vnet_hdr, b.tx.len())?;
        if b.tx_pos + plan.need > b.tx.len() || b.msgs.len() + plan.datagrams > TX_MSGS {
            self.flush_tx(b, ctr);
        }
        let start = b.tx_pos;
        let out = tx::write(&plan, read, &mut b.tx[start..])?;
        for i in 0..out.count() {
            let r = out.range(i);
            Self::queue(b, dst, outer, start + r.start, r.len());
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

    fn queue(b: &mut Buffers, dst: Ipv4Addr, o: super::OuterParams, start: usize, len: usize) {
        b.msgs.push(Queued {
            msg: RawTx {
                dst,
                start,
                len,
                ttl: o.ttl,
                tos: o.tos,
            },
            df: o.df,
        });
    }

    /// Sends the queue: DF messages, then the others (a flow's DF bit does not
    /// change, so per-flow order is kept).
    fn flush_tx(&self, b: &mut Buffers, ctr: &mut Local) {
        let mut batch = [RawTx {
            dst: Ipv4Addr::UNSPECIFIED,
            start: 0,
            len: 0,
            ttl: 0,
            tos: 0,
        }; BATCH];
        for df in [true, false] {
            if !b.msgs.iter().any(|q| q.df == df) {
                continue;
            }
            if self.sock.set_df(df).is_err() {
                ctr.add(Ctr::IoError, 1);
            }
            let mut n = 0;
            for q in b.msgs.iter().filter(|q| q.df == df) {
                batch[n] = q.msg;
                n += 1;
                if n == BATCH {
                    self.send_all(&batch[..n], &b.tx, ctr);
                    n = 0;
                }
            }
            if n > 0 {
                self.send_all(&batch[..n], &b.tx, ctr);
            }
        }
        b.msgs.clear();
        b.tx_pos = 0;
    }

    fn send_all(&self, msgs: &[RawTx], arena: &[u8], ctr: &mut Local) {
        let mut i = 0;
        while i < msgs.len() {
            ctr.add(Ctr::UdpSends, 1);
            match self.sock.send_batch(&msgs[i..], arena) {
                Ok(0) => {
                    ctr.add(Ctr::UdpSendError, (msgs.len() - i) as u64);
                    return;
                }
                Ok(k) => i += k,
                Err(e) => {
                    if e.raw_os_error() == Some(libc::EMSGSIZE) {
                        ctr.drop(DropReason::Mtu, 1);
                    } else {
                        ctr.add(Ctr::UdpSendError, 1);
                    }
                    i += 1;
                }
            }
        }
    }

    // === raw -> TUN ===

    fn raw_step(&self, b: &mut Buffers, ctr: &mut Local) -> bool {
        let got = match self.sock.recv_batch(&mut b.rx, RX_SLOT, &mut b.lens) {
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
            let base = i * RX_SLOT;
            let pkt = &mut b.rx[base..base + b.lens[i]];
            let (src, d) = match rx::ipip(mode, &peers, pkt) {
                Ok(v) => v,
                Err(r) => {
                    ctr.drop(r, 1);
                    continue;
                }
            };
            let (start, plen) = (base + d.inner.start, d.inner.len());
            if let Some(e) = d.from {
                e.counters.add(self.index, false, 1, plen as u64);
                if d.unexpected {
                    e.counters.unexpected(self.index, IpAddr::V4(src));
                    ctr.add(Ctr::UnexpectedSource, 1);
                }
            }
            ctr.add(Ctr::RxPackets, 1);
            ctr.add(Ctr::RxBytes, plen as u64);
            b.out.push(&self.tun, &mut b.rx, start, plen, ctr);
        }
        b.out.flush(&self.tun, &mut b.rx, ctr);
        true
    }
}
