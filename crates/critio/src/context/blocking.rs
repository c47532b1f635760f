//! Blocking status: what a task waits on, recorded before it blocks and
//! cleared after, so a critical waiter's dependency can be followed through
//! any chain (paper 000, Section 4.4).
//!
//! | status        | object recorded         | resolved by                      |
//! |---------------|-------------------------|----------------------------------|
//! | `Lock`        | the lock                | owner(s) inherit (sync)          |
//! | `Condvar`     | the condvar or event    | helpers inherit (sync)           |
//! | `Io`          | the request, by id      | promotion where it is (block)    |
//! | `Admission`   | the stage, by name      | wake to retry as critical        |
//!
//! Every object a task can block on implements [`Blocker`]: that is the hook
//! through which the `block` and `cache` layers resolve I/O and admission
//! dependencies without `context` knowing about them.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::task::TaskRef;
use super::{current, inherit};
use crate::class::Class;
use crate::metrics;

/// What a blocked task waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum BlockingStatus {
    /// A mutex or an rwlock, by name.
    Lock {
        /// The lock's name (its wait point).
        name: &'static str,
    },
    /// A condition variable or an event, by name.
    Condvar {
        /// The condvar's name (its wait point).
        name: &'static str,
    },
    /// The completion of an I/O request.
    Io {
        /// The request's id.
        id: u64,
        /// The wait point to account the wait to (for example a page
        /// writeback wait or a plain synchronous read).
        point: &'static str,
    },
    /// An admission stage (block slots, cache dirty throttle), by name.
    Admission {
        /// The stage's name, also its wait point.
        stage: &'static str,
    },
}

impl BlockingStatus {
    /// The wait point this wait is accounted to.
    pub fn wait_point(&self) -> &'static str {
        match *self {
            BlockingStatus::Lock { name } | BlockingStatus::Condvar { name } => name,
            BlockingStatus::Io { point, .. } => point,
            BlockingStatus::Admission { stage } => stage,
        }
    }
}

impl fmt::Display for BlockingStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BlockingStatus::Lock { name } => write!(f, "lock {name}"),
            BlockingStatus::Condvar { name } => write!(f, "condvar {name}"),
            BlockingStatus::Io { id, .. } => write!(f, "I/O {id}"),
            BlockingStatus::Admission { stage } => write!(f, "admission: {stage}"),
        }
    }
}

/// An object a task can block on, and the hook that resolves a critical
/// waiter's dependency on it.
///
/// `resolve` is called whenever `waiter`, blocked on this object, may have
/// changed class: when it starts waiting already critical, and each time it
/// inherits or loses criticality while blocked. The object makes what it does
/// for the waiter match the waiter's class *now* (boost a lock owner, promote
/// an I/O, wake an admission waiter to retry as critical, or undo that), and
/// pushes every task whose class flipped as a result onto `flipped`, so the
/// chain walk continues from it. It must be idempotent, must not block, and
/// is called with no critio lock held.
pub trait Blocker: Send + Sync {
    /// Reconciles this object's treatment of `waiter` with its current class.
    fn resolve(&self, waiter: &TaskRef, flipped: &mut Vec<TaskRef>);

    /// Records a wait on this object that just ended, in the registry of
    /// the stack it belongs to (default: the process-wide one).
    fn record_wait(&self, point: &'static str, class: Class, waited: Duration) {
        metrics::global().record_wait(point, class, waited);
    }
}

/// A task's record of what it is blocked on.
#[derive(Clone)]
pub(crate) struct Blocking {
    pub(crate) status: BlockingStatus,
    pub(crate) on: Arc<dyn Blocker>,
}

/// A wait in progress: while it lives, the current task's blocking status is
/// set; when it ends, the status is cleared and the wait time is recorded at
/// its wait point, under the class the task had when the wait began (the
/// wait tables are of waits critical tasks entered; a background task that
/// inherits criticality while it waits is counted with the background, its
/// wait being the critical task's own wait on it).
#[must_use = "the blocking status is cleared when the scope is dropped"]
pub struct WaitScope {
    task: TaskRef,
    point: &'static str,
    started: Instant,
    critical_at_start: bool,
}

impl WaitScope {
    /// Records that the current task is about to block on `on`, then resolves
    /// the dependency at once if the task is critical already. For layers that
    /// block outside `sync` (I/O waits, admission stages).
    pub fn enter(status: BlockingStatus, on: Arc<dyn Blocker>) -> WaitScope {
        let scope = WaitScope::record(status, on.clone());
        if scope.task.is_critical() {
            let mut flipped = Vec::new();
            on.resolve(&scope.task, &mut flipped);
            inherit::propagate(flipped);
        }
        scope
    }

    /// Records the blocking status only; the caller accounts the waiter's
    /// class itself under its own lock (the `sync` primitives do).
    pub(crate) fn record(status: BlockingStatus, on: Arc<dyn Blocker>) -> WaitScope {
        let task = current();
        let critical_at_start = task.is_critical();
        task.set_blocking(Some(Blocking { status, on }));
        WaitScope {
            task,
            point: status.wait_point(),
            started: Instant::now(),
            critical_at_start,
        }
    }

    /// Records the wait as non-critical whatever the task's class: a wait
    /// for work, which no request waits through.
    pub(crate) fn count_as_idle(&mut self) {
        self.critical_at_start = false;
    }

    /// The waiting task.
    pub fn task(&self) -> &TaskRef {
        &self.task
    }
}

impl Drop for WaitScope {
    fn drop(&mut self) {
        let blocking = self.task.take_blocking();
        let class = if self.critical_at_start {
            Class::Critical
        } else {
            Class::NonCritical
        };
        let waited = self.started.elapsed();
        match blocking {
            Some(b) => b.on.record_wait(self.point, class, waited),
            None => metrics::global().record_wait(self.point, class, waited),
        }
    }
}
