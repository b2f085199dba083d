//! The calling thread's EEVDF slice (`sched_setattr` with `sched_runtime`
//! on a `SCHED_OTHER` thread, Linux 6.12+).

use std::io;
use std::mem::size_of;
use std::time::Duration;

use super::syscall;

/// Asks for a custom slice of `slice` for the calling thread (the kernel
/// clamps it to 0.1-100 ms), keeping its policy and nice value. A thread
/// with a shorter slice than the running task's gets an earlier deadline
/// when it wakes and preempts it (`PREEMPT_SHORT`); its share of the CPU
/// does not change. Fails on kernels before 6.12 (`EINVAL`: the field was
/// only read by `SCHED_DEADLINE`) or where `sched_setattr` is filtered.
pub fn set_slice(slice: Duration) -> io::Result<()> {
    // SAFETY: all-zero is a valid sched_attr.
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    let size = u32::try_from(size_of::<libc::sched_attr>()).unwrap_or(48);
    syscall!(syscall(
        libc::SYS_sched_getattr,
        0,
        &mut attr as *mut libc::sched_attr,
        size,
        0
    ))?;
    if attr.sched_policy != libc::SCHED_OTHER as u32 {
        return Ok(());
    }
    attr.size = size;
    attr.sched_flags = 0;
    attr.sched_runtime = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    syscall!(syscall(
        libc::SYS_sched_setattr,
        0,
        &attr as *const libc::sched_attr,
        0
    ))?;
    Ok(())
}

/// The calling thread's slice as the kernel reports it.
#[cfg(test)]
pub fn slice() -> io::Result<Duration> {
    // SAFETY: all-zero is a valid sched_attr.
    let mut attr: libc::sched_attr = unsafe { std::mem::zeroed() };
    let size = u32::try_from(size_of::<libc::sched_attr>()).unwrap_or(48);
    syscall!(syscall(
        libc::SYS_sched_getattr,
        0,
        &mut attr as *mut libc::sched_attr,
        size,
        0
    ))?;
    Ok(Duration::from_nanos(attr.sched_runtime))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_gets_the_slice_it_asks_for() {
        std::thread::spawn(|| {
            let before = slice().expect("sched_getattr");
            match set_slice(Duration::from_micros(200)) {
                Ok(()) => assert_eq!(slice().expect("sched_getattr"), Duration::from_micros(200)),
                // An old kernel: the default stays.
                Err(e) => {
                    assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
                    assert_eq!(slice().expect("sched_getattr"), before);
                }
            }
        })
        .join()
        .expect("thread");
    }
}
