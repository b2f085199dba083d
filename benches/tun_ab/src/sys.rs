//! The few syscalls the harness needs: entering a network namespace, this
//! process's CPU time and the machine's busy CPU time.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// Runs `f` with this thread in network namespace `name` (`/run/netns/NAME`,
/// as `ip netns add` makes it), then returns the thread to its own.
///
/// # Panics
///
/// If the thread cannot return to its namespace.
pub fn in_netns<T, E: From<io::Error>>(
    name: &str,
    f: impl FnOnce() -> Result<T, E>,
) -> Result<T, E> {
    let home = File::open("/proc/thread-self/ns/net")?;
    let target = File::open(format!("/run/netns/{name}"))?;
    setns(&target)?;
    let r = f();
    setns(&home).expect("cannot return to the original network namespace");
    r
}

fn setns(ns: &File) -> io::Result<()> {
    // SAFETY: `ns` is an open namespace file; setns only reads the descriptor.
    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } == -1 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// This process's CPU time (all threads) in seconds: (user, user + system).
pub fn self_cpu() -> (f64, f64) {
    // SAFETY: an all-zero rusage is a valid value of the plain C struct.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `ru` is a live rusage the kernel fills.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let user = secs(ru.ru_utime);
    (user, user + secs(ru.ru_stime))
}

/// The machine's busy CPU time in seconds since boot, from `/proc/stat`
/// (user, nice, system, irq, softirq, steal; guest time is within user).
pub fn machine_busy() -> io::Result<f64> {
    let stat = std::fs::read_to_string("/proc/stat")?;
    let line = stat.lines().next().unwrap_or_default();
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .map(|v| v.parse().unwrap_or(0.0))
        .collect();
    let busy: f64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| f.get(i)).sum();
    // SAFETY: sysconf has no memory arguments.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    Ok(busy / hz.max(1) as f64)
}
