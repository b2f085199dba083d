//! NAT traversal on the vxlan and flannel-UDP engine (docs/nat.md, "vxlan
//! and udp"): endpoint discovery and NAT keepalives on the backend port,
//! the I/O shell around the sans-IO discovery WireGuard uses too
//! ([`crate::path::wg::disco`]).
//!
//! - **Off by default**: until the control plane turns [`Discovery`] on,
//!   nothing here sends, and a `0xd1` datagram is dropped like any other
//!   that is neither VXLAN nor IP (`malformed`).
//! - **Receive** ([`Nat::receive`], every worker: the steering program
//!   hashes inner flows, so a discovery message lands on any worker):
//!   called only for a datagram that failed to be a valid VXLAN / IP packet
//!   (data pays nothing), whose first byte is `0xd1`. A request is answered
//!   from the worker's receive socket, i.e. the backend port, with a datagram
//!   of the same length; an answer is checked against the outstanding nonce
//!   in [`Discovery`]; a NAT keepalive is dropped without an answer. No
//!   allocation, no lock.
//! - **Send** ([`Ask::round`], worker 0 only, at the start of its round,
//!   when discovery is on): a discovery round when [`Asker`] says one is
//!   due (a random nonce each), and every [`KEEPALIVE`] (at once when the
//!   peer table changed) an 8-byte keepalive to each peer the table names
//!   ([`crate::peers::NatPath::keepalive`]), all from the receive socket
//!   (the backend port), so this node's NAT maps them as it maps the data
//!   sent to NAT peers ([`crate::peers::Entry::from_port`]).
//! - **Trust**: nothing received moves a peer: the peers' paths come from
//!   the peer table (the lease store) only.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use crate::path::wg::disco::{Asker, Discovery, Handled, KEEPALIVE, handle};
use crate::path::wg::{Now, Out};
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local};
use crate::sys::udp::{TxMsg, Udp};
use crate::wire::disco::{self, KEEPALIVE_MSG};

/// The largest message sent or answered here (a discovery message, 48 bytes).
const ROOM: usize = 64;

/// Sends each datagram when it is pushed, from `sock`.
struct SendNow<'a> {
    sock: &'a Udp,
    buf: [u8; ROOM],
    sent: u64,
    failed: u64,
}

impl<'a> SendNow<'a> {
    fn new(sock: &'a Udp) -> SendNow<'a> {
        SendNow {
            sock,
            buf: [0; ROOM],
            sent: 0,
            failed: 0,
        }
    }

    fn count(&self, ctr: &mut Local) {
        ctr.add(Ctr::TxPackets, self.sent);
        ctr.add(Ctr::UdpSendError, self.failed);
    }
}

impl Out for SendNow<'_> {
    fn room(&mut self, len: usize, _datagrams: usize) -> &mut [u8] {
        &mut self.buf[..len.min(ROOM)]
    }

    fn push(&mut self, to: SocketAddr, len: usize) {
        let msg = TxMsg {
            dst: to,
            start: 0,
            len: len.min(ROOM),
            segment: 0,
        };
        match self.sock.send_batch(&[msg], &self.buf) {
            Ok(1) => self.sent += 1,
            _ => self.failed += 1,
        }
    }
}

/// Every worker's part: the shared discovery state.
pub(crate) struct Nat {
    pub shared: Arc<Discovery>,
}

impl Nat {
    /// A datagram from `src` that failed to decapsulate: a discovery
    /// message or keepalive when discovery is on; whether it was taken
    /// (else the caller drops it for its own reason). Answers leave `sock`.
    pub(crate) fn receive(&self, d: &[u8], src: SocketAddr, sock: &Udp, ctr: &mut Local) -> bool {
        if !disco::maybe(d) || !self.shared.enabled() {
            return false;
        }
        let mut out = SendNow::new(sock);
        let taken = handle(d, src, &self.shared, Now::read(), &mut out) != Handled::No;
        out.count(ctr);
        taken
    }
}

/// Worker 0's asking side.
pub(crate) struct Ask {
    asker: Asker,
    next_keepalive: Instant,
    /// The table the last keepalives went to.
    table: usize,
}

impl Ask {
    pub(crate) fn new(shared: Arc<Discovery>) -> Ask {
        let now = Instant::now();
        Ask {
            asker: Asker::new(shared, now),
            next_keepalive: now,
            table: 0,
        }
    }

    /// A discovery round when due, keepalives when due, from `sock`;
    /// whether anything was sent.
    pub(crate) fn round(&mut self, peers: &Arc<PeerTable>, sock: &Udp, ctr: &mut Local) -> bool {
        if !self.asker.shared.enabled() {
            return false;
        }
        let now = Now::read();
        let mut out = SendNow::new(sock);
        if self.asker.due(now) {
            // A fresh nonce each round (a syscall every second at most).
            let mut nonce = [0u8; 16];
            if getrandom::fill(&mut nonce).is_ok() {
                self.asker.ask(now, nonce, &mut out);
            }
        }
        let table = Arc::as_ptr(peers) as usize;
        if now.mono >= self.next_keepalive || table != self.table {
            self.next_keepalive = now.mono + KEEPALIVE;
            self.table = table;
            for to in peers.keepalives() {
                out.buf[..KEEPALIVE_MSG.len()].copy_from_slice(&KEEPALIVE_MSG);
                out.push(*to, KEEPALIVE_MSG.len());
            }
        }
        out.count(ctr);
        out.sent > 0
    }
}
