//! A task: one OS thread, its criticality word and its blocking status.
//!
//! The criticality word packs everything that makes a task critical into one
//! `AtomicU64`, so `class()` is a single load and a flip between the classes
//! is detected exactly by the read-modify-write that causes it:
//!
//! ```text
//!   bit 48        bits 32..48            bits 0..32
//!  +------+---------------------+---------------------------+
//!  | life | foreground scopes   | inheritance count         |
//!  +------+---------------------+---------------------------+
//!   word == 0  <=>  non-critical
//! ```

use std::fmt;
use std::sync::Arc;

use super::blocking::{Blocking, BlockingStatus};
use super::inherit::InheritKind;
use crate::class::Class;
use crate::metrics;
use crate::shim::{thread, AtomicU64, Ordering, SideMutex};

/// A task's stable identity, unique for the life of the process (never
/// reused). `0` is never a valid id.
pub type TaskId = u64;

const INHERIT_ONE: u64 = 1;
const INHERIT_MASK: u64 = 0xFFFF_FFFF;
const SCOPE_ONE: u64 = 1 << 32;
const SCOPE_MASK: u64 = 0xFFFF << 32;
const LIFE_BIT: u64 = 1 << 48;

const _: () = assert!(INHERIT_MASK & SCOPE_MASK == 0);
const _: () = assert!(SCOPE_MASK & LIFE_BIT == 0);
const _: () = assert!(INHERIT_MASK.count_ones() == 32);

/// A shared handle to a task.
pub type TaskRef = Arc<Task>;

/// One OS thread as critio sees it. Created lazily the first time the thread
/// touches critio (see [`crate::context::current`]).
pub struct Task {
    id: TaskId,
    os_tid: i32,
    name: Option<String>,
    crit: AtomicU64,
    thread: thread::Thread,
    blocking: SideMutex<Option<Blocking>>,
    /// For a thread marked background: its own nice and what critio last
    /// added to it (see `mirror.rs`); None for every other thread.
    #[cfg_attr(loom, allow(dead_code))]
    nice: parking_lot::Mutex<Option<Nice>>,
    /// For a thread marked background: how many nice levels the CPU floor
    /// takes off the background nice while it is non-critical (see
    /// `floor.rs`).
    #[cfg_attr(loom, allow(dead_code))]
    relief: std::sync::atomic::AtomicI32,
}

/// A background thread's CPU nice: the one it had when it was marked
/// background (a request thread's, which it gets back while critical),
/// and how many levels critio last put it below that.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(loom, allow(dead_code))]
pub(crate) struct Nice {
    pub(crate) base: i32,
    pub(crate) offset: i32,
}

impl Nice {
    /// The nice value `offset` levels below `base`, within the kernel's
    /// range.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn value(base: i32, offset: i32) -> i32 {
        (base + offset).clamp(-20, 19)
    }
}

impl Task {
    pub(crate) fn new(id: TaskId) -> Self {
        assert!(id != 0, "task id 0 is reserved");
        let current = thread::current();
        Self {
            id,
            os_tid: rustix::thread::gettid().as_raw_nonzero().get(),
            name: current.name().map(str::to_owned),
            crit: AtomicU64::new(0),
            thread: current,
            blocking: SideMutex::new(None),
            nice: parking_lot::Mutex::new(None),
            relief: std::sync::atomic::AtomicI32::new(0),
        }
    }

    /// The CPU nice state of a thread marked background (None: not one).
    #[cfg_attr(loom, allow(dead_code))] // the mirror is not built under loom
    pub(crate) fn nice(&self) -> &parking_lot::Mutex<Option<Nice>> {
        &self.nice
    }

    /// The CPU floor's relief of a background thread, in nice levels.
    #[cfg_attr(loom, allow(dead_code))]
    pub(crate) fn relief(&self) -> &std::sync::atomic::AtomicI32 {
        &self.relief
    }

    /// The task's stable id.
    pub fn id(&self) -> TaskId {
        self.id
    }

    /// The Linux thread id (for `ioprio_set` and for reading `/proc`).
    pub fn os_tid(&self) -> i32 {
        self.os_tid
    }

    /// The thread's name, if it had one when it registered.
    pub fn name(&self) -> Option<&str> {
        self.name.as_deref()
    }

    /// The effective class: critical when foreground or inheriting.
    pub fn class(&self) -> Class {
        if self.is_critical() {
            Class::Critical
        } else {
            Class::NonCritical
        }
    }

    /// `class() == Class::Critical`, as one atomic load.
    pub fn is_critical(&self) -> bool {
        self.crit.load(Ordering::SeqCst) != 0
    }

    /// Whether the task is foreground (for life or in a scope), ignoring
    /// inheritance.
    pub fn is_foreground(&self) -> bool {
        self.crit.load(Ordering::SeqCst) & (LIFE_BIT | SCOPE_MASK) != 0
    }

    /// [`Task::class`] and [`Task::is_foreground`] from one atomic load.
    pub fn class_and_foreground(&self) -> (Class, bool) {
        let crit = self.crit.load(Ordering::SeqCst);
        let class = if crit != 0 {
            Class::Critical
        } else {
            Class::NonCritical
        };
        (class, crit & (LIFE_BIT | SCOPE_MASK) != 0)
    }

    /// How many inheritance sources currently make this task critical.
    pub fn inherited_count(&self) -> u32 {
        (self.crit.load(Ordering::SeqCst) & INHERIT_MASK) as u32
    }

    /// What the task is blocked on right now, if anything.
    pub fn blocking_status(&self) -> Option<BlockingStatus> {
        self.blocking.lock().as_ref().map(|b| b.status)
    }

    /// Adds one inheritance source. Returns true when this made the task
    /// critical (the caller must then continue the chain walk from it).
    ///
    /// For implementors of [`crate::context::Blocker`]; every `inherit` must
    /// be matched by exactly one [`Task::revoke`] when the dependency ends.
    pub fn inherit(&self, kind: InheritKind) -> bool {
        let prev = self.crit.fetch_add(INHERIT_ONE, Ordering::SeqCst);
        assert!(
            prev & INHERIT_MASK != INHERIT_MASK,
            "inheritance count overflow"
        );
        metrics::global().count_boost(kind);
        prev == 0
    }

    /// Removes one inheritance source. Returns true when this made the task
    /// non-critical (the caller must then continue the chain walk from it).
    pub fn revoke(&self, kind: InheritKind) -> bool {
        let prev = self.crit.fetch_sub(INHERIT_ONE, Ordering::SeqCst);
        assert!(
            prev & INHERIT_MASK != 0,
            "revoke without a matching inherit"
        );
        metrics::global().count_revoke(kind);
        prev == INHERIT_ONE
    }

    /// Marks the task foreground for the rest of its life. Returns true when
    /// the class flipped.
    pub(crate) fn set_life_foreground(&self) -> bool {
        self.crit.fetch_or(LIFE_BIT, Ordering::SeqCst) == 0
    }

    /// Clears the for-life foreground mark. Returns true when the class
    /// flipped.
    pub(crate) fn clear_life_foreground(&self) -> bool {
        self.crit.fetch_and(!LIFE_BIT, Ordering::SeqCst) == LIFE_BIT
    }

    pub(crate) fn enter_scope(&self) -> bool {
        let prev = self.crit.fetch_add(SCOPE_ONE, Ordering::SeqCst);
        assert!(
            prev & SCOPE_MASK != SCOPE_MASK,
            "foreground scope nesting overflow"
        );
        prev == 0
    }

    pub(crate) fn exit_scope(&self) -> bool {
        let prev = self.crit.fetch_sub(SCOPE_ONE, Ordering::SeqCst);
        assert!(
            prev & SCOPE_MASK != 0,
            "foreground scope exit without entry"
        );
        prev == SCOPE_ONE
    }

    pub(crate) fn set_blocking(&self, blocking: Option<Blocking>) {
        let mut slot = self.blocking.lock();
        // A task blocks on one thing at a time; nesting is a bug.
        assert!(
            slot.is_none() || blocking.is_none(),
            "task {} blocks on {:?} while already blocked",
            self.id,
            blocking.as_ref().map(|b| b.status)
        );
        *slot = blocking;
    }

    /// Clears the blocking status, returning what it was.
    pub(crate) fn take_blocking(&self) -> Option<Blocking> {
        self.blocking.lock().take()
    }

    /// The object this task is blocked on, for the chain walk.
    pub(crate) fn blocker(&self) -> Option<Blocking> {
        self.blocking.lock().clone()
    }

    /// Wakes the task if it is parked in one of critio's waits. Waits
    /// re-check their condition, so a stray wake-up is harmless.
    pub fn unpark(&self) {
        self.thread.unpark();
    }
}

impl fmt::Debug for Task {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Task")
            .field("id", &self.id)
            .field("name", &self.name)
            .field("class", &self.class())
            .field("foreground", &self.is_foreground())
            .field("inherited", &self.inherited_count())
            .finish()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn class_is_critical_exactly_while_any_source_holds() {
        let t = Task::new(u64::MAX);
        assert_eq!(t.class(), Class::NonCritical);
        assert!(t.inherit(InheritKind::Lock));
        assert!(!t.inherit(InheritKind::Condvar));
        assert_eq!(t.inherited_count(), 2);
        assert!(!t.set_life_foreground());
        assert!(!t.revoke(InheritKind::Lock));
        assert!(!t.revoke(InheritKind::Condvar));
        assert!(t.is_critical());
        assert!(t.clear_life_foreground());
        assert_eq!(t.class(), Class::NonCritical);
    }

    #[test]
    fn scopes_nest() {
        let t = Task::new(u64::MAX - 1);
        assert!(t.enter_scope());
        assert!(!t.enter_scope());
        assert!(!t.exit_scope());
        assert!(t.is_foreground());
        assert!(t.exit_scope());
        assert!(!t.is_foreground());
    }

    #[test]
    #[should_panic(expected = "revoke without a matching inherit")]
    fn unmatched_revoke_panics() {
        let t = Task::new(u64::MAX - 2);
        t.revoke(InheritKind::Lock);
    }
}
