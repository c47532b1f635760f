//! A manual-reset event whose setters inherit criticality.
//!
//! `set` wakes every waiter and keeps the event set until `reset`; `wait`
//! returns at once while it is set. Like a condvar, every task that sets the
//! event becomes a helper, and helpers inherit while a critical task waits.
//! The check and the enqueue happen under one lock, so a `set` is never lost.

use std::sync::Arc;
use std::time::Duration;

use super::helpers::{deadline_after, finish_signal, WaitQueue};
use super::SyncOptions;
use crate::context::{propagate, InheritKind, TaskId, TaskRef};

/// A manual-reset event with helper-based priority inheritance.
pub struct Event {
    queue: Arc<WaitQueue>,
}

impl Default for Event {
    fn default() -> Self {
        Self::new()
    }
}

impl Event {
    /// An unset event with default options (named `"event"`).
    pub fn new() -> Self {
        Self::with_options(SyncOptions::named("event"))
    }

    /// An unset event whose waits are accounted to wait point `name`.
    pub fn named(name: &'static str) -> Self {
        Self::with_options(SyncOptions::named(name))
    }

    /// An unset event with explicit options.
    pub fn with_options(opts: SyncOptions) -> Self {
        Self {
            queue: WaitQueue::new(InheritKind::Event, opts),
        }
    }

    /// Sets the event and wakes every waiter; the caller becomes a helper.
    pub fn set(&self) {
        let signalled = {
            let mut side = self.queue.lock_side();
            side.set = true;
            self.queue.signal(&mut side, usize::MAX)
        };
        finish_signal(signalled);
    }

    /// Clears the event; later waits block until the next `set`.
    pub fn reset(&self) {
        self.queue.lock_side().set = false;
    }

    /// Whether the event is set.
    pub fn is_set(&self) -> bool {
        self.queue.lock_side().set
    }

    /// Blocks until the event is set.
    pub fn wait(&self) {
        self.wait_inner(None);
    }

    /// Blocks until the event is set or `timeout` elapses. Returns whether it
    /// was set.
    pub fn wait_timeout(&self, timeout: Duration) -> bool {
        self.wait_inner(Some(timeout))
    }

    fn wait_inner(&self, timeout: Option<Duration>) -> bool {
        let mut flipped = Vec::new();
        let ticket = {
            let mut side = self.queue.lock_side();
            if side.set {
                return true;
            }
            self.queue.enqueue(&mut side, &mut flipped)
        };
        propagate(flipped);
        self.queue.park(ticket, timeout.and_then(deadline_after))
    }

    /// Registers `task` as a known helper (never dropped by the window).
    pub fn register_helper(&self, task: TaskRef) {
        self.queue.register_helper(task);
    }

    /// Removes a helper and revokes any inheritance it holds from here.
    pub fn unregister_helper(&self, id: TaskId) {
        self.queue.unregister_helper(id);
    }

    /// The current helpers.
    pub fn helpers(&self) -> Vec<TaskId> {
        self.queue.helper_ids()
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
    fn set_wakes_waiters_and_stays_set_until_reset() {
        let e = Arc::new(Event::named("t-event"));
        let waiter = {
            let e = e.clone();
            std::thread::spawn(move || e.wait())
        };
        std::thread::sleep(Duration::from_millis(10));
        e.set();
        waiter.join().unwrap();
        assert!(e.wait_timeout(Duration::ZERO));
        e.reset();
        assert!(!e.wait_timeout(Duration::from_millis(5)));
    }
}
