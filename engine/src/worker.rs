//! The one worker run loop, generic over the encapsulation.
//!
//! Every engine worker owns one TUN queue, the network side its
//! [`Encapsulation`] opened (UDP sockets or a raw IPIP socket) and all of its
//! buffers, and runs [`Worker::run`] until the engine stops. One round:
//!
//! 1. load the peer table snapshot (once per round; a swap is seen from the
//!    next round on);
//! 2. [`Encapsulation::begin_round`] (WireGuard: a table swap reconciles its
//!    sessions; handed-off packets from other workers);
//! 3. the TUN step: up to [`TUN_BUDGET`] non-blocking reads, each handed to
//!    [`Encapsulation::tun_packet`] (an I/O shell around
//!    [`crate::path::tx`]); the queue is sent once it holds
//!    [`Encapsulation::FLUSH_AT`] bytes, and at the end of the step;
//! 4. [`Encapsulation::net_step`]: one receive batch through
//!    [`crate::path::rx`] to the TUN;
//! 5. [`Encapsulation::end_round`] (WireGuard: timers);
//! 6. the counters are published, and [`Idle::end_round`] decides whether
//!    the worker sleeps in `poll` (on the TUN, the network descriptor and
//!    the worker's wake-up event, if it has one) or goes on: the idle and
//!    latency policy lives there and nowhere else. It counts its sleeps and
//!    polled rounds into the next round's publication (a worker's last
//!    round before a sleep shows after its wake-up, 100 ms at most).
//!
//! The encapsulation is a type parameter: every call is statically
//! dispatched, and the loop adds no allocation, lock or syscall to what the
//! steps do. All buffers are allocated when the thread starts
//! ([`Encapsulation::state`]).
//!
//! Also here, the pieces of the I/O shells that every encapsulation shares:
//! the buffers ([`Buffers`]: the transmit arena and its queue,
//! [`TxQueue`], the receive arena, the TUN output), batching a queue into
//! `sendmmsg`-sized slices ([`in_batches`]), the outcome of a receive call
//! ([`received`]) and the transmit and receive counting of one packet
//! ([`Worker::count_tx`], [`Worker::deliver`]).

use std::io;
use std::net::IpAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::antispoof;
use crate::encap::DropReason;
use crate::idle::{Idle, Spin};
use crate::path::rx::Delivery;
use crate::path::tx::Datagrams;
use crate::peers::{Entry, PeerTable};
use crate::stats::{Ctr, Local, Shared};
use crate::sys::event::{Event, wait_readable};
use crate::sys::tun::Queue;
use crate::tun_out::TunOut;
use crate::wire::vnet;

/// TUN reads per round.
pub const TUN_BUDGET: usize = 64;
/// A TUN read: vnet header + up to 64 KiB.
pub(crate) const TUN_BUF: usize = vnet::HEADER_LEN + 65536;
/// A receive slot: one datagram, `UDP_GRO` train or raw packet.
pub(crate) const RX_SLOT: usize = 65536;
/// How long an idle worker sleeps in `poll` before it looks at the stop flag.
const WAIT_MS: i32 = 100;

/// What an encapsulation adds to the run loop. Its functions take the
/// whole [`Worker`] (the shared fields and the encapsulation's own, `encap`)
/// and the worker's mutable [`Encapsulation::State`].
pub(crate) trait Encapsulation: Sized + Send + 'static {
    /// What the worker mutates: its buffers (and WireGuard's sessions).
    type State;
    /// Queued bytes after which the TUN step sends before reading on.
    const FLUSH_AT: usize;
    /// The worker's state, made on its thread at start.
    fn state(w: &Worker<Self>) -> Self::State;
    /// Runs before the TUN step of each round; whether it moved anything.
    fn begin_round(
        _w: &Worker<Self>,
        _s: &mut Self::State,
        _peers: &Arc<PeerTable>,
        _ctr: &mut Local,
    ) -> bool {
        false
    }
    /// One TUN read (`read` is exactly what was read): queued for the
    /// network, or why it was dropped.
    fn tun_packet(
        w: &Worker<Self>,
        s: &mut Self::State,
        peers: &PeerTable,
        read: &mut [u8],
        ctr: &mut Local,
    ) -> Result<(), DropReason>;
    /// Bytes queued for the network.
    fn queued(s: &Self::State) -> usize;
    /// Sends what is queued.
    fn flush(w: &Worker<Self>, s: &mut Self::State, ctr: &mut Local);
    /// One receive batch from the network to the TUN; whether anything came.
    fn net_step(w: &Worker<Self>, s: &mut Self::State, peers: &PeerTable, ctr: &mut Local) -> bool;
    /// Runs at the end of each round.
    fn end_round(_w: &Worker<Self>, _s: &mut Self::State, _ctr: &mut Local) {}
    /// The descriptor [`Encapsulation::net_step`] reads.
    fn net_fd(&self) -> RawFd;
    /// An event other workers wake this one with.
    fn wake(&self) -> Option<&Event> {
        None
    }
}

/// The state every worker of one engine holds a clone of.
#[derive(Clone)]
pub(crate) struct SharedState {
    /// The peer table snapshot (the control plane's one handoff).
    pub peers: Arc<ArcSwap<PeerTable>>,
    /// Set when the engine stops.
    pub stop: Arc<AtomicBool>,
    /// The anti-spoofing mode, read once per receive batch.
    pub anti_spoof: Arc<antispoof::Mode>,
    /// Whether UDP GSO is in use (turns off at runtime on `EIO`).
    pub udp_gso: Arc<AtomicBool>,
    /// The workers' poll-on window (`WEFT_ENGINE_SPIN_US`).
    pub spin: Spin,
}

/// One worker, moved into its thread: what every encapsulation's worker
/// has, and the encapsulation's own part.
pub(crate) struct Worker<E> {
    /// This worker's index: its slot in per-peer counters.
    pub index: usize,
    pub tun: Queue,
    pub vnet_hdr: bool,
    /// The TUN MTU.
    pub mtu: usize,
    pub peers: Arc<ArcSwap<PeerTable>>,
    /// The anti-spoofing mode, read once per receive batch.
    pub anti_spoof: Arc<antispoof::Mode>,
    /// Whether UDP GSO is in use (turns off at runtime on `EIO`).
    pub udp_gso: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    /// This worker's block of engine counters.
    pub counters: Arc<Shared>,
    /// The poll-on window.
    pub spin: Spin,
    pub encap: E,
}

impl<E: Encapsulation> Worker<E> {
    /// Worker `index` on TUN queue `tun` (of a device with or without vnet
    /// header, MTU `mtu`) with the engine's shared state.
    pub(crate) fn new(
        index: usize,
        tun: Queue,
        vnet_hdr: bool,
        mtu: u16,
        shared: &SharedState,
        encap: E,
    ) -> Worker<E> {
        Worker {
            index,
            tun,
            vnet_hdr,
            mtu: usize::from(mtu),
            peers: shared.peers.clone(),
            anti_spoof: shared.anti_spoof.clone(),
            udp_gso: shared.udp_gso.clone(),
            stop: shared.stop.clone(),
            counters: Arc::new(Shared::default()),
            spin: shared.spin.clone(),
            encap,
        }
    }

    /// The run loop (see the module docs); returns when the engine stops.
    pub(crate) fn run(self) {
        let mut tun_buf = vec![0; TUN_BUF];
        let mut s = E::state(&self);
        let mut ctr = Local::default();
        ctr.add(Ctr::PeerCounting, 1);
        let mut idle = Idle::new(self.spin.clone());
        while !self.stop.load(Ordering::Relaxed) {
            let peers = self.peers.load();
            let h = E::begin_round(&self, &mut s, &peers, &mut ctr);
            let a = self.tun_step(&mut tun_buf, &mut s, &peers, &mut ctr);
            let r = E::net_step(&self, &mut s, &peers, &mut ctr);
            E::end_round(&self, &mut s, &mut ctr);
            drop(peers);
            ctr.publish(&self.counters);
            idle.end_round(h || a || r, &mut ctr, || self.wait());
        }
    }

    /// Up to [`TUN_BUDGET`] non-blocking reads, each handed to
    /// [`Encapsulation::tun_packet`]; whether anything was read.
    fn tun_step(
        &self,
        buf: &mut [u8],
        s: &mut E::State,
        peers: &PeerTable,
        ctr: &mut Local,
    ) -> bool {
        let mut any = false;
        for _ in 0..TUN_BUDGET {
            let n = match self.tun.read(buf) {
                Ok(Some(n)) => n,
                Ok(None) => break,
                Err(_) => {
                    ctr.add(Ctr::IoError, 1);
                    break;
                }
            };
            any = true;
            ctr.add(Ctr::TunReads, 1);
            if let Err(r) = E::tun_packet(self, s, peers, &mut buf[..n], ctr) {
                ctr.drop(r, 1);
            }
            if E::queued(s) >= E::FLUSH_AT {
                E::flush(self, s, ctr);
            }
        }
        E::flush(self, s, ctr);
        any
    }

    /// Sleeps until the TUN, the network descriptor or the wake-up event is
    /// readable (at most [`WAIT_MS`]); clears the event.
    fn wait(&self) {
        let wake = self.encap.wake();
        // poll ignores a negative descriptor.
        let fds = [
            self.tun.raw_fd(),
            self.encap.net_fd(),
            wake.map_or(-1, Event::raw_fd),
        ];
        if wait_readable(fds, WAIT_MS)[2]
            && let Some(e) = wake
        {
            e.clear();
        }
    }

    /// Counts the datagrams `out` that [`crate::path::tx`] wrote for `entry`.
    pub(crate) fn count_tx(&self, entry: &Entry, out: &Datagrams, ctr: &mut Local) {
        let (count, inner) = (out.count() as u64, out.inner_bytes() as u64);
        self.count_sent(entry, count, inner, out.cut, ctr);
    }

    /// Counts `packets` inner packets of `bytes` sent to `entry` (`cut`: a
    /// super-packet became them).
    pub(crate) fn count_sent(
        &self,
        entry: &Entry,
        packets: u64,
        bytes: u64,
        cut: bool,
        ctr: &mut Local,
    ) {
        if cut {
            ctr.add(Ctr::GsoSuperPackets, 1);
        }
        entry.counters.add(self.index, true, packets, bytes);
        ctr.add(Ctr::TxPackets, packets);
        ctr.add(Ctr::TxBytes, bytes);
    }

    /// Counts the delivery `d` of the packet at `base + d.inner` in `arena`
    /// from outer source `src` and hands it to `out` (GRO or the TUN).
    pub(crate) fn deliver(
        &self,
        out: &mut TunOut,
        arena: &mut [u8],
        base: usize,
        d: &Delivery<'_>,
        src: IpAddr,
        ctr: &mut Local,
    ) {
        let (start, len) = (base + d.inner.start, d.inner.len());
        if let Some(e) = d.from {
            e.counters.add(self.index, false, 1, len as u64);
            if d.unexpected {
                e.counters.unexpected(self.index, src);
                ctr.add(Ctr::UnexpectedSource, 1);
            }
        }
        ctr.add(Ctr::RxPackets, 1);
        ctr.add(Ctr::RxBytes, len as u64);
        out.push(&self.tun, arena, start, len, ctr);
    }
}

/// A worker's transmit arena and the messages queued from it.
pub(crate) struct TxQueue<M> {
    /// The arena: datagrams are written from `pos` on.
    pub buf: Vec<u8>,
    /// Bytes in use.
    pub pos: usize,
    /// Queued messages, pointing into `buf[..pos]`.
    pub msgs: Vec<M>,
    max_msgs: usize,
}

impl<M> TxQueue<M> {
    /// An arena of `bytes` bytes for at most `max_msgs` messages.
    pub(crate) fn new(bytes: usize, max_msgs: usize) -> TxQueue<M> {
        TxQueue {
            buf: vec![0; bytes],
            pos: 0,
            msgs: Vec::with_capacity(max_msgs),
            max_msgs,
        }
    }

    /// Whether `need` more bytes and `msgs` more messages fit (else: flush first).
    pub(crate) fn fits(&self, need: usize, msgs: usize) -> bool {
        self.pos + need <= self.buf.len() && self.msgs.len() + msgs <= self.max_msgs
    }

    /// Empties the queue (after it was sent).
    pub(crate) fn clear(&mut self) {
        self.msgs.clear();
        self.pos = 0;
    }
}

/// A worker's buffers: the transmit queue, the receive arena of `SLOTS`
/// slots of [`RX_SLOT`] bytes with what the receive call says of each
/// (`R`), and the TUN output.
pub(crate) struct Buffers<M, R, const SLOTS: usize> {
    pub tx: TxQueue<M>,
    pub rx: Vec<u8>,
    pub meta: [R; SLOTS],
    pub out: TunOut,
}

impl<M, R: Copy + Default, const SLOTS: usize> Buffers<M, R, SLOTS> {
    /// Buffers for worker `w`, with a transmit arena of `tx_bytes` for at
    /// most `tx_msgs` messages.
    pub(crate) fn new<E>(w: &Worker<E>, tx_bytes: usize, tx_msgs: usize) -> Self {
        Buffers {
            tx: TxQueue::new(tx_bytes, tx_msgs),
            rx: vec![0; RX_SLOT * SLOTS],
            meta: [R::default(); SLOTS],
            out: TunOut::new(w.vnet_hdr, w.mtu, 2 * RX_SLOT),
        }
    }
}

/// Hands `msgs` to `send` in slices of at most `B` (one `sendmmsg` each).
pub(crate) fn in_batches<M: Copy, const B: usize>(
    mut msgs: impl Iterator<Item = M>,
    mut send: impl FnMut(&[M]),
) {
    let Some(first) = msgs.next() else { return };
    let mut batch = [first; B];
    let mut n = 1;
    for m in msgs {
        if n == B {
            send(&batch[..n]);
            n = 0;
        }
        batch[n] = m;
        n += 1;
    }
    send(&batch[..n]);
}

/// What a receive call got: `Some(count)` of at least one (counted as a
/// receive call), or `None` for nothing (or an error, counted).
pub(crate) fn received(r: io::Result<usize>, ctr: &mut Local) -> Option<usize> {
    match r {
        Ok(0) => None,
        Ok(got) => {
            ctr.add(Ctr::UdpRecvs, 1);
            Some(got)
        }
        Err(_) => {
            ctr.add(Ctr::IoError, 1);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batches_are_full_but_the_last() {
        let mut seen = Vec::new();
        in_batches::<u32, 3>(0..8, |b| seen.push(b.to_vec()));
        assert_eq!(seen, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7]]);
        seen.clear();
        in_batches::<u32, 3>(0..3, |b| seen.push(b.to_vec()));
        assert_eq!(seen, vec![vec![0, 1, 2]]);
        in_batches::<u32, 3>(0..0, |_| panic!("nothing to send"));
    }

    #[test]
    fn the_queue_fits_bytes_and_messages() {
        let mut q = TxQueue::<u8>::new(100, 2);
        assert!(q.fits(100, 2));
        assert!(!q.fits(101, 1) && !q.fits(1, 3));
        q.pos = 60;
        q.msgs.push(0);
        assert!(q.fits(40, 1) && !q.fits(41, 1) && !q.fits(1, 2));
        q.clear();
        assert!(q.fits(100, 2));
    }
}
