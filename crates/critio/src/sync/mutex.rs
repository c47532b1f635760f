//! A mutex whose owner inherits criticality from critical waiters.
//!
//! The lock word holds the owner's task id, so the owner is always known
//! exactly and the uncontended path is one compare-and-swap each way, like
//! parking_lot's:
//!
//! ```text
//!   bits 2..64      bit 1        bit 0
//!  +-------------+------------+--------+
//!  | owner id    | CONTENDED  | LOCKED |     0 == free
//!  +-------------+------------+--------+
//! ```
//!
//! Once a waiter sets CONTENDED (under the side lock), the owner can no longer
//! release with its fast CAS: it takes the slow path, revokes its inherited
//! criticality and hands the lock directly to the first waiter (FIFO, so a
//! background waiter is never starved by a stream of critical ones; a
//! critical waiter behind it makes it inherit instead).
//!
//! | waiters              | owner's class                |
//! |----------------------|------------------------------|
//! | none                 | its own                      |
//! | only non-critical    | its own                      |
//! | at least 1 critical  | critical (inherits once)     |

use std::marker::PhantomData;
use std::sync::Arc;

use atomic_refcell::{AtomicRefCell, AtomicRefMut};

use super::waiters::{BoostSet, WaiterQueue};
use super::SyncOptions;
use crate::context::{
    self, propagate, Blocker, BlockingStatus, InheritKind, TaskId, TaskRef, WaitScope,
};
use crate::shim::{thread, AtomicU64, Ordering, SideMutex};

const LOCKED: u64 = 1;
const CONTENDED: u64 = 2;
const OWNER_SHIFT: u32 = 2;

/// How long a contender spins before parking (0 under loom: every spin is a
/// modelled step).
#[cfg(not(loom))]
pub(crate) const SPIN_LIMIT: u32 = 64;
#[cfg(loom)]
pub(crate) const SPIN_LIMIT: u32 = 0;

/// Spin iterations allowed (a function so the loom build's empty range is
/// not a lint).
fn spins() -> std::ops::Range<u32> {
    0..SPIN_LIMIT
}

fn owner_of(state: u64) -> TaskId {
    state >> OWNER_SHIFT
}

fn locked_by(id: TaskId) -> u64 {
    debug_assert!(
        id < 1 << (64 - OWNER_SHIFT),
        "task id does not fit the lock word"
    );
    (id << OWNER_SHIFT) | LOCKED
}

/// A mutual-exclusion lock with priority inheritance. Shaped like
/// `parking_lot::Mutex`: `lock()` returns a guard, no poisoning.
pub struct Mutex<T> {
    core: Arc<MutexCore>,
    data: AtomicRefCell<T>,
}

pub(crate) struct MutexCore {
    state: AtomicU64,
    opts: SyncOptions,
    side: SideMutex<MutexSide>,
}

struct MutexSide {
    waiters: WaiterQueue<()>,
    boosts: BoostSet,
}

impl<T> Mutex<T> {
    /// A mutex with the default options (named `"mutex"`, inheritance on).
    pub fn new(value: T) -> Self {
        Self::with_options(value, SyncOptions::named("mutex"))
    }

    /// A mutex whose waits are accounted to wait point `name`.
    pub fn named(name: &'static str, value: T) -> Self {
        Self::with_options(value, SyncOptions::named(name))
    }

    /// A mutex with explicit options.
    pub fn with_options(value: T, opts: SyncOptions) -> Self {
        Self {
            core: Arc::new(MutexCore {
                state: AtomicU64::new(0),
                opts,
                side: SideMutex::new(MutexSide {
                    waiters: WaiterQueue::default(),
                    boosts: BoostSet::new(InheritKind::Lock),
                }),
            }),
            data: AtomicRefCell::new(value),
        }
    }

    /// Acquires the lock, blocking the current thread until it is free. While
    /// blocked and critical, the owner inherits criticality.
    ///
    /// # Panics
    /// If the current thread already holds the lock (that would deadlock).
    pub fn lock(&self) -> MutexGuard<'_, T> {
        let me = context::current_id();
        self.core.lock(me);
        self.guard(me)
    }

    /// Acquires the lock if it is free right now.
    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        let me = context::current_id();
        self.core.try_lock(me).then(|| self.guard(me))
    }

    fn guard(&self, me: TaskId) -> MutexGuard<'_, T> {
        let data = self
            .data
            .try_borrow_mut()
            .expect("critio Mutex: data borrowed while the lock was free");
        MutexGuard {
            data,
            raw: RawGuard {
                core: &self.core,
                owner: me,
                _not_send: PhantomData,
            },
            mutex: self,
        }
    }

    /// The task holding the lock, if any.
    pub fn owner(&self) -> Option<TaskId> {
        let s = self.core.state.load(Ordering::SeqCst);
        (s & LOCKED != 0).then(|| owner_of(s))
    }

    /// Whether the lock is held.
    pub fn is_locked(&self) -> bool {
        self.owner().is_some()
    }

    /// The wait point name.
    pub fn name(&self) -> &'static str {
        self.core.opts.name
    }

    /// Mutable access without locking (the borrow proves exclusivity).
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// Consumes the mutex and returns the value.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: Default> Default for Mutex<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for Mutex<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mutex")
            .field("name", &self.name())
            .field("owner", &self.owner())
            .finish_non_exhaustive()
    }
}

impl MutexCore {
    #[inline]
    fn lock(self: &Arc<Self>, me: TaskId) {
        if self
            .state
            .compare_exchange(0, locked_by(me), Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            self.lock_slow(me);
        }
    }

    #[inline]
    fn try_lock(&self, me: TaskId) -> bool {
        self.state
            .compare_exchange(0, locked_by(me), Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    #[inline]
    fn unlock(&self, me: TaskId) {
        if self
            .state
            .compare_exchange(locked_by(me), 0, Ordering::Release, Ordering::Relaxed)
            .is_err()
        {
            self.unlock_slow(me);
        }
    }

    #[cold]
    fn lock_slow(self: &Arc<Self>, me: TaskId) {
        for _ in spins() {
            let s = self.state.load(Ordering::Relaxed);
            if s & CONTENDED != 0 {
                break; // others are queued: take a place in line
            }
            if s == 0 && self.try_lock(me) {
                return;
            }
            thread::spin_hint();
        }
        let Some(scope) = self.enqueue(me) else {
            return; // acquired on the way in
        };
        for _ in spins() {
            if owner_of(self.state.load(Ordering::Acquire)) == me {
                return;
            }
            thread::spin_hint();
        }
        while owner_of(self.state.load(Ordering::Acquire)) != me {
            thread::park();
        }
        drop(scope);
    }

    /// Takes the lock if free, else queues the current task (setting
    /// CONTENDED) and makes the owner inherit if the task is critical.
    /// Returns the wait scope, or None if the lock was acquired.
    fn enqueue(self: &Arc<Self>, me: TaskId) -> Option<WaitScope> {
        let task = context::current();
        let mut flipped = Vec::new();
        let scope = {
            let mut side = self.side.lock();
            loop {
                let s = self.state.load(Ordering::Acquire);
                assert!(
                    s & LOCKED == 0 || owner_of(s) != me,
                    "critio Mutex `{}` locked twice by task {me}: this would deadlock",
                    self.opts.name
                );
                if s & LOCKED == 0 {
                    // Free with CONTENDED clear: hand-off never leaves the lock
                    // free while anyone waits.
                    debug_assert!(side.waiters.is_empty());
                    if self.try_lock(me) {
                        return None;
                    }
                    continue;
                }
                if s & CONTENDED != 0
                    || self
                        .state
                        .compare_exchange(s, s | CONTENDED, Ordering::AcqRel, Ordering::Relaxed)
                        .is_ok()
                {
                    break;
                }
            }
            let status = BlockingStatus::Lock {
                name: self.opts.name,
            };
            let scope = WaitScope::record(status, self.clone());
            side.waiters.push_back(task, ());
            self.sync_boost(&mut side, &mut flipped);
            scope
        };
        propagate(flipped);
        Some(scope)
    }

    #[cold]
    fn unlock_slow(&self, me: TaskId) {
        let mut flipped = Vec::new();
        let next = {
            let mut side = self.side.lock();
            let s = self.state.load(Ordering::Acquire);
            assert_eq!(owner_of(s), me, "critio Mutex unlocked by a non-owner");
            assert!(s & CONTENDED != 0, "slow unlock without contention");
            side.boosts.revoke(me, &mut flipped);
            let next = side
                .waiters
                .pop_front()
                .expect("CONTENDED is set only while a waiter is queued");
            let contended = if side.waiters.is_empty() {
                0
            } else {
                CONTENDED
            };
            self.state
                .store(locked_by(next.task.id()) | contended, Ordering::Release);
            self.sync_boost(&mut side, &mut flipped);
            next.task
        };
        next.unpark();
        propagate(flipped);
    }

    /// Boosts the owner while a critical waiter waits; revokes otherwise.
    fn sync_boost(&self, side: &mut MutexSide, flipped: &mut Vec<TaskRef>) {
        let s = self.state.load(Ordering::Acquire);
        let want_boost = self.opts.inherit && side.waiters.critical() > 0 && s & LOCKED != 0;
        let desired = if want_boost {
            vec![owner_of(s)]
        } else {
            vec![]
        };
        side.boosts.sync(&desired, flipped, context::lookup);
        #[cfg(debug_assertions)]
        {
            side.waiters.check_invariants();
            assert!(side.boosts.is_empty() || s & CONTENDED != 0);
        }
    }
}

impl Blocker for MutexCore {
    fn resolve(&self, waiter: &TaskRef, flipped: &mut Vec<TaskRef>) {
        let mut side = self.side.lock();
        side.waiters.recount(waiter);
        self.sync_boost(&mut side, flipped);
    }
}

/// Releases the raw lock when dropped, after the data borrow (field order).
struct RawGuard<'a> {
    core: &'a MutexCore,
    owner: TaskId,
    _not_send: PhantomData<*const ()>,
}

impl Drop for RawGuard<'_> {
    fn drop(&mut self) {
        self.core.unlock(self.owner);
    }
}

/// Holds a [`Mutex`] locked; dereferences to the data. Not `Send`: it must be
/// released by the thread that locked it.
#[must_use = "the lock is released when the guard drops"]
pub struct MutexGuard<'a, T> {
    // Field order matters: the data borrow ends before the lock is released.
    data: AtomicRefMut<'a, T>,
    raw: RawGuard<'a>,
    mutex: &'a Mutex<T>,
}

impl<'a, T> MutexGuard<'a, T> {
    /// Releases the lock, returning the mutex (used by `Condvar::wait`).
    pub(crate) fn unlock(self) -> &'a Mutex<T> {
        let MutexGuard { data, raw, mutex } = self;
        drop(data);
        drop(raw);
        mutex
    }
}

impl<T> std::ops::Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.data
    }
}

impl<T> std::ops::DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.data
    }
}

impl<T: std::fmt::Debug> std::fmt::Debug for MutexGuard<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(&*self.data, f)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Barrier;

    #[test]
    fn uncontended_lock_records_owner_and_releases() {
        let m = Mutex::named("t-uncontended", 5);
        {
            let mut g = m.lock();
            *g += 1;
            assert_eq!(m.owner(), Some(context::current_id()));
            assert!(m.try_lock().is_none());
        }
        assert_eq!(m.owner(), None);
        assert_eq!(*m.lock(), 6);
    }

    #[test]
    #[should_panic(expected = "locked twice")]
    fn relock_by_owner_panics_instead_of_deadlocking() {
        let m = Mutex::new(());
        let _g = m.lock();
        let _h = m.lock();
    }

    #[test]
    fn many_threads_keep_the_count() {
        let m = Arc::new(Mutex::named("t-count", 0u64));
        let start = Arc::new(Barrier::new(4));
        let threads: Vec<_> = (0..4)
            .map(|_| {
                let (m, start) = (m.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    for _ in 0..5_000 {
                        *m.lock() += 1;
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(*m.lock(), 20_000);
    }
}
