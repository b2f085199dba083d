//! Userspace GRO: coalesce decapsulated TCP segments of one flow into one
//! super-packet before the TUN write, following the kernel's rules
//! (`tcp_gro_receive`, wireguard-go `tcpGROTable`):
//! same addresses, ports and ACK number; same TOS/TTL/DF (IPv6: traffic class,
//! flow label, hop limit); identical TCP options; adjacent sequence numbers;
//! equal payload size except a shorter last one; only ACK/PSH flags, and a PSH
//! segment ends the item; at most [`MAX_SEGS`] segments and 64 KiB. Every
//! merged segment's TCP checksum is verified first, because the super-packet is
//! handed over with `NEEDS_CSUM` (the kernel will not verify it again).
//!
//! Segments stay where they were received (the caller's arena); an item keeps
//! offsets, and [`Gro::flush`] emits each item as an iovec list
//! `[virtio_net_hdr, first packet, payload 2, payload 3, ...]` so that the TUN
//! write gathers them without a userspace copy. Items are emitted in arrival
//! order, and a packet that cannot join its flow's open item closes it, so
//! per-flow order is preserved.

use std::io::IoSlice;

use crate::wire::{checksum, ip, ipv4, ipv6, tcp, vnet};

/// Maximum segments per coalesced packet.
pub const MAX_SEGS: usize = 64;
/// Maximum items (packets to write) per flush.
pub const MAX_ITEMS: usize = 128;
const MAX_TOTAL: usize = 65535;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct FlowKey {
    v6: bool,
    src: [u8; 16],
    dst: [u8; 16],
    ports: u32,
}

#[derive(Debug, Clone, Copy)]
struct Item {
    start: usize,
    first_len: usize,
    key: FlowKey,
    /// Whether more segments may join.
    open: bool,
    /// The first packet's checksum has been verified.
    head_ok: bool,
    ip_hl: usize,
    hdrs: usize,
    ack: u32,
    next_seq: u32,
    gso_size: usize,
    total: usize,
    last_payload: usize,
    nsegs: usize,
    psh: bool,
    /// A single packet larger than the MTU (a peer's GSO train that crossed a
    /// veth unsegmented): handed over as GSO with `gso_size = mtu - headers`.
    oversize: bool,
}

/// Result of [`Gro::push`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pushed {
    /// Queued (alone or merged).
    Queued,
    /// The table is full: flush and push again.
    Full,
}

/// A per-worker coalescing table; allocated once, reused for every batch.
pub struct Gro {
    mtu: usize,
    items: Vec<Item>,
    /// Extra payload slices: `MAX_SEGS - 1` per item slot, `(offset, len)` in the arena.
    extra: Vec<(usize, usize)>,
    coalesced: u64,
}

/// A segment may be merged when its TCP checksum is valid, or partial (see
/// [`super::partial_checksum`]): the merged packet is handed over as partial anyway.
fn tcp_csum_ok(pkt: &[u8], v6: bool, ip_hl: usize) -> bool {
    let seg = &pkt[ip_hl..];
    let len = u32::try_from(seg.len()).unwrap_or(0);
    let ps = super::pseudo_sum(pkt, v6, ipv4::PROTO_TCP, len);
    if u32::from(tcp::Packet::new_unchecked(seg).checksum()) == ps {
        return true;
    }
    checksum::combine(ps, checksum::sum(seg)) == 0xffff
}

impl Gro {
    /// An empty table for a TUN with this MTU.
    pub fn new(mtu: usize) -> Self {
        Gro {
            mtu,
            items: Vec::with_capacity(MAX_ITEMS),
            extra: vec![(0, 0); MAX_ITEMS * (MAX_SEGS - 1)],
            coalesced: 0,
        }
    }

    /// Number of queued items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether nothing is queued.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Segments merged into an earlier one since the last call (for stats).
    pub fn take_coalesced(&mut self) -> u64 {
        std::mem::take(&mut self.coalesced)
    }

    /// Queues the IP packet `arena[start..start + len]` (already validated by decap).
    pub fn push(&mut self, arena: &[u8], start: usize, len: usize) -> Pushed {
        let pkt = &arena[start..start + len];
        let cand = Self::candidate(pkt);
        if let Some((key, ip_hl, hdrs, seq, ack, flags)) = cand {
            let payload = len - hdrs;
            if let Some(idx) = self.items.iter().rposition(|it| it.open && it.key == key) {
                if self.try_merge(idx, arena, start, len, ip_hl, hdrs, seq, ack, flags) {
                    return Pushed::Queued;
                }
                self.items[idx].open = false;
            }
            if self.items.len() == MAX_ITEMS {
                return Pushed::Full;
            }
            let oversize = len > self.mtu && self.mtu > hdrs;
            self.items.push(Item {
                start,
                first_len: len,
                key,
                open: flags & tcp::PSH == 0 && !oversize,
                head_ok: false,
                ip_hl,
                hdrs,
                ack,
                next_seq: seq.wrapping_add(u32::try_from(payload).unwrap_or(0)),
                gso_size: if oversize { self.mtu - hdrs } else { payload },
                total: len,
                last_payload: payload,
                nsegs: 1,
                psh: flags & tcp::PSH != 0,
                oversize,
            });
            return Pushed::Queued;
        }
        // Not coalescable: close the flow's open item (if it is TCP) to keep order.
        if let Some(key) = Self::flow_key(pkt)
            && let Some(idx) = self.items.iter().rposition(|it| it.open && it.key == key)
        {
            self.items[idx].open = false;
        }
        if self.items.len() == MAX_ITEMS {
            return Pushed::Full;
        }
        self.items.push(Item {
            start,
            first_len: len,
            key: FlowKey::default(),
            open: false,
            head_ok: false,
            ip_hl: 0,
            hdrs: 0,
            ack: 0,
            next_seq: 0,
            gso_size: 0,
            total: len,
            last_payload: 0,
            nsegs: 1,
            psh: false,
            oversize: false,
        });
        Pushed::Queued
    }

    /// The TCP flow key of any TCP/IP packet (options-free IPv4, or IPv6
    /// without extension headers) holding a whole fixed TCP header.
    fn flow_key(pkt: &[u8]) -> Option<FlowKey> {
        let ip = ip::Packet::new_checked(pkt).ok()?;
        let v6 = ip.version() == 6;
        let ip_hl = if v6 {
            ipv6::HEADER_LEN
        } else {
            ipv4::HEADER_LEN
        };
        if ip.protocol() != ipv4::PROTO_TCP
            || ip.header_len() != ip_hl
            || pkt.len() < ip_hl + tcp::HEADER_LEN
        {
            return None;
        }
        let t = tcp::Packet::new_unchecked(&pkt[ip_hl..]);
        let mut key = FlowKey {
            v6,
            ports: u32::from(t.src_port()) << 16 | u32::from(t.dst_port()),
            ..FlowKey::default()
        };
        let (src, dst) = ip.addr_bytes().split_at(if v6 { 16 } else { 4 });
        key.src[..src.len()].copy_from_slice(src);
        key.dst[..dst.len()].copy_from_slice(dst);
        Some(key)
    }

    /// `(key, ip_hl, hdrs, seq, ack, flags)` for a TCP segment that may be coalesced.
    fn candidate(pkt: &[u8]) -> Option<(FlowKey, usize, usize, u32, u32, u8)> {
        let key = Self::flow_key(pkt)?;
        let ip_hl = if key.v6 {
            ipv6::HEADER_LEN
        } else {
            ipv4::HEADER_LEN
        };
        if !key.v6 {
            let ip = ipv4::Packet::new_unchecked(pkt);
            if ip.more_frags() || ip.frag_offset() != 0 {
                return None;
            }
        }
        let t = tcp::Packet::new_checked(&pkt[ip_hl..]).ok()?;
        let hdrs = ip_hl + t.header_len();
        let flags = t.flags();
        if pkt.len() <= hdrs || flags & !(tcp::ACK | tcp::PSH) != 0 || flags & tcp::ACK == 0 {
            return None;
        }
        Some((key, ip_hl, hdrs, t.seq(), t.ack(), flags))
    }

    #[allow(clippy::too_many_arguments)]
    fn try_merge(
        &mut self,
        idx: usize,
        arena: &[u8],
        start: usize,
        len: usize,
        ip_hl: usize,
        hdrs: usize,
        seq: u32,
        ack: u32,
        flags: u8,
    ) -> bool {
        let it = self.items[idx];
        let payload = len - hdrs;
        if it.ack != ack
            || it.next_seq != seq
            || it.hdrs != hdrs
            || it.nsegs >= MAX_SEGS
            || it.last_payload != it.gso_size
            || payload > it.gso_size
            || it.total + payload > MAX_TOTAL
        {
            return false;
        }
        let head = &arena[it.start..it.start + it.first_len];
        let pkt = &arena[start..start + len];
        // IP fields the kernel compares: v4 TOS, TTL, DF; v6 version, traffic
        // class and flow label, hop limit.
        let same_ip = if it.key.v6 {
            let (h, p) = (
                ipv6::Packet::new_unchecked(head),
                ipv6::Packet::new_unchecked(pkt),
            );
            h.ver_tc_flow() == p.ver_tc_flow() && h.hop_limit() == p.hop_limit()
        } else {
            let (h, p) = (
                ipv4::Packet::new_unchecked(head),
                ipv4::Packet::new_unchecked(pkt),
            );
            h.tos() == p.tos() && h.ttl() == p.ttl() && h.dont_frag() == p.dont_frag()
        };
        // TCP options (bytes 20.. of the TCP header) must be identical.
        if !same_ip || head[ip_hl + tcp::HEADER_LEN..hdrs] != pkt[ip_hl + tcp::HEADER_LEN..hdrs] {
            return false;
        }
        if !it.head_ok {
            if !tcp_csum_ok(head, it.key.v6, ip_hl) {
                return false;
            }
            self.items[idx].head_ok = true;
        }
        if !tcp_csum_ok(pkt, it.key.v6, ip_hl) {
            return false;
        }
        let it = &mut self.items[idx];
        self.extra[idx * (MAX_SEGS - 1) + it.nsegs - 1] = (start + hdrs, payload);
        it.nsegs += 1;
        it.total += payload;
        it.last_payload = payload;
        it.next_seq = seq.wrapping_add(u32::try_from(payload).unwrap_or(0));
        if flags & tcp::PSH != 0 {
            it.psh = true;
            it.open = false;
        }
        self.coalesced += 1;
        true
    }

    /// Emits every item through `write(iovecs)` in arrival order and clears the
    /// table. Headers of coalesced items are rewritten in `arena` first.
    pub fn flush(&mut self, arena: &mut [u8], mut write: impl FnMut(&[IoSlice<'_>])) {
        let none = vnet::VnetHdr::default().to_bytes();
        for idx in 0..self.items.len() {
            let it = self.items[idx];
            let mut hdr = none;
            if it.nsegs > 1 || it.oversize {
                hdr = Self::finalize(&it, &mut arena[it.start..it.start + it.first_len]).to_bytes();
            } else if let Some((start, off)) =
                super::partial_checksum(&arena[it.start..it.start + it.first_len])
            {
                hdr = vnet::VnetHdr {
                    flags: vnet::F_NEEDS_CSUM,
                    csum_start: u16::try_from(start).unwrap_or(0),
                    csum_offset: u16::try_from(off).unwrap_or(0),
                    ..vnet::VnetHdr::default()
                }
                .to_bytes();
            }
            let arena: &[u8] = arena;
            let empty: &[u8] = &[];
            let mut iov: [IoSlice<'_>; MAX_SEGS + 1] = [IoSlice::new(empty); MAX_SEGS + 1];
            iov[0] = IoSlice::new(&hdr);
            iov[1] = IoSlice::new(&arena[it.start..it.start + it.first_len]);
            let base = idx * (MAX_SEGS - 1);
            for s in 1..it.nsegs {
                let (off, l) = self.extra[base + s - 1];
                iov[s + 1] = IoSlice::new(&arena[off..off + l]);
            }
            write(&iov[..it.nsegs + 1]);
        }
        self.items.clear();
    }

    /// Rewrites the head packet's headers for the coalesced length and returns its vnet header.
    fn finalize(it: &Item, head: &mut [u8]) -> vnet::VnetHdr {
        let tcp_len = it.total - it.ip_hl;
        if it.key.v6 {
            ipv6::Packet::new_unchecked(&mut *head)
                .set_payload_len(u16::try_from(tcp_len).unwrap_or(u16::MAX));
        } else {
            let mut ip = ipv4::Packet::new_unchecked(&mut *head);
            ip.set_total_len(u16::try_from(it.total).unwrap_or(u16::MAX));
            ip.fill_checksum();
        }
        // NEEDS_CSUM: the field holds the folded (not complemented) pseudo-header sum.
        let ps = super::pseudo_sum(
            head,
            it.key.v6,
            ipv4::PROTO_TCP,
            u32::try_from(tcp_len).unwrap_or(0),
        );
        let mut t = tcp::Packet::new_unchecked(&mut head[it.ip_hl..]);
        if it.psh {
            t.set_flags(t.flags() | tcp::PSH);
        }
        t.set_checksum(u16::try_from(ps).unwrap_or(0));
        vnet::VnetHdr {
            flags: vnet::F_NEEDS_CSUM,
            gso_type: if it.key.v6 {
                vnet::GSO_TCPV6
            } else {
                vnet::GSO_TCPV4
            },
            hdr_len: u16::try_from(it.hdrs).unwrap_or(0),
            gso_size: u16::try_from(it.gso_size).unwrap_or(0),
            csum_start: u16::try_from(it.ip_hl).unwrap_or(0),
            csum_offset: u16::try_from(tcp::CHECKSUM_OFFSET).unwrap_or(0),
        }
    }
}

#[cfg(test)]
#[path = "gro_tests.rs"]
mod tests;
