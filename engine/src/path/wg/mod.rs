//! The WireGuard core, sans-IO: one worker's WireGuard sessions and every
//! per-packet decision about them, over caller buffers, with the time as an
//! argument ([`Now`], in the [`Round`] every call gets). The worker
//! (`wg/worker.rs`) only reads, writes, hands off and counts around it,
//! through the [`Out`] and [`Io`] it implements; the fuzz target,
//! `tests/pipeline.rs` and the criterion benches drive the same [`Core`].
//!
//! - [`Core::tun_tx`]: a TUN read -> its peer; handed off to the peer's
//!   owner worker, or segmented in place ([`seg`]) and encrypted into the
//!   caller's [`Out`] (a handshake initiation instead when the session is
//!   not up: boringtun queues the packets).
//! - [`Core::datagram`]: a received datagram -> deliver `plain[..len]`
//!   (decrypted, AllowedIPs checked, a TCP checksum marked trusted),
//!   answers written to [`Out`] (handshake response, cookie reply,
//!   keepalive, packets that waited for the handshake), hand off to worker
//!   `w`, or drop for a reason. Handshake messages pass the [`gate`] first;
//!   authenticated packets move the peer's endpoint to their source
//!   (roaming). [`Core::train`] takes a received `UDP_GRO` train through it
//!   and tells the [`Io`] what became of each datagram, which part of the
//!   train another worker takes included.
//! - [`Core::follow`] (a new peer table: sessions created, kept or
//!   dropped, new ones greeted with an initiation) and [`Core::tick`] (the
//!   protocol's timers every [`TIMER_TICK`]).
//!
//! Sessions are boringtun's `Tunn`s; the message and time limits and the
//! replay window are enforced by the patched boringtun weft builds
//! (`third_party/boringtun`, see its `PATCHES.md`), on every packet, the
//! gate and the AllowedIPs check here. boringtun reads no clock of its
//! own: every call hands it `now` first (`boringtun::clock::set`), so its
//! timers and session ages run on the same time as every decision here.

pub mod direct;
pub mod disco;
pub mod fixmap;
pub mod gate;
mod io;
mod peer;
pub mod relay;
pub mod seg;
pub mod sim;

pub use io::{Io, Now, Out, Round, Rx, Train, TunTx};

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, UNIX_EPOCH};

use boringtun::noise::handshake::parse_handshake_anon;
use boringtun::noise::rate_limiter::RateLimiter;
use boringtun::noise::{Packet, Tunn};
use boringtun::x25519;

use crate::antispoof::AntiSpoofing;
use crate::encap::DropReason;
use crate::encap::wg::{MIN_DST, OVERHEAD, classify, holds_ip_header, owner, source_allowed};
use crate::path::rx;
use crate::path::tx::{self, Outer, Shape, WgRoute};
use crate::peers::{PeerTable, WgEntry};
use crate::wire::wg::{self as msg, Message};
use gate::{Gate, Load, Verdict};
use peer::{ById, Decap, Owned, Run, decap, seal};

/// How often each peer's timers run (boringtun's own device uses 250 ms).
pub const TIMER_TICK: Duration = Duration::from_millis(250);
/// Room [`Core::datagram`] asks for to send one packet that waited for a
/// handshake (a TUN packet up to 64 KiB, encrypted).
const DRAIN_ROOM: usize = 65536 + OVERHEAD;

/// The worker whose gate checks initiations from `src`: one per source
/// address, so that its token bucket lives in one place.
pub fn gate_worker(src: IpAddr, workers: usize) -> usize {
    let h = match src {
        IpAddr::V4(a) => u64::from(u32::from(a)),
        IpAddr::V6(a) => (u128::from(a) >> 64) as u64,
    };
    (h.wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40) as usize % workers.max(1)
}

/// What a core needs to start.
#[derive(Clone)]
pub struct Config {
    /// This worker's index.
    pub me: usize,
    /// Workers of the engine.
    pub workers: usize,
    /// Our static private key.
    pub secret: [u8; 32],
    /// 64 random bytes (the gate's cookie secret and nonce key).
    pub seed: [u8; 64],
    /// The engine's handshake load, shared by all cores.
    pub load: Arc<Load>,
    /// When the core starts.
    pub now: Instant,
    /// Endpoint discovery, shared by the engine's cores ([`disco`]; off
    /// until the control plane turns it on).
    pub disco: Arc<disco::Discovery>,
}

/// One worker's WireGuard sessions (see the module docs).
pub struct Core {
    me: usize,
    workers: usize,
    secret: x25519::StaticSecret,
    public: x25519::PublicKey,
    /// boringtun's own limiter, given to every `Tunn`: it re-checks MAC1
    /// and is never under load (the [`gate`] decides).
    mac1_only: Arc<RateLimiter>,
    gate: Gate,
    /// The table the sessions follow.
    table: Arc<PeerTable>,
    owned: ById<Owned>,
    next_tick: Instant,
    disco: Arc<disco::Discovery>,
    /// Worker 0's side that asks ([`disco`]).
    asker: Option<disco::Asker>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("me", &self.me)
            .field("peers", &self.owned.len())
            .finish()
    }
}

impl Core {
    /// A core owning no peer yet (the first [`Core::follow`] creates them).
    pub fn new(c: Config) -> Core {
        boringtun::clock::set(c.now);
        let secret = x25519::StaticSecret::from(c.secret);
        let public = x25519::PublicKey::from(&secret);
        Core {
            me: c.me,
            workers: c.workers.max(1),
            gate: Gate::new(public.as_bytes(), c.seed, c.load),
            mac1_only: Arc::new(RateLimiter::new(&public, u64::MAX)),
            secret,
            public,
            table: Arc::new(PeerTable::default()),
            owned: ById::default(),
            next_tick: c.now + TIMER_TICK,
            asker: (c.me == 0).then(|| disco::Asker::new(Arc::clone(&c.disco), c.now)),
            disco: c.disco,
        }
    }

    /// Follows `table` if it is not the one the sessions follow: creates,
    /// replaces or drops `Tunn`s so that they match the peers this worker
    /// owns (control-plane pace), and greets new ones with an initiation (a
    /// peer still holding a session with our previous incarnation would
    /// otherwise keep using it until its own 15 s rekey). Whether it did.
    pub fn follow(&mut self, table: &Arc<PeerTable>, now: Now, out: &mut impl Out) -> bool {
        if Arc::ptr_eq(table, &self.table) {
            return false;
        }
        boringtun::clock::set(now.mono);
        self.table = Arc::clone(table);
        self.owned.retain(|id, o| {
            table
                .wg_by_id(*id)
                .is_some_and(|w| w.params.public_key == o.key)
        });
        for w in table.wg_peers() {
            if owner(w.id, self.workers) != self.me {
                continue;
            }
            match self.owned.get_mut(&w.id) {
                Some(o) if o.psk == w.params.psk && o.keepalive == w.params.keepalive => {
                    o.handshake = Arc::clone(&w.handshake);
                    o.initiated = Arc::clone(&w.initiated);
                    o.seen = Arc::clone(&w.seen);
                    if o.configured != w.endpoint {
                        o.configured = w.endpoint;
                        o.endpoint = w.endpoint;
                        // NAT traversal: a peer's published endpoint moved
                        // (a hole to punch): greet it there now rather than
                        // at the next retry, up to 5 s later.
                        o.greet = self.disco.enabled();
                    }
                }
                _ => {
                    let o = self.new_owned(w);
                    self.owned.insert(w.id, o);
                }
            }
        }
        for o in self.owned.values_mut().filter(|o| o.greet) {
            o.greet = false;
            o.send(MIN_DST, now, out, |t, b| {
                t.format_handshake_initiation(b, false)
            });
        }
        true
    }

    fn new_owned(&self, w: &WgEntry) -> Owned {
        let ka = (w.params.keepalive > 0).then_some(w.params.keepalive);
        let tunn = Tunn::new(
            self.secret.clone(),
            x25519::PublicKey::from(w.params.public_key),
            w.params.psk,
            ka,
            w.id,
            Some(Arc::clone(&self.mac1_only)),
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
            seen: Arc::clone(&w.seen),
        }
    }

    /// One TUN read (`read` is exactly what was read, edited in place):
    /// routed, handed off, or segmented and encrypted into `out`.
    pub fn tun_tx<'t>(
        &mut self,
        cx: &Round<'t>,
        read: &mut [u8],
        out: &mut impl Out,
    ) -> Result<TunTx<'t>, DropReason> {
        let (me, workers, now) = (self.me, self.workers, cx.now);
        let route = tx::wg_plan(cx.table, read, cx.vnet_hdr, (me, workers), usize::MAX)?;
        let plan = match route {
            WgRoute::HandOff(to) => return Ok(TunTx::HandOff(to)),
            WgRoute::Here(plan) => plan,
        };
        let (entry, need) = (plan.entry, plan.need);
        let Outer::Wg { id } = plan.outer else {
            return Err(DropReason::NoRoute);
        };
        let peer = self.owned.get_mut(&id).ok_or(DropReason::NoRoute)?;
        boringtun::clock::set(now.mono);
        let ip = &mut read[plan.pkt.start..];
        let size = match plan.shape {
            Shape::Tcp(size) => Some(size),
            _ => None,
        };
        // Room for the datagrams, and for a handshake initiation in place of the last.
        let room = out.room(need + MIN_DST, plan.datagrams);
        let mut run = Run::default();
        match size {
            Some(size) => {
                seg::segment_in_place(ip, size, |s| {
                    let r = peer.tunn.encapsulate(s, &mut room[run.pos..]);
                    run.add(seal(peer, r, s.len(), now), s.len());
                })?;
            }
            None => {
                let r = peer.tunn.encapsulate(ip, room);
                run.add(seal(peer, r, ip.len(), now), ip.len());
            }
        }
        run.push(peer.endpoint, out);
        if let (0, 0, Some(r)) = (run.data, run.init, run.err) {
            return Err(r);
        }
        Ok(TunTx::Sent {
            entry,
            packets: run.data as u64,
            bytes: run.bytes,
            cut: size.is_some(),
        })
    }

    /// One received datagram `d` from `src` (`vouched`: handed over by a
    /// gate that found its initiator's id). A decrypted packet goes to the
    /// room [`Io::plain`] gives, answers to the [`Out`].
    pub fn datagram<'t>(
        &mut self,
        cx: &Round<'t>,
        d: &[u8],
        src: SocketAddr,
        vouched: Option<u32>,
        io: &mut impl Io,
    ) -> Rx<'t> {
        let Ok(m) = Message::new_checked(d) else {
            // Not WireGuard: perhaps endpoint discovery (one byte compared).
            return disco::receive(d, src, self.me, &self.disco, cx.now, io);
        };
        let now = cx.now;
        boringtun::clock::set(now.mono);
        let id = match (vouched, m.receiver()) {
            (Some(id), _) => id,
            (None, Some(r)) => r >> 8,
            (None, None) => match self.initiation(cx.table, &m, src, now, io) {
                Ok(Some(id)) => id,
                Ok(None) => {
                    let to = gate_worker(src.ip(), self.workers);
                    return Rx::HandOff { to, vouched: None };
                }
                Err(r) => return Rx::Drop(r),
            },
        };
        let home = owner(id, self.workers);
        if home != self.me {
            let vouched = m.receiver().is_none().then_some(id);
            return Rx::HandOff { to: home, vouched };
        }
        if m.kind() == msg::RESPONSE
            && let Err(r) = self.gate(&m, src, now, io)
        {
            return Rx::Drop(r);
        }
        let Some(peer) = self.owned.get_mut(&id) else {
            return Rx::Drop(DropReason::UnknownKey);
        };
        let data = m.kind() == msg::DATA;
        let res = if data {
            let plain = io.plain(d.len());
            if plain.len() < d.len() {
                return Rx::Drop(DropReason::Malformed);
            }
            let res = decap(peer.tunn.decapsulate(Some(src.ip()), d, plain));
            if let (Decap::Tunnel(len, _), true) = (res, cx.vnet_hdr) {
                seg::trust_tcp_checksum(&mut plain[..len]);
            }
            res
        } else {
            let room = io.room(MIN_DST.max(d.len()), 1);
            decap(peer.tunn.decapsulate(Some(src.ip()), d, room))
        };
        match res {
            Decap::Tunnel(len, inner_src) => {
                if !holds_ip_header(inner_src, len) {
                    return Rx::Drop(DropReason::Malformed);
                }
                let from = source_allowed(cx.table, id, inner_src);
                if from.is_none() && cx.mode != AntiSpoofing::Off {
                    return Rx::Drop(DropReason::SpoofedSource);
                }
                peer.endpoint = src;
                Rx::Deliver { len, from }
            }
            Decap::Network(len) => {
                // A handshake answer (boringtun answers data with nothing).
                peer.endpoint = src;
                if !data {
                    peer.note_sent(&io.room(len, 1)[..len], now);
                    io.push(src, len);
                }
                let mut sent = 0;
                while peer.send(DRAIN_ROOM, now, io, |t, b| t.decapsulate(None, &[], b)) {
                    sent += 1;
                }
                Rx::Done { sent }
            }
            // A keepalive is authenticated: roam; a cookie reply is not.
            Decap::Done => {
                if data {
                    peer.endpoint = src;
                }
                Rx::Done { sent: 0 }
            }
            Decap::Err(r) => Rx::Drop(r),
        }
    }

    /// A received `UDP_GRO` train `t` (arrived as `how`) through
    /// [`Core::datagram`], each outcome told to `io`. Where another worker
    /// takes a datagram, an initiation a gate vouched for goes alone and
    /// anything else takes the rest of the train with it (a train comes
    /// from one source, so one peer). The targets (the source's gate
    /// worker, the peer's owner) do not depend on who asks, so a datagram
    /// is passed on at most twice.
    pub fn train(&mut self, cx: &Round<'_>, t: &[u8], how: Train, io: &mut impl Io) {
        if t.is_empty() {
            return io.dropped(DropReason::Malformed);
        }
        let src = how.src;
        for seg in rx::train(t.len(), how.stride) {
            match self.datagram(cx, &t[seg.clone()], src, how.vouched, io) {
                Rx::Deliver { len, from } => io.deliver(len, from, src),
                Rx::Done { sent } => io.answered(sent),
                Rx::Drop(reason) => io.dropped(reason),
                Rx::HandOff { to, vouched: None } => {
                    let rest = Train {
                        vouched: None,
                        ..how
                    };
                    return io.hand_off(to, &t[seg.start..], rest);
                }
                Rx::HandOff { to, vouched } => {
                    io.hand_off(to, &t[seg], Train { vouched, ..how });
                }
            }
        }
    }

    /// The gate's verdict on the handshake message `m` from `src`; a cookie
    /// reply goes back to `src` (and the message is dropped).
    fn gate(
        &mut self,
        m: &Message<&[u8]>,
        src: SocketAddr,
        now: Now,
        out: &mut impl Out,
    ) -> Result<(), DropReason> {
        let mut reply = [0u8; msg::COOKIE_REPLY_LEN];
        match self.gate.check(m, src, now.mono, &mut reply) {
            Verdict::Pass => Ok(()),
            Verdict::Cookie => {
                out.room(reply.len(), 1)[..reply.len()].copy_from_slice(&reply);
                out.push(src, reply.len());
                Err(DropReason::Handshake)
            }
            Verdict::Drop(r) => Err(r),
        }
    }

    /// An initiation `m` from `src`: MAC1 anywhere; then this worker's gate
    /// if it is the source's ([`gate_worker`], else `Ok(None)`: hand it
    /// there) and the initiator's static key, which names its peer.
    fn initiation(
        &mut self,
        table: &PeerTable,
        m: &Message<&[u8]>,
        src: SocketAddr,
        now: Now,
        out: &mut impl Out,
    ) -> Result<Option<u32>, DropReason> {
        if m.kind() != msg::INITIATION {
            return Err(DropReason::Malformed);
        }
        if !self.gate.mac1_ok(m) {
            return Err(DropReason::DecryptFailure);
        }
        if gate_worker(src.ip(), self.workers) != self.me {
            return Ok(None);
        }
        self.gate(m, src, now, out)?;
        let Ok(Packet::HandshakeInit(h)) = Tunn::parse_incoming_packet(m.as_bytes()) else {
            return Err(DropReason::Malformed);
        };
        let half =
            parse_handshake_anon(&self.secret, &self.public, &h).map_err(|e| classify(&e))?;
        match table.wg_by_key(&half.peer_static_public) {
            Some(w) => Ok(Some(w.id)),
            None => Err(DropReason::UnknownKey),
        }
    }

    /// Every [`TIMER_TICK`]: each owned peer's timers (retries, rekeys,
    /// keepalives into `out`) and its last handshake published. Whether
    /// they ran.
    pub fn tick(&mut self, now: Now, out: &mut impl Out) -> bool {
        if now.mono < self.next_tick {
            return false;
        }
        self.next_tick = now.mono + TIMER_TICK;
        boringtun::clock::set(now.mono);
        let disco = self.disco.enabled();
        let mut stale = false;
        for o in self.owned.values_mut() {
            let age = o.tunn.time_since_last_handshake();
            if let Some(at) = age.and_then(|d| now.wall.checked_sub(d)) {
                let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
                o.handshake.store(secs, Ordering::Relaxed);
            }
            stale |= disco && o.keepalive > 0 && age.is_none_or(|a| a > disco::STALE);
            let unix = |ago: Option<Duration>| {
                let at = ago.and_then(|d| now.wall.checked_sub(d));
                at.and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                    .map_or(0, |d| (d.as_millis() as u64).max(1))
            };
            o.seen.publish(
                unix(o.tunn.time_since_last_received()),
                unix(o.tunn.time_since_last_data_sent()),
                o.endpoint,
            );
            o.send(MIN_DST, now, out, |t, b| t.update_timers(b));
        }
        if stale {
            self.disco.hurry();
        }
        true
    }

    /// Whether a discovery round is due (worker 0, discovery on): the
    /// caller draws a random nonce and calls [`Core::disco_ask`].
    pub fn disco_due(&mut self, now: Now) -> bool {
        self.asker.as_mut().is_some_and(|a| a.due(now))
    }

    /// A discovery round: a request with `nonce` to each server; how many.
    pub fn disco_ask(&mut self, now: Now, nonce: [u8; 16], out: &mut impl Out) -> usize {
        match self.asker.as_mut() {
            Some(a) => a.ask(now, nonce, out),
            None => 0,
        }
    }

    /// Where the core sends to peer `id` now (its endpoint after roaming).
    pub fn endpoint(&self, id: u32) -> Option<SocketAddr> {
        self.owned.get(&id).map(|o| o.endpoint)
    }

    /// The `Tunn` of peer `id` (tests: to drive a session's limits).
    #[cfg(test)]
    pub(crate) fn tunn(&mut self, id: u32) -> Option<&mut Tunn> {
        self.owned.get_mut(&id).map(|o| &mut *o.tunn)
    }
}

#[cfg(test)]
mod tests;
