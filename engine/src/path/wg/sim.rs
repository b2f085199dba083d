//! Two WireGuard cores joined by an in-memory wire (as quinn tests its
//! endpoints): node 1 (10.244.1.0/24 at 192.0.2.1) and node 2
//! (10.244.2.0/24 at 192.0.2.2), one worker each, fixed keys, time
//! advanced by hand. The unit tests, `tests/pipeline.rs`, the `wg` fuzz
//! target and the criterion benches drive the real [`Core`] through it.
//! Set-up code: it allocates (never inside [`Wire`]'s steady state) and
//! panics on impossible set-ups.

use std::net::{IpAddr, SocketAddr};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use super::gate::{Load, UNDER_LOAD};
use super::{Config, Core, Io, Now, Out, Round, Rx, Train};
use crate::DropReason;
use crate::antispoof::AntiSpoofing;
use crate::peers::{Entry, Peer, PeerTable, WgPeer};

/// Static private keys of node 1 and node 2.
pub const KEYS: [[u8; 32]; 2] = [[0x11; 32], [0x22; 32]];
/// The pre-shared key of the pair.
pub const PSK: [u8; 32] = [0x44; 32];
/// Underlay addresses of node 1 and node 2.
pub const ADDRS: [[u8; 4]; 2] = [[192, 0, 2, 1], [192, 0, 2, 2]];
/// Listen port of both.
pub const PORT: u16 = 51820;

/// A node's side of its core ([`Io`]): the datagrams it pushed, back to
/// back in one buffer; decrypted packets, back to back in another; and
/// what [`Core::train`] said of each datagram. Its vectors are allocated
/// ahead, so a step that fits them allocates nothing.
#[derive(Debug, Default)]
pub struct Wire {
    buf: Vec<u8>,
    pos: usize,
    /// Each datagram's destination and place in the buffer.
    pub sent: Vec<(SocketAddr, Range<usize>)>,
    plain: Vec<u8>,
    plain_pos: usize,
    /// Each delivered packet's place in the plaintext buffer ([`Wire::plain`]).
    pub delivered: Vec<Range<usize>>,
    /// Each handoff: the worker, the bytes handed on and how.
    pub handed: Vec<(usize, usize, Train)>,
    /// Packets that waited for a handshake and were sent.
    pub answered: u64,
    /// Drops, by reason.
    pub dropped: Vec<DropReason>,
}

impl Wire {
    /// A wire with `bytes` of buffer for each direction (they grow if a
    /// step needs more).
    pub fn new(bytes: usize) -> Wire {
        Wire {
            buf: vec![0; bytes],
            sent: Vec::with_capacity(1024),
            plain: vec![0; bytes],
            delivered: Vec::with_capacity(1024),
            handed: Vec::with_capacity(16),
            dropped: Vec::with_capacity(1024),
            ..Wire::default()
        }
    }

    /// Forgets everything (keeps the buffers).
    pub fn clear(&mut self) {
        self.pos = 0;
        self.sent.clear();
        self.plain_pos = 0;
        self.delivered.clear();
        self.handed.clear();
        self.answered = 0;
        self.dropped.clear();
    }

    /// Datagram `i`.
    pub fn datagram(&self, i: usize) -> &[u8] {
        &self.buf[self.sent[i].1.clone()]
    }

    /// Mutable datagram `i` (to corrupt it).
    pub fn datagram_mut(&mut self, i: usize) -> &mut [u8] {
        let r = self.sent[i].1.clone();
        &mut self.buf[r]
    }

    /// The datagrams sent, back to back as a receiving socket hands them
    /// over as one `UDP_GRO` train, and their stride (the first one's length).
    pub fn train(&self) -> (&[u8], usize) {
        let stride = self.sent.first().map_or(0, |s| s.1.len());
        (&self.buf[..self.pos], stride)
    }

    /// The plaintext buffer: `delivered` ranges, and after an
    /// [`Rx::Deliver`] of `len` bytes from [`Core::datagram`], that packet
    /// at [`Wire::opened`].
    pub fn plain(&mut self) -> &mut [u8] {
        &mut self.plain
    }

    /// Where the packet of an [`Rx::Deliver`] of `len` bytes lies.
    pub fn opened(&self, len: usize) -> Range<usize> {
        self.plain_pos..self.plain_pos + len
    }
}

impl Out for Wire {
    fn room(&mut self, len: usize, _datagrams: usize) -> &mut [u8] {
        if self.pos + len > self.buf.len() {
            self.buf.resize(self.pos + len, 0);
        }
        &mut self.buf[self.pos..]
    }

    fn push(&mut self, to: SocketAddr, len: usize) {
        self.sent.push((to, self.pos..self.pos + len));
        self.pos += len;
    }
}

impl Io for Wire {
    fn plain(&mut self, len: usize) -> &mut [u8] {
        if self.plain_pos + len > self.plain.len() {
            self.plain.resize(self.plain_pos + len, 0);
        }
        &mut self.plain[self.plain_pos..]
    }

    fn deliver(&mut self, len: usize, _from: Option<&Entry>, _src: SocketAddr) {
        self.delivered.push(self.opened(len));
        self.plain_pos += len;
    }

    fn hand_off(&mut self, to: usize, d: &[u8], how: Train) {
        self.handed.push((to, d.len(), how));
    }

    fn answered(&mut self, sent: u64) {
        self.answered += sent;
    }

    fn dropped(&mut self, reason: DropReason) {
        self.dropped.push(reason);
    }
}

/// One node of the pair.
#[derive(Debug)]
pub struct Node {
    /// Its core.
    pub core: Core,
    /// Its peer table (the other node).
    pub table: Arc<PeerTable>,
    /// Its underlay address.
    pub addr: SocketAddr,
    /// What it sent and received last.
    pub io: Wire,
    /// Its engine's handshake load meter.
    pub load: Arc<Load>,
}

/// What one delivery step gave.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Got {
    /// Decrypted packets.
    pub delivered: Vec<Vec<u8>>,
    /// Drops, by reason.
    pub dropped: Vec<DropReason>,
}

/// What [`Core::datagram`] said ([`Rx`] without the borrow of the table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// [`Rx::Deliver`] of this many bytes.
    Deliver(usize),
    /// [`Rx::HandOff`] to this worker, vouched or not.
    HandOff(usize, Option<u32>),
    /// [`Rx::Done`], this many queued packets sent.
    Done(u64),
    /// [`Rx::Drop`].
    Drop(DropReason),
}

/// Two nodes and the time.
#[derive(Debug)]
pub struct Pair {
    /// Node 1 and node 2.
    pub nodes: [Node; 2],
    /// The time both see.
    pub now: Now,
}

fn public(secret: [u8; 32]) -> [u8; 32] {
    crate::WgSecret(secret).public_key()
}

/// Node `i`'s peer table: the other node with `keepalive` seconds.
pub fn table(i: usize, keepalive: u16) -> PeerTable {
    let o = 1 - i;
    let peer = Peer {
        subnet: format!("10.244.{}.0/24", o + 1).parse().expect("subnet"),
        endpoint: IpAddr::from(ADDRS[o]),
        vtep_mac: None,
        nat: None,
        wireguard: Some(WgPeer {
            public_key: public(KEYS[o]),
            port: PORT,
            psk: Some(PSK),
            keepalive,
        }),
        tunnel_gso: false,
    };
    PeerTable::new(&[peer], PORT)
}

/// A round on `table` at `now` (strict AllowedIPs; `vnet_hdr`: reads
/// carry virtio-net headers, decrypted TCP checksums are marked trusted).
pub fn round(table: &PeerTable, vnet_hdr: bool, now: Now) -> Round<'_> {
    Round {
        table,
        mode: AntiSpoofing::Strict,
        vnet_hdr,
        now,
    }
}

/// Node `i`'s core as worker `me` of `workers`, on the meter `load`.
pub fn core(i: usize, me: usize, workers: usize, load: &Arc<Load>, now: Now) -> Core {
    Core::new(Config {
        me,
        workers,
        secret: KEYS[i],
        seed: [i as u8 + 1; 64],
        load: Arc::clone(load),
        now: now.mono,
        disco: Arc::default(),
    })
}

impl Pair {
    /// Both nodes at `now`, no session yet (see [`Pair::connect`]).
    pub fn new(now: Now) -> Pair {
        let node = |i: usize| {
            let load = Arc::new(Load::new(now.mono));
            Node {
                core: core(i, 0, 1, &load, now),
                table: Arc::new(table(i, 0)),
                addr: SocketAddr::new(IpAddr::from(ADDRS[i]), PORT),
                io: Wire::new(1 << 20),
                load,
            }
        };
        Pair {
            nodes: [node(0), node(1)],
            now,
        }
    }

    /// Both follow their tables (greeting each other) and exchange until
    /// nothing is left to send: a session both ways.
    pub fn connect(now: Now) -> Pair {
        let mut p = Pair::new(now);
        for n in &mut p.nodes {
            n.core.follow(&n.table, now, &mut n.io);
        }
        p.settle();
        p
    }

    /// Node `i` follows its table; the handshake initiation it greets the
    /// other node with (not sent).
    pub fn initiation(&mut self, i: usize) -> Vec<u8> {
        let n = &mut self.nodes[i];
        let mut out = Wire::new(4096);
        n.core.follow(&n.table, self.now, &mut out);
        out.datagram(0).to_vec()
    }

    /// Puts node `i`'s engine under handshake load (over [`UNDER_LOAD`]
    /// handshake messages this second): its gate asks for cookies.
    pub fn overload(&mut self, i: usize) {
        for _ in 0..=UNDER_LOAD {
            self.nodes[i].load.note(self.now.mono);
        }
    }

    /// Moves the clock.
    pub fn advance(&mut self, d: Duration) {
        self.now.mono += d;
        self.now.wall += d;
    }

    /// Delivers what each node sent to the other until both are quiet (at
    /// most 8 rounds); what each received.
    pub fn settle(&mut self) -> [Got; 2] {
        let mut got = [Got::default(), Got::default()];
        for _ in 0..8 {
            if self.nodes.iter().all(|n| n.io.sent.is_empty()) {
                break;
            }
            for to in [1, 0] {
                let g = self.deliver(1 - to, AntiSpoofing::Strict);
                got[to].delivered.extend(g.delivered);
                got[to].dropped.extend(g.dropped);
            }
        }
        got
    }

    /// Hands what node `from` sent to the other node (from `from`'s
    /// address) and clears it; what the other node made of it.
    pub fn deliver(&mut self, from: usize, mode: AntiSpoofing) -> Got {
        let src = self.nodes[from].addr;
        self.deliver_from(from, src, mode)
    }

    /// [`Pair::deliver`] as if sent from `src` (roaming, spoofing).
    pub fn deliver_from(&mut self, from: usize, src: SocketAddr, mode: AntiSpoofing) -> Got {
        let sent = std::mem::take(&mut self.nodes[from].io);
        let mut got = Got::default();
        for i in 0..sent.sent.len() {
            match self.receive(1 - from, sent.datagram(i), src, mode) {
                Outcome::Deliver(len) => {
                    let w = &mut self.nodes[1 - from].io;
                    let at = w.opened(len);
                    got.delivered.push(w.plain()[at].to_vec());
                }
                Outcome::Drop(reason) => got.dropped.push(reason),
                Outcome::Done(_) | Outcome::HandOff(..) => {}
            }
        }
        self.nodes[from].io = sent;
        self.nodes[from].io.clear();
        got
    }

    /// Node `i` receives the datagram `d` from `src`: [`Core::datagram`]
    /// (answers go to its [`Wire`]).
    pub fn receive(&mut self, i: usize, d: &[u8], src: SocketAddr, mode: AntiSpoofing) -> Outcome {
        let now = self.now;
        let n = &mut self.nodes[i];
        let cx = Round {
            mode,
            ..round(&n.table, false, now)
        };
        match n.core.datagram(&cx, d, src, None, &mut n.io) {
            Rx::Deliver { len, .. } => Outcome::Deliver(len),
            Rx::HandOff { to, vouched } => Outcome::HandOff(to, vouched),
            Rx::Done { sent } => Outcome::Done(sent),
            Rx::Drop(r) => Outcome::Drop(r),
        }
    }

    /// Node `i` sends the TUN read `read` (no virtio-net header unless
    /// `vnet_hdr`); the result of [`Core::tun_tx`] as `Ok(())` or the drop.
    pub fn send(&mut self, i: usize, read: &mut [u8], vnet_hdr: bool) -> Result<(), DropReason> {
        let now = self.now;
        let n = &mut self.nodes[i];
        let cx = round(&n.table, vnet_hdr, now);
        n.core.tun_tx(&cx, read, &mut n.io).map(|_| ())
    }

    /// The other node receives what node `from` sent as one `UDP_GRO`
    /// train ([`Wire::train`]) through [`Core::train`]: its [`Wire`] says
    /// what became of each datagram.
    pub fn receive_train(&mut self, from: usize, vnet_hdr: bool) {
        let now = self.now;
        let [a, b] = &mut self.nodes;
        let (s, r) = if from == 0 { (a, b) } else { (b, a) };
        let (t, stride) = s.io.train();
        let how = Train {
            src: s.addr,
            stride,
            vouched: None,
        };
        r.core
            .train(&round(&r.table, vnet_hdr, now), t, how, &mut r.io);
    }

    /// Runs both nodes' timers at the current time.
    pub fn tick(&mut self) {
        let now = self.now;
        for n in &mut self.nodes {
            n.core.tick(now, &mut n.io);
        }
    }

    /// The peer id node `i` gave the other node.
    pub fn peer_id(&self, i: usize) -> u32 {
        self.nodes[i]
            .table
            .wg_peers()
            .first()
            .map(|w| w.id)
            .expect("a peer")
    }
}
