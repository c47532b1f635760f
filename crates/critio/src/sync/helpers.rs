//! The wait queue behind [`Condvar`](super::Condvar) and
//! [`Event`](super::Event): waiters, and the *helpers* that are expected to
//! wake them (paper 000, Section 4.2.1).
//!
//! A condition variable has no owner, so critio infers who will signal it
//! from history: every task that signals becomes a helper. While a critical
//! task waits, every helper that is not itself waiting here inherits; a
//! helper that has not signalled for `helper_window` is dropped (and its
//! inheritance revoked). Known helpers (a log writer) can be registered
//! explicitly; those are never dropped by the window.
//!
//! ```text
//!   signal()  ──> helper list (last signal time, explicit?)
//!   wait()    ──> waiter list (counted critical?)
//!   rule: critical waiters > 0  =>  live helpers not waiting here inherit
//!   expiry: checked by each waiter, which parks at most until the next one
//! ```

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::waiters::{BoostSet, WaiterQueue};
use super::SyncOptions;
use crate::context::{
    self, propagate, Blocker, BlockingStatus, InheritKind, TaskId, TaskRef, WaitScope,
};
use crate::metrics;
use crate::shim::{thread, AtomicBool, Ordering, SideMutex};

struct Helper {
    task: TaskRef,
    last_signal: Instant,
    explicit: bool,
}

pub(crate) struct QueueSide {
    waiters: WaiterQueue<Arc<AtomicBool>>,
    helpers: Vec<Helper>,
    boosts: BoostSet,
    /// The event's state (unused by condvars).
    pub(crate) set: bool,
}

pub(crate) struct WaitQueue {
    opts: SyncOptions,
    side: SideMutex<QueueSide>,
}

/// A wait in progress: the waiter's scope and its wake-up flag.
pub(crate) struct Ticket {
    scope: WaitScope,
    woken: Arc<AtomicBool>,
}

impl WaitQueue {
    pub(crate) fn new(kind: InheritKind, opts: SyncOptions) -> Arc<Self> {
        assert!(matches!(kind, InheritKind::Condvar | InheritKind::Event));
        Arc::new(Self {
            opts,
            side: SideMutex::new(QueueSide {
                waiters: WaiterQueue::default(),
                helpers: Vec::new(),
                boosts: BoostSet::new(kind),
                set: false,
            }),
        })
    }

    pub(crate) fn name(&self) -> &'static str {
        self.opts.name
    }

    pub(crate) fn lock_side(&self) -> crate::shim::SideGuard<'_, QueueSide> {
        self.side.lock()
    }

    /// Queues the current task as a waiter (the caller holds `side`) and
    /// returns its ticket plus the tasks whose class flipped.
    pub(crate) fn enqueue(
        self: &Arc<Self>,
        side: &mut QueueSide,
        flipped: &mut Vec<TaskRef>,
    ) -> Ticket {
        let task = context::current();
        let woken = Arc::new(AtomicBool::new(false));
        let status = BlockingStatus::Condvar {
            name: self.opts.name,
        };
        let mut scope = WaitScope::record(status, self.clone());
        if self.opts.idle {
            scope.count_as_idle();
        }
        side.waiters.push_back(task, woken.clone());
        self.sync_boost(side, Instant::now(), flipped);
        Ticket { scope, woken }
    }

    /// Parks until woken or until `deadline`. Returns true if woken by a
    /// signal, false on timeout (the waiter is then dequeued).
    pub(crate) fn park(&self, ticket: Ticket, deadline: Option<Instant>) -> bool {
        let me = ticket.scope.task().id();
        loop {
            let now = Instant::now();
            let expiry = self.expire(now);
            // Checked after taking the side lock and right before parking:
            // nothing between this check and `park` may block, or a wake-up
            // arriving in between could be absorbed (loom models that).
            if ticket.woken.load(Ordering::Acquire) {
                return true;
            }
            if deadline.is_some_and(|d| now >= d) {
                return !self.cancel(me);
            }
            let wake_at = match (deadline, expiry) {
                (Some(d), Some(e)) => Some(d.min(e)),
                (d, e) => d.or(e),
            };
            match wake_at {
                Some(at) => thread::park_timeout(at.saturating_duration_since(now)),
                None => thread::park(),
            }
        }
    }

    /// Drops helpers whose window passed and re-syncs the boosts. Returns
    /// when the next boosted helper would expire.
    fn expire(&self, now: Instant) -> Option<Instant> {
        let mut flipped = Vec::new();
        let next = {
            let mut side = self.side.lock();
            self.sync_boost(&mut side, now, &mut flipped)
        };
        propagate(flipped);
        next
    }

    /// Dequeues a waiter that timed out. Returns true if it was still queued
    /// (so no signal consumed it).
    fn cancel(&self, me: TaskId) -> bool {
        let mut flipped = Vec::new();
        let was_queued = {
            let mut side = self.side.lock();
            let was_queued = side.waiters.remove(me).is_some();
            self.sync_boost(&mut side, Instant::now(), &mut flipped);
            was_queued
        };
        propagate(flipped);
        was_queued
    }

    /// Registers the current task as a helper (it is signalling now) and
    /// wakes up to `n` waiters, oldest first. Returns how many were woken.
    pub(crate) fn signal(&self, side: &mut QueueSide, n: usize) -> (Vec<TaskRef>, Vec<TaskRef>) {
        let now = Instant::now();
        let me = context::current();
        match side.helpers.iter_mut().find(|h| h.task.id() == me.id()) {
            Some(h) => h.last_signal = now,
            None => side.helpers.push(Helper {
                task: me,
                last_signal: now,
                explicit: false,
            }),
        }
        let mut woken = Vec::new();
        while woken.len() < n {
            let Some(w) = side.waiters.pop_front() else {
                break;
            };
            w.extra.store(true, Ordering::Release);
            woken.push(w.task);
        }
        let mut flipped = Vec::new();
        self.sync_boost(side, now, &mut flipped);
        (woken, flipped)
    }

    /// Registers `task` as a known helper, never dropped by the window.
    pub(crate) fn register_helper(&self, task: TaskRef) {
        let mut flipped = Vec::new();
        {
            let mut side = self.side.lock();
            match side.helpers.iter_mut().find(|h| h.task.id() == task.id()) {
                Some(h) => h.explicit = true,
                None => side.helpers.push(Helper {
                    task,
                    last_signal: Instant::now(),
                    explicit: true,
                }),
            }
            self.sync_boost(&mut side, Instant::now(), &mut flipped);
        }
        propagate(flipped);
    }

    /// Removes a helper (explicit or inferred) and revokes its inheritance.
    pub(crate) fn unregister_helper(&self, id: TaskId) {
        let mut flipped = Vec::new();
        {
            let mut side = self.side.lock();
            side.helpers.retain(|h| h.task.id() != id);
            self.sync_boost(&mut side, Instant::now(), &mut flipped);
        }
        propagate(flipped);
    }

    pub(crate) fn helper_ids(&self) -> Vec<TaskId> {
        self.side
            .lock()
            .helpers
            .iter()
            .map(|h| h.task.id())
            .collect()
    }

    pub(crate) fn waiter_count(&self) -> usize {
        self.side.lock().waiters.len()
    }

    /// Drops expired inferred helpers, then boosts every live helper not
    /// waiting here while a critical waiter waits. Returns the next expiry of
    /// a boosted inferred helper.
    fn sync_boost(
        &self,
        side: &mut QueueSide,
        now: Instant,
        flipped: &mut Vec<TaskRef>,
    ) -> Option<Instant> {
        let window = self.opts.helper_window;
        let before = side.helpers.len();
        side.helpers
            .retain(|h| h.explicit || now.saturating_duration_since(h.last_signal) < window);
        for _ in side.helpers.len()..before {
            metrics::global().count_helper_dropped();
        }
        let active = self.opts.inherit && side.waiters.critical() > 0;
        let desired: Vec<TaskId> = if active {
            side.helpers
                .iter()
                .map(|h| h.task.id())
                .filter(|&id| !side.waiters.contains(id))
                .collect()
        } else {
            Vec::new()
        };
        let helpers = &side.helpers;
        side.boosts.sync(&desired, flipped, |id| {
            helpers
                .iter()
                .find(|h| h.task.id() == id)
                .map(|h| h.task.clone())
        });
        #[cfg(debug_assertions)]
        side.waiters.check_invariants();
        side.helpers
            .iter()
            .filter(|h| !h.explicit && side.boosts.contains(h.task.id()))
            .map(|h| h.last_signal + window)
            .min()
    }
}

impl Blocker for WaitQueue {
    fn record_wait(
        &self,
        point: &'static str,
        class: crate::class::Class,
        waited: std::time::Duration,
    ) {
        self.opts.metrics.get().record_wait(point, class, waited);
    }
    fn resolve(&self, waiter: &TaskRef, flipped: &mut Vec<TaskRef>) {
        let mut side = self.side.lock();
        side.waiters.recount(waiter);
        self.sync_boost(&mut side, Instant::now(), flipped);
    }
}

/// Wakes `woken` and continues the chain walk from `flipped`, after the side
/// lock is released.
pub(crate) fn finish_signal((woken, flipped): (Vec<TaskRef>, Vec<TaskRef>)) -> usize {
    let n = woken.len();
    for t in woken {
        t.unpark();
    }
    propagate(flipped);
    n
}

/// `deadline` for a timeout measured from now (None if it overflows).
pub(crate) fn deadline_after(timeout: Duration) -> Option<Instant> {
    Instant::now().checked_add(timeout)
}
