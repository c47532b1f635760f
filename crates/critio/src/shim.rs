//! The concurrency primitives critio's own mechanisms are built from,
//! switchable to [loom](https://docs.rs/loom)'s model-checked versions.
//!
//! Building with `RUSTFLAGS="--cfg loom"` swaps the atomics, the internal
//! mutex and thread parking for loom's, so `tests/loom.rs` can explore every
//! interleaving of the lock and condition-variable protocols. Everything that
//! is not part of the protocol under test (task ids, the task registry,
//! metrics) stays on std: loom never preempts inside those short critical
//! sections, because they contain no loom operation.
//!
//! ```text
//!   sync::{Mutex, RwLock, Condvar, Event}   context::Task
//!                    \                       /
//!                     shim::{atomic, SideMutex, thread}
//!                    /                       \
//!          std + parking_lot              loom (cfg(loom))
//! ```

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// Thread handles and parking. `park_timeout` degrades to `park` under loom,
/// which has no notion of time; loom models never rely on a timeout.
pub(crate) mod thread {
    #[cfg(not(loom))]
    pub(crate) use std::thread::{current, park, Thread};

    #[cfg(loom)]
    pub(crate) use loom::thread::{current, park, Thread};

    /// Parks the current thread until unparked or until `timeout` elapses.
    #[cfg(not(loom))]
    pub(crate) fn park_timeout(timeout: std::time::Duration) {
        std::thread::park_timeout(timeout)
    }

    /// Under loom a timed park is a plain park (loom models no time).
    #[cfg(loom)]
    pub(crate) fn park_timeout(_timeout: std::time::Duration) {
        loom::thread::park()
    }

    /// Gives up the CPU to another runnable thread.
    #[cfg(not(loom))]
    pub(crate) fn yield_now() {
        std::thread::yield_now()
    }

    /// Gives up the CPU to another modelled thread.
    #[cfg(loom)]
    pub(crate) fn yield_now() {
        loom::thread::yield_now()
    }

    /// A busy-wait hint (a yield point under loom).
    #[cfg(not(loom))]
    pub(crate) fn spin_hint() {
        std::hint::spin_loop()
    }

    /// A busy-wait hint (a yield point under loom).
    #[cfg(loom)]
    pub(crate) fn spin_hint() {
        loom::thread::yield_now()
    }
}

/// The mutex that guards the slow-path state of critio's primitives. It is a
/// leaf lock: nothing else is locked while it is held, except the task
/// registry, which is itself a leaf.
#[derive(Debug, Default)]
pub(crate) struct SideMutex<T> {
    #[cfg(not(loom))]
    inner: parking_lot::Mutex<T>,
    #[cfg(loom)]
    inner: loom::sync::Mutex<T>,
}

#[cfg(not(loom))]
pub(crate) type SideGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
#[cfg(loom)]
pub(crate) type SideGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> SideMutex<T> {
    pub(crate) fn new(value: T) -> Self {
        Self {
            #[cfg(not(loom))]
            inner: parking_lot::Mutex::new(value),
            #[cfg(loom)]
            inner: loom::sync::Mutex::new(value),
        }
    }

    #[cfg(not(loom))]
    pub(crate) fn lock(&self) -> SideGuard<'_, T> {
        self.inner.lock()
    }

    #[cfg(loom)]
    pub(crate) fn lock(&self) -> SideGuard<'_, T> {
        // A panic while holding the side lock is a bug in critio itself.
        self.inner.lock().expect("critio side lock poisoned")
    }
}
