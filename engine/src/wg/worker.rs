//! The WireGuard worker's half of the run loop ([`crate::worker`]): one
//! socket on the listen port (receive and send: WireGuard peers learn our
//! endpoint from the source port), the `Tunn`s of the peers it owns, its
//! inbox of packets other workers handed over, and its buffers. See
//! [`super`] for the design.
//!
//! Each round begins with a table swap, if there was one (sessions
//! reconciled, new ones greeted), and the inbox; it ends with the timers
//! every [`TIMER_TICK`].

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, SocketAddr};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use boringtun::noise::errors::WireGuardError;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Tunn, TunnResult};
use boringtun::x25519;

use super::handoff::{Hub, Inbox, Kind};
use super::seg::{segment_in_place, trust_tcp_checksum};
use super::{MIN_DST, OVERHEAD, TIMER_TICK, owner};
use crate::encap::DropReason;
use crate::path::rx::{self, Initiation};
use crate::path::tx::{self, WgRoute};
use crate::peers::{PeerTable, WgEntry};
use crate::stats::{Ctr, Local};
use crate::sys::event::Event;
use crate::sys::udp::{BATCH, RxMeta, TxMsg, Udp};
use crate::tun_out::TunOut;
use crate::udp::worker::FLUSH_AT;
use crate::udp_tx::{self, MAX_UDP_PAYLOAD};
use crate::worker::{Encapsulation, RX_SLOT, TUN_BUF, TxQueue, Worker, received};

/// Handed-off packets processed per step.
const INBOX_BUDGET: usize = 32;
const TX_ARENA: usize = 1 << 20;
const TX_MSGS: usize = 256;
const RX_SLOTS: usize = 16;

const _: () = assert!(TX_ARENA + 2 * RX_SLOT * RX_SLOTS + TUN_BUF <= 4 << 20);
const _: () = assert!(RX_SLOTS <= BATCH);

/// The WireGuard part of a worker.
pub(crate) struct WgEncap {
    /// Worker threads of the engine (peer owners, [`owner`]).
    pub workers: usize,
    pub sock: Udp,
    /// Our static key (answering initiations, [`rx::wg_initiation`]).
    pub secret: x25519::StaticSecret,
    /// Its public key.
    pub public: x25519::PublicKey,
    pub rate_limiter: Arc<RateLimiter>,
    pub hub: Arc<Hub>,
    pub inbox: Inbox,
}

/// Peers by id. Ids are small integers the peer table assigns (a packet
/// can only look one up, never add one), so a multiplicative hash is enough;
/// SipHash took 0.5 % of the CPU in a one-stream profile.
type ById<V> = HashMap<u32, V, BuildHasherDefault<IdHasher>>;

#[derive(Default)]
struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 = (self.0 ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    fn write_u32(&mut self, x: u32) {
        self.0 = u64::from(x).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

/// A peer this worker owns.
struct Owned {
    key: [u8; 32],
    psk: Option<[u8; 32]>,
    keepalive: u16,
    tunn: Box<Tunn>,
    /// The endpoint from the lease (a change resets `endpoint`).
    configured: SocketAddr,
    /// Where we send: `configured`, or the source of the last authenticated packet.
    endpoint: SocketAddr,
    /// A fresh `Tunn` that has not yet sent its first handshake initiation.
    greet: bool,
    /// The table's last-handshake slot for this peer (unix seconds).
    handshake: Arc<AtomicU64>,
    /// The table's last-initiation slot for this peer (unix milliseconds).
    initiated: Arc<AtomicU64>,
}

impl Owned {
    /// Records when `pkt`, about to be sent to the peer, is a handshake
    /// initiation (type 1): the peer remembers its timestamp.
    fn note_sent(&self, pkt: &[u8]) {
        if pkt.len() == MIN_DST && pkt[0] == 1 {
            let ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
            self.initiated.store(ms.max(1), Ordering::Relaxed);
        }
    }
}

pub(crate) struct Buffers {
    tx: TxQueue<TxMsg>,
    rx: Vec<u8>,
    plain: Vec<u8>,
    plain_pos: usize,
    meta: [RxMeta; RX_SLOTS],
    out: TunOut,
}

/// A worker's state: its buffers, the table its sessions follow, the
/// sessions of the peers it owns, and its timers.
pub(crate) struct State {
    b: Buffers,
    table: Arc<PeerTable>,
    owned: ById<Owned>,
    next_tick: Instant,
    next_reset: Instant,
}

/// What a `decapsulate` call produced, with the borrow of the output buffer ended.
enum Decap {
    Tunnel(usize, IpAddr),
    Network(usize),
    Done,
    Err(DropReason),
}

/// The drop reason counted for a boringtun error.
pub fn classify(e: &WireGuardError) -> DropReason {
    match e {
        WireGuardError::InvalidMac | WireGuardError::InvalidAeadTag | WireGuardError::WrongKey => {
            DropReason::DecryptFailure
        }
        WireGuardError::DuplicateCounter | WireGuardError::InvalidCounter => DropReason::Replay,
        WireGuardError::WrongIndex => DropReason::UnknownKey,
        WireGuardError::InvalidPacket
        | WireGuardError::IncorrectPacketLength
        | WireGuardError::WrongPacketType
        | WireGuardError::DestinationBufferTooSmall => DropReason::Malformed,
        _ => DropReason::Handshake,
    }
}

fn decap_result(r: TunnResult<'_>) -> Decap {
    match r {
        TunnResult::Done => Decap::Done,
        TunnResult::Err(e) => Decap::Err(classify(&e)),
        TunnResult::WriteToNetwork(p) => Decap::Network(p.len()),
        TunnResult::WriteToTunnelV4(p, a) => Decap::Tunnel(p.len(), IpAddr::V4(a)),
        TunnResult::WriteToTunnelV6(p, a) => Decap::Tunnel(p.len(), IpAddr::V6(a)),
    }
}

/// The peer id a datagram is addressed to, from its receiver index
/// (handshake responses, cookie replies, data). `None` for initiations and junk.
pub fn receiver_id(d: &[u8]) -> Option<u32> {
    let at = match d.first()? {
        2 => 8,
        3 | 4 => 4,
        _ => return None,
    };
    let b = d.get(at..at + 4)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) >> 8)
}

impl Encapsulation for WgEncap {
    type State = State;
    const FLUSH_AT: usize = FLUSH_AT;

    fn state(w: &Worker<Self>) -> State {
        let now = Instant::now();
        State {
            b: Buffers {
                tx: TxQueue::new(TX_ARENA, TX_MSGS),
                rx: vec![0; RX_SLOT * RX_SLOTS],
                plain: vec![0; RX_SLOT * RX_SLOTS],
                plain_pos: 0,
                meta: [RxMeta::default(); RX_SLOTS],
                out: TunOut::new(w.vnet_hdr, w.mtu, 2 * RX_SLOT),
            },
            // No table yet: the first round reconciles with the current one.
            table: Arc::new(PeerTable::default()),
            owned: ById::default(),
            next_tick: now + TIMER_TICK,
            next_reset: now,
        }
    }

    /// A table swap (sessions reconciled, new ones greeted), then the inbox.
    fn begin_round(
        w: &Worker<Self>,
        s: &mut State,
        peers: &Arc<PeerTable>,
        ctr: &mut Local,
    ) -> bool {
        if !Arc::ptr_eq(peers, &s.table) {
            s.table = Arc::clone(peers);
            w.reconcile(&s.table, &mut s.owned);
            w.greet(&mut s.owned, &mut s.b, ctr);
        }
        w.inbox_step(peers, &mut s.owned, &mut s.b, ctr)
    }

    fn tun_packet(
        w: &Worker<Self>,
        s: &mut State,
        peers: &PeerTable,
        read: &mut [u8],
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        w.on_tun_packet(peers, &mut s.owned, read, &mut s.b, ctr)
    }

    fn queued(s: &State) -> usize {
        s.b.tx.pos
    }

    fn flush(w: &Worker<Self>, s: &mut State, ctr: &mut Local) {
        w.flush_tx(&mut s.b, ctr);
    }

    fn net_step(w: &Worker<Self>, s: &mut State, peers: &PeerTable, ctr: &mut Local) -> bool {
        w.udp_step(peers, &mut s.owned, &mut s.b, ctr)
    }

    /// Every [`TIMER_TICK`], each owned peer's timers; every second (worker
    /// 0), the handshake rate limiter's count.
    fn end_round(w: &Worker<Self>, s: &mut State, ctr: &mut Local) {
        let now = Instant::now();
        if now >= s.next_tick {
            s.next_tick = now + TIMER_TICK;
            w.timers(&mut s.owned, &mut s.b, ctr);
        }
        if w.index == 0 && now >= s.next_reset {
            s.next_reset = now + std::time::Duration::from_secs(1);
            w.encap.rate_limiter.reset_count();
        }
    }

    fn net_fd(&self) -> RawFd {
        self.sock.raw_fd()
    }

    fn wake(&self) -> Option<&Event> {
        Some(&self.inbox.event)
    }
}

impl Worker<WgEncap> {
    /// Creates, replaces or drops `Tunn`s so that `owned` matches the peers of
    /// `table` this worker owns. Runs on table swaps only (control-plane pace).
    fn reconcile(&self, table: &PeerTable, owned: &mut ById<Owned>) {
        owned.retain(|id, o| {
            table
                .wg_by_id(*id)
                .is_some_and(|w| w.params.public_key == o.key)
        });
        for w in table.wg_peers() {
            if owner(w.id, self.encap.workers) != self.index {
                continue;
            }
            match owned.get_mut(&w.id) {
                Some(o) if o.psk == w.params.psk && o.keepalive == w.params.keepalive => {
                    o.handshake = Arc::clone(&w.handshake);
                    o.initiated = Arc::clone(&w.initiated);
                    if o.configured != w.endpoint {
                        o.configured = w.endpoint;
                        o.endpoint = w.endpoint;
                    }
                }
                _ => {
                    owned.insert(w.id, self.new_owned(w));
                }
            }
        }
    }

    fn new_owned(&self, w: &WgEntry) -> Owned {
        let ka = (w.params.keepalive > 0).then_some(w.params.keepalive);
        let tunn = Tunn::new(
            self.encap.secret.clone(),
            x25519::PublicKey::from(w.params.public_key),
            w.params.psk,
            ka,
            w.id,
            Some(self.encap.rate_limiter.clone()),
        );
        Owned {
            key: w.params.public_key,
            psk: w.params.psk,
            keepalive: w.params.keepalive,
            tunn: Box::new(tunn),
            configured: w.endpoint,
            endpoint: w.endpoint,
            greet: true,
            handshake: Arc::clone(&w.handshake),
            initiated: Arc::clone(&w.initiated),
        }
    }

    /// Sends a handshake initiation from every `Tunn` created since the last
    /// call. A peer that still holds a session with our previous incarnation
    /// (same key, restarted process) keeps encrypting with it, and nothing we
    /// can decrypt arrives until its own rekey timer (up to 15 s); our
    /// initiation replaces that session within one round trip.
    fn greet(&self, owned: &mut ById<Owned>, b: &mut Buffers, ctr: &mut Local) {
        let mut any = false;
        for o in owned.values_mut().filter(|o| o.greet) {
            o.greet = false;
            if !b.tx.fits(MIN_DST, 1) {
                self.flush_tx(b, ctr);
            }
            let start = b.tx.pos;
            let end = start + MIN_DST;
            if let TunnResult::WriteToNetwork(p) = o
                .tunn
                .format_handshake_initiation(&mut b.tx.buf[start..end], false)
            {
                let len = p.len();
                o.note_sent(p);
                self.queue(b, o.endpoint, start, len);
                b.tx.pos += len;
                any = true;
            }
        }
        if any {
            self.flush_tx(b, ctr);
        }
    }

    // === handoff ===

    fn inbox_step(
        &self,
        table: &PeerTable,
        owned: &mut ById<Owned>,
        b: &mut Buffers,
        ctr: &mut Local,
    ) -> bool {
        let mut any = false;
        for _ in 0..INBOX_BUDGET {
            let Ok(mut m) = self.encap.inbox.rx.try_recv() else {
                break;
            };
            any = true;
            match m.kind {
                Kind::Tun => {
                    if let Err(r) = self.on_tun_packet(table, owned, &mut m.buf[..m.len], b, ctr) {
                        ctr.drop(r, 1);
                    }
                }
                Kind::Udp { src, stride } => {
                    for seg in rx::train(m.len, stride) {
                        self.on_datagram(table, owned, &m.buf[seg], src, b, ctr);
                    }
                }
            }
            self.encap.hub.recycle(m.buf);
        }
        if any {
            self.flush_rx(b, ctr);
            self.flush_tx(b, ctr);
        }
        any
    }

    fn hand_off(&self, to: usize, kind: Kind, data: &[u8], ctr: &mut Local) {
        match self.encap.hub.send(to, kind, data) {
            Ok(()) => ctr.add(Ctr::Handoffs, 1),
            Err(_) => ctr.drop(DropReason::Backlog, 1),
        }
    }

    // === TUN -> UDP ===

    /// One TUN read: routed by [`tx::wg_route`], handed off or segmented in
    /// place + encrypted + queued.
    fn on_tun_packet(
        &self,
        table: &PeerTable,
        owned: &mut ById<Owned>,
        read: &mut [u8],
        b: &mut Buffers,
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let workers = self.encap.workers;
        let (id, entry, pkt) = match tx::wg_route(table, read, self.vnet_hdr, self.index, workers)?
        {
            WgRoute::HandOff(home) => {
                self.hand_off(home, Kind::Tun, read, ctr);
                return Ok(());
            }
            WgRoute::Local { id, entry, pkt } => (id, entry, pkt),
        };
        let peer = owned.get_mut(&id).ok_or(DropReason::NoRoute)?;
        let ip = &mut read[pkt.start..];
        match tx::Shape::of(&pkt.hdr, tx::WG_CUTS)? {
            tx::Shape::Tcp(size) => {
                let (mut segs, mut bytes) = (0u64, 0u64);
                segment_in_place(ip, size, |seg| {
                    segs += 1;
                    bytes += seg.len() as u64;
                    self.encrypt(peer, seg, b, ctr);
                })?;
                ctr.add(Ctr::GsoSuperPackets, 1);
                entry.counters.add(self.index, true, segs, bytes);
            }
            tx::Shape::Single(csum) => {
                tx::single(ip, csum, MAX_UDP_PAYLOAD - OVERHEAD)?;
                entry.counters.add(self.index, true, 1, ip.len() as u64);
                self.encrypt(peer, ip, b, ctr);
            }
            tx::Shape::Udp(_) => return Err(DropReason::Malformed),
        }
        Ok(())
    }

    /// Encrypts one inner packet for `peer` into the TX arena and queues it.
    fn encrypt(&self, peer: &mut Owned, plain: &[u8], b: &mut Buffers, ctr: &mut Local) {
        let len = plain.len();
        let need = (len + OVERHEAD).max(MIN_DST);
        if !b.tx.fits(need, 1) {
            self.flush_tx(b, ctr);
        }
        let start = b.tx.pos;
        let out = match peer
            .tunn
            .encapsulate(plain, &mut b.tx.buf[start..start + need])
        {
            TunnResult::WriteToNetwork(p) => p.len(),
            TunnResult::Done => return,
            TunnResult::Err(e) => {
                ctr.drop(classify(&e), 1);
                return;
            }
            TunnResult::WriteToTunnelV4(..) | TunnResult::WriteToTunnelV6(..) => return,
        };
        // A handshake initiation instead of data means the packet was queued.
        if out == len + OVERHEAD {
            ctr.add(Ctr::TxPackets, 1);
            ctr.add(Ctr::TxBytes, len as u64);
        } else {
            peer.note_sent(&b.tx.buf[start..start + out]);
        }
        self.queue(b, peer.endpoint, start, out);
        b.tx.pos += out;
    }

    /// Appends `tx[start..start+len]` to the last message when it extends an
    /// equal-size train (UDP GSO), else starts a new one.
    fn queue(&self, b: &mut Buffers, dst: SocketAddr, start: usize, len: usize) {
        if self.udp_gso.load(Ordering::Relaxed)
            && let Some(m) = b.tx.msgs.last_mut()
            && udp_tx::extend_train(m, dst, start, len)
        {
            return;
        }
        b.tx.msgs.push(udp_tx::single(dst, start, len));
    }

    fn flush_tx(&self, b: &mut Buffers, ctr: &mut Local) {
        udp_tx::send_all(&self.encap.sock, &b.tx.msgs, &b.tx.buf, &self.udp_gso, ctr);
        b.tx.clear();
    }

    fn timers(&self, owned: &mut ById<Owned>, b: &mut Buffers, ctr: &mut Local) {
        let now = SystemTime::now();
        for o in owned.values_mut() {
            if let Some(at) = o
                .tunn
                .time_since_last_handshake()
                .and_then(|d| now.checked_sub(d))
            {
                let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                o.handshake.store(secs, Ordering::Relaxed);
            }
            if !b.tx.fits(MIN_DST, 1) {
                self.flush_tx(b, ctr);
            }
            let start = b.tx.pos;
            if let TunnResult::WriteToNetwork(p) = o.tunn.update_timers(&mut b.tx.buf[start..]) {
                let len = p.len();
                o.note_sent(p);
                self.queue(b, o.endpoint, start, len);
                b.tx.pos += len;
            }
        }
        self.flush_tx(b, ctr);
    }

    // === UDP -> TUN ===

    fn udp_step(
        &self,
        table: &PeerTable,
        owned: &mut ById<Owned>,
        b: &mut Buffers,
        ctr: &mut Local,
    ) -> bool {
        let r = self.encap.sock.recv_batch(&mut b.rx, RX_SLOT, &mut b.meta);
        let Some(got) = received(r, ctr) else {
            return false;
        };
        // Take the receive arena out so that segments can be borrowed while `b` is mutated.
        let arena = std::mem::take(&mut b.rx);
        for i in 0..got {
            let m = b.meta[i];
            let base = i * RX_SLOT;
            let len = m.len.min(RX_SLOT);
            let src = SocketAddr::new(m.src, m.src_port);
            if len == 0 {
                ctr.drop(DropReason::Malformed, 1);
                continue;
            }
            let first = &arena[base..base + m.stride.min(len)];
            let home = match receiver_id(first) {
                Some(id) => owner(id, self.encap.workers),
                None => self.index,
            };
            if home != self.index {
                self.hand_off(
                    home,
                    Kind::Udp {
                        src,
                        stride: m.stride,
                    },
                    &arena[base..base + len],
                    ctr,
                );
                continue;
            }
            for seg in rx::train(len, m.stride) {
                let d = &arena[base + seg.start..base + seg.end];
                self.on_datagram(table, owned, d, src, b, ctr);
            }
        }
        b.rx = arena;
        self.flush_rx(b, ctr);
        self.flush_tx(b, ctr);
        true
    }

    /// One WireGuard message from `src`.
    fn on_datagram(
        &self,
        table: &PeerTable,
        owned: &mut ById<Owned>,
        d: &[u8],
        src: SocketAddr,
        b: &mut Buffers,
        ctr: &mut Local,
    ) {
        let id = match receiver_id(d) {
            Some(id) => id,
            None => match self.initiator(table, d, src, b, ctr) {
                Some(id) => id,
                None => return,
            },
        };
        let home = owner(id, self.encap.workers);
        if home != self.index {
            self.hand_off(
                home,
                Kind::Udp {
                    src,
                    stride: d.len(),
                },
                d,
                ctr,
            );
            return;
        }
        let Some(peer) = owned.get_mut(&id) else {
            ctr.drop(DropReason::UnknownKey, 1);
            return;
        };
        let data = d.first() == Some(&4);
        let res = if data {
            if b.plain_pos + d.len() > b.plain.len() {
                self.flush_rx(b, ctr);
            }
            let s = b.plain_pos;
            decap_result(peer.tunn.decapsulate(Some(src.ip()), d, &mut b.plain[s..]))
        } else {
            if !b.tx.fits(MIN_DST.max(d.len()), 1) {
                self.flush_tx(b, ctr);
            }
            let s = b.tx.pos;
            decap_result(peer.tunn.decapsulate(Some(src.ip()), d, &mut b.tx.buf[s..]))
        };
        match res {
            Decap::Tunnel(len, inner_src) => {
                let from = match rx::wg(self.anti_spoof.get(), table, id, inner_src, len) {
                    Ok(from) => from,
                    Err(r) => {
                        ctr.drop(r, 1);
                        return;
                    }
                };
                if let Some(e) = from {
                    e.counters.add(self.index, false, 1, len as u64);
                }
                peer.endpoint = src;
                let start = b.plain_pos;
                b.plain_pos += len;
                ctr.add(Ctr::RxPackets, 1);
                ctr.add(Ctr::RxBytes, len as u64);
                self.deliver_plain(b, start, len, ctr);
            }
            Decap::Network(len) => {
                // A handshake answer (boringtun answers data with nothing).
                peer.endpoint = src;
                if !data {
                    let start = b.tx.pos;
                    self.queue(b, src, start, len);
                    b.tx.pos += len;
                }
                // Then what boringtun queued while it had no session.
                self.drain_queued(peer, b, ctr);
            }
            Decap::Done => {}
            Decap::Err(r) => ctr.drop(r, 1),
        }
    }

    /// Sends the packets boringtun queued while it had no session.
    fn drain_queued(&self, peer: &mut Owned, b: &mut Buffers, ctr: &mut Local) {
        loop {
            if !b.tx.fits(RX_SLOT, 1) {
                self.flush_tx(b, ctr);
            }
            let s = b.tx.pos;
            match peer
                .tunn
                .decapsulate(None, &[], &mut b.tx.buf[s..s + RX_SLOT])
            {
                TunnResult::WriteToNetwork(p) => {
                    let len = p.len();
                    self.queue(b, peer.endpoint, s, len);
                    b.tx.pos += len;
                    ctr.add(Ctr::TxPackets, 1);
                }
                _ => break,
            }
        }
    }

    /// A handshake initiation (or junk): [`rx::wg_initiation`]; a cookie
    /// reply it asks for is queued to `src`.
    fn initiator(
        &self,
        table: &PeerTable,
        d: &[u8],
        src: SocketAddr,
        b: &mut Buffers,
        ctr: &mut Local,
    ) -> Option<u32> {
        let e = &self.encap;
        let mut cookie = [0u8; 64];
        let r = rx::wg_initiation(
            &e.rate_limiter,
            &e.secret,
            &e.public,
            table,
            d,
            src.ip(),
            &mut cookie,
        );
        match r {
            Ok(Initiation::Peer(id)) => return Some(id),
            Ok(Initiation::Cookie(len)) => {
                if !b.tx.fits(len, 1) {
                    self.flush_tx(b, ctr);
                }
                let s = b.tx.pos;
                b.tx.buf[s..s + len].copy_from_slice(&cookie[..len]);
                self.queue(b, src, s, len);
                b.tx.pos += len;
                ctr.drop(DropReason::Handshake, 1);
            }
            Err(r) => ctr.drop(r, 1),
        }
        None
    }

    /// Hands a decrypted packet `plain[start..start+len]` to GRO (or the TUN).
    fn deliver_plain(&self, b: &mut Buffers, start: usize, len: usize, ctr: &mut Local) {
        if self.vnet_hdr {
            trust_tcp_checksum(&mut b.plain[start..start + len]);
        }
        b.out.push(&self.tun, &mut b.plain, start, len, ctr);
    }

    /// Writes everything decrypted so far and frees the plaintext arena.
    fn flush_rx(&self, b: &mut Buffers, ctr: &mut Local) {
        b.out.flush(&self.tun, &mut b.plain, ctr);
        b.plain_pos = 0;
    }
}
