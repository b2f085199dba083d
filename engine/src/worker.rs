//! One worker thread: a TUN queue, a receive socket (shared port via
//! `SO_REUSEPORT`) and [`SEND_SOCKETS`] send sockets on ephemeral ports.
//!
//! The loop alternates two budgeted steps and sleeps in `poll` only when both
//! found nothing:
//! - TUN -> UDP: up to [`TUN_BUDGET`] reads; each packet is routed, prepared,
//!   segmented (userspace GSO) into the TX arena with headroom, headed, and
//!   queued as `sendmmsg` messages whose equal-size runs become one
//!   `UDP_SEGMENT` train; the arena is flushed once it holds [`FLUSH_AT`]
//!   bytes, when full and at the end.
//! - UDP -> TUN: one `recvmmsg` (with `UDP_GRO` trains), decap + anti-spoofing
//!   ([`crate::antispoof`]) per segment, userspace GRO, one `writev` per
//!   (coalesced) packet.
//!
//! The peer table is loaded once per step. All buffers are allocated at start.

use std::io::IoSlice;
use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use arc_swap::ArcSwap;

use crate::antispoof::{self, Verdict};
use crate::encap::{Codec, DropReason};
use crate::idle::Idle;
use crate::offload::gso::{self, Segments};
use crate::offload::uso;
use crate::peers::PeerTable;
use crate::stats::{Ctr, Local, Shared};
use crate::sys::event::wait_readable;
use crate::sys::tun::Queue;
use crate::sys::udp::{BATCH, RxMeta, TxMsg, Udp};
use crate::tun_out::TunOut;
use crate::udp_tx::{self, MAX_UDP_PAYLOAD};
use crate::wire::{ipv4, vnet};

/// Bytes a super-packet's segments need (`gso::required_len`, `uso::udp_required_len`).
type Required = fn(&[u8], usize, usize) -> Option<usize>;
/// Cuts a super-packet into segments (`gso::tcp_segment`, `uso::udp_segment`).
type Cut = fn(&[u8], usize, usize, &mut [u8]) -> Result<Segments, DropReason>;

/// Send sockets (= distinct outer source ports) per worker; flows are hashed onto them.
pub const SEND_SOCKETS: usize = 4;
/// TUN reads per step.
pub const TUN_BUDGET: usize = 64;
const TUN_BUF: usize = vnet::HEADER_LEN + 65536;
const TX_ARENA: usize = 1 << 20;
/// Queued bytes after which a TUN step sends before reading on: the arena
/// holds about 15 super-packets, and waiting for all of them delayed the
/// first while the peer's worker idled. WireGuard, where a super-packet
/// takes ~40 us to encrypt, gained 5 % in A-B runs; flannel-UDP and VXLAN,
/// within noise (+2-4 %).
pub(crate) const FLUSH_AT: usize = 128 << 10;
const TX_MSGS: usize = 256;
const RX_SLOT: usize = 65536;
const RX_SLOTS: usize = 32;

// Memory budget per worker, checked at compile time: TX arena + RX arena + TUN buffer.
const _: () = assert!(TX_ARENA + RX_SLOT * RX_SLOTS + TUN_BUF <= 4 << 20);
const _: () = assert!(RX_SLOTS <= BATCH);

/// Everything a worker needs, moved into its thread.
pub(crate) struct Worker {
    pub codec: Codec,
    pub tun: Queue,
    pub vnet_hdr: bool,
    pub rx: Udp,
    pub tx: Vec<Udp>,
    pub peers: Arc<ArcSwap<PeerTable>>,
    /// The anti-spoofing mode, read once per receive batch.
    pub anti_spoof: Arc<antispoof::Mode>,
    pub mtu: usize,
    pub icmp_src: Option<Ipv4Addr>,
    pub udp_gso: Arc<AtomicBool>,
    pub stop: Arc<AtomicBool>,
    pub shared: Arc<Shared>,
    /// This worker's slot in per-peer counters.
    pub index: usize,
}

/// A queued message plus the send socket it leaves through.
#[derive(Clone, Copy)]
struct Queued {
    msg: TxMsg,
    sock: usize,
}

struct Buffers {
    tx: Vec<u8>,
    tx_pos: usize,
    msgs: Vec<Queued>,
    rx: Vec<u8>,
    meta: [RxMeta; RX_SLOTS],
    out: TunOut,
}

/// FNV-style hash of the inner flow (addresses + L4 ports), like the kernel's
/// `udp_flow_src_port` input: stable per flow, spread across flows.
fn flow_hash(pkt: &[u8]) -> u32 {
    let (addrs, l4) = match pkt[0] >> 4 {
        4 if pkt.len() >= 20 => {
            let hl = usize::from(pkt[0] & 0x0f) * 4;
            (&pkt[12..20], matches!(pkt[9], 6 | 17).then_some(hl))
        }
        6 if pkt.len() >= 40 => (&pkt[8..40], matches!(pkt[6], 6 | 17).then_some(40)),
        _ => (&pkt[..0], None),
    };
    let mut h: u32 = 0x811c_9dc5;
    let ports = l4.and_then(|o| pkt.get(o..o + 4)).unwrap_or(&[]);
    for b in addrs.iter().chain(ports) {
        h = (h ^ u32::from(*b)).wrapping_mul(0x0100_0193);
    }
    h ^ (h >> 16)
}

/// A worker's TUN step: up to [`TUN_BUDGET`] non-blocking reads into `buf`,
/// each handed to `each(buf, len)`, which returns why the packet was dropped,
/// if it was. Returns whether anything was read.
pub(crate) fn read_tun(
    tun: &Queue,
    buf: &mut [u8],
    ctr: &mut Local,
    mut each: impl FnMut(&mut [u8], usize, &mut Local) -> Result<(), DropReason>,
) -> bool {
    let mut any = false;
    for _ in 0..TUN_BUDGET {
        let n = match tun.read(buf) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(_) => {
                ctr.add(Ctr::IoError, 1);
                break;
            }
        };
        any = true;
        ctr.add(Ctr::TunReads, 1);
        if let Err(r) = each(buf, n, ctr) {
            ctr.drop(r, 1);
        }
    }
    any
}

impl Worker {
    pub(crate) fn run(self) {
        let mut tun_buf = vec![0; TUN_BUF];
        let mut b = Buffers {
            tx: vec![0; TX_ARENA],
            tx_pos: 0,
            msgs: Vec::with_capacity(TX_MSGS),
            rx: vec![0; RX_SLOT * RX_SLOTS],
            meta: [RxMeta::default(); RX_SLOTS],
            out: TunOut::new(self.vnet_hdr, self.mtu, 2 * RX_SLOT),
        };
        let mut ctr = Local::default();
        ctr.add(Ctr::PeerCounting, 1);
        let mut idle = Idle::new();
        while !self.stop.load(Ordering::Relaxed) {
            let a = self.tun_step(&mut tun_buf, &mut b, &mut ctr);
            let r = self.udp_step(&mut b, &mut ctr);
            ctr.publish(&self.shared);
            idle.end_round(a || r, || self.wait());
        }
    }

    fn wait(&self) {
        wait_readable([self.tun.raw_fd(), self.rx.raw_fd()], 100);
    }

    // === TUN -> UDP ===

    fn tun_step(&self, tun_buf: &mut [u8], b: &mut Buffers, ctr: &mut Local) -> bool {
        let peers = self.peers.load();
        let any = read_tun(&self.tun, tun_buf, ctr, |buf, n, ctr| {
            let r = self.on_tun_packet(b, buf, n, &peers, ctr);
            if b.tx_pos >= FLUSH_AT {
                self.flush_tx(b, ctr);
            }
            r
        });
        self.flush_tx(b, ctr);
        any
    }

    fn on_tun_packet(
        &self,
        b: &mut Buffers,
        buf: &mut [u8],
        n: usize,
        peers: &PeerTable,
        ctr: &mut Local,
    ) -> Result<(), DropReason> {
        let (hdr, off) =
            vnet::VnetHdr::split(&buf[..n], self.vnet_hdr).ok_or(DropReason::Malformed)?;
        let pkt_len = n - off;
        let pkt = &mut buf[off..n];
        let (version, entry) = match pkt.first().map(|v| v >> 4) {
            Some(4) if pkt.len() >= ipv4::HEADER_LEN => {
                let mut d = [0; 4];
                d.copy_from_slice(&pkt[16..20]);
                (4, peers.lookup_v4(d))
            }
            Some(6) if pkt.len() >= 40 => {
                let mut d = [0; 16];
                d.copy_from_slice(&pkt[24..40]);
                (6, peers.lookup_v6(d))
            }
            _ => return Err(DropReason::Malformed),
        };
        let Some(entry) = entry else {
            if version == 4 && matches!(self.codec, Codec::FlannelUdp) {
                self.send_unreachable(&buf[off..n], ctr);
            }
            return Err(DropReason::NoRoute);
        };
        let (dst, mac) = (entry.dst, entry.mac);
        let peer_ctr = &entry.counters;
        self.codec.prepare_inner(pkt)?;
        let sock = (flow_hash(pkt) as usize) % self.tx.len().max(1);
        let headroom = self.codec.headroom();
        let gso_type = hdr.gso_type & !vnet::GSO_ECN;
        let cutter: Option<(Required, Cut)> = match gso_type {
            vnet::GSO_TCPV4 | vnet::GSO_TCPV6 => Some((gso::required_len, gso::tcp_segment)),
            vnet::GSO_UDP_L4 => Some((uso::udp_required_len, uso::udp_segment)),
            _ => None,
        };
        if let Some((required, cut)) = cutter.filter(|_| hdr.gso_size > 0) {
            let gs = usize::from(hdr.gso_size);
            let need = required(pkt, gs, headroom).ok_or(DropReason::Malformed)?;
            if need > b.tx.len() {
                return Err(DropReason::Mtu);
            }
            if b.tx_pos + need > b.tx.len() || b.msgs.len() + need / (headroom + gs) + 2 > TX_MSGS {
                self.flush_tx(b, ctr);
            }
            let pkt = &buf[off..n];
            let start = b.tx_pos;
            let segs = cut(pkt, gs, headroom, &mut b.tx[start..])?;
            ctr.add(Ctr::GsoSuperPackets, 1);
            let inner = segs.total_len() - segs.count * headroom;
            peer_ctr.add(self.index, true, segs.count as u64, inner as u64);
            for i in 0..segs.count {
                let r = segs.range(i);
                let (s, len) = (start + r.start, r.len());
                self.codec
                    .write_header(&mut b.tx[s..s + headroom], mac, version);
                self.queue(b, dst, sock, s, len);
                ctr.add(Ctr::TxPackets, 1);
                ctr.add(Ctr::TxBytes, (len - headroom) as u64);
            }
            b.tx_pos += segs.total_len();
        } else {
            if gso_type != vnet::GSO_NONE {
                return Err(DropReason::Malformed);
            }
            if hdr.flags & vnet::F_NEEDS_CSUM != 0 {
                gso::complete_checksum(
                    pkt,
                    usize::from(hdr.csum_start),
                    usize::from(hdr.csum_offset),
                )?;
            }
            let len = headroom + pkt_len;
            if len > MAX_UDP_PAYLOAD {
                return Err(DropReason::Mtu);
            }
            if b.tx_pos + len > b.tx.len() || b.msgs.len() + 1 > TX_MSGS {
                self.flush_tx(b, ctr);
            }
            let s = b.tx_pos;
            b.tx[s + headroom..s + len].copy_from_slice(&buf[off..n]);
            self.codec
                .write_header(&mut b.tx[s..s + headroom], mac, version);
            self.queue(b, dst, sock, s, len);
            b.tx_pos += len;
            ctr.add(Ctr::TxPackets, 1);
            ctr.add(Ctr::TxBytes, pkt_len as u64);
            peer_ctr.add(self.index, true, 1, pkt_len as u64);
        }
        Ok(())
    }

    /// Appends `tx[start..start+len]` to the last message when it extends an
    /// equal-size train on the same socket (UDP GSO), else starts a new one.
    fn queue(
        &self,
        b: &mut Buffers,
        dst: std::net::SocketAddr,
        sock: usize,
        start: usize,
        len: usize,
    ) {
        if self.udp_gso.load(Ordering::Relaxed)
            && let Some(last) = b.msgs.last_mut()
            && last.sock == sock
            && udp_tx::extend_train(&mut last.msg, dst, start, len)
        {
            return;
        }
        b.msgs.push(Queued {
            msg: udp_tx::single(dst, start, len),
            sock,
        });
    }

    fn flush_tx(&self, b: &mut Buffers, ctr: &mut Local) {
        let mut batch = [TxMsg {
            dst: std::net::SocketAddr::from(([0, 0, 0, 0], 0)),
            start: 0,
            len: 0,
            segment: 0,
        }; BATCH];
        for (si, sock) in self.tx.iter().enumerate() {
            let mut n = 0;
            for q in b.msgs.iter().filter(|q| q.sock == si) {
                batch[n] = q.msg;
                n += 1;
                if n == BATCH {
                    udp_tx::send_all(sock, &batch[..n], &b.tx, &self.udp_gso, ctr);
                    n = 0;
                }
            }
            if n > 0 {
                udp_tx::send_all(sock, &batch[..n], &b.tx, &self.udp_gso, ctr);
            }
        }
        b.msgs.clear();
        b.tx_pos = 0;
    }

    /// flannel-UDP: ICMP net-unreachable back into the TUN for the unroutable `pkt`.
    fn send_unreachable(&self, pkt: &[u8], ctr: &mut Local) {
        let Some(src) = self.icmp_src else { return };
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

    // === UDP -> TUN ===

    fn udp_step(&self, b: &mut Buffers, ctr: &mut Local) -> bool {
        let got = match self.rx.recv_batch(&mut b.rx, RX_SLOT, &mut b.meta) {
            Ok(0) => return false,
            Ok(g) => g,
            Err(_) => {
                ctr.add(Ctr::IoError, 1);
                return false;
            }
        };
        ctr.add(Ctr::UdpRecvs, 1);
        let peers = self.peers.load();
        let mode = self.anti_spoof.get();
        for i in 0..got {
            let m = b.meta[i];
            let base = i * RX_SLOT;
            let len = m.len.min(RX_SLOT);
            let entries = peers.endpoint_entries(m.src);
            let early_drop = mode.drops_unknown_outer() && entries.is_empty();
            if len == 0 {
                let r = if early_drop {
                    DropReason::UnknownPeer
                } else {
                    DropReason::Malformed
                };
                ctr.drop(r, 1);
                continue;
            }
            let mut off = 0;
            while off < len {
                let seg_len = m.stride.min(len - off);
                let seg_start = base + off;
                off += seg_len;
                if early_drop {
                    ctr.drop(DropReason::UnknownPeer, 1);
                    continue;
                }
                let r = match self.codec.decap(&mut b.rx[seg_start..seg_start + seg_len]) {
                    Ok(r) => r,
                    Err(e) => {
                        ctr.drop(e, 1);
                        continue;
                    }
                };
                let (start, plen) = (seg_start + r.start, r.end - r.start);
                let inner = inner_src(&b.rx[start..start + plen]);
                match antispoof::check(mode, &peers, entries, inner) {
                    Verdict::Drop(r) => {
                        ctr.drop(r, 1);
                        continue;
                    }
                    Verdict::Accept(from) => {
                        if let Some(e) = from {
                            e.counters.add(self.index, false, 1, plen as u64);
                        }
                    }
                    Verdict::Unexpected(e) => {
                        e.counters.add(self.index, false, 1, plen as u64);
                        e.counters.unexpected(self.index, m.src);
                        ctr.add(Ctr::UnexpectedSource, 1);
                    }
                }
                ctr.add(Ctr::RxPackets, 1);
                ctr.add(Ctr::RxBytes, plen as u64);
                b.out.push(&self.tun, &mut b.rx, start, plen, ctr);
            }
        }
        b.out.flush(&self.tun, &mut b.rx, ctr);
        true
    }
}

/// Source address of a decapsulated (already validated) IP packet.
fn inner_src(pkt: &[u8]) -> IpAddr {
    if pkt[0] >> 4 == 6 {
        let mut a = [0; 16];
        a.copy_from_slice(&pkt[8..24]);
        IpAddr::from(a)
    } else {
        let mut a = [0; 4];
        a.copy_from_slice(&pkt[12..16]);
        IpAddr::from(a)
    }
}
