//! The last step of every worker's receive path: a decapsulated (or
//! decrypted) inner packet, already checked and counted, goes to userspace
//! GRO and from there to the TUN, or, on a TUN without vnet header, straight
//! to it with its checksum completed and oversize TCP cut to the MTU.

use std::io::IoSlice;

use crate::offload::gro::{Gro, Pushed};
use crate::offload::{self, gso};
use crate::stats::{Ctr, Local};
use crate::sys::tun::Queue;

/// A worker's TUN output state: its GRO table and, without vnet header, the
/// scratch space for segmenting oversize packets.
pub(crate) struct TunOut {
    vnet_hdr: bool,
    mtu: usize,
    gro: Gro,
    /// Segments of oversize packets when the TUN has no vnet header.
    scratch: Vec<u8>,
}

impl TunOut {
    /// Output for a TUN with (or without) vnet header and this MTU; `scratch`
    /// bytes are set aside only without vnet header.
    pub(crate) fn new(vnet_hdr: bool, mtu: usize, scratch: usize) -> TunOut {
        TunOut {
            vnet_hdr,
            mtu,
            gro: Gro::new(mtu),
            scratch: if vnet_hdr {
                Vec::new()
            } else {
                vec![0; scratch]
            },
        }
    }

    /// Hands over the IP packet `arena[start..start + len]`: queued for GRO
    /// (the arena must stay untouched until [`TunOut::flush`]), or written.
    pub(crate) fn push(
        &mut self,
        tun: &Queue,
        arena: &mut [u8],
        start: usize,
        len: usize,
        ctr: &mut Local,
    ) {
        if !self.vnet_hdr {
            self.write_plain(tun, &mut arena[start..start + len], ctr);
        } else if self.gro.push(arena, start, len) == Pushed::Full {
            self.flush(tun, arena, ctr);
            let _ = self.gro.push(arena, start, len);
        }
    }

    /// Writes everything GRO holds (one `writev` per coalesced packet).
    pub(crate) fn flush(&mut self, tun: &Queue, arena: &mut [u8], ctr: &mut Local) {
        if !self.vnet_hdr {
            return;
        }
        let (mut ok, mut err) = (0, 0);
        self.gro.flush(arena, |iov| match tun.writev(iov) {
            Ok(_) => ok += 1,
            Err(_) => err += 1,
        });
        ctr.add(Ctr::TunWrites, ok);
        ctr.add(Ctr::TunWriteError, err);
        ctr.add(Ctr::GroCoalesced, self.gro.take_coalesced());
    }

    /// TUN without vnet header: complete a partial checksum and cut oversize
    /// TCP packets to the MTU in userspace before writing.
    fn write_plain(&mut self, tun: &Queue, pkt: &mut [u8], ctr: &mut Local) {
        let mut write = |s: &[u8]| match tun.writev(&[IoSlice::new(s)]) {
            Ok(_) => ctr.add(Ctr::TunWrites, 1),
            Err(_) => ctr.add(Ctr::TunWriteError, 1),
        };
        if pkt.len() > self.mtu
            && let Some(hdrs) = gso::tcp_headers_len(pkt)
            && self.mtu > hdrs
            && let Ok(segs) = gso::tcp_segment(pkt, self.mtu - hdrs, 0, &mut self.scratch)
        {
            for i in 0..segs.count {
                write(&self.scratch[segs.range(i)]);
            }
            return;
        }
        if let Some((cs, co)) = offload::partial_checksum(pkt) {
            let _ = gso::complete_checksum(pkt, cs, co);
        }
        write(pkt);
    }
}
