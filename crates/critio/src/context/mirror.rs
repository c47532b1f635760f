//! Optional: mirror each thread's effective class into the kernel with
//! `ioprio_set`, so I/O the kernel issues on the thread's behalf (buffered
//! writes, page-cache misses of the application itself) is prioritized too.
//! Off by default (`context.kernel_mirror` in the config).
//!
//! ```text
//!   class flip (foreground, inherit, revoke) ──> chain walk ──> ioprio_set(tid, prio of class)
//! ```

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use super::task::Task;
use crate::device::uring::{set_thread_ioprio_or_fallback, ClassPriorities};

static ON: AtomicBool = AtomicBool::new(false);
static PRIORITIES: RwLock<Option<ClassPriorities>> = RwLock::new(None);

/// Turns the mirror on with `priorities` (or off with `None`). Turning it on
/// sets every registered thread's kernel priority at once.
pub fn set_kernel_mirror(priorities: Option<ClassPriorities>) {
    *PRIORITIES.write().unwrap_or_else(|e| e.into_inner()) = priorities;
    ON.store(priorities.is_some(), Ordering::SeqCst);
    if priorities.is_some() {
        for task in super::registry::all() {
            mirror(&task);
        }
    }
}

/// Whether the mirror is on.
pub fn kernel_mirror() -> Option<ClassPriorities> {
    *PRIORITIES.read().unwrap_or_else(|e| e.into_inner())
}

/// Sets `task`'s kernel priority to its class's, if the mirror is on. Best
/// effort: a thread that exited or a refused class is not an error here
/// (a refused real-time class falls back to best-effort 0).
pub(crate) fn mirror(task: &Task) {
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    if let Some(p) = kernel_mirror() {
        let _ = set_thread_ioprio_or_fallback(task.os_tid(), p.of(task.class()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::context;
    use crate::device::uring::{thread_ioprio, IoPriority};

    #[test]
    fn a_threads_kernel_priority_follows_its_class() {
        let p = ClassPriorities::LEVELS;
        set_kernel_mirror(Some(p));
        let seen = std::thread::spawn(|| {
            let tid = context::current().os_tid();
            let before = thread_ioprio(tid).unwrap();
            context::set_foreground();
            let fg = thread_ioprio(tid).unwrap();
            context::clear_foreground();
            let bg = thread_ioprio(tid).unwrap();
            (before, fg, bg)
        })
        .join()
        .unwrap();
        set_kernel_mirror(None);
        // Registration happens before the mirror sees the thread, so its
        // priority starts as the kernel default; each flip then mirrors.
        assert_eq!(seen.1, IoPriority::BestEffort(0));
        assert_eq!(seen.2, IoPriority::BestEffort(7));
    }
}
