//! The IPIP worker's half of the run loop ([`crate::worker`]): one raw
//! IPIP socket (send and receive; its BPF filter keeps this worker's share
//! of the received flows).
//!
//! - TUN -> raw: each IPv4 read is planned by [`tx::ipip_plan`], segmented
//!   (userspace GSO; raw IP has no kernel GSO) into the TX arena by
//!   [`tx::write`] and queued as one `sendmmsg` message per segment with its
//!   outer TTL/TOS; the queue is sent (DF messages first, then the others:
//!   DF is a socket mode) when full and at the end of the TUN step.
//! - raw -> TUN: one `recvmmsg`, [`rx::ipip`] per packet (outer header
//!   stripped, anti-spoofing, ECN), userspace GRO, one `writev` per
//!   (coalesced) packet.

use std::net::IpAddr;
use std::os::fd::RawFd;

use crate::encap::DropReason;
use crate::path::{rx, tx};
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local};
use crate::sys::raw::{BATCH, Raw, RawTx};
use crate::worker::{self, Encapsulation, RX_SLOT, TUN_BUF, Worker, in_batches, received};

const TX_ARENA: usize = 1 << 20;
const TX_MSGS: usize = 1024;
const RX_SLOTS: usize = 32;

// Memory budget per worker, checked at compile time: TX arena + RX arena + TUN buffer.
const _: () = assert!(TX_ARENA + RX_SLOT * RX_SLOTS + TUN_BUF <= 4 << 20);
const _: () = assert!(RX_SLOTS <= BATCH);

/// The IPIP part of a worker.
pub(crate) struct IpipEncap {
    pub sock: Raw,
}

/// A queued message and whether it leaves with DF.
#[derive(Clone, Copy)]
pub(crate) struct Queued {
    msg: RawTx,
    df: bool,
}

type Buffers = worker::Buffers<Queued, usize, RX_SLOTS>;

impl Encapsulation for IpipEncap {
    type State = Buffers;
    /// The queue is sent when full and at the end of the TUN step only.
    const FLUSH_AT: usize = usize::MAX;

    fn state(w: &Worker<Self>) -> Buffers {
        Buffers::new(w, TX_ARENA, TX_MSGS)
    }

    /// Planned by [`tx::ipip_plan`], cut into the arena by [`tx::write`]
    /// (after a flush if it does not fit), queued.
    fn tun_packet(
        w: &Worker<Self>,
        b: &mut Buffers,
        peers: &PeerTable,
        read: &mut [u8],
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let plan = tx::ipip_plan(peers, read, w.vnet_hdr, b.tx.buf.len())?;
        let tx::Outer::Ipip { dst, params: o } = plan.outer else {
            return Err(DropReason::NoRoute);
        };
        if !b.tx.fits(plan.need, plan.datagrams) {
            Self::flush(w, b, ctr);
        }
        let start = b.tx.pos;
        let out = tx::write(&plan, read, &mut b.tx.buf[start..])?;
        for i in 0..out.count() {
            let r = out.range(i);
            let msg = RawTx {
                dst,
                start: start + r.start,
                len: r.len(),
                ttl: o.ttl,
                tos: o.tos,
            };
            b.tx.msgs.push(Queued { msg, df: o.df });
        }
        b.tx.pos += out.segs.total_len();
        w.count_tx(plan.entry, &out, ctr);
        Ok(())
    }

    fn queued(b: &Buffers) -> usize {
        b.tx.pos
    }

    /// Sends the queue: DF messages, then the others (a flow's DF bit does not
    /// change, so per-flow order is kept).
    fn flush(w: &Worker<Self>, b: &mut Buffers, ctr: &mut Local) {
        let q = &mut b.tx;
        for df in [true, false] {
            if !q.msgs.iter().any(|m| m.df == df) {
                continue;
            }
            if w.encap.sock.set_df(df).is_err() {
                ctr.add(Ctr::IoError, 1);
            }
            let msgs = q.msgs.iter().filter(|m| m.df == df).map(|m| m.msg);
            in_batches::<_, BATCH>(msgs, |batch| w.send_all(batch, &q.buf, ctr));
        }
        q.clear();
    }

    /// One `recvmmsg`; [`rx::ipip`] for each packet.
    fn net_step(w: &Worker<Self>, b: &mut Buffers, peers: &PeerTable, ctr: &mut Local) -> bool {
        let r = w.encap.sock.recv_batch(&mut b.rx, RX_SLOT, &mut b.meta);
        let Some(got) = received(r, ctr) else {
            return false;
        };
        let mode = w.anti_spoof.get();
        for i in 0..got {
            let base = i * RX_SLOT;
            let pkt = &mut b.rx[base..base + b.meta[i]];
            match rx::ipip(mode, peers, pkt) {
                Ok((src, d)) => {
                    let src = IpAddr::V4(src);
                    w.deliver(&mut b.out, &mut b.rx, base, &d, src, ctr);
                }
                Err(r) => ctr.drop(r, 1),
            }
        }
        b.out.flush(&w.tun, &mut b.rx, ctr);
        true
    }

    fn net_fd(&self) -> RawFd {
        self.sock.raw_fd()
    }
}

impl Worker<IpipEncap> {
    fn send_all(&self, msgs: &[RawTx], arena: &[u8], ctr: &mut Local) {
        let mut i = 0;
        while i < msgs.len() {
            ctr.add(Ctr::UdpSends, 1);
            match self.encap.sock.send_batch(&msgs[i..], arena) {
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
}
