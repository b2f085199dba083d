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

use super::gate::Load;
use super::{Config, Core, Now, Out, Rx};
use crate::antispoof::AntiSpoofing;
use crate::peers::{Peer, PeerTable, WgPeer};

/// Static private keys of node 1 and node 2.
pub const KEYS: [[u8; 32]; 2] = [[0x11; 32], [0x22; 32]];
/// The pre-shared key of the pair.
pub const PSK: [u8; 32] = [0x44; 32];
/// Underlay addresses of node 1 and node 2.
pub const ADDRS: [[u8; 4]; 2] = [[192, 0, 2, 1], [192, 0, 2, 2]];
/// Listen port of both.
pub const PORT: u16 = 51820;

/// Datagrams a core pushed, back to back in one buffer.
#[derive(Debug, Default)]
pub struct Wire {
    buf: Vec<u8>,
    pos: usize,
    /// Each datagram's destination and place in the buffer.
    pub sent: Vec<(SocketAddr, Range<usize>)>,
}

impl Wire {
    /// A wire with `bytes` of buffer (it grows if a step needs more).
    pub fn new(bytes: usize) -> Wire {
        Wire {
            buf: vec![0; bytes],
            pos: 0,
            sent: Vec::with_capacity(1024),
        }
    }

    /// Forgets what was pushed (keeps the buffers).
    pub fn clear(&mut self) {
        self.pos = 0;
        self.sent.clear();
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
}

impl Out for Wire {
    fn room(&mut self, len: usize) -> &mut [u8] {
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

/// One node of the pair.
#[derive(Debug)]
pub struct Node {
    /// Its core.
    pub core: Core,
    /// Its peer table (the other node).
    pub table: Arc<PeerTable>,
    /// Its underlay address.
    pub addr: SocketAddr,
    /// What it sent last.
    pub out: Wire,
    /// Its plaintext arena.
    pub plain: Vec<u8>,
}

/// What one delivery step gave.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Got {
    /// Decrypted packets.
    pub delivered: Vec<Vec<u8>>,
    /// Drops, by reason.
    pub dropped: Vec<crate::DropReason>,
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
        wireguard: Some(WgPeer {
            public_key: public(KEYS[o]),
            port: PORT,
            psk: Some(PSK),
            keepalive,
        }),
    };
    PeerTable::new(&[peer], PORT)
}

impl Pair {
    /// Both nodes at `now`, no session yet (see [`Pair::connect`]).
    pub fn new(now: Now) -> Pair {
        let node = |i: usize| {
            let load = Arc::new(Load::new(now.mono));
            Node {
                core: Core::new(Config {
                    me: 0,
                    workers: 1,
                    secret: KEYS[i],
                    seed: [i as u8 + 1; 64],
                    load,
                    now: now.mono,
                }),
                table: Arc::new(table(i, 0)),
                addr: SocketAddr::new(IpAddr::from(ADDRS[i]), PORT),
                out: Wire::new(1 << 20),
                plain: vec![0; 1 << 17],
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
            let t = Arc::clone(&n.table);
            n.core.follow(&t, now, &mut n.out);
        }
        p.settle();
        p
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
            if self.nodes.iter().all(|n| n.out.sent.is_empty()) {
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
        let now = self.now;
        let [a, b] = &mut self.nodes;
        let (s, r) = if from == 0 { (a, b) } else { (b, a) };
        let mut got = Got::default();
        for i in 0..s.out.sent.len() {
            let d = s.out.datagram(i);
            let t = Arc::clone(&r.table);
            match r
                .core
                .datagram(&t, mode, d, src, None, &mut r.plain, now, &mut r.out)
            {
                Rx::Deliver { len, .. } => got.delivered.push(r.plain[..len].to_vec()),
                Rx::Drop(reason) => got.dropped.push(reason),
                Rx::Done { .. } | Rx::HandOff { .. } => {}
            }
        }
        s.out.clear();
        got
    }

    /// Node `i` sends the TUN read `read` (no virtio-net header unless
    /// `vnet_hdr`); the result of [`Core::tun_tx`] as `Ok(())` or the drop.
    pub fn send(
        &mut self,
        i: usize,
        read: &mut [u8],
        vnet_hdr: bool,
    ) -> Result<(), crate::DropReason> {
        let now = self.now;
        let n = &mut self.nodes[i];
        let t = Arc::clone(&n.table);
        n.core
            .tun_tx(&t, read, vnet_hdr, now, &mut n.out)
            .map(|_| ())
    }

    /// Runs both nodes' timers at the current time.
    pub fn tick(&mut self) {
        let now = self.now;
        for n in &mut self.nodes {
            n.core.tick(now, &mut n.out);
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
