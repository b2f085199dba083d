// weft's addition to boringtun, under boringtun's licence.
// SPDX-License-Identifier: BSD-3-Clause

//! weft: boringtun's clock is the caller's (this module replaces upstream's
//! `sleepyinstant`, which read `CLOCK_BOOTTIME` on every call). The caller
//! [`set`]s the time before it calls into a `Tunn` (weft's engine: once per
//! call of its WireGuard core, from the `now` it was given), and every timer,
//! session age and handshake decision of that thread reads it, so a test can
//! move time by hand. A thread that never set it reads the monotonic clock.
//! The time never goes backwards: an earlier `set` is ignored (upstream's
//! timer arithmetic would underflow).

use std::cell::Cell;
use std::time::Duration;

thread_local! {
    static NOW: Cell<Option<std::time::Instant>> = const { Cell::new(None) };
}

/// Sets this thread's time to `now` (unless it is earlier than the last).
pub fn set(now: std::time::Instant) {
    NOW.with(|t| {
        if t.get().map_or(true, |last| now > last) {
            t.set(Some(now));
        }
    });
}

/// Moves this thread's time `d` ahead (tests).
#[cfg(test)]
pub(crate) fn advance(d: Duration) {
    set(Instant::now().0 + d);
}

/// A point in time on this thread's clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Instant(std::time::Instant);

impl Instant {
    /// The time last [`set`] on this thread, or the monotonic clock's.
    pub fn now() -> Self {
        Instant(NOW.with(Cell::get).unwrap_or_else(std::time::Instant::now))
    }

    /// The time from `earlier` to this one (zero if `earlier` is later).
    pub fn duration_since(&self, earlier: Instant) -> Duration {
        self.0.saturating_duration_since(earlier.0)
    }

    /// The time since this one.
    pub fn elapsed(&self) -> Duration {
        Self::now().duration_since(*self)
    }
}
