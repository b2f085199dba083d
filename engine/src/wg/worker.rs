//! The WireGuard worker's half of the run loop ([`crate::worker`]): an I/O
//! shell around [`Core`] (`path::wg`), which owns the sessions of the peers
//! this worker owns and decides everything per packet. The shell keeps one
//! socket on the listen port (receive and send: WireGuard peers learn our
//! endpoint from the source port), the inbox of packets other workers
//! handed over, the timer tick and the buffers. See [`super`] for the design.
//!
//! Each round begins with the clocks read once ([`Now`]), a table swap if
//! there was one ([`Core::follow`]) and the inbox; it ends with
//! [`Core::tick`].

use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::handoff::{Hub, Inbox, Kind};
use crate::encap::DropReason;
use crate::path::rx;
use crate::path::wg::gate::Load;
use crate::path::wg::seg::trust_tcp_checksum;
use crate::path::wg::{Config, Core, Now, Out, Rx, TunTx};
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local};
use crate::sys::event::Event;
use crate::sys::udp::{BATCH, RxMeta, TxMsg, Udp};
use crate::udp::worker::FLUSH_AT;
use crate::udp_tx;
use crate::worker::{self, Encapsulation, RX_SLOT, TUN_BUF, TxQueue, Worker, received};

/// Handed-off packets processed per step.
const INBOX_BUDGET: usize = 32;
const TX_ARENA: usize = 1 << 20;
const TX_MSGS: usize = 256;
const RX_SLOTS: usize = 16;

const _: () = assert!(TX_ARENA + 2 * RX_SLOT * RX_SLOTS + TUN_BUF <= 4 << 20);
const _: () = assert!(RX_SLOTS <= BATCH);

/// The WireGuard part of a worker.
pub(crate) struct WgEncap {
    pub sock: Udp,
    pub hub: Arc<Hub>,
    pub inbox: Inbox,
    /// Our static private key.
    pub secret: [u8; 32],
    /// The gate's random secrets.
    pub seed: [u8; 64],
    /// The engine's handshake load, shared by all workers' gates.
    pub load: Arc<Load>,
}

/// A worker's state: the core and the buffers.
pub(crate) struct State {
    core: Core,
    b: worker::Buffers<TxMsg, RxMeta, RX_SLOTS>,
    /// Decrypted packets, waiting for GRO and the TUN.
    plain: Vec<u8>,
    plain_pos: usize,
    now: Now,
}

/// The transmit queue as the core's [`Out`]: sends what it holds when a
/// datagram does not fit.
struct Queue<'a> {
    w: &'a Worker<WgEncap>,
    tx: &'a mut TxQueue<TxMsg>,
    ctr: &'a mut Local,
}

impl Out for Queue<'_> {
    fn room(&mut self, len: usize) -> &mut [u8] {
        if !self.tx.fits(len, 1) {
            flush_tx(self.w, self.tx, self.ctr);
        }
        &mut self.tx.buf[self.tx.pos..]
    }

    /// Appends to the last message when it extends an equal-size train
    /// (UDP GSO), else starts a new one.
    fn push(&mut self, to: SocketAddr, len: usize) {
        let start = self.tx.pos;
        self.tx.pos += len;
        if self.w.udp_gso.load(Ordering::Relaxed)
            && let Some(m) = self.tx.msgs.last_mut()
            && udp_tx::extend_train(m, to, start, len)
        {
            return;
        }
        if !self.tx.fits(0, 1) {
            // Out of messages: send them; the bytes stay where they are.
            self.tx.pos -= len;
            flush_tx(self.w, self.tx, self.ctr);
            self.tx.buf.copy_within(start..start + len, 0);
            self.tx.pos = len;
            self.tx.msgs.push(udp_tx::single(to, 0, len));
            return;
        }
        self.tx.msgs.push(udp_tx::single(to, start, len));
    }
}

fn flush_tx(w: &Worker<WgEncap>, tx: &mut TxQueue<TxMsg>, ctr: &mut Local) {
    udp_tx::send_all(&w.encap.sock, &tx.msgs, &tx.buf, &w.udp_gso, ctr);
    tx.clear();
}

impl Encapsulation for WgEncap {
    type State = State;
    const FLUSH_AT: usize = FLUSH_AT;

    fn state(w: &Worker<Self>) -> State {
        let now = Now::read();
        let e = &w.encap;
        State {
            core: Core::new(Config {
                me: w.index,
                workers: e.hub.workers(),
                secret: e.secret,
                seed: e.seed,
                load: Arc::clone(&e.load),
                now: now.mono,
            }),
            b: worker::Buffers::new(w, TX_ARENA, TX_MSGS),
            plain: vec![0; RX_SLOT * RX_SLOTS],
            plain_pos: 0,
            now,
        }
    }

    /// The clocks, a table swap, then the inbox.
    fn begin_round(
        w: &Worker<Self>,
        s: &mut State,
        peers: &Arc<PeerTable>,
        ctr: &mut Local,
    ) -> bool {
        s.now = Now::read();
        let mut q = Queue {
            w,
            tx: &mut s.b.tx,
            ctr,
        };
        if s.core.follow(peers, s.now, &mut q) {
            flush_tx(w, q.tx, q.ctr);
        }
        inbox_step(w, s, peers, ctr)
    }

    fn tun_packet(
        w: &Worker<Self>,
        s: &mut State,
        peers: &PeerTable,
        read: &mut [u8],
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let mut q = Queue {
            w,
            tx: &mut s.b.tx,
            ctr,
        };
        match s.core.tun_tx(peers, read, w.vnet_hdr, s.now, &mut q)? {
            TunTx::HandOff(to) => hand_off(w, to, Kind::Tun, read, ctr),
            TunTx::Sent {
                entry,
                packets,
                bytes,
                cut,
            } => w.count_sent(entry, packets, bytes, cut, ctr),
        }
        Ok(())
    }

    fn queued(s: &State) -> usize {
        s.b.tx.pos
    }

    fn flush(w: &Worker<Self>, s: &mut State, ctr: &mut Local) {
        flush_tx(w, &mut s.b.tx, ctr);
    }

    /// One `recvmmsg`; each datagram of each train through the core.
    fn net_step(w: &Worker<Self>, s: &mut State, peers: &PeerTable, ctr: &mut Local) -> bool {
        let r = w.encap.sock.recv_batch(&mut s.b.rx, RX_SLOT, &mut s.b.meta);
        let Some(got) = received(r, ctr) else {
            return false;
        };
        // Take the receive arena out so that segments can be borrowed while `s` is mutated.
        let arena = std::mem::take(&mut s.b.rx);
        for i in 0..got {
            let m = s.b.meta[i];
            let base = i * RX_SLOT;
            let len = m.len.min(RX_SLOT);
            let src = SocketAddr::new(m.src, m.src_port);
            if len == 0 {
                ctr.drop(DropReason::Malformed, 1);
                continue;
            }
            train(
                w,
                s,
                peers,
                &arena[base..base + len],
                m.stride,
                src,
                None,
                ctr,
            );
        }
        s.b.rx = arena;
        flush_rx(w, s, ctr);
        flush_tx(w, &mut s.b.tx, ctr);
        true
    }

    /// Every timer tick, each owned peer's timers.
    fn end_round(w: &Worker<Self>, s: &mut State, ctr: &mut Local) {
        let mut q = Queue {
            w,
            tx: &mut s.b.tx,
            ctr,
        };
        if s.core.tick(s.now, &mut q) {
            flush_tx(w, q.tx, q.ctr);
        }
    }

    fn net_fd(&self) -> RawFd {
        self.sock.raw_fd()
    }

    fn wake(&self) -> Option<&Event> {
        Some(&self.inbox.event)
    }
}

/// One datagram through the core; `Some((worker, vouched))` when it belongs
/// to another worker.
fn datagram(
    w: &Worker<WgEncap>,
    s: &mut State,
    peers: &PeerTable,
    d: &[u8],
    src: SocketAddr,
    vouched: Option<u32>,
    ctr: &mut Local,
) -> Option<(usize, Option<u32>)> {
    if s.plain_pos + d.len() > s.plain.len() {
        flush_rx(w, s, ctr);
    }
    let mode = w.anti_spoof.get();
    let mut q = Queue {
        w,
        tx: &mut s.b.tx,
        ctr,
    };
    let plain = &mut s.plain[s.plain_pos..];
    match s
        .core
        .datagram(peers, mode, d, src, vouched, plain, s.now, &mut q)
    {
        Rx::Deliver { len, from } => {
            let start = s.plain_pos;
            s.plain_pos += len;
            if w.vnet_hdr {
                trust_tcp_checksum(&mut s.plain[start..start + len]);
            }
            let d = rx::Delivery {
                inner: start..start + len,
                from,
                unexpected: false,
            };
            w.deliver(&mut s.b.out, &mut s.plain, 0, &d, src.ip(), ctr);
        }
        Rx::HandOff { to, vouched } => return Some((to, vouched)),
        Rx::Done { sent } => ctr.add(Ctr::TxPackets, sent),
        Rx::Drop(r) => ctr.drop(r, 1),
    }
    None
}

/// The datagrams of a `UDP_GRO` train (`vouched`: one initiation a gate
/// checked) through the core. Where one belongs to another worker, the rest
/// of the train goes with it (a train comes from one source, so one peer),
/// but a vouched initiation goes alone. The targets (the source's gate
/// worker, the peer's owner) do not depend on who asks, so a datagram is
/// passed on at most twice.
#[allow(clippy::too_many_arguments)]
fn train(
    w: &Worker<WgEncap>,
    s: &mut State,
    peers: &PeerTable,
    train: &[u8],
    stride: usize,
    src: SocketAddr,
    vouched: Option<u32>,
    ctr: &mut Local,
) {
    for seg in rx::train(train.len(), stride) {
        let Some((to, v)) = datagram(w, s, peers, &train[seg.clone()], src, vouched, ctr) else {
            continue;
        };
        if v.is_some() {
            let kind = Kind::Udp {
                src,
                stride: seg.len(),
                vouched: v,
            };
            hand_off(w, to, kind, &train[seg], ctr);
            continue;
        }
        let kind = Kind::Udp {
            src,
            stride,
            vouched: None,
        };
        hand_off(w, to, kind, &train[seg.start..], ctr);
        return;
    }
}

/// Up to [`INBOX_BUDGET`] packets other workers handed over.
fn inbox_step(w: &Worker<WgEncap>, s: &mut State, peers: &PeerTable, ctr: &mut Local) -> bool {
    let mut any = false;
    for _ in 0..INBOX_BUDGET {
        let Ok(mut m) = w.encap.inbox.rx.try_recv() else {
            break;
        };
        any = true;
        match m.kind {
            Kind::Tun => {
                if let Err(r) = WgEncap::tun_packet(w, s, peers, &mut m.buf[..m.len], ctr) {
                    ctr.drop(r, 1);
                }
            }
            Kind::Udp {
                src,
                stride,
                vouched,
            } => train(w, s, peers, &m.buf[..m.len], stride, src, vouched, ctr),
        }
        w.encap.hub.recycle(m.buf);
    }
    if any {
        flush_rx(w, s, ctr);
        flush_tx(w, &mut s.b.tx, ctr);
    }
    any
}

fn hand_off(w: &Worker<WgEncap>, to: usize, kind: Kind, data: &[u8], ctr: &mut Local) {
    match w.encap.hub.send(to, kind, data) {
        Ok(()) => ctr.add(Ctr::Handoffs, 1),
        Err(_) => ctr.drop(DropReason::Backlog, 1),
    }
}

/// Writes everything decrypted so far and frees the plaintext arena.
fn flush_rx(w: &Worker<WgEncap>, s: &mut State, ctr: &mut Local) {
    s.b.out.flush(&w.tun, &mut s.plain, ctr);
    s.plain_pos = 0;
}
