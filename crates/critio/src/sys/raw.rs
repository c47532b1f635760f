//! Raw system calls, made through `libc`: the
//! per-thread I/O priority (`ioprio_set(2)`, `ioprio_get(2)`), the
//! scheduling policy, and populating memory ahead of its first write
//! (`madvise(2)`, for the page cache's frames).
//!
//! An I/O priority is a 16-bit value, the class in the top 3 bits and the
//! level (0 = highest) in the low bits:
//!
//! ```text
//!   bits 15..13   bits 12..3          bits 2..0
//!  +-----------+-------------------+-----------+
//!  |  class    | hints (ignored)   |  level    |     0 == no priority set
//!  +-----------+-------------------+-----------+
//!    1 = RT, 2 = BE, 3 = IDLE
//! ```
//!
//! The same value goes into an io_uring SQE's `ioprio` field for one
//! request, or into a thread's I/O context with `ioprio_set`, where it
//! applies to every I/O the thread issues without a per-request value.
//! The safe, typed interface is `super::prio` ([`crate::sys`]).

use std::io;

/// No class: the kernel derives a priority from the thread's CPU nice value.
pub const IOPRIO_CLASS_NONE: u16 = 0;
/// Real-time: served before every other class; needs `CAP_SYS_NICE` or
/// `CAP_SYS_ADMIN`.
pub const IOPRIO_CLASS_RT: u16 = 1;
/// Best-effort: the default class, levels 0 (high) to 7 (low).
pub const IOPRIO_CLASS_BE: u16 = 2;
/// Idle: served only when no other class has I/O pending (on schedulers
/// that honour classes).
pub const IOPRIO_CLASS_IDLE: u16 = 3;

/// Where the class starts in an I/O priority value.
pub const IOPRIO_CLASS_SHIFT: u16 = 13;
/// The bits of the level (kernels since 6.5 use bits 3..12 for hints).
pub const IOPRIO_LEVEL_MASK: u16 = 0x7;
/// The number of levels per class (0..=7).
pub const IOPRIO_LEVELS: u8 = 8;

const _: () = assert!(IOPRIO_LEVELS as u16 == IOPRIO_LEVEL_MASK + 1);
const _: () = assert!(IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT >> IOPRIO_CLASS_SHIFT == 3);

/// `ioprio_set`/`ioprio_get` target: one thread (a tid) or, with 0, the
/// calling thread.
const IOPRIO_WHO_PROCESS: libc::c_int = 1;

/// The raw value for `class` and `level`.
pub const fn ioprio_value(class: u16, level: u16) -> u16 {
    (class << IOPRIO_CLASS_SHIFT) | (level & IOPRIO_LEVEL_MASK)
}

/// Sets the I/O priority of thread `tid` (0 = the calling thread).
pub fn ioprio_set(tid: i32, value: u16) -> io::Result<()> {
    // SAFETY: `ioprio_set(which, who, ioprio)` takes three integers by value
    // and touches no memory of this process; a bad tid or value is reported
    // as -1/errno, which is checked below.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            IOPRIO_WHO_PROCESS,
            tid as libc::c_int,
            libc::c_int::from(value),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The I/O priority of thread `tid` (0 = the calling thread).
pub fn ioprio_get(tid: i32) -> io::Result<u16> {
    // SAFETY: `ioprio_get(which, who)` takes two integers by value and
    // touches no memory of this process; it returns the priority or -1 with
    // errno, which is checked below.
    let rc = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid as libc::c_int) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    u16::try_from(rc).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("ioprio_get returned {rc}, which is not a 16-bit I/O priority"),
        )
    })
}

/// A thread's scheduling policy, as critio sets and reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SchedPolicy {
    /// `SCHED_OTHER`: the fair scheduler, at the thread's nice value.
    Normal,
    /// `SCHED_IDLE`: runs only on a CPU nothing else wants.
    Idle,
    /// `SCHED_FIFO` (set at the lowest real-time level, the lock ceiling):
    /// above every normal thread.
    Realtime,
    /// Any other policy (read only).
    Other,
}

/// The real-time priority a thread at the lock ceiling runs at (the
/// lowest real-time level: above every normal thread, below anything the
/// administrator made real-time).
pub const CEILING_RT_PRIORITY: i32 = 1;

/// Puts thread `tid` (0: the calling thread) under `policy`. Its nice
/// value is kept (the kernel stores it apart from the policy).
pub fn set_thread_policy(tid: i32, policy: SchedPolicy) -> io::Result<()> {
    match policy {
        SchedPolicy::Normal => set_scheduler(tid, libc::SCHED_OTHER, 0),
        SchedPolicy::Idle => set_scheduler(tid, libc::SCHED_IDLE, 0),
        SchedPolicy::Realtime => set_thread_fifo(tid, CEILING_RT_PRIORITY),
        SchedPolicy::Other => Err(io::Error::from(io::ErrorKind::InvalidInput)),
    }
}

/// Puts thread `tid` (0: the calling thread) in `SCHED_FIFO` at real-time
/// `priority` (1..=99); [`SchedPolicy::Realtime`] is this at
/// [`CEILING_RT_PRIORITY`]. A thread above the ceiling preempts critio's
/// ceiling sections too (a probe that must see only what is above the
/// process, the host and the kernel).
pub fn set_thread_fifo(tid: i32, priority: i32) -> io::Result<()> {
    set_scheduler(tid, libc::SCHED_FIFO, priority)
}

fn set_scheduler(tid: i32, policy: libc::c_int, priority: libc::c_int) -> io::Result<()> {
    let param = libc::sched_param {
        sched_priority: priority,
    };
    // SAFETY: `sched_setscheduler(tid, policy, &param)` reads one
    // `sched_param` that lives on this stack for the whole call and writes
    // no memory of this process; failure is -1/errno, checked below.
    let rc = unsafe { libc::sched_setscheduler(tid, policy, &param) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Backs the pages of `[addr, addr + len)` with memory now, as a write to
/// each would, without writing: `madvise(MADV_POPULATE_WRITE)` (Linux
/// 5.14+; older kernels answer `EINVAL`). Anonymous memory not yet touched
/// is allocated and zeroed by the kernel here, in the calling thread,
/// instead of at its first write; pages already there keep their contents.
/// `addr` must be page-aligned.
pub fn populate_write(addr: usize, len: usize) -> io::Result<()> {
    // SAFETY: MADV_POPULATE_WRITE changes no byte of this process's memory
    // (it faults in pages that are missing, which for anonymous memory read
    // as zero either way, and leaves present pages as they are), so no
    // Rust reference to the range, even one another thread writes through
    // meanwhile, sees a change. The kernel checks the range itself: an
    // unmapped part is ENOMEM, an unaligned `addr` EINVAL, both returned.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Asks for transparent huge pages over `[addr, addr + len)` (`huge`:
/// `madvise(MADV_HUGEPAGE)`; the kernel then backs its aligned 2 MiB
/// stretches with huge pages where it can, as it does everywhere when the
/// system's setting is `always` rather than `madvise`), or for none
/// (`MADV_NOHUGEPAGE`). `addr` must be page-aligned. `EINVAL` where the
/// kernel has no transparent huge pages.
pub fn advise_huge_pages(addr: usize, len: usize, huge: bool) -> io::Result<()> {
    let advice = match huge {
        true => libc::MADV_HUGEPAGE,
        false => libc::MADV_NOHUGEPAGE,
    };
    // SAFETY: MADV_HUGEPAGE and MADV_NOHUGEPAGE only set a flag on the
    // mappings of the range (how the kernel backs them from now on); they
    // change no byte of this process's memory, so no Rust reference to the
    // range sees a change. The kernel checks the range itself: an unmapped
    // part is ENOMEM, an unaligned `addr` EINVAL, both returned.
    let rc = unsafe { libc::madvise(addr as *mut libc::c_void, len, advice) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The scheduling policy of thread `tid` (0: the calling thread).
pub fn thread_policy(tid: i32) -> io::Result<SchedPolicy> {
    // SAFETY: `sched_getscheduler(tid)` takes an integer and touches no
    // memory of this process; it returns the policy or -1/errno.
    let rc = unsafe { libc::sched_getscheduler(tid) };
    Ok(match rc {
        libc::SCHED_OTHER => SchedPolicy::Normal,
        libc::SCHED_IDLE => SchedPolicy::Idle,
        libc::SCHED_FIFO => SchedPolicy::Realtime,
        rc if rc < 0 => return Err(io::Error::last_os_error()),
        _ => SchedPolicy::Other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A thread set to `SCHED_FIFO` at a priority runs there (read back
    /// from the kernel), and leaves it for the fair scheduler.
    #[test]
    fn a_thread_goes_real_time_above_the_ceiling_and_back() {
        std::thread::spawn(|| {
            match set_thread_fifo(0, CEILING_RT_PRIORITY + 1) {
                // No CAP_SYS_NICE nor RLIMIT_RTPRIO here: nothing to check.
                Err(e) if e.raw_os_error() == Some(libc::EPERM) => return,
                r => r.unwrap(),
            }
            assert_eq!(thread_policy(0).unwrap(), SchedPolicy::Realtime);
            let mut param = libc::sched_param { sched_priority: 0 };
            // SAFETY: `sched_getparam(0, &mut param)` writes one
            // `sched_param` that lives on this stack for the whole call.
            let rc = unsafe { libc::sched_getparam(0, &mut param) };
            assert_eq!(rc, 0, "{}", io::Error::last_os_error());
            assert_eq!(param.sched_priority, CEILING_RT_PRIORITY + 1);
            set_thread_policy(0, SchedPolicy::Normal).unwrap();
            assert_eq!(thread_policy(0).unwrap(), SchedPolicy::Normal);
        })
        .join()
        .unwrap();
    }
}
