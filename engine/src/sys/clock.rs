//! The kernel's clock discipline state (`adjtimex(2)` read-only), for
//! `weft doctor`: WireGuard drops a handshake initiation whose TAI64N
//! timestamp is not newer than the last one its peer accepted, so a node
//! whose wall clock steps backwards (no NTP, a bad RTC after a reboot)
//! cannot handshake until its clock catches up.

use std::io;

/// Whether the kernel's clock is synchronised (an NTP daemon such as
/// chronyd, ntpd or systemd-timesyncd disciplines it): `adjtimex` with no
/// mode bits set changes nothing and returns `TIME_ERROR` (or sets
/// `STA_UNSYNC`) while the clock is not synchronised.
pub fn clock_synchronised() -> io::Result<bool> {
    let mut t = std::mem::MaybeUninit::<libc::timex>::zeroed();
    // SAFETY: `t` is a zeroed (valid) timex; modes 0 only reads the state into it.
    let state = super::syscall!(adjtimex(t.as_mut_ptr()))?;
    // SAFETY: adjtimex succeeded and filled `t`; a zeroed timex is valid anyway.
    let t = unsafe { t.assume_init() };
    Ok(state != libc::TIME_ERROR && t.status & libc::STA_UNSYNC == 0)
}

#[cfg(test)]
mod tests {
    #[test]
    fn reading_the_clock_state_works_unprivileged() {
        // Either answer is fine; the call must not fail (it changes nothing).
        super::clock_synchronised().expect("adjtimex read");
    }
}
