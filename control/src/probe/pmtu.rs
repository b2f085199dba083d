//! Path-MTU search for one peer, packetization-layer style (RFC 8899), sans-IO.
//!
//! The prober sends padded probes with DF set and the route's cached path
//! MTU ignored (`IP_PMTUDISC_PROBE`), so a probe larger than the path is
//! lost, not fragmented; the peer acks each with its size. No ICMP is
//! needed, so filtered "fragmentation needed" messages do not matter.
//!
//! Search: the first probe is the overlay MTU itself (the ceiling, the
//! device's MTU): acked, the path is fine and the search is over after one
//! probe. Lost [`FAILS`] times, the search bisects between the largest size
//! acked (at first [`MIN`], which every IPv4 path must carry) and the
//! smallest size lost, one probe in flight, [`GAP`] apart, until they are
//! one byte apart: at most 10 steps from 1450 (~10 s with losses). Probes
//! run only while the peer answers the small probes (a lost peer says
//! nothing about its MTU), and a lost size counts only once a small probe
//! sent after it is answered ([`Search::path_up`]; the table sends one at
//! once), so that a moment of loss on the path is not taken for a small
//! MTU; the result is searched again after [`RAISE`]
//! (RFC 8899's PMTU_RAISE_TIMER), keeping the last result meanwhile.
//! Sizes are IP packet lengths (the probe's UDP payload plus 28 bytes).

/// The smallest size searched, taken to pass (IPv4's minimum reassembly size).
pub const MIN: u32 = 576;
/// How long a size probe waits for its ack (ns).
pub const TIMEOUT: u64 = 1_000_000_000;
/// The pause between two size probes (ns).
pub const GAP: u64 = 200_000_000;
/// When a finished search starts again (ns): 10 minutes.
pub const RAISE: u64 = 600_000_000_000;
/// Losses of one size before it counts as too big (one loss may be chance).
pub const FAILS: u8 = 2;

/// One peer's search.
#[derive(Debug, Clone)]
pub struct Search {
    ceiling: u32,
    lo: u32,
    hi: u32,
    fails: u8,
    outstanding: Option<(u64, u64, u32)>,
    /// A size lost, not yet judged: (size, when it was sent).
    suspect: Option<(u32, u64)>,
    due: u64,
    /// The largest size the last finished search saw acked.
    pub found: Option<u32>,
}

impl Search {
    /// A search up to `ceiling` (the overlay MTU), starting at `now`.
    pub fn new(ceiling: u32, now: u64) -> Search {
        Search {
            ceiling,
            lo: MIN.min(ceiling),
            hi: ceiling + 1,
            fails: 0,
            outstanding: None,
            suspect: None,
            due: now,
            found: None,
        }
    }

    /// The size to probe now with sequence number `seq`, if any (recorded
    /// as in flight); `answering`: the peer answers the small probes.
    pub fn next(&mut self, seq: u64, now: u64, answering: bool) -> Option<u32> {
        if let Some((_, sent, size)) = self.outstanding
            && now >= sent + TIMEOUT
        {
            self.outstanding = None;
            self.due = now + GAP;
            if answering {
                self.suspect = Some((size, sent));
            }
        }
        if !answering || self.outstanding.is_some() || self.suspect.is_some() || now < self.due {
            return None;
        }
        if self.hi - self.lo <= 1 {
            self.found = Some(self.lo);
            self.lo = MIN.min(self.ceiling);
            self.hi = self.ceiling + 1;
            self.due = now + RAISE;
            return None;
        }
        let size = if self.hi > self.ceiling {
            self.ceiling
        } else {
            (self.lo + self.hi) / 2
        };
        self.outstanding = Some((seq, now, size));
        Some(size)
    }

    /// Takes the ack of probe `seq` sent at `stamp`; false if it answers
    /// nothing in flight.
    pub fn ack(&mut self, seq: u64, stamp: u64, now: u64) -> bool {
        match self.outstanding {
            Some((s, sent, size)) if s == seq && sent == stamp => {
                self.outstanding = None;
                self.lo = self.lo.max(size);
                self.fails = 0;
                self.due = now + GAP;
                true
            }
            _ => false,
        }
    }

    /// Whether a lost size waits for a small probe to prove the path up.
    pub fn wants_check(&self) -> bool {
        self.suspect.is_some()
    }

    /// A small probe sent at `sent` was answered at `now`: a size lost
    /// before it was lost to its size, not to the path ([`FAILS`] such
    /// losses make it too big).
    pub fn path_up(&mut self, sent: u64, now: u64) {
        if let Some((size, lost_at)) = self.suspect
            && sent >= lost_at
        {
            self.suspect = None;
            self.fails += 1;
            if self.fails >= FAILS {
                self.hi = size;
                self.fails = 0;
            }
            self.due = now + GAP;
        }
    }

    /// When the search next has something to do (never while a lost size
    /// waits for the table's small probe: that one wakes the table).
    pub fn wake(&self) -> u64 {
        if self.suspect.is_some() {
            return u64::MAX;
        }
        self.outstanding
            .map_or(self.due, |(_, sent, _)| sent + TIMEOUT)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a search against a path that carries `path` bytes; returns
    /// what it found and how long it took (ns).
    fn search(ceiling: u32, path: u32) -> (u32, u64, u32) {
        let mut s = Search::new(ceiling, 0);
        let (mut now, mut seq, mut probes) = (0u64, 0u64, 0u32);
        while s.found.is_none() {
            now = now.max(s.wake());
            if let Some(size) = s.next(seq, now, true) {
                probes += 1;
                if size <= path {
                    assert!(s.ack(seq, now, now + 1_000_000));
                }
                seq += 1;
            }
            if s.wants_check() {
                // The table's small probe, sent now, answered in 1 ms.
                s.path_up(now, now + 1_000_000);
                now += 1_000_000;
            }
            assert!(now < 120_000_000_000, "no result after {now} ns");
        }
        (s.found.unwrap_or(0), now, probes)
    }

    #[test]
    fn a_path_as_large_as_the_overlay_takes_one_probe() {
        let (found, _, probes) = search(1450, 1500);
        assert_eq!((found, probes), (1450, 1));
    }

    #[test]
    fn a_smaller_path_is_found_to_the_byte() {
        for path in [1350, 1400, 1449, 600, 1000] {
            let (found, took, probes) = search(1450, path);
            assert_eq!(found, path);
            assert!(probes <= 20, "{path}: {probes} probes");
            assert!(took < 30_000_000_000, "{path}: took {took} ns");
        }
    }

    #[test]
    fn a_silent_peer_teaches_nothing_and_a_stray_ack_counts_nothing() {
        let mut s = Search::new(1450, 0);
        assert_eq!(s.next(1, 0, true), Some(1450));
        // The peer stops answering: the timeouts do not lower the ceiling.
        for t in 1..10 {
            assert_eq!(s.next(2, t * TIMEOUT, false), None);
        }
        assert!(!s.wants_check());
        assert!(!s.ack(7, 0, 11 * TIMEOUT));
        assert_eq!(s.next(3, 11 * TIMEOUT, true), Some(1450));
        assert!(s.ack(3, 11 * TIMEOUT, 11 * TIMEOUT + 1));
        assert_eq!(s.next(4, 12 * TIMEOUT, true), None);
        assert_eq!(s.found, Some(1450));
        // Searched again after RAISE.
        assert_eq!(s.next(5, 12 * TIMEOUT + RAISE, true), Some(1450));
    }

    #[test]
    fn a_size_lost_while_the_path_was_down_counts_nothing() {
        let mut s = Search::new(1450, 0);
        assert_eq!(s.next(1, 10, true), Some(1450));
        // Lost; the peer still answered small probes, so the size is suspect.
        assert_eq!(s.next(2, 10 + TIMEOUT, true), None);
        assert!(s.wants_check());
        assert_eq!(s.wake(), u64::MAX, "the table's small probe wakes it");
        // An ack of a small probe sent before the size probe proves nothing.
        s.path_up(5, 10 + TIMEOUT + 1);
        assert!(s.wants_check());
        // One sent after it does: one failure, not yet FAILS.
        s.path_up(10 + TIMEOUT, 10 + TIMEOUT + 2);
        assert!(!s.wants_check());
        assert_eq!(
            s.next(3, 10 + 2 * TIMEOUT, true),
            Some(1450),
            "retried at the same size"
        );
    }
}
