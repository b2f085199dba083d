//! The WireGuard worker's half of the run loop ([`crate::worker`]): an I/O
//! shell around [`Core`] (`path::wg`), which owns the sessions of the peers
//! this worker owns and decides everything per packet. The shell keeps one
//! socket on the listen port (receive and send: WireGuard peers learn our
//! endpoint from the source port), the inbox of packets other workers
//! handed over, the timer tick and the buffers, and is the core's [`Io`]:
//! its transmit queue, plaintext arena, handoffs and counters. See
//! [`super`] for the design.
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
use crate::path::rx::Delivery;
use crate::path::wg::{Config, Core, Io, Now, Out, Round, Train, TunTx};
use crate::peers::{Entry, PeerTable};
use crate::stats::{Ctr, Local};
use crate::sys::event::Event;
use crate::sys::udp::{BATCH, RxMeta, TxMsg, Udp};
use crate::tun_out::TunOut;
use crate::udp::worker::FLUSH_AT;
use crate::udp_tx;
use crate::worker::{self, Encapsulation, RX_SLOT, TUN_BUF, TxQueue, Worker, received};

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
    /// What the worker's core starts with.
    pub core: Config,
}

/// A worker's state: the core, the buffers and the round's time.
pub(crate) struct State {
    core: Core,
    b: worker::Buffers<TxMsg, RxMeta, RX_SLOTS>,
    /// Decrypted packets waiting for GRO and the TUN, and the bytes in use.
    plain: (Vec<u8>, usize),
    now: Now,
}

/// The worker as the core's [`Io`] for one step.
struct Shell<'a> {
    w: &'a Worker<WgEncap>,
    tx: &'a mut TxQueue<TxMsg>,
    out: &'a mut TunOut,
    plain: &'a mut (Vec<u8>, usize),
    ctr: &'a mut Local,
}

/// Splits `s` into the core, the time and the shell around them.
fn split<'a>(
    w: &'a Worker<WgEncap>,
    s: &'a mut State,
    ctr: &'a mut Local,
) -> (&'a mut Core, Now, Shell<'a>) {
    let (tx, out) = (&mut s.b.tx, &mut s.b.out);
    let io = Shell {
        w,
        tx,
        out,
        plain: &mut s.plain,
        ctr,
    };
    (&mut s.core, s.now, io)
}

/// The round's shared inputs: `peers`, the worker's modes, the time.
fn round<'t>(w: &Worker<WgEncap>, peers: &'t PeerTable, now: Now) -> Round<'t> {
    Round {
        table: peers,
        mode: w.anti_spoof.get(),
        vnet_hdr: w.vnet_hdr,
        now,
    }
}

fn flush_tx(w: &Worker<WgEncap>, tx: &mut TxQueue<TxMsg>, ctr: &mut Local) {
    udp_tx::send_all(&w.encap.sock, &tx.msgs, &tx.buf, &w.udp_gso, ctr);
    tx.clear();
}

impl Shell<'_> {
    /// Writes everything decrypted so far to the TUN and sends the queue.
    fn flush(&mut self) {
        self.out.flush(&self.w.tun, &mut self.plain.0, self.ctr);
        self.plain.1 = 0;
        flush_tx(self.w, self.tx, self.ctr);
    }

    fn pass(&mut self, to: usize, kind: Kind, data: &[u8]) {
        match self.w.encap.hub.send(to, kind, data) {
            Ok(()) => self.ctr.add(Ctr::Handoffs, 1),
            Err(_) => self.ctr.drop(DropReason::Backlog, 1),
        }
    }

    /// A TUN read (or one handed over) through the core.
    fn tun_tx(
        &mut self,
        core: &mut Core,
        cx: &Round<'_>,
        read: &mut [u8],
    ) -> Result<(), DropReason> {
        match core.tun_tx(cx, read, self)? {
            TunTx::HandOff(to) => self.pass(to, Kind::Tun, read),
            TunTx::Sent {
                entry,
                packets,
                bytes,
                cut,
            } => self.w.count_sent(entry, packets, bytes, cut, self.ctr),
        }
        Ok(())
    }
}

impl Out for Shell<'_> {
    fn room(&mut self, len: usize, datagrams: usize) -> &mut [u8] {
        if !self.tx.fits(len, datagrams) {
            flush_tx(self.w, self.tx, self.ctr);
        }
        &mut self.tx.buf[self.tx.pos..]
    }

    /// Appends to the last message when it extends an equal-size train
    /// (UDP GSO), else starts a new one.
    fn push(&mut self, to: SocketAddr, len: usize) {
        let start = self.tx.pos;
        self.tx.pos += len;
        let gso = self.w.udp_gso.load(Ordering::Relaxed);
        if !(gso
            && (self.tx.msgs.last_mut()).is_some_and(|m| udp_tx::extend_train(m, to, start, len)))
        {
            self.tx.msgs.push(udp_tx::single(to, start, len));
        }
    }
}

impl Io for Shell<'_> {
    fn plain(&mut self, len: usize) -> &mut [u8] {
        if self.plain.1 + len > self.plain.0.len() {
            self.out.flush(&self.w.tun, &mut self.plain.0, self.ctr);
            self.plain.1 = 0;
        }
        &mut self.plain.0[self.plain.1..]
    }

    fn deliver(&mut self, len: usize, from: Option<&Entry>, src: SocketAddr) {
        let start = self.plain.1;
        self.plain.1 += len;
        let d = Delivery {
            inner: start..start + len,
            from,
            unexpected: false,
        };
        self.w
            .deliver(self.out, &mut self.plain.0, 0, &d, src.ip(), self.ctr);
    }

    fn hand_off(&mut self, to: usize, d: &[u8], how: Train) {
        self.pass(to, Kind::Udp(how), d);
    }

    fn answered(&mut self, sent: u64) {
        self.ctr.add(Ctr::TxPackets, sent);
    }

    fn dropped(&mut self, reason: DropReason) {
        self.ctr.drop(reason, 1);
    }
}

impl Encapsulation for WgEncap {
    type State = State;
    const FLUSH_AT: usize = FLUSH_AT;

    fn state(w: &Worker<Self>) -> State {
        let now = Now::read();
        State {
            core: Core::new(Config {
                now: now.mono,
                ..w.encap.core.clone()
            }),
            b: worker::Buffers::new(w, TX_ARENA, TX_MSGS),
            plain: (vec![0; RX_SLOT * RX_SLOTS], 0),
            now,
        }
    }

    /// The clocks, a table swap, then packets other workers handed over.
    fn begin_round(
        w: &Worker<Self>,
        s: &mut State,
        peers: &Arc<PeerTable>,
        ctr: &mut Local,
    ) -> bool {
        s.now = Now::read();
        let (core, now, mut io) = split(w, s, ctr);
        core.follow(peers, now, &mut io);
        let cx = round(w, peers, now);
        let any = w.encap.inbox.take(&w.encap.hub, |kind, d| match kind {
            Kind::Tun => {
                if let Err(r) = io.tun_tx(core, &cx, d) {
                    io.ctr.drop(r, 1);
                }
            }
            Kind::Udp(how) => core.train(&cx, d, how, &mut io),
        });
        io.flush();
        any
    }

    fn tun_packet(
        w: &Worker<Self>,
        s: &mut State,
        peers: &PeerTable,
        read: &mut [u8],
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let (core, now, mut io) = split(w, s, ctr);
        io.tun_tx(core, &round(w, peers, now), read)
    }

    fn queued(s: &State) -> usize {
        s.b.tx.pos
    }

    fn flush(w: &Worker<Self>, s: &mut State, ctr: &mut Local) {
        flush_tx(w, &mut s.b.tx, ctr);
    }

    /// One `recvmmsg`; each train through the core.
    fn net_step(w: &Worker<Self>, s: &mut State, peers: &PeerTable, ctr: &mut Local) -> bool {
        let r = w.encap.sock.recv_batch(&mut s.b.rx, RX_SLOT, &mut s.b.meta);
        let Some(got) = received(r, ctr) else {
            return false;
        };
        // The receive arena is read while the rest of the state is the shell.
        let (arena, meta) = (std::mem::take(&mut s.b.rx), s.b.meta);
        let (core, now, mut io) = split(w, s, ctr);
        let cx = round(w, peers, now);
        for (i, m) in meta.iter().enumerate().take(got) {
            let t = &arena[i * RX_SLOT..i * RX_SLOT + m.len.min(RX_SLOT)];
            let how = Train {
                src: SocketAddr::new(m.src, m.src_port),
                stride: m.stride,
                vouched: None,
            };
            core.train(&cx, t, how, &mut io);
        }
        io.flush();
        s.b.rx = arena;
        true
    }

    /// Every timer tick, each owned peer's timers.
    fn end_round(w: &Worker<Self>, s: &mut State, ctr: &mut Local) {
        let (core, now, mut io) = split(w, s, ctr);
        core.tick(now, &mut io);
        if core.disco_due(now) {
            // A fresh nonce each round (a syscall every second at most).
            let mut nonce = [0u8; 16];
            if getrandom::fill(&mut nonce).is_ok() {
                let sent = core.disco_ask(now, nonce, &mut io);
                io.ctr.add(Ctr::TxPackets, sent as u64);
            }
        }
        io.flush();
    }

    fn net_fd(&self) -> RawFd {
        self.sock.raw_fd()
    }

    fn wake(&self) -> Option<&Event> {
        Some(&self.inbox.event)
    }
}
