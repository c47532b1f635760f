//! A condition variable whose helpers inherit criticality.
//!
//! Shaped like `std::sync::Condvar` over critio's [`Mutex`]: `wait` takes the
//! guard by value and returns it re-locked. Every task that signals becomes a
//! helper; while a critical task waits, the helpers inherit until they signal
//! (or until the helper window passes without a signal). Known helpers can be
//! registered explicitly with [`Condvar::register_helper`].
//!
//! The waiter is queued *before* the mutex is released, so a signal sent by
//! anyone who takes the mutex afterwards cannot be lost.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::helpers::{deadline_after, finish_signal, WaitQueue};
use super::mutex::{Mutex, MutexGuard};
use super::SyncOptions;
use crate::context::{propagate, InheritKind, TaskId, TaskRef};

/// Whether a timed wait returned because its timeout elapsed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitTimeoutResult(bool);

impl WaitTimeoutResult {
    /// True if the wait timed out rather than being signalled.
    pub fn timed_out(&self) -> bool {
        self.0
    }
}

/// A condition variable with helper-based priority inheritance.
pub struct Condvar {
    queue: Arc<WaitQueue>,
}

impl Default for Condvar {
    fn default() -> Self {
        Self::new()
    }
}

impl Condvar {
    /// A condvar with default options (named `"condvar"`, 1 s helper window).
    pub fn new() -> Self {
        Self::with_options(SyncOptions::named("condvar"))
    }

    /// A condvar whose waits are accounted to wait point `name`.
    pub fn named(name: &'static str) -> Self {
        Self::with_options(SyncOptions::named(name))
    }

    /// A condvar with explicit options.
    pub fn with_options(opts: SyncOptions) -> Self {
        Self {
            queue: WaitQueue::new(InheritKind::Condvar, opts),
        }
    }

    /// Blocks until signalled, releasing `guard`'s mutex meanwhile. Spurious
    /// wake-ups are possible only in the sense std allows: re-check the
    /// condition (or use [`Condvar::wait_while`]).
    pub fn wait<'a, T>(&self, guard: MutexGuard<'a, T>) -> MutexGuard<'a, T> {
        self.wait_until(guard, None).0
    }

    /// Blocks while `condition` holds.
    pub fn wait_while<'a, T>(
        &self,
        mut guard: MutexGuard<'a, T>,
        mut condition: impl FnMut(&mut T) -> bool,
    ) -> MutexGuard<'a, T> {
        while condition(&mut guard) {
            guard = self.wait(guard);
        }
        guard
    }

    /// Blocks until signalled or until `timeout` elapses.
    pub fn wait_timeout<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        timeout: Duration,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        self.wait_until(guard, deadline_after(timeout))
    }

    fn wait_until<'a, T>(
        &self,
        guard: MutexGuard<'a, T>,
        deadline: Option<Instant>,
    ) -> (MutexGuard<'a, T>, WaitTimeoutResult) {
        let mut flipped = Vec::new();
        let ticket = {
            let mut side = self.queue.lock_side();
            self.queue.enqueue(&mut side, &mut flipped)
        };
        let mutex: &'a Mutex<T> = guard.unlock();
        propagate(flipped);
        let signalled = self.queue.park(ticket, deadline);
        (mutex.lock(), WaitTimeoutResult(!signalled))
    }

    /// Wakes the oldest waiter; the caller becomes (or stays) a helper.
    /// Returns whether a waiter was woken.
    pub fn notify_one(&self) -> bool {
        self.notify(1) == 1
    }

    /// Wakes every waiter; the caller becomes (or stays) a helper. Returns
    /// how many were woken.
    pub fn notify_all(&self) -> usize {
        self.notify(usize::MAX)
    }

    fn notify(&self, n: usize) -> usize {
        let signalled = {
            let mut side = self.queue.lock_side();
            self.queue.signal(&mut side, n)
        };
        finish_signal(signalled)
    }

    /// Registers `task` as a known helper: it inherits whenever a critical
    /// task waits here, and is never dropped by the helper window.
    pub fn register_helper(&self, task: TaskRef) {
        self.queue.register_helper(task);
    }

    /// Removes a helper and revokes any inheritance it holds from here.
    pub fn unregister_helper(&self, id: TaskId) {
        self.queue.unregister_helper(id);
    }

    /// The current helpers (explicit and inferred).
    pub fn helpers(&self) -> Vec<TaskId> {
        self.queue.helper_ids()
    }

    /// How many tasks wait now.
    pub fn waiters(&self) -> usize {
        self.queue.waiter_count()
    }

    /// The wait point name.
    pub fn name(&self) -> &'static str {
        self.queue.name()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn producer_consumer_hands_over_every_item() {
        let state = Arc::new((Mutex::named("t-pc", Vec::new()), Condvar::named("t-pc-cv")));
        let producer = {
            let state = state.clone();
            std::thread::spawn(move || {
                for i in 0..1000 {
                    state.0.lock().push(i);
                    state.1.notify_one();
                }
            })
        };
        let mut got = Vec::new();
        while got.len() < 1000 {
            let mut g = state.1.wait_while(state.0.lock(), |q| q.is_empty());
            got.append(&mut g);
        }
        producer.join().unwrap();
        assert_eq!(got, (0..1000).collect::<Vec<_>>());
    }

    #[test]
    fn a_wait_for_work_is_not_counted_as_a_critical_wait() {
        use crate::context::{self, Class};
        use crate::metrics::MetricsHandle;
        use crate::sync::SyncOptions;
        let metrics = MetricsHandle::new_registry();
        let m = Mutex::new(());
        let work = Condvar::with_options(
            SyncOptions::named("t: idle")
                .idle()
                .metrics(metrics.clone()),
        );
        let other = Condvar::with_options(SyncOptions::named("t: other").metrics(metrics.clone()));
        let _fg = context::foreground();
        for cv in [&work, &other] {
            let (g, r) = cv.wait_timeout(m.lock(), Duration::from_millis(2));
            assert!(r.timed_out());
            drop(g);
        }
        let count = |point, class| metrics.get().wait_histogram(point, class).count();
        assert_eq!(count("t: idle", Class::Critical), 0);
        assert_eq!(count("t: idle", Class::NonCritical), 1);
        assert_eq!(
            count("t: other", Class::Critical),
            1,
            "a critical waiter's own wait"
        );
    }

    #[test]
    fn wait_timeout_times_out_and_dequeues() {
        let m = Mutex::new(());
        let cv = Condvar::named("t-timeout");
        let (g, r) = cv.wait_timeout(m.lock(), Duration::from_millis(20));
        assert!(r.timed_out());
        drop(g);
        assert_eq!(cv.waiters(), 0);
        assert!(!cv.notify_one(), "nobody left to wake");
    }
}
