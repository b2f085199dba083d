//! Cross-worker handoff: a packet read by a worker that does not own its
//! peer goes to the owner (see the [`super`] docs).
//!
//! Buffers come from one fixed pool shared by all workers and go back to it
//! after the owner has processed them; inboxes are bounded. Nothing is
//! allocated after start. A full inbox or an empty pool drops the packet.

use std::sync::Arc;

use crossbeam_channel::{Receiver, Sender, TrySendError, bounded};

use crate::path::wg::Train;
use crate::sys::event::Event;

/// Pool buffers per worker.
const BUFFERS_PER_WORKER: usize = 16;
/// Handed-off packets a worker takes per step ([`Inbox::take`]).
const BUDGET: usize = 32;

/// What a handed-off buffer holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A TUN read (with its vnet header when the TUN has one).
    Tun,
    /// A received datagram or GRO train, and how it arrived.
    Udp(Train),
}

/// One handed-off packet: `buf[..len]`.
#[derive(Debug)]
pub(crate) struct Msg {
    pub kind: Kind,
    pub buf: Vec<u8>,
    pub len: usize,
}

/// The shared half: every worker's inbox sender and wake-up event, and the pool.
#[derive(Debug)]
pub(crate) struct Hub {
    inboxes: Vec<Sender<Msg>>,
    events: Vec<Arc<Event>>,
    pool_tx: Sender<Vec<u8>>,
    pool_rx: Receiver<Vec<u8>>,
}

/// A worker's own half.
#[derive(Debug)]
pub(crate) struct Inbox {
    rx: Receiver<Msg>,
    pub event: Arc<Event>,
}

impl Inbox {
    /// Up to [`BUDGET`] packets other workers handed over, each given to
    /// `f` (its kind and bytes) and its buffer then returned to `hub`'s
    /// pool; whether there were any.
    pub fn take(&self, hub: &Hub, mut f: impl FnMut(Kind, &mut [u8])) -> bool {
        let mut any = false;
        for _ in 0..BUDGET {
            let Ok(mut m) = self.rx.try_recv() else {
                break;
            };
            any = true;
            f(m.kind, &mut m.buf[..m.len]);
            hub.recycle(m.buf);
        }
        any
    }
}

/// Why a handoff failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Full;

impl Hub {
    /// A hub for `workers` workers with buffers of `buf_size` bytes.
    pub fn new(workers: usize, buf_size: usize) -> std::io::Result<(Arc<Hub>, Vec<Inbox>)> {
        let n = workers * BUFFERS_PER_WORKER;
        let (pool_tx, pool_rx) = bounded(n);
        for _ in 0..n {
            let _ = pool_tx.try_send(vec![0u8; buf_size]);
        }
        let (mut inboxes, mut events, mut mine) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..workers {
            let (tx, rx) = bounded(n);
            let ev = Arc::new(Event::new()?);
            inboxes.push(tx);
            events.push(ev.clone());
            mine.push(Inbox { rx, event: ev });
        }
        Ok((
            Arc::new(Hub {
                inboxes,
                events,
                pool_tx,
                pool_rx,
            }),
            mine,
        ))
    }

    /// Copies `data` into a pool buffer and queues it for worker `to`, then wakes it.
    pub fn send(&self, to: usize, kind: Kind, data: &[u8]) -> Result<(), Full> {
        let Some(inbox) = self.inboxes.get(to) else {
            return Err(Full);
        };
        let mut buf = self.pool_rx.try_recv().map_err(|_| Full)?;
        if data.len() > buf.len() {
            self.recycle(buf);
            return Err(Full);
        }
        buf[..data.len()].copy_from_slice(data);
        match inbox.try_send(Msg {
            kind,
            buf,
            len: data.len(),
        }) {
            Ok(()) => {
                if let Some(e) = self.events.get(to) {
                    e.notify();
                }
                Ok(())
            }
            Err(TrySendError::Full(m) | TrySendError::Disconnected(m)) => {
                self.recycle(m.buf);
                Err(Full)
            }
        }
    }

    /// Returns a buffer to the pool.
    pub fn recycle(&self, buf: Vec<u8>) {
        let _ = self.pool_tx.try_send(buf);
    }
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use super::*;

    #[test]
    fn buffers_circulate_and_the_pool_bounds_the_backlog() {
        let (hub, inboxes) = Hub::new(2, 64).expect("hub");
        let src: SocketAddr = "192.0.2.1:51820".parse().expect("sa");
        assert_eq!(
            hub.send(
                1,
                Kind::Udp(Train {
                    src,
                    stride: 3,
                    vouched: None,
                }),
                b"abc"
            ),
            Ok(())
        );
        let m = inboxes[1].rx.try_recv().expect("queued");
        assert_eq!(
            (m.kind, &m.buf[..m.len]),
            (
                Kind::Udp(Train {
                    src,
                    stride: 3,
                    vouched: None,
                }),
                &b"abc"[..]
            )
        );
        hub.recycle(m.buf);
        assert_eq!(
            hub.send(0, Kind::Tun, &[0; 65]),
            Err(Full),
            "too big for a buffer"
        );
        let mut sent = 0;
        while hub.send(0, Kind::Tun, b"x").is_ok() {
            sent += 1;
        }
        assert_eq!(sent, 2 * BUFFERS_PER_WORKER);
        assert_eq!(hub.send(7, Kind::Tun, b"x"), Err(Full));
        // The owner takes them (a budget's worth), and their buffers are free again.
        let mut taken = 0;
        assert!(inboxes[0].take(&hub, |k, d| {
            assert_eq!((k, &*d), (Kind::Tun, &b"x"[..]));
            taken += 1;
        }));
        assert_eq!(taken, BUDGET.min(sent));
        assert!(hub.send(1, Kind::Tun, b"y").is_ok());
        assert!(inboxes[1].take(&hub, |_, d| assert_eq!(&*d, b"y")));
        assert!(!inboxes[1].take(&hub, |_, _| panic!("an empty inbox")));
    }
}
