//! A fixed-size hash map for the relay's per-datagram lookups
//! ([`super::relay`]): open addressing with linear probing, allocated once,
//! nothing allocated per operation, no lock.
//!
//! - **Bounded probes**: an entry sits at most [`WINDOW`] - 1 buckets after
//!   its home bucket, so a lookup reads at most [`WINDOW`] buckets (it stops
//!   at the first empty one). An insert that finds no empty bucket in its
//!   window takes the one its caller ranks lowest (the least recently used
//!   session) instead.
//! - **Deletion** shifts the following entries of the run back (no
//!   tombstones): every entry stays reachable from its home without an
//!   empty bucket in between, and a run never holds a dead bucket.
//! - **Keyed hash**: the home bucket is a multiply-xorshift mix of the key
//!   and a secret seed (the relay derives it from its private key), so a
//!   node cannot choose receiver indices that pile up in one window.
//! - Capacity: callers keep the load at most one quarter (the relay's
//!   1024 sessions in 4096 buckets, 64 nodes in 256): a simulation of
//!   random keys filling such tables (3,000 of 4096 buckets, 20,000 of
//!   256) never overflowed a window of 16, where at one half 23 % of full
//!   2048-bucket tables did (3e-4 per insert), and a lookup reads about
//!   1.2 buckets on average.

use std::net::SocketAddr;

/// Buckets an entry may sit from its home bucket, at most.
pub const WINDOW: usize = 16;

/// A key: a word to hash (equal keys give equal words).
pub trait Key: Copy + Eq {
    /// The key folded into 64 bits.
    fn word(&self) -> u64;
}

impl Key for (u8, u32) {
    fn word(&self) -> u64 {
        u64::from(self.0) << 32 | u64::from(self.1)
    }
}

impl Key for SocketAddr {
    fn word(&self) -> u64 {
        let ip = match self {
            SocketAddr::V4(a) => u128::from(u32::from(*a.ip())),
            SocketAddr::V6(a) => u128::from(*a.ip()),
        };
        ((ip >> 64) as u64) ^ (ip as u64).rotate_left(16) ^ u64::from(self.port())
    }
}

/// See the module docs.
#[derive(Debug, Clone)]
pub struct FixMap<K, V> {
    slots: Box<[Option<(K, V)>]>,
    mask: usize,
    seed: u64,
    len: usize,
}

impl<K: Key, V: Copy> FixMap<K, V> {
    /// A map of `buckets` buckets (rounded up to a power of two, at least
    /// [`WINDOW`]) hashed with `seed`.
    pub fn new(buckets: usize, seed: u64) -> FixMap<K, V> {
        let n = buckets.max(WINDOW).next_power_of_two();
        FixMap {
            slots: vec![None; n].into_boxed_slice(),
            mask: n - 1,
            seed,
            len: 0,
        }
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn home(&self, k: &K) -> usize {
        let mut x = k.word() ^ self.seed;
        x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
        x = (x ^ (x >> 33)).wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        (x ^ (x >> 33)) as usize & self.mask
    }

    /// The bucket holding `k`.
    fn find(&self, k: &K) -> Option<usize> {
        let h = self.home(k);
        for d in 0..WINDOW {
            let i = (h + d) & self.mask;
            match &self.slots[i] {
                None => return None,
                Some((q, _)) if q == k => return Some(i),
                Some(_) => {}
            }
        }
        None
    }

    /// The value of `k`.
    pub fn get(&self, k: &K) -> Option<&V> {
        let i = self.find(k)?;
        self.slots[i].as_ref().map(|(_, v)| v)
    }

    /// The value of `k`, to change.
    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        let i = self.find(k)?;
        self.slots[i].as_mut().map(|(_, v)| v)
    }

    /// Sets `k` to `v`: in place when present, else in the first empty
    /// bucket of its window, else over the entry of the window that `rank`
    /// orders first (the lowest), which is returned.
    pub fn insert<R: Ord>(&mut self, k: K, v: V, rank: impl Fn(&V) -> R) -> Option<(K, V)> {
        if let Some(i) = self.find(&k) {
            self.slots[i] = Some((k, v));
            return None;
        }
        let h = self.home(&k);
        let window = (0..WINDOW).map(|d| (h + d) & self.mask);
        if let Some(i) = window.clone().find(|i| self.slots[*i].is_none()) {
            self.slots[i] = Some((k, v));
            self.len += 1;
            return None;
        }
        let i = window.min_by_key(|i| self.slots[*i].as_ref().map(|(_, v)| rank(v)))?;
        self.slots[i].replace((k, v))
    }

    /// Removes `k`; its value.
    pub fn remove(&mut self, k: &K) -> Option<V> {
        let i = self.find(k)?;
        let (_, v) = self.slots[i]?;
        self.vacate(i);
        Some(v)
    }

    /// Empties bucket `i` and shifts the rest of its run back: an entry
    /// moves into the hole when the hole lies between its home and its
    /// bucket (cyclically), so each stays reachable from its home.
    fn vacate(&mut self, mut hole: usize) {
        self.slots[hole] = None;
        self.len -= 1;
        let mut i = hole;
        loop {
            i = (i + 1) & self.mask;
            let Some((k, _)) = &self.slots[i] else {
                return;
            };
            let home = self.home(k);
            // Distance from home to i, and from home to the hole.
            let to_i = i.wrapping_sub(home) & self.mask;
            let to_hole = hole.wrapping_sub(home) & self.mask;
            if to_hole < to_i {
                self.slots[hole] = self.slots[i].take();
                hole = i;
            }
        }
    }

    /// Removes every entry for which `drop` holds.
    pub fn remove_where(&mut self, drop: impl Fn(&K, &V) -> bool) {
        let mut i = 0;
        while i < self.slots.len() {
            match &self.slots[i] {
                Some((k, v)) if drop(k, v) => self.vacate(i),
                _ => i += 1,
            }
        }
    }

    /// The entry `rank` orders first (the lowest), if any.
    pub fn min_by<R: Ord>(&self, rank: impl Fn(&V) -> R) -> Option<K> {
        (self.slots.iter().flatten())
            .min_by_key(|(_, v)| rank(v))
            .map(|(k, _)| *k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every entry reachable from its home within the window, no empty
    /// bucket on the way, and `len` right.
    fn sound<K: Key + std::fmt::Debug, V: Copy>(m: &FixMap<K, V>) {
        let mut n = 0;
        for (i, s) in m.slots.iter().enumerate() {
            if let Some((k, _)) = s {
                n += 1;
                assert_eq!(m.find(k), Some(i), "{k:?}");
            }
        }
        assert_eq!(n, m.len());
    }

    #[test]
    fn inserts_finds_and_removes_with_shifts() {
        let mut m: FixMap<(u8, u32), u32> = FixMap::new(4096, 0x1234);
        for i in 0..1024u32 {
            assert_eq!(m.insert((i as u8, i), i, |v| *v), None);
        }
        sound(&m);
        assert_eq!(m.len(), 1024);
        for i in 0..1024u32 {
            assert_eq!(m.get(&(i as u8, i)), Some(&i));
        }
        assert_eq!(m.get(&(0, 5000)), None);
        for i in (0..1024u32).step_by(3) {
            assert_eq!(m.remove(&(i as u8, i)), Some(i));
        }
        sound(&m);
        for i in 0..1024u32 {
            let want = (i % 3 != 0).then_some(i);
            assert_eq!(m.get(&(i as u8, i)).copied(), want, "{i}");
        }
        m.remove_where(|k, _| k.1 % 2 == 0);
        sound(&m);
        assert!((0..1024u32).all(|i| m.get(&(i as u8, i)).is_some() == (i % 3 != 0 && i % 2 != 0)));
        // In place: no second entry.
        let n = m.len();
        m.insert((1, 1), 7, |v| *v);
        assert_eq!((m.len(), m.get(&(1, 1))), (n, Some(&7)));
    }

    #[test]
    fn a_full_window_gives_up_its_lowest_entry() {
        // A map of 16 buckets: every key's window is the whole map.
        let mut m: FixMap<(u8, u32), u32> = FixMap::new(16, 7);
        for i in 0..16u32 {
            assert_eq!(m.insert((0, i), 100 + i, |v| *v), None);
        }
        assert_eq!(m.insert((0, 99), 1, |v| *v), Some(((0, 0), 100)));
        assert_eq!(m.get(&(0, 0)), None);
        assert_eq!(m.get(&(0, 99)), Some(&1));
        assert_eq!(m.len(), 16);
        sound(&m);
        assert_eq!(m.min_by(|v| *v), Some((0, 99)));
    }

    #[test]
    fn addresses_are_keys() {
        let mut m: FixMap<SocketAddr, u8> = FixMap::new(128, 9);
        let a: SocketAddr = "192.0.2.1:51820".parse().expect("a");
        let b: SocketAddr = "192.0.2.1:51821".parse().expect("b");
        let c: SocketAddr = "[2001:db8::1]:51820".parse().expect("c");
        for (i, k) in [a, b, c].into_iter().enumerate() {
            m.insert(k, i as u8, |v| *v);
        }
        assert_eq!(
            (m.get(&a), m.get(&b), m.get(&c)),
            (Some(&0), Some(&1), Some(&2))
        );
        assert_eq!(m.remove(&b), Some(1));
        assert_eq!(m.get(&b), None);
        sound(&m);
    }
}
