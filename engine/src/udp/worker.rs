//! The flannel-UDP/VXLAN worker's half of the run loop
//! ([`crate::worker`]): a receive socket (shared port via `SO_REUSEPORT`)
//! and [`SEND_SOCKETS`] send sockets on ephemeral ports.
//!
//! - TUN -> UDP: each read is planned by [`tx::udp_plan`]; a TCP
//!   super-packet is sent at once without a payload copy
//!   ([`gather::udp_gather`] writes header blocks into the TX arena, the
//!   payload stays in the TUN read; [`udp_tx::send_gathered`]), anything
//!   else is segmented (USO) or copied into the TX arena with headroom and
//!   headed by [`tx::udp_write`], and queued as `sendmmsg` messages whose equal-size
//!   runs become one `UDP_SEGMENT` train; the arena is sent once it holds
//!   [`FLUSH_AT`] bytes, when full and at the end of the TUN step.
//! - UDP -> TUN: one `recvmmsg` (with `UDP_GRO` trains), [`rx::udp_from`]
//!   per segment (decap + anti-spoofing; over an IPv6 underlay the inner
//!   TCP checksum trusted, [`rx::outer_checksum_covers`]), userspace GRO,
//!   one `writev` per (coalesced) packet.
//! - NAT traversal ([`super::nat`], docs/nat.md "vxlan and udp"): a peer
//!   entry [`crate::peers::Entry::from_port`] is sent from the receive
//!   socket (the backend port) instead of a send socket; a datagram that
//!   failed to decapsulate may be a discovery message or keepalive; worker
//!   0 asks and sends keepalives at the start of its round.

use std::cell::Cell;
use std::io::IoSlice;
use std::net::{Ipv4Addr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::nat::{Ask, Nat};
use crate::encap::{Codec, DropReason};
use crate::path::tx::{self, Refusal};
use crate::path::{gather, rx, tap};
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local};
use crate::sys::udp::{BATCH, RxMeta, TxMsg, Udp};
use crate::udp_tx;
use crate::wire::{ipv4, vnet};
use crate::worker::{self, Encapsulation, RX_SLOT, TUN_BUF, TxQueue, Worker, in_batches, received};

/// Send sockets (= distinct outer source ports) per worker; flows are hashed onto them.
pub const SEND_SOCKETS: usize = 4;
const TX_ARENA: usize = 1 << 20;
/// Queued bytes after which a TUN step sends before reading on: the arena
/// holds about 15 super-packets, and waiting for all of them delayed the
/// first while the peer's worker idled. WireGuard, where a super-packet
/// takes ~40 us to encrypt, gained 5 % in A-B runs; flannel-UDP and VXLAN,
/// within noise (+2-4 %).
pub(crate) const FLUSH_AT: usize = 128 << 10;
const TX_MSGS: usize = 256;
const RX_SLOTS: usize = 32;

// Memory budget per worker, checked at compile time: TX arena + RX arena + TUN buffer.
const _: () = assert!(TX_ARENA + RX_SLOT * RX_SLOTS + TUN_BUF <= 4 << 20);
const _: () = assert!(RX_SLOTS <= BATCH);

/// The flannel-UDP/VXLAN part of a worker.
pub(crate) struct UdpEncap {
    pub codec: Codec,
    pub rx: Udp,
    pub tx: Vec<Udp>,
    /// Source of ICMP net-unreachables (flannel-UDP).
    pub icmp_src: Option<Ipv4Addr>,
    /// NAT traversal's discovery state.
    pub nat: Nat,
    /// VXLAN TCP super-packets go here whole, the kernel segments them
    /// (`EngineConfig::tunnel_tap`, [`tap`]).
    pub tap: Option<TapTx>,
}

/// This worker's queue of the tunnel TAP.
pub(crate) struct TapTx {
    pub queue: crate::sys::tun::Queue,
    pub side: tap::TapSide,
    /// The next outer IP ID (the kernel counts on per segment).
    pub id: Cell<u16>,
}

impl UdpEncap {
    /// Send socket `i`; one past the send sockets, the receive socket (the
    /// backend port: [`crate::peers::Entry::from_port`]).
    fn sock(&self, i: usize) -> Option<&Udp> {
        self.tx.get(i).or((i == self.tx.len()).then_some(&self.rx))
    }
}

/// A worker's state: its buffers and, on worker 0, the asking side of
/// NAT traversal.
pub(crate) struct State {
    b: Buffers,
    ask: Option<Ask>,
    /// Something is queued for the receive socket (so a flush without NAT
    /// peers makes no pass more over the queue).
    port_queued: bool,
}

/// A queued message plus the send socket it leaves through.
#[derive(Clone, Copy)]
pub(crate) struct Queued {
    msg: TxMsg,
    sock: usize,
}

type Buffers = worker::Buffers<Queued, RxMeta, RX_SLOTS>;

impl Encapsulation for UdpEncap {
    type State = State;
    const FLUSH_AT: usize = FLUSH_AT;

    fn state(w: &Worker<Self>) -> State {
        State {
            b: Buffers::new(w, TX_ARENA, TX_MSGS),
            ask: (w.index == 0).then(|| Ask::new(Arc::clone(&w.encap.nat.shared))),
            port_queued: false,
        }
    }

    /// Worker 0: NAT traversal's discovery round and keepalives when due
    /// (one relaxed load while it is off).
    fn begin_round(
        w: &Worker<Self>,
        s: &mut State,
        peers: &Arc<PeerTable>,
        ctr: &mut Local,
    ) -> bool {
        match s.ask.as_mut() {
            Some(a) => a.round(peers, &w.encap.rx, ctr),
            None => false,
        }
    }

    /// Planned by [`tx::udp_plan`], written into the arena by
    /// [`tx::udp_write`] (after a flush if it does not fit), queued.
    fn tun_packet(
        w: &Worker<Self>,
        s: &mut State,
        peers: &PeerTable,
        read: &mut [u8],
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let e = &w.encap;
        let plan = match tx::udp_plan(&e.codec, peers, read, w.vnet_hdr, s.b.tx.buf.len()) {
            Ok(p) => p,
            Err(r) => {
                if let Refusal::Unreachable { start } = r {
                    w.send_unreachable(&read[start..], ctr);
                }
                return Err(r.reason());
            }
        };
        let sock = if plan.entry.from_port {
            e.tx.len()
        } else {
            (tx::flow_hash(&read[plan.pkt.start..]) as usize) % e.tx.len().max(1)
        };
        if matches!(plan.shape, tx::Shape::Tcp(_)) {
            // Gathered: what is queued goes first (order, and the arena is
            // free for the header blocks), then the super-packet, before the
            // next read overwrites it.
            flush(w, s, ctr);
            let b = &mut s.b;
            // Not for a NAT peer: the TAP's datagrams do not leave the
            // backend port ([`crate::peers::Entry::from_port`]).
            if let Some(t) = &e.tap
                && !plan.entry.from_port
                && w.tap_send(t, &plan, read, &mut b.tx.buf, ctr)
            {
                return Ok(());
            }
            if let Some(g) = gather::udp_gather(&e.codec, &plan, read, &mut b.tx.buf)?
                && let Some(s) = e.sock(sock)
            {
                let ip = &read[plan.pkt.start..];
                udp_tx::send_gathered(s, plan.entry.dst, &g, (&b.tx.buf, ip), &w.udp_gso, ctr);
                let inner = g.count * (g.head - plan.headroom) + g.payload_bytes();
                w.count_sent(plan.entry, g.count as u64, inner as u64, true, ctr);
                return Ok(());
            }
        }
        if !s.b.tx.fits(plan.need, plan.datagrams) {
            flush(w, s, ctr);
        }
        // Queued for the receive socket: the next flush sends it too.
        s.port_queued |= plan.entry.from_port;
        let b = &mut s.b;
        let start = b.tx.pos;
        let out = tx::udp_write(&e.codec, &plan, read, &mut b.tx.buf[start..])?;
        for i in 0..out.count() {
            let r = out.range(i);
            w.queue(&mut b.tx, plan.entry.dst, sock, start + r.start, r.len());
        }
        b.tx.pos += out.segs.total_len();
        w.count_tx(plan.entry, &out, ctr);
        Ok(())
    }

    fn queued(s: &State) -> usize {
        s.b.tx.pos
    }

    /// Sends the queue, socket by socket.
    fn flush(w: &Worker<Self>, s: &mut State, ctr: &mut Local) {
        flush(w, s, ctr);
    }

    /// One `recvmmsg`; [`rx::udp`] for each datagram of each train; one
    /// that fails may be NAT traversal's ([`Nat::receive`]).
    fn net_step(w: &Worker<Self>, s: &mut State, peers: &PeerTable, ctr: &mut Local) -> bool {
        let b = &mut s.b;
        let e = &w.encap;
        let Some(got) = received(e.rx.recv_batch(&mut b.rx, RX_SLOT, &mut b.meta), ctr) else {
            return false;
        };
        let mode = w.anti_spoof.get();
        for i in 0..got {
            let m = b.meta[i];
            let base = i * RX_SLOT;
            let len = m.len.min(RX_SLOT);
            let entries = peers.endpoint_entries(m.src);
            if len == 0 {
                if let Err(r) = rx::udp(&e.codec, mode, peers, entries, &mut []) {
                    ctr.drop(r, 1);
                }
                continue;
            }
            for seg in rx::train(len, m.stride) {
                let dgram = &mut b.rx[base + seg.start..base + seg.end];
                match rx::udp_from(&e.codec, mode, peers, (m.src, entries), dgram) {
                    Ok(d) => w.deliver(&mut b.out, &mut b.rx, base + seg.start, &d, m.src, ctr),
                    Err(r) => {
                        let src = SocketAddr::new(m.src, m.src_port);
                        if !e.nat.receive(dgram, src, &e.rx, ctr) {
                            ctr.drop(r, 1);
                        }
                    }
                }
            }
        }
        b.out.flush(&w.tun, &mut b.rx, ctr);
        true
    }

    fn net_fd(&self) -> RawFd {
        self.rx.raw_fd()
    }
}

/// Sends the queue, socket by socket (the receive socket last, when
/// anything is queued for it).
fn flush(w: &Worker<UdpEncap>, s: &mut State, ctr: &mut Local) {
    let q = &mut s.b.tx;
    let socks = w.encap.tx.len() + usize::from(std::mem::take(&mut s.port_queued));
    for si in 0..socks {
        let Some(sock) = w.encap.sock(si) else {
            continue;
        };
        let msgs = q.msgs.iter().filter(|m| m.sock == si).map(|m| m.msg);
        in_batches::<_, BATCH>(msgs, |batch| {
            udp_tx::send_all(sock, batch, &q.buf, &w.udp_gso, ctr);
        });
    }
    q.clear();
}

impl Worker<UdpEncap> {
    /// The planned TCP super-packet of `read` written whole to the tunnel
    /// TAP (header block in `buf`); false when [`tap::tunnel_header`] does
    /// not take it or the write fails (a TAP that is down: `EIO`), and the
    /// caller sends it through its sockets.
    fn tap_send(
        &self,
        t: &TapTx,
        plan: &tx::Plan<'_>,
        read: &[u8],
        buf: &mut [u8],
        ctr: &mut Local,
    ) -> bool {
        let ip = &read[plan.pkt.start..];
        let tx::Shape::Tcp(mss) = plan.shape else {
            return false;
        };
        // Source ports spread by flow, as kernel vxlan's `udp_flow_src_port`.
        let sport = 49152 | (tx::flow_hash(ip) as u16 & 0x3fff);
        let (segs, inner) = tap::segments(ip, usize::from(plan.pkt.hdr.csum_start), mss);
        let id = t.id.get();
        let Some(n) = tap::tunnel_header(&self.encap.codec, plan, ip, t.side, (sport, id), buf)
        else {
            return false;
        };
        if t.queue
            .writev(&[IoSlice::new(&buf[..n]), IoSlice::new(ip)])
            .is_err()
        {
            ctr.add(Ctr::TunWriteError, 1);
            return false;
        }
        t.id.set(id.wrapping_add(segs as u16));
        self.count_sent(plan.entry, segs as u64, inner as u64, true, ctr);
        true
    }

    /// Appends `tx[start..start+len]` to the last message when it extends an
    /// equal-size train on the same socket (UDP GSO), else starts a new one.
    fn queue(
        &self,
        q: &mut TxQueue<Queued>,
        dst: SocketAddr,
        sock: usize,
        start: usize,
        len: usize,
    ) {
        if self.udp_gso.load(Ordering::Relaxed)
            && let Some(last) = q.msgs.last_mut()
            && last.sock == sock
            && udp_tx::extend_train(&mut last.msg, dst, start, len)
        {
            return;
        }
        q.msgs.push(Queued {
            msg: udp_tx::single(dst, start, len),
            sock,
        });
    }

    /// flannel-UDP: ICMP net-unreachable back into the TUN for the unroutable `pkt`.
    fn send_unreachable(&self, pkt: &[u8], ctr: &mut Local) {
        let Some(src) = self.encap.icmp_src else {
            return;
        };
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
}
