//! One IPIP worker thread: a TUN queue and one raw IPIP socket (send and
//! receive; its BPF filter keeps this worker's share of the received flows).
//!
//! The loop alternates two budgeted steps and sleeps in `poll` only when both
//! found nothing:
//! - TUN -> raw: up to [`TUN_BUDGET`](crate::worker::TUN_BUDGET) reads
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

use crate::antispoof::{self, Verdict};
use crate::encap::DropReason;
use crate::idle::Idle;
use crate::offload::gso;
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local, Shared};
use crate::sys::event::wait_readable;
use crate::sys::raw::{BATCH, Raw, RawTx};
use crate::sys::tun::Queue;
use crate::tun_out::TunOut;
use crate::wire::{ipv4, vnet};
use crate::worker::read_tun;

/// Largest inner packet an outer IPv4 packet can carry.
const MAX_INNER: usize = 65535 - ipv4::HEADER_LEN;
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

    fn on_tun_packet(
        &self,
        b: &mut Buffers,
        buf: &mut [u8],
        n: usize,
        peers: &PeerTable,
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let (hdr, off) =
            vnet::VnetHdr::split(&buf[..n], self.vnet_hdr).ok_or(DropReason::Malformed)?;
        let pkt = &mut buf[off..n];
        let pkt_len = pkt.len();
        match pkt.first().map(|v| v >> 4) {
            Some(4) if pkt_len >= ipv4::HEADER_LEN => {}
            // IPIP carries IPv4 only; the TUN has no IPv6 routes (link-local chatter ends here).
            Some(6) => return Err(DropReason::NoRoute),
            _ => return Err(DropReason::Malformed),
        }
        let d: [u8; 4] = [pkt[16], pkt[17], pkt[18], pkt[19]];
        let (dst, peer_ctr) = match peers.lookup_v4(d) {
            Some(e) => match e.dst.ip() {
                IpAddr::V4(a) => (a, &e.counters),
                IpAddr::V6(_) => return Err(DropReason::NoRoute),
            },
            None => return Err(DropReason::NoRoute),
        };
        let outer = super::outer_params(pkt).ok_or(DropReason::Malformed)?;
        let gso_type = hdr.gso_type & !vnet::GSO_ECN;
        if gso_type == vnet::GSO_TCPV4 && hdr.gso_size > 0 {
            let gs = usize::from(hdr.gso_size);
            let need = gso::required_len(pkt, gs, 0).ok_or(DropReason::Malformed)?;
            if need > b.tx.len() {
                return Err(DropReason::Mtu);
            }
            if b.tx_pos + need > b.tx.len() || b.msgs.len() + need / gs.max(1) + 2 > TX_MSGS {
                self.flush_tx(b, ctr);
            }
            let pkt = &buf[off..n];
            let start = b.tx_pos;
            let segs = gso::tcp_segment(pkt, gs, 0, &mut b.tx[start..])?;
            ctr.add(Ctr::GsoSuperPackets, 1);
            peer_ctr.add(self.index, true, segs.count as u64, segs.total_len() as u64);
            for i in 0..segs.count {
                let r = segs.range(i);
                let len = r.len();
                Self::queue(b, dst, outer, start + r.start, len);
                ctr.add(Ctr::TxPackets, 1);
                ctr.add(Ctr::TxBytes, len as u64);
            }
            b.tx_pos += segs.total_len();
        } else {
            if gso_type != vnet::GSO_NONE {
                return Err(DropReason::Malformed);
            }
            if hdr.flags & vnet::F_NEEDS_CSUM != 0 {
                gso::complete_checksum(
                    pkt,
                    usize::from(hdr.csum_start),
                    usize::from(hdr.csum_offset),
                )?;
            }
            if pkt_len > MAX_INNER {
                return Err(DropReason::Mtu);
            }
            if b.tx_pos + pkt_len > b.tx.len() || b.msgs.len() + 1 > TX_MSGS {
                self.flush_tx(b, ctr);
            }
            let s = b.tx_pos;
            b.tx[s..s + pkt_len].copy_from_slice(&buf[off..n]);
            Self::queue(b, dst, outer, s, pkt_len);
            b.tx_pos += pkt_len;
            peer_ctr.add(self.index, true, 1, pkt_len as u64);
            ctr.add(Ctr::TxPackets, 1);
            ctr.add(Ctr::TxBytes, pkt_len as u64);
        }
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
            let len = b.lens[i];
            let pkt = &mut b.rx[base..base + len];
            let Some(src) = super::outer_source(pkt) else {
                ctr.drop(DropReason::Malformed, 1);
                continue;
            };
            let entries = peers.endpoint_entries(IpAddr::V4(src));
            if mode.drops_unknown_outer() && entries.is_empty() {
                ctr.drop(DropReason::UnknownPeer, 1);
                continue;
            }
            let r = match super::decap(pkt) {
                Ok(r) => r,
                Err(e) => {
                    ctr.drop(e, 1);
                    continue;
                }
            };
            let (start, plen) = (base + r.start, r.end - r.start);
            let inner = &b.rx[start..start + plen];
            let inner_src = IpAddr::from([inner[12], inner[13], inner[14], inner[15]]);
            match antispoof::check(mode, &peers, entries, inner_src) {
                Verdict::Drop(r) => {
                    ctr.drop(r, 1);
                    continue;
                }
                Verdict::Accept(from) => {
                    if let Some(e) = from {
                        e.counters.add(self.index, false, 1, plen as u64);
                    }
                }
                Verdict::Unexpected(e) => {
                    e.counters.add(self.index, false, 1, plen as u64);
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
