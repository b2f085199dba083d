//! Endpoint discovery on a backend's own port (docs/nat.md; the messages are
//! [`crate::wire::disco`]): the asking side and the answering side, sans-IO.
//! One implementation for every backend that has it: WireGuard's
//! [`super::Core`] runs it on worker 0 (and [`receive`] adds relays and
//! direct probes), the vxlan and flannel-UDP engine (`udp/nat.rs`) through
//! [`Asker`] on worker 0 and [`handle`] on every worker.
//!
//! - **Off by default.** [`Discovery`] is shared by the engine's cores and
//!   the control plane; until [`Discovery::set_enabled`] nothing is sent and
//!   a discovery message is dropped like any other datagram that is not
//!   WireGuard (`malformed`), so the wire is what it was without it.
//! - **No cost on the data path.** The receive path looks at a datagram's
//!   first byte only after WireGuard's own check refused it; it allocates
//!   nothing and takes no lock (the servers are an `ArcSwap` load, the
//!   answer one atomic store).
//! - **Asking** (worker 0 only; the steering program sends every discovery
//!   message there, byte 5 being 0): every [`SLOW`] (every [`FAST`], with
//!   [`backoff`] while rounds go unanswered, until an answer came, when the last one is older than three [`SLOW`]s, or while
//!   a kept-alive peer's handshakes have stopped, [`STALE`]) a
//!   fresh random nonce goes to each server, at most [`MAX_SERVERS`], from
//!   the listen port, so a NAT maps the request exactly as it maps the
//!   node's WireGuard traffic. 15 s is half of the 30 s that Linux keeps
//!   an unreplied UDP mapping (`nf_conntrack_udp_timeout`) and below
//!   WireGuard's 25 s keepalive that holds it, so a mapping that changed is
//!   seen again within one round; the measured recovery is in docs/nat.md.
//! - **Answering** (any node with discovery on): a request gets an answer
//!   of the same length to its source, naming that source. No state is kept.
//! - **Trust.** An answer counts only when it echoes the outstanding nonce
//!   (kept in [`Discovery`], so any worker can check an answer: the vxlan
//!   and udp engines' steering does not send it to worker 0) and comes
//!   from a server asked; then it changes only what this node
//!   publishes about itself ([`Discovery::seen`]), never where a peer's
//!   traffic goes: that moves only with the peer table (the lease store)
//!   or WireGuard's authenticated roaming.
//!
//! - **Relays** (docs/nat.md, "Relays"; the relay is [`super::relay`]):
//!   the control plane gives [`Discovery::set_relays`] ready-made
//!   registrations (their MAC needs the node's key); worker 0 sends each
//!   one to its relay's relay port every [`REGISTER_EVERY`] from the
//!   listen port, and notes when a relay acknowledged (an ack counts only
//!   from the relay asked and echoing that registration's MAC), which the
//!   control plane reads to tell a live relay from a silent one.
//!
//! - **Direct probes** while relayed ([`super::direct`]): worker 0 sends a
//!   new set once, and answers and notes kinds 5 and 6.
//!
//! IPv4 only: an answer naming an IPv6 source is accepted on the wire but
//! not published (NAT66 is out of scope).

use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use arc_swap::ArcSwap;

use super::direct::{self, Direct};
use super::{Io, Now, Out, Rx};
use crate::encap::DropReason;
use crate::wire::direct::DirectMsg;
#[cfg(test)]
use crate::wire::disco::FIRST;
use crate::wire::disco::{self, Disco, LEN, REGISTER_LEN, RelayMsg};

/// The round while no answer is known (and while starting): a node behind
/// NAT publishes its endpoint about a second after its engine starts.
pub const FAST: Duration = Duration::from_secs(1);
/// The round once an answer is known (see the module docs).
pub const SLOW: Duration = Duration::from_secs(15);
/// A kept-alive peer whose last handshake is older than this has lost its
/// path: WireGuard starts a new handshake 120 s into a session
/// (`REKEY_AFTER_TIME`) and retries every 5 s, so a live peer with a
/// persistent keepalive never gets here; then discovery runs its [`FAST`]
/// round (a NAT mapping may have changed under the node).
pub const STALE: Duration = Duration::from_secs(135);
/// How often the vxlan and udp engines send a NAT keepalive
/// ([`crate::wire::disco::KEEPALIVE_MSG`]) to each peer that gets one
/// ([`crate::peers::NatPath`]): WireGuard's advice for NAT, the same
/// persistent keepalive its peers get, below the 30 s Linux keeps an
/// unreplied UDP mapping (`nf_conntrack_udp_timeout`).
pub const KEEPALIVE: Duration = Duration::from_secs(25);
/// At most this many servers are asked each round.
pub const MAX_SERVERS: usize = 4;
/// The longest wait between rounds that got no answer: a round that goes
/// unanswered doubles the next wait from [`FAST`] (1, 2, 4, 8, 16, 30 s),
/// so servers that never answer (a peer that lost its address, or
/// firewalls it) are not asked every second forever; any answer brings
/// [`FAST`] back. 30 s is twice [`SLOW`]: at most one round more than a
/// node with answers needs to see a new mapping.
pub const BACKOFF_CAP: Duration = Duration::from_secs(30);

/// The wait after `unanswered` rounds in a row without an answer.
pub fn backoff(unanswered: u32) -> Duration {
    FAST.saturating_mul(1u32 << unanswered.min(5))
        .min(BACKOFF_CAP)
}
/// At most this many relays are registered with.
pub const MAX_RELAYS: usize = 4;
/// How often a node registers with each relay: often enough that three
/// missed acks (a relay gone silent, [`RELAY_SILENT`]) are noticed within
/// 6 s, and far below the 30 s Linux keeps an unreplied UDP mapping. A
/// 64-byte datagram per relay every 2 s costs nothing measurable.
pub const REGISTER_EVERY: Duration = Duration::from_secs(2);
/// A relay that acknowledged nothing for this long is silent: three
/// registrations in a row went unanswered.
pub const RELAY_SILENT: Duration = Duration::from_secs(3 * 2 + 1);

/// A registration to send: the relay's relay address and the message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registration {
    /// The relay's address and relay port.
    pub to: SocketAddr,
    /// The message ([`super::relay::registration`]).
    pub msg: [u8; REGISTER_LEN],
}

/// The discovery state the cores and the control plane share.
#[derive(Debug, Default)]
pub struct Discovery {
    enabled: AtomicBool,
    servers: ArcSwap<Vec<SocketAddr>>,
    /// The last IPv4 answer: `1 << 48 | address << 16 | port`, 0 for none.
    seen: AtomicU64,
    /// When it came, Unix milliseconds.
    seen_at: AtomicU64,
    /// Requests answered (this node as a server).
    answered: AtomicU64,
    /// A core saw a kept-alive peer without a recent handshake ([`STALE`]).
    hurry: AtomicBool,
    /// Bumped when the servers change.
    generation: AtomicU64,
    /// The relays to register with.
    relays: ArcSwap<Vec<Registration>>,
    /// When each of them (by index) last acknowledged, Unix milliseconds.
    acks: [AtomicU64; MAX_RELAYS],
    /// Direct probes while relayed ([`super::direct`]).
    pub direct: Direct,
    /// The outstanding nonce (two halves; written by worker 0 when a round
    /// starts, read by any worker an answer reaches), and whether one is.
    nonce: [AtomicU64; 2],
    asking: AtomicBool,
    /// Valid answers received (worker 0's [`Asker`] notes new ones), and
    /// when the last came, Unix milliseconds.
    answers: AtomicU64,
    answer_at: AtomicU64,
}

impl Discovery {
    /// Turns discovery on or off (asking and answering).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::Relaxed);
    }

    /// Whether it is on.
    pub fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    /// The peers to ask (their listen address and port). A changed list
    /// starts the [`backoff`] over.
    pub fn set_servers(&self, servers: Vec<SocketAddr>) {
        if **self.servers.load() != servers {
            self.servers.store(Arc::new(servers));
            self.generation.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The endpoint this node was last seen from, and when the answer came.
    pub fn seen(&self) -> Option<(SocketAddrV4, SystemTime)> {
        let v = self.seen.load(Ordering::Acquire);
        if v == 0 {
            return None;
        }
        let ip = Ipv4Addr::from(((v >> 16) & 0xffff_ffff) as u32);
        let at = UNIX_EPOCH + Duration::from_millis(self.seen_at.load(Ordering::Relaxed));
        Some((SocketAddrV4::new(ip, v as u16), at))
    }

    /// Asks for the [`FAST`] round: a peer's handshakes stopped.
    pub fn hurry(&self) {
        self.hurry.store(true, Ordering::Relaxed);
    }

    /// The relays to register with (at most [`MAX_RELAYS`]); a relay kept
    /// from the last list keeps its last ack.
    pub fn set_relays(&self, relays: Vec<Registration>) {
        let old = self.relays.load();
        let mut times = [0u64; MAX_RELAYS];
        for (i, r) in relays.iter().take(MAX_RELAYS).enumerate() {
            if let Some(j) = old.iter().position(|o| o.to == r.to) {
                times[i] = self.acks.get(j).map_or(0, |a| a.load(Ordering::Relaxed));
            }
        }
        self.relays.store(Arc::new(relays));
        for (a, t) in self.acks.iter().zip(times) {
            a.store(t, Ordering::Relaxed);
        }
    }

    /// When the relay at `to` last acknowledged a registration.
    pub fn relay_ack(&self, to: SocketAddr) -> Option<SystemTime> {
        let i = self.relays.load().iter().position(|r| r.to == to)?;
        let ms = self.acks.get(i)?.load(Ordering::Relaxed);
        (ms != 0).then(|| UNIX_EPOCH + Duration::from_millis(ms))
    }

    /// Requests this node answered.
    pub fn answered(&self) -> u64 {
        self.answered.load(Ordering::Relaxed)
    }

    fn set_nonce(&self, nonce: [u8; 16]) {
        let (hi, lo) = split_nonce(nonce);
        self.nonce[0].store(hi, Ordering::Relaxed);
        self.nonce[1].store(lo, Ordering::Relaxed);
        self.asking.store(true, Ordering::Release);
    }

    /// An answer from `src` naming `seen`: published when it echoes the
    /// outstanding nonce and comes from a server asked; whether it was.
    /// Any worker may call it (two relaxed loads against a 128-bit nonce:
    /// a read torn by a new round only refuses an answer).
    pub(crate) fn answer(
        &self,
        nonce: [u8; 16],
        seen: SocketAddr,
        src: SocketAddr,
        now: Now,
    ) -> bool {
        let (hi, lo) = split_nonce(nonce);
        if !self.asking.load(Ordering::Acquire)
            || self.nonce[0].load(Ordering::Relaxed) != hi
            || self.nonce[1].load(Ordering::Relaxed) != lo
            || !self.servers.load().contains(&src)
        {
            return false;
        }
        if let SocketAddr::V4(v4) = seen {
            self.publish(v4, now);
        }
        self.answer_at.store(now.unix_ms(), Ordering::Relaxed);
        self.answers.fetch_add(1, Ordering::Release);
        true
    }

    fn publish(&self, seen: SocketAddrV4, now: Now) {
        let v = 1 << 48 | u64::from(u32::from(*seen.ip())) << 16 | u64::from(seen.port());
        self.seen_at.store(now.unix_ms(), Ordering::Relaxed);
        self.seen.store(v, Ordering::Release);
    }
}

fn split_nonce(n: [u8; 16]) -> (u64, u64) {
    let mut hi = [0u8; 8];
    let mut lo = [0u8; 8];
    hi.copy_from_slice(&n[..8]);
    lo.copy_from_slice(&n[8..]);
    (u64::from_ne_bytes(hi), u64::from_ne_bytes(lo))
}

/// Worker 0's asking side: the next round (the outstanding nonce is in
/// [`Discovery`]).
#[derive(Debug)]
pub(crate) struct Asker {
    pub shared: Arc<Discovery>,
    /// The answers [`Discovery::answer`] took, as last noted.
    answers: u64,
    next: Instant,
    last_answer: Option<Instant>,
    next_register: Instant,
    /// Whether the outstanding nonce was answered.
    answered: bool,
    /// Rounds in a row without an answer ([`backoff`]).
    unanswered: u32,
    /// Requests the last round sent, and the servers' generation then.
    sent: usize,
    generation: u64,
    /// The generation of the last direct probes sent.
    probes: u64,
}

impl Asker {
    pub fn new(shared: Arc<Discovery>, now: Instant) -> Asker {
        Asker {
            shared,
            answers: 0,
            next: now,
            last_answer: None,
            next_register: now,
            answered: false,
            unanswered: 0,
            sent: 0,
            generation: 0,
            probes: 0,
        }
    }

    /// Whether a round is due (the caller then draws a nonce); notes an
    /// answer that came since the last look.
    pub fn due(&mut self, now: Now) -> bool {
        self.note_answers(now);
        let now = now.mono;
        self.shared.enabled()
            && (now >= self.next
                || (now >= self.next_register && !self.shared.relays.load().is_empty())
                || self.shared.direct.generation() != self.probes)
    }

    /// One round: a request with `nonce` to each server when discovery is
    /// due, a registration to each relay when that is, a new set of direct
    /// probes ([`super::direct`]) once; how many datagrams.
    pub fn ask(&mut self, now: Now, nonce: [u8; 16], out: &mut impl Out) -> usize {
        let mut sent = 0;
        let probes = self.shared.direct.generation();
        if probes != self.probes {
            self.probes = probes;
            sent += self.shared.direct.send(out);
        }
        if now.mono >= self.next_register {
            self.next_register = now.mono + REGISTER_EVERY;
            for r in self.shared.relays.load().iter().take(MAX_RELAYS) {
                let room = out.room(REGISTER_LEN, 1);
                if let Some(dst) = room.get_mut(..REGISTER_LEN) {
                    dst.copy_from_slice(&r.msg);
                    out.push(r.to, REGISTER_LEN);
                    sent += 1;
                }
            }
        }
        if now.mono < self.next {
            return sent;
        }
        sent + self.discover(now, nonce, out)
    }

    fn discover(&mut self, now: Now, nonce: [u8; 16], out: &mut impl Out) -> usize {
        let hurry = self.shared.hurry.swap(false, Ordering::Relaxed);
        let fresh = !hurry
            && self
                .last_answer
                .is_some_and(|t| now.mono.saturating_duration_since(t) < 3 * SLOW);
        // Only a round that asked someone counts; new servers start over.
        let generation = self.shared.generation.load(Ordering::Relaxed);
        if generation != self.generation {
            self.generation = generation;
            self.unanswered = 0;
        } else if self.sent > 0 && !self.answered {
            self.unanswered = self.unanswered.saturating_add(1);
        }
        self.answered = false;
        self.next = now.mono
            + if fresh {
                SLOW
            } else {
                backoff(self.unanswered)
            };
        self.shared.set_nonce(nonce);
        let servers = self.shared.servers.load();
        let mut sent = 0;
        for s in servers.iter().take(MAX_SERVERS) {
            let room = out.room(LEN, 1);
            if let Some(n) = (Disco::Request { nonce }).write(room) {
                out.push(*s, n);
                sent += 1;
            }
        }
        self.sent = sent;
        sent
    }

    /// Notes the answers [`Discovery::answer`] took since the last look:
    /// the round was answered, the next one waits [`SLOW`] from the answer.
    fn note_answers(&mut self, now: Now) {
        let n = self.shared.answers.load(Ordering::Acquire);
        if n == self.answers {
            return;
        }
        self.answers = n;
        let ago = now
            .unix_ms()
            .saturating_sub(self.shared.answer_at.load(Ordering::Relaxed));
        let now = (now.mono)
            .checked_sub(Duration::from_millis(ago))
            .unwrap_or(now.mono);
        self.last_answer = Some(now);
        self.answered = true;
        self.unanswered = 0;
        if !self.shared.hurry.load(Ordering::Relaxed) {
            self.next = now + SLOW;
        }
    }
}

/// What [`handle`] did with a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handled {
    /// A request, answered (one datagram pushed).
    Answered,
    /// A valid answer, or a NAT keepalive: consumed, nothing sent.
    Taken,
    /// Not one of these (or not valid): the caller goes on or drops it.
    No,
}

/// The backend-neutral part of the receive side, on any worker, for a
/// datagram `d` from `src` whose first byte is `0xd1`, discovery being on:
/// a request is answered to its source with the same length, naming it; an
/// answer is checked ([`Discovery::answer`]); a NAT keepalive
/// ([`disco::is_keepalive`]) is taken without an answer.
pub fn handle(
    d: &[u8],
    src: SocketAddr,
    shared: &Discovery,
    now: Now,
    out: &mut impl Out,
) -> Handled {
    if disco::is_keepalive(d) {
        return Handled::Taken;
    }
    match Disco::parse(d) {
        Ok(Disco::Request { nonce }) => {
            let room = out.room(LEN, 1);
            let seen = match src {
                SocketAddr::V6(a) => match a.ip().to_ipv4_mapped() {
                    Some(v4) => SocketAddr::new(IpAddr::V4(v4), a.port()),
                    None => src,
                },
                v4 => v4,
            };
            match (Disco::Answer { nonce, seen }).write(room) {
                Some(n) => {
                    out.push(src, n);
                    shared.answered.fetch_add(1, Ordering::Relaxed);
                    Handled::Answered
                }
                None => Handled::No,
            }
        }
        Ok(Disco::Answer { nonce, seen }) if shared.answer(nonce, seen, src, now) => Handled::Taken,
        _ => Handled::No,
    }
}

/// A datagram WireGuard refused, from `src`: a discovery message when
/// discovery is on and it parses (`me`: this worker; worker 0 handles them).
pub(super) fn receive(
    d: &[u8],
    src: SocketAddr,
    me: usize,
    shared: &Discovery,
    now: Now,
    io: &mut impl Io,
) -> Rx<'static> {
    if !disco::maybe(d) || !shared.enabled() {
        return Rx::Drop(DropReason::Malformed);
    }
    if me != 0 {
        return Rx::HandOff {
            to: 0,
            vouched: None,
        };
    }
    match handle(d, src, shared, now, io) {
        Handled::Answered => return Rx::Done { sent: 1 },
        Handled::Taken => return Rx::Done { sent: 0 },
        Handled::No => {}
    }
    match Disco::parse(d) {
        Ok(_) => Rx::Drop(DropReason::Malformed),
        Err(_) if let Ok(m) = DirectMsg::parse(d) => {
            direct::receive(m, d, src, &shared.direct, now, io)
        }
        Err(_) => match RelayMsg::parse(d) {
            Ok(RelayMsg::Ack { mac, .. }) => {
                let relays = shared.relays.load();
                let i = relays
                    .iter()
                    .position(|r| r.to == src && r.msg[48..] == mac);
                match i.and_then(|i| shared.acks.get(i)) {
                    Some(a) => {
                        a.store(now.unix_ms(), Ordering::Relaxed);
                        Rx::Done { sent: 0 }
                    }
                    None => Rx::Drop(DropReason::Malformed),
                }
            }
            _ => Rx::Drop(DropReason::Malformed),
        },
    }
}

#[cfg(test)]
#[path = "disco_tests.rs"]
mod tests;
