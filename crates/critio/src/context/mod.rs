//! The enlightenment API: who is critical now, and what each task waits on.
//!
//! An application marks the threads that serve requests as *foreground*
//! (for the thread's life, or for a scope); everything else is background.
//! A task's effective class is **critical** while it is foreground or while
//! it inherits criticality from anyone (a count, not a flag: several critical
//! waiters may depend on it at once), and **non-critical** otherwise. Lower
//! layers call [`current_class`] when an I/O is submitted.
//!
//! ```text
//!   set_foreground() / foreground()        Blocker::resolve (sync, block, cache)
//!              |                                      |
//!              v                                      v
//!   +-------------------- Task (one OS thread) -----------------------+
//!   | id | life fg | fg scopes | inherited count | blocking status     |
//!   +------------------------------------------------------------------+
//!              |                                      ^
//!              v                                      |
//!   current_class() == Critical  <=>  fg || inherited > 0
//! ```
//!
//! A wrong call never breaks correctness, only priority: marking too much
//! foreground makes everything critical (the `none` scheme, in effect), and
//! marking too little lets requests wait behind background work.
//!
//! What the classes get is decided by the layers below: see each layer's
//! module docs and `docs/ARCHITECTURE.md`.

mod blocking;
#[cfg(not(loom))]
mod floor;
mod inherit;
#[cfg(not(loom))]
mod mirror;
mod registry;
mod task;

use std::marker::PhantomData;

pub use blocking::{Blocker, BlockingStatus, WaitScope};
#[cfg(not(loom))]
pub use floor::{
    background_cpu_min_share, cpu_floor_stats, next_relief, set_background_cpu_min_share,
    CpuFloorStats,
};
pub(crate) use inherit::propagate;
pub use inherit::{InheritKind, CHAIN_DEPTH_MAX};
#[cfg(not(loom))]
pub use mirror::{
    background_idle, background_nice, background_yield, ceiling, kernel_mirror, lock_ceiling,
    set_background, set_background_idle, set_background_nice, set_background_yield,
    set_kernel_mirror, set_lock_ceiling, yield_point, CeilingGuard,
};
/// Under loom there is no kernel to mirror into: marking a thread
/// background changes nothing the models check.
#[cfg(loom)]
pub fn set_background() {}
/// Under loom there is no kernel scheduler to yield to.
#[cfg(loom)]
pub fn yield_point() {}
/// Under loom there is no kernel scheduler: a ceiling section is a no-op.
#[cfg(loom)]
pub fn ceiling() {}
pub use crate::class::Class;
pub use registry::{lookup, registered_count};
pub use task::{Task, TaskId, TaskRef};

/// The current thread's task, registering the thread on first use.
pub fn current() -> TaskRef {
    registry::CURRENT.with(|r| r.0.clone())
}

/// The current thread's task id, registering the thread on first use.
/// Cheaper than [`current`]: no reference count is touched.
pub fn current_id() -> TaskId {
    registry::CURRENT.with(|r| r.0.id())
}

/// The current thread's effective class: one thread-local access and one
/// atomic load. Lower layers consult it when an I/O is submitted.
pub fn current_class() -> Class {
    registry::CURRENT.with(|r| r.0.class())
}

/// Whether the current thread is foreground (for life or in a scope),
/// ignoring inheritance: one thread-local access and one atomic load.
pub fn current_is_foreground() -> bool {
    registry::CURRENT.with(|r| r.0.is_foreground())
}

/// [`current_class`] and [`current_is_foreground`] together, read at the
/// same instant: one thread-local access and one atomic load (what the
/// block layer asks of every request).
pub fn current_class_and_foreground() -> (Class, bool) {
    registry::CURRENT.with(|r| r.0.class_and_foreground())
}

thread_local! {
    static BACKGROUND_LEVEL: std::cell::Cell<u8> = const { std::cell::Cell::new(0) };
}

/// Sets the current thread's background level (0, the default, is the
/// highest; see `block::BACKGROUND_LEVELS`): its non-critical I/O is queued
/// in that level's lane, below the critical lane and below every higher
/// level (paper 004's priority levels, like `ionice -c2 -n LEVEL`). A
/// request the thread makes critical (foreground, inherited) ignores it.
pub fn set_background_level(level: u8) {
    BACKGROUND_LEVEL.with(|l| l.set(level));
}

/// The current thread's background level (see [`set_background_level`]).
pub fn current_background_level() -> u8 {
    BACKGROUND_LEVEL.with(std::cell::Cell::get)
}

/// Marks the current thread foreground for the rest of its life (until
/// [`clear_foreground`]).
pub fn set_foreground() {
    registry::CURRENT.with(|r| {
        if r.0.set_life_foreground() {
            propagate(vec![r.0.clone()]);
        }
    })
}

/// Clears the for-life foreground mark set by [`set_foreground`]. Scopes
/// opened with [`foreground`] stay in force until their guards drop, and
/// inherited criticality is unaffected.
pub fn clear_foreground() {
    registry::CURRENT.with(|r| {
        if r.0.clear_life_foreground() {
            propagate(vec![r.0.clone()]);
        }
    })
}

/// Marks the current thread foreground until the returned guard drops.
/// Scopes nest.
pub fn foreground() -> ForegroundGuard {
    let task = current();
    if task.enter_scope() {
        propagate(vec![task.clone()]);
    }
    ForegroundGuard {
        task,
        _not_send: PhantomData,
    }
}

/// Keeps the current thread foreground while it lives; see [`foreground`].
#[must_use = "the thread stops being foreground when the guard drops"]
pub struct ForegroundGuard {
    task: TaskRef,
    _not_send: PhantomData<*const ()>,
}

impl Drop for ForegroundGuard {
    fn drop(&mut self) {
        if self.task.exit_scope() {
            propagate(vec![self.task.clone()]);
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn foreground_for_life_and_for_a_scope() {
        std::thread::spawn(|| {
            assert_eq!(current_class(), Class::NonCritical);
            {
                let _fg = foreground();
                assert_eq!(current_class(), Class::Critical);
                let inner = foreground();
                drop(inner);
                assert_eq!(current_class(), Class::Critical);
            }
            assert_eq!(current_class(), Class::NonCritical);
            set_foreground();
            assert_eq!(current_class(), Class::Critical);
            let scope = foreground();
            clear_foreground();
            assert_eq!(current_class(), Class::Critical, "scope still open");
            drop(scope);
            assert_eq!(current_class(), Class::NonCritical);
        })
        .join()
        .unwrap();
    }

    #[test]
    fn inheritance_makes_a_background_task_critical_until_revoked() {
        std::thread::spawn(|| {
            let me = current();
            assert!(me.inherit(InheritKind::Lock));
            assert_eq!(current_class(), Class::Critical);
            assert!(!me.is_foreground());
            assert!(me.revoke(InheritKind::Lock));
            assert_eq!(current_class(), Class::NonCritical);
        })
        .join()
        .unwrap();
    }
}
