//! When a released lock is handed to its first waiter and when it is left
//! free for whoever comes first (barging): the rule [`Mutex`](super::Mutex)
//! and [`RwLock`](super::RwLock) share.
//!
//! Handing a contended lock to a parked waiter costs a context switch per
//! transfer: the lock is held by a thread that is not running until it
//! wakes. Letting the running thread take the lock again (parking_lot's
//! barging) keeps it busy, and the woken waiter retries. critio barges only
//! while nobody critical waits:
//!
//! | at a contended release                         | the lock goes to            |
//! |------------------------------------------------|-----------------------------|
//! | a counted-critical waiter is queued            | the first waiter (FIFO)     |
//! | the first waiter is due ([`Turn::due`])        | the first waiter (FIFO)     |
//! | otherwise                                      | nobody: it is released and the first waiter is woken to retry |
//!
//! A woken waiter that loses the race goes back to the *front* of the queue
//! with its turn (its first arrival and how often it lost), so its place in
//! line is kept and the bound below holds for it: a non-critical waiter is
//! never starved, and a critical one is never barged past (every release
//! while it waits is a hand-off).

#[cfg(not(loom))]
use std::time::{Duration, Instant};

/// A waiter that has waited this long is handed the lock at the next
/// release (parking_lot's "eventual fairness" uses 0.5 ms on average too).
#[cfg(not(loom))]
pub(crate) const FAIR_WAIT: Duration = Duration::from_micros(500);

/// A waiter woken this many times without winning the lock is handed it at
/// the next release. 1 under loom, so the models reach the fair hand-off
/// (loom has no time).
#[cfg(not(loom))]
pub(crate) const LOST_MAX: u32 = 8;
#[cfg(loom)]
pub(crate) const LOST_MAX: u32 = 1;

const _: () = assert!(LOST_MAX >= 1);

/// One waiter's place in line, kept across the retries of one wait.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Turn {
    /// When it first queued.
    #[cfg(not(loom))]
    since: Instant,
    /// How many times it was woken to retry and lost the lock.
    lost: u32,
}

impl Turn {
    /// The turn of a waiter queueing for the first time.
    pub(crate) fn new() -> Self {
        Self {
            #[cfg(not(loom))]
            since: Instant::now(),
            lost: 0,
        }
    }

    /// The same turn after one more lost retry.
    pub(crate) fn lost_once(self) -> Self {
        Self {
            lost: self.lost.saturating_add(1),
            ..self
        }
    }

    /// Whether this waiter must be handed the lock at the next release
    /// rather than woken to race for it.
    pub(crate) fn due(&self) -> bool {
        if self.lost >= LOST_MAX {
            return true;
        }
        #[cfg(not(loom))]
        if self.since.elapsed() >= FAIR_WAIT {
            return true;
        }
        false
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn a_turn_is_due_after_losing_often_enough_or_waiting_long_enough() {
        let mut t = Turn::new();
        assert!(!t.due(), "a fresh waiter may be barged past");
        for _ in 0..LOST_MAX {
            assert!(!t.due() || t.since.elapsed() >= FAIR_WAIT);
            t = t.lost_once();
        }
        assert!(t.due(), "lost {LOST_MAX} times");
        let old = Turn {
            since: Instant::now() - FAIR_WAIT,
            lost: 0,
        };
        assert!(old.due(), "waited {FAIR_WAIT:?}");
    }
}
