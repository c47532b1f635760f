//! Synchronization primitives that pass criticality on: [`Mutex`],
//! [`RwLock`], [`Condvar`] and [`Event`].
//!
//! They are drop-in shaped like std's and parking_lot's (guards, no
//! poisoning), and they close the task-dependency half of I/O priority
//! inversion (paper 000, Section 4.2.1):
//!
//! | primitive | a critical waiter makes ... inherit | until             |
//! |-----------|-------------------------------------|-------------------|
//! | Mutex     | the owner                           | it unlocks        |
//! | RwLock    | the writer, or every current reader | each releases     |
//! | Condvar   | every helper (signaller)            | it signals, or the helper window passes |
//! | Event     | every helper (setter)               | it sets, or the window passes |
//!
//! After each inheritance step the chain walk follows the new inheritor's
//! blocking status (lock -> owner -> condvar -> helper -> ... -> I/O or
//! admission stage), bounded and cycle-safe; see [`crate::context`].
//!
//! What each class gets: with no critical waiter, the locks behave like
//! parking_lot's: a running thread may re-take a released lock ahead of the
//! waiter it woke (no context switch per transfer), and a waiter that has
//! waited 0.5 ms or lost a few races is handed the lock, so none starves
//! (`fair.rs`). With a critical waiter queued, every release hands the lock
//! over in FIFO order (a background waiter ahead of it is not overtaken; it
//! inherits instead), nobody barges past, and the tasks it depends on run as
//! critical, so the I/O they issue is served first by every layer below.

mod condvar;
mod config;
mod event;
mod fair;
mod helpers;
mod mutex;
mod rwlock;
mod waiters;

use std::time::Duration;

use crate::metrics::MetricsHandle;

pub use condvar::{Condvar, WaitTimeoutResult};
pub use config::{SyncConfig, HELPER_WINDOW_MS_RANGE};
pub use event::Event;
pub use mutex::{Mutex, MutexGuard};
pub use rwlock::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// The default helper window: an inferred condvar helper that has not
/// signalled for this long stops inheriting (paper 000, Section 4.2.1).
pub const HELPER_WINDOW_DEFAULT: Duration = Duration::from_secs(1);

/// Options shared by the primitives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SyncOptions {
    /// The wait point waits on this primitive are accounted to.
    pub name: &'static str,
    /// Whether a critical waiter makes the owner/helpers inherit. Off gives
    /// the "classes without inheritance" scheme.
    pub inherit: bool,
    /// How long an inferred helper may go without signalling before it is
    /// dropped (condvars and events only).
    pub helper_window: Duration,
    /// The registry waits on this primitive are recorded in (a stack's, or
    /// the process-wide one).
    pub metrics: MetricsHandle,
    /// Waits on this primitive are a thread waiting for work (a log
    /// writer with nothing to write): no request waits through them, so
    /// they are recorded as non-critical whatever the waiter's class (a
    /// helper still boosted from its last request would otherwise show in
    /// the critical wait tables, idle).
    pub idle: bool,
}

impl SyncOptions {
    /// Defaults with a name: inheritance on, 1 s helper window.
    pub const fn named(name: &'static str) -> Self {
        Self {
            name,
            inherit: true,
            helper_window: HELPER_WINDOW_DEFAULT,
            metrics: MetricsHandle::GLOBAL,
            idle: false,
        }
    }

    /// The same options for a wait for work (see [`SyncOptions::idle`]).
    pub const fn idle(mut self) -> Self {
        self.idle = true;
        self
    }

    /// The same options with inheritance switched on or off.
    pub const fn inherit(mut self, on: bool) -> Self {
        self.inherit = on;
        self
    }

    /// The same options with another helper window.
    pub const fn helper_window(mut self, window: Duration) -> Self {
        self.helper_window = window;
        self
    }

    /// The same options recording waits in `metrics`.
    pub fn metrics(mut self, metrics: MetricsHandle) -> Self {
        self.metrics = metrics;
        self
    }
}

impl Default for SyncOptions {
    fn default() -> Self {
        Self::named("unnamed")
    }
}
