//! The kernel's per-thread and per-request I/O priority: the `ioprio_set(2)`
//! and `ioprio_get(2)` system calls, and the typed priorities critio hands
//! the kernel for each class; and the thread's scheduling policy
//! (`sched_setscheduler(2)`), which `context` sets for the lock ceiling
//! and the background's idle policy (and `critio bench`'s stall probe, one
//! real-time level above the ceiling).
//!
//! Two layers hand a class to the kernel as an I/O priority: `device`
//! (the `uring` backend in each request's SQE, the `pool` backend's
//! per-class workers with `ioprio_set`) and `context` (the optional kernel
//! mirror, which sets each thread's priority to its class's as it flips).
//! Neither owns the other, so the system calls and the priority types live
//! here, below both, and depend only on [`crate::class`]: `context` no
//! longer reaches into a device backend to mirror a class, and a backend
//! does not reach into `context`.
//!
//! ```text
//!   context (kernel mirror) ──┐
//!   device::uring (SQE ioprio)├──> sys::{IoPriority, ClassPriorities, set_thread_ioprio*}
//!   device::pool (workers) ───┘            │
//!                                          v
//!                               raw: ioprio_set / ioprio_get (unsafe, libc::syscall)
//! ```
//!
//! | module | what                                                          |
//! |--------|---------------------------------------------------------------|
//! | `raw`  | the system calls and the kernel's 16-bit priority layout      |
//! | `prio` | [`IoPriority`], [`ClassPriorities`], the thread functions     |
//! | `disk` | the disk under a path: name, I/O scheduler, queue depth (sysfs) |
//! | `schedstat` | a thread's run and run-queue wait times (procfs), for the CPU floor |
//! | `raw::populate_write` | memory backed ahead of its first write (`madvise`), for the cache |
//! | `raw::advise_huge_pages` | transparent huge pages asked for (`madvise`), for the cache's frames |
//! | [`mapping_flags`], `mapping_field` | the kernel's flags (and any other `smaps` field, for tests) for the mapping holding an address (procfs) |
//!
//! `raw` is one of the two places in critio with `unsafe` (the other is
//! `device::uring`, which hands the kernel buffers in SQEs); each `unsafe`
//! block says why it is sound. The same items are re-exported from
//! `critio::device::uring`, where they used to live.

mod disk;
mod prio;
#[allow(unsafe_code)] // the ioprio system calls (`libc::syscall`), sched_setscheduler, madvise
mod raw;
mod schedstat;

pub use raw::{
    advise_huge_pages, populate_write, set_thread_fifo, set_thread_policy, thread_policy,
    SchedPolicy, CEILING_RT_PRIORITY,
};

/// The raw calls, for a synchronous write that takes its request's
/// priority for its thread (`device::uring`).
pub(crate) use raw::{ioprio_get, ioprio_set};

pub use disk::{active_scheduler, disk_of, Disk};
pub use prio::{
    set_thread_ioprio, set_thread_ioprio_or_fallback, thread_ioprio, ClassPriorities, InvalidLevel,
    IoPriority,
};
pub use schedstat::{thread_cpu_times, CpuTimes};

/// The kernel's flags (`VmFlags` of `/proc/self/smaps`: `rd`, `wr`, `hg`
/// for huge pages asked for, `nh` for never, ...) of the mapping of this
/// process that holds `addr`; None if no mapping holds it.
pub fn mapping_flags(addr: usize) -> std::io::Result<Option<Vec<String>>> {
    Ok(mapping_field(addr, "VmFlags")?
        .map(|flags| flags.split_whitespace().map(str::to_owned).collect()))
}

/// The value of field `name` (`Rss`, `VmFlags`, ...: the text after
/// "name:", trimmed) in `/proc/self/smaps` for the mapping of this process
/// that holds `addr`; None if no mapping holds it (or it has no such
/// field).
pub(crate) fn mapping_field(addr: usize, name: &str) -> std::io::Result<Option<String>> {
    let smaps = std::fs::read_to_string("/proc/self/smaps")?;
    let mut inside = false;
    for line in smaps.lines() {
        if let Some(value) = line.strip_prefix(name).and_then(|v| v.strip_prefix(':')) {
            if inside {
                return Ok(Some(value.trim().to_owned()));
            }
            continue;
        }
        // A mapping's first line: "start-end perms offset dev inode path".
        let range = line
            .split_whitespace()
            .next()
            .and_then(|r| r.split_once('-'));
        let parsed = range.and_then(|(a, b)| {
            let a = usize::from_str_radix(a, 16).ok()?;
            let b = usize::from_str_radix(b, 16).ok()?;
            Some((a, b))
        });
        if let Some((start, end)) = parsed {
            inside = (start..end).contains(&addr);
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mapping_of_a_heap_address_is_found_and_one_of_nothing_is_not() {
        let v = vec![1u8; 1 << 20];
        let flags = mapping_flags(v.as_ptr() as usize).unwrap().expect("mapped");
        assert!(
            flags.iter().any(|f| f == "rd") && flags.iter().any(|f| f == "wr"),
            "{flags:?}"
        );
        assert_eq!(mapping_flags(8).unwrap(), None, "page 0 is never mapped");
    }
}
