//! Dirty throttling: a writer whose class has too many dirty pages waits
//! here until writeback cleans some (paper 000, Section 4.3).
//!
//! It is an admission stage in the RCP sense: a throttled background writer
//! that inherits criticality while it waits (because a critical task waits
//! for a lock it holds) is woken at once and re-checked against the critical
//! limit, so it can finish its critical section instead of waiting for
//! writeback of background data (paper 000, Section 4.4).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use parking_lot::Mutex;

use crate::context::{self, Blocker, BlockingStatus, InheritKind, TaskRef, WaitScope};
use crate::metrics::MetricsHandle;
use crate::shim::thread;

/// The wait point of dirty throttling.
pub const THROTTLE_POINT: &str = "cache: dirty throttle";

/// How often a throttled writer re-checks on its own (a safety net: it is
/// normally woken by writeback or by turning critical).
const RECHECK: Duration = Duration::from_millis(50);

#[cfg(test)]
thread_local! {
    /// A unit test's [`RECHECK`] for the writers throttled in its own
    /// thread: a long one tells a wake-up from the re-check.
    pub(crate) static RECHECK_IN_TEST: std::cell::Cell<Option<Duration>> =
        const { std::cell::Cell::new(None) };
}

/// How long a throttled writer parks before it re-checks on its own.
fn recheck() -> Duration {
    #[cfg(test)]
    if let Some(d) = RECHECK_IN_TEST.with(std::cell::Cell::get) {
        return d;
    }
    RECHECK
}

/// The writers waiting in dirty throttling.
pub(crate) struct Throttle {
    /// The stack's registry (resolutions are counted there).
    metrics: MetricsHandle,
    waiters: Mutex<Vec<TaskRef>>,
    /// How many wait (read on every write without taking the lock).
    count: AtomicUsize,
}

impl Blocker for Throttle {
    fn resolve(&self, waiter: &TaskRef, _flipped: &mut Vec<TaskRef>) {
        if waiter.is_critical() {
            self.metrics.get().count_resolution(InheritKind::Admission);
            waiter.unpark(); // re-check against the critical limit
        }
    }

    fn record_wait(&self, point: &'static str, class: crate::class::Class, waited: Duration) {
        self.metrics.get().record_wait(point, class, waited);
    }
}

impl Throttle {
    pub(crate) fn new(metrics: MetricsHandle) -> Self {
        Self {
            metrics,
            waiters: Mutex::new(Vec::new()),
            count: AtomicUsize::new(0),
        }
    }

    /// Blocks the current task until `allowed()` (checked with the task's
    /// class at that moment) holds; `kick` asks writeback to run.
    pub(crate) fn wait(
        self: &std::sync::Arc<Self>,
        mut allowed: impl FnMut() -> bool,
        kick: impl Fn(),
    ) {
        let status = BlockingStatus::Admission {
            stage: THROTTLE_POINT,
        };
        let scope = WaitScope::enter(status, self.clone());
        let me = context::current();
        self.waiters.lock().push(me.clone());
        self.count.fetch_add(1, Ordering::SeqCst);
        while !allowed() {
            kick();
            thread::park_timeout(recheck());
        }
        self.count.fetch_sub(1, Ordering::SeqCst);
        self.waiters.lock().retain(|t| t.id() != me.id());
        drop(scope);
    }

    /// Whether anyone is throttled.
    pub(crate) fn has_waiters(&self) -> bool {
        self.count.load(Ordering::Relaxed) > 0
    }

    /// Wakes every throttled writer to re-check.
    pub(crate) fn wake_all(&self) {
        for t in self.waiters.lock().iter() {
            t.unpark();
        }
    }
}
