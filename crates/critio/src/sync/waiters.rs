//! The two pieces of bookkeeping every priority-inheriting primitive shares:
//! its queue of waiters, with the number of them counted as critical, and the
//! set of tasks it currently makes inherit.
//!
//! A primitive's rule is always the same: *while at least one counted-critical
//! waiter waits, exactly the tasks it depends on (owner, readers, helpers) are
//! boosted, each once*. [`BoostSet::sync`] moves the boosted set to the desired
//! one and reports every class flip, so revocation is exact: when the
//! dependency ends, the inheritance ends.

use std::collections::VecDeque;

use crate::context::{InheritKind, Task, TaskId, TaskRef};

/// One waiting task.
pub(crate) struct Waiter<E> {
    pub(crate) task: TaskRef,
    /// Whether this waiter is counted in [`WaiterQueue::critical`].
    counted: bool,
    pub(crate) extra: E,
}

/// A FIFO of waiters that knows how many of them are critical.
pub(crate) struct WaiterQueue<E> {
    queue: VecDeque<Waiter<E>>,
    critical: usize,
}

impl<E> Default for WaiterQueue<E> {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            critical: 0,
        }
    }
}

impl<E> WaiterQueue<E> {
    /// Enqueues `task`, counting it by its class now. The caller holds the
    /// primitive's side lock and has recorded the task's blocking status, so
    /// a later flip reaches [`WaiterQueue::recount`].
    pub(crate) fn push_back(&mut self, task: TaskRef, extra: E) {
        debug_assert!(!self.contains(task.id()), "task waits twice on one object");
        let counted = task.is_critical();
        self.critical += usize::from(counted);
        self.queue.push_back(Waiter {
            task,
            counted,
            extra,
        });
    }

    /// Puts `task` back at the head of the queue: a woken waiter that lost
    /// the race for a released lock keeps its place in line. Counted like
    /// [`WaiterQueue::push_back`].
    pub(crate) fn push_front(&mut self, task: TaskRef, extra: E) {
        debug_assert!(!self.contains(task.id()), "task waits twice on one object");
        let counted = task.is_critical();
        self.critical += usize::from(counted);
        self.queue.push_front(Waiter {
            task,
            counted,
            extra,
        });
    }

    pub(crate) fn pop_front(&mut self) -> Option<Waiter<E>> {
        let w = self.queue.pop_front()?;
        self.uncount(&w);
        Some(w)
    }

    pub(crate) fn front(&self) -> Option<&Waiter<E>> {
        self.queue.front()
    }

    pub(crate) fn remove(&mut self, id: TaskId) -> Option<Waiter<E>> {
        let at = self.queue.iter().position(|w| w.task.id() == id)?;
        let w = self.queue.remove(at).expect("position is in range");
        self.uncount(&w);
        Some(w)
    }

    fn uncount(&mut self, w: &Waiter<E>) {
        if w.counted {
            assert!(self.critical > 0, "critical waiter count underflow");
            self.critical -= 1;
        }
    }

    /// Re-counts `task` by its class now. Returns true if its count changed.
    pub(crate) fn recount(&mut self, task: &Task) -> bool {
        let Some(w) = self.queue.iter_mut().find(|w| w.task.id() == task.id()) else {
            return false; // no longer waiting here
        };
        let critical = task.is_critical();
        if w.counted == critical {
            return false;
        }
        w.counted = critical;
        if critical {
            self.critical += 1;
        } else {
            self.critical -= 1;
        }
        true
    }

    /// How many waiters are counted critical.
    pub(crate) fn critical(&self) -> usize {
        self.critical
    }

    pub(crate) fn contains(&self, id: TaskId) -> bool {
        self.queue.iter().any(|w| w.task.id() == id)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    #[cfg(debug_assertions)]
    pub(crate) fn check_invariants(&self) {
        let counted = self.queue.iter().filter(|w| w.counted).count();
        assert_eq!(counted, self.critical, "critical waiter count drifted");
    }
}

/// The tasks one primitive currently makes inherit, each at most once.
pub(crate) struct BoostSet {
    kind: InheritKind,
    boosted: Vec<TaskRef>,
}

impl BoostSet {
    pub(crate) fn new(kind: InheritKind) -> Self {
        Self {
            kind,
            boosted: Vec::new(),
        }
    }

    /// Moves the boosted set to exactly `desired`: revokes tasks no longer
    /// desired, boosts new ones (found with `lookup`). Every task whose class
    /// flipped is pushed onto `flipped`.
    pub(crate) fn sync(
        &mut self,
        desired: &[TaskId],
        flipped: &mut Vec<TaskRef>,
        lookup: impl Fn(TaskId) -> Option<TaskRef>,
    ) {
        let mut i = 0;
        while i < self.boosted.len() {
            if desired.contains(&self.boosted[i].id()) {
                i += 1;
                continue;
            }
            let task = self.boosted.swap_remove(i);
            if task.revoke(self.kind) {
                flipped.push(task);
            }
        }
        for &id in desired {
            if self.contains(id) {
                continue;
            }
            // A task that is gone (its thread exited) cannot be helped.
            let Some(task) = lookup(id) else { continue };
            if task.inherit(self.kind) {
                flipped.push(task.clone());
            }
            self.boosted.push(task);
        }
    }

    /// Revokes the boost of one task, if it has one (a holder releasing).
    pub(crate) fn revoke(&mut self, id: TaskId, flipped: &mut Vec<TaskRef>) {
        if let Some(at) = self.boosted.iter().position(|t| t.id() == id) {
            let task = self.boosted.swap_remove(at);
            if task.revoke(self.kind) {
                flipped.push(task);
            }
        }
    }

    pub(crate) fn contains(&self, id: TaskId) -> bool {
        self.boosted.iter().any(|t| t.id() == id)
    }

    #[cfg(debug_assertions)]
    pub(crate) fn is_empty(&self) -> bool {
        self.boosted.is_empty()
    }
}

impl Drop for BoostSet {
    fn drop(&mut self) {
        // A primitive dropped while boosting would leak inheritance; it cannot
        // be dropped while borrowed, so this is a bug in critio itself.
        debug_assert!(
            self.boosted.is_empty() || std::thread::panicking(),
            "primitive dropped while boosting {} task(s)",
            self.boosted.len()
        );
    }
}
