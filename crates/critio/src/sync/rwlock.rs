//! A reader-writer lock whose holders inherit criticality: while a critical
//! task waits, the writer, or *every* current reader, is critical.
//!
//! All state lives under the side lock, so the holders are always known
//! exactly (an rwlock has no single owner word to pack into an atomic).
//! A reader arriving while readers hold the lock and a writer waits queues
//! behind the writer, so writers are not starved; consecutive readers at the
//! head of the queue are granted together. A thread that already reads may
//! read again (re-entrant reads), even with a writer queued.
//!
//! When a release frees the lock, the rule of `fair.rs` decides who gets it:
//!
//! | head of the queue                         | at the release                         |
//! |-------------------------------------------|----------------------------------------|
//! | readers                                   | granted together (FIFO)                |
//! | a writer, a critical waiter queued, or the writer due | granted (FIFO hand-off)    |
//! | a writer, otherwise                       | woken to retry; the lock stays free, so a running thread may take it (barging) |
//!
//! A woken writer that loses goes back to the front with its turn. Anyone
//! who queues while the lock is free serves the queue in order first, so the
//! lock is never left free with only parked waiters.

use std::marker::PhantomData;
use std::sync::Arc;

use atomic_refcell::{AtomicRef, AtomicRefCell, AtomicRefMut};

use super::fair::Turn;
use super::waiters::{BoostSet, WaiterQueue};
use super::SyncOptions;
use crate::context::{
    self, propagate, Blocker, BlockingStatus, InheritKind, TaskId, TaskRef, WaitScope,
};
use crate::shim::{thread, AtomicU64, Ordering, SideMutex};

/// A reader-writer lock with priority inheritance, shaped like
/// `parking_lot::RwLock`.
pub struct RwLock<T> {
    core: Arc<RwCore>,
    data: AtomicRefCell<T>,
}

pub(crate) struct RwCore {
    opts: SyncOptions,
    side: SideMutex<RwSide>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Read,
    Write,
}

/// A queued waiter's wake-up word.
const WAITING: u64 = 0;
/// The lock was granted to the waiter.
const GRANTED: u64 = 1;
/// The waiter was dequeued and woken to retry (the lock was left free).
const RETRY: u64 = 2;

struct Pending {
    want: Want,
    /// WAITING, GRANTED or RETRY; set under the side lock.
    wake: Arc<AtomicU64>,
    turn: Turn,
}

struct RwSide {
    writer: Option<TaskRef>,
    /// Current readers and how many read guards each holds.
    readers: Vec<(TaskRef, u32)>,
    waiters: WaiterQueue<Pending>,
    boosts: BoostSet,
}

impl RwSide {
    fn holder(&self, id: TaskId) -> Option<TaskRef> {
        self.writer
            .iter()
            .chain(self.readers.iter().map(|(t, _)| t))
            .find(|t| t.id() == id)
            .cloned()
    }

    fn holder_ids(&self) -> Vec<TaskId> {
        match &self.writer {
            Some(w) => vec![w.id()],
            None => self.readers.iter().map(|(t, _)| t.id()).collect(),
        }
    }

    fn reader_slot(&mut self, id: TaskId) -> Option<&mut u32> {
        self.readers
            .iter_mut()
            .find(|(t, _)| t.id() == id)
            .map(|(_, n)| n)
    }

    fn is_free(&self) -> bool {
        self.writer.is_none() && self.readers.is_empty()
    }

    /// Whether an arrival may take the free lock ahead of the queue: only
    /// while no critical task waits and the head is not due.
    fn may_barge(&self) -> bool {
        self.waiters.critical() == 0 && self.waiters.front().is_none_or(|w| !w.extra.turn.due())
    }

    /// Grants the lock to the head of the queue if it can run now; returns
    /// the tasks to wake.
    fn grant(&mut self) -> Vec<TaskRef> {
        let mut woken = Vec::new();
        if self.writer.is_some() {
            return woken;
        }
        while let Some(front) = self.waiters.front() {
            match front.extra.want {
                Want::Write if self.readers.is_empty() && woken.is_empty() => {
                    let w = self.waiters.pop_front().expect("front exists");
                    w.extra.wake.store(GRANTED, Ordering::Release);
                    self.writer = Some(w.task.clone());
                    woken.push(w.task);
                    break;
                }
                Want::Write => break,
                Want::Read => {
                    let w = self.waiters.pop_front().expect("front exists");
                    w.extra.wake.store(GRANTED, Ordering::Release);
                    self.readers.push((w.task.clone(), 1));
                    woken.push(w.task);
                }
            }
        }
        woken
    }

    /// The lock has just been freed: grants it to the head of the queue, or,
    /// if the head is a writer that may be barged past, dequeues it and wakes
    /// it to retry, leaving the lock free. Returns the tasks to wake.
    fn on_free(&mut self) -> Vec<TaskRef> {
        debug_assert!(self.is_free());
        let Some(front) = self.waiters.front() else {
            return Vec::new();
        };
        if front.extra.want == Want::Read || !self.may_barge() {
            return self.grant();
        }
        let w = self.waiters.pop_front().expect("front exists");
        w.extra.wake.store(RETRY, Ordering::Release);
        vec![w.task]
    }
}

impl<T> RwLock<T> {
    /// An rwlock with the default options (named `"rwlock"`).
    pub fn new(value: T) -> Self {
        Self::with_options(value, SyncOptions::named("rwlock"))
    }

    /// An rwlock whose waits are accounted to wait point `name`.
    pub fn named(name: &'static str, value: T) -> Self {
        Self::with_options(value, SyncOptions::named(name))
    }

    /// An rwlock with explicit options.
    pub fn with_options(value: T, opts: SyncOptions) -> Self {
        Self {
            core: Arc::new(RwCore {
                opts,
                side: SideMutex::new(RwSide {
                    writer: None,
                    readers: Vec::new(),
                    waiters: WaiterQueue::default(),
                    boosts: BoostSet::new(InheritKind::RwLock),
                }),
            }),
            data: AtomicRefCell::new(value),
        }
    }

    /// Acquires shared access, blocking while a writer holds or waits.
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        let me = self.core.acquire(Want::Read);
        self.read_guard(me)
    }

    /// Acquires exclusive access.
    ///
    /// # Panics
    /// If the current thread already holds this lock.
    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        let me = self.core.acquire(Want::Write);
        self.write_guard(me)
    }

    /// Shared access if available right now.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        let me = self.core.try_acquire(Want::Read)?;
        Some(self.read_guard(me))
    }

    /// Exclusive access if available right now.
    pub fn try_write(&self) -> Option<RwLockWriteGuard<'_, T>> {
        let me = self.core.try_acquire(Want::Write)?;
        Some(self.write_guard(me))
    }

    fn read_guard(&self, me: TaskId) -> RwLockReadGuard<'_, T> {
        RwLockReadGuard {
            data: self
                .data
                .try_borrow()
                .expect("critio RwLock: data written while read-locked"),
            _raw: RawRwGuard::new(&self.core, me, Want::Read),
        }
    }

    fn write_guard(&self, me: TaskId) -> RwLockWriteGuard<'_, T> {
        RwLockWriteGuard {
            data: self
                .data
                .try_borrow_mut()
                .expect("critio RwLock: data borrowed while write-locked"),
            _raw: RawRwGuard::new(&self.core, me, Want::Write),
        }
    }

    /// The tasks holding the lock now: the writer, or every reader.
    pub fn holders(&self) -> Vec<TaskId> {
        self.core.side.lock().holder_ids()
    }

    /// The wait point name.
    pub fn name(&self) -> &'static str {
        self.core.opts.name
    }

    /// Mutable access without locking.
    pub fn get_mut(&mut self) -> &mut T {
        self.data.get_mut()
    }

    /// Consumes the lock and returns the value.
    pub fn into_inner(self) -> T {
        self.data.into_inner()
    }
}

impl<T: Default> Default for RwLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

impl RwCore {
    /// Takes the lock now if possible: a re-entrant read, or a free lock
    /// that nobody queued is owed (see [`RwSide::may_barge`]).
    fn try_take(side: &mut RwSide, task: &TaskRef, want: Want) -> bool {
        match want {
            Want::Read => {
                if let Some(n) = side.reader_slot(task.id()) {
                    *n += 1; // re-entrant read: never queue behind a writer
                    return true;
                }
                let joins = side.writer.is_none() && side.waiters.is_empty();
                if joins || (side.is_free() && side.may_barge()) {
                    side.readers.push((task.clone(), 1));
                    return true;
                }
                false
            }
            Want::Write => {
                if side.is_free() && (side.waiters.is_empty() || side.may_barge()) {
                    side.writer = Some(task.clone());
                    return true;
                }
                false
            }
        }
    }

    fn try_acquire(&self, want: Want) -> Option<TaskId> {
        let task = context::current();
        let mut side = self.side.lock();
        Self::try_take(&mut side, &task, want).then(|| task.id())
    }

    /// Takes the lock, or queues (at the back the first time, at the front
    /// with its turn after a lost retry) and parks until granted or woken to
    /// retry. The wait scope spans every retry of the one wait.
    fn acquire(self: &Arc<Self>, want: Want) -> TaskId {
        let task = context::current();
        let wake = Arc::new(AtomicU64::new(WAITING));
        let mut scope = None;
        let mut turn = None;
        loop {
            if self.take_or_queue(&task, want, &wake, &mut scope, &mut turn) {
                return task.id();
            }
            let got = loop {
                match wake.load(Ordering::Acquire) {
                    WAITING => thread::park(),
                    state => break state,
                }
            };
            if got == GRANTED {
                return task.id(); // the scope drops here: one wait recorded
            }
            debug_assert_eq!(got, RETRY);
            turn = turn.map(Turn::lost_once);
        }
    }

    /// Under the side lock: takes the lock (true), or queues the task and, if
    /// the lock is free, serves the queue in order at once.
    fn take_or_queue(
        self: &Arc<Self>,
        task: &TaskRef,
        want: Want,
        wake: &Arc<AtomicU64>,
        scope: &mut Option<WaitScope>,
        turn: &mut Option<Turn>,
    ) -> bool {
        let mut flipped = Vec::new();
        let woken = {
            let mut side = self.side.lock();
            if Self::try_take(&mut side, task, want) {
                return true;
            }
            assert!(
                side.holder(task.id()).is_none(),
                "critio RwLock `{}` write-locked by a task that holds it: this would deadlock",
                self.opts.name
            );
            wake.store(WAITING, Ordering::Relaxed);
            let pending = |turn| Pending {
                want,
                wake: wake.clone(),
                turn,
            };
            match *turn {
                None => {
                    let status = BlockingStatus::Lock {
                        name: self.opts.name,
                    };
                    *scope = Some(WaitScope::record(status, self.clone()));
                    let first = Turn::new();
                    side.waiters.push_back(task.clone(), pending(first));
                    *turn = Some(first);
                }
                Some(t) => side.waiters.push_front(task.clone(), pending(t)),
            }
            // Refused a free lock (someone is owed it): serve the queue now.
            let woken = if side.is_free() {
                side.grant()
            } else {
                Vec::new()
            };
            self.sync_boost(&mut side, &mut flipped);
            woken
        };
        for t in woken {
            t.unpark();
        }
        propagate(flipped);
        false
    }

    fn release(&self, me: TaskId, held: Want) {
        let mut flipped = Vec::new();
        let woken = {
            let mut side = self.side.lock();
            let still_holds = match held {
                Want::Write => {
                    let w = side.writer.take().expect("write guard without a writer");
                    assert_eq!(w.id(), me, "critio RwLock released by a non-holder");
                    false
                }
                Want::Read => {
                    let n = side.reader_slot(me).expect("read guard without a reader");
                    *n -= 1;
                    let left = *n;
                    if left == 0 {
                        side.readers.retain(|(t, _)| t.id() != me);
                    }
                    left > 0
                }
            };
            if !still_holds {
                side.boosts.revoke(me, &mut flipped);
            }
            let woken = if side.is_free() {
                side.on_free()
            } else {
                side.grant()
            };
            self.sync_boost(&mut side, &mut flipped);
            woken
        };
        for t in woken {
            t.unpark();
        }
        propagate(flipped);
    }

    /// Boosts every holder while a critical waiter waits; revokes otherwise.
    fn sync_boost(&self, side: &mut RwSide, flipped: &mut Vec<TaskRef>) {
        let desired = if self.opts.inherit && side.waiters.critical() > 0 {
            side.holder_ids()
        } else {
            Vec::new()
        };
        let holders: Vec<TaskRef> = side
            .writer
            .iter()
            .chain(side.readers.iter().map(|(t, _)| t))
            .cloned()
            .collect();
        side.boosts.sync(&desired, flipped, |id| {
            holders.iter().find(|t| t.id() == id).cloned()
        });
        #[cfg(debug_assertions)]
        side.waiters.check_invariants();
    }
}

impl Blocker for RwCore {
    fn record_wait(
        &self,
        point: &'static str,
        class: crate::class::Class,
        waited: std::time::Duration,
    ) {
        self.opts.metrics.get().record_wait(point, class, waited);
    }
    fn resolve(&self, waiter: &TaskRef, flipped: &mut Vec<TaskRef>) {
        let woken = {
            let mut side = self.side.lock();
            side.waiters.recount(waiter);
            // A waiter turned critical while the lock is free (its writer
            // woken to retry and not back yet): serve the queue now, so
            // nobody barges past it.
            let woken = if side.waiters.critical() > 0 && side.is_free() {
                side.grant()
            } else {
                Vec::new()
            };
            self.sync_boost(&mut side, flipped);
            woken
        };
        for t in woken {
            t.unpark();
        }
    }
}

struct RawRwGuard<'a> {
    core: &'a RwCore,
    holder: TaskId,
    held: Want,
    _not_send: PhantomData<*const ()>,
}

impl<'a> RawRwGuard<'a> {
    fn new(core: &'a RwCore, holder: TaskId, held: Want) -> Self {
        Self {
            core,
            holder,
            held,
            _not_send: PhantomData,
        }
    }
}

impl Drop for RawRwGuard<'_> {
    fn drop(&mut self) {
        self.core.release(self.holder, self.held);
    }
}

/// Shared access to an [`RwLock`].
#[must_use = "the lock is released when the guard drops"]
pub struct RwLockReadGuard<'a, T> {
    data: AtomicRef<'a, T>,
    _raw: RawRwGuard<'a>,
}

/// Exclusive access to an [`RwLock`].
#[must_use = "the lock is released when the guard drops"]
pub struct RwLockWriteGuard<'a, T> {
    data: AtomicRefMut<'a, T>,
    _raw: RawRwGuard<'a>,
}

impl<T> std::ops::Deref for RwLockReadGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.data
    }
}

impl<T> std::ops::Deref for RwLockWriteGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.data
    }
}

impl<T> std::ops::DerefMut for RwLockWriteGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.data
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn readers_share_and_writer_excludes() {
        let l = RwLock::named("t-rw", 1);
        let a = l.read();
        let b = l.read();
        assert_eq!(*a + *b, 2);
        assert!(l.try_write().is_none());
        assert_eq!(l.holders(), vec![context::current_id()]);
        drop((a, b));
        *l.write() = 7;
        assert!(l.try_read().is_some());
        assert_eq!(*l.read(), 7);
    }

    #[test]
    fn writers_and_readers_from_many_threads_agree() {
        let l = Arc::new(RwLock::named("t-rw-many", (0u64, 0u64)));
        let threads: Vec<_> = (0..4)
            .map(|i| {
                let l = l.clone();
                std::thread::spawn(move || {
                    for _ in 0..2_000 {
                        if i % 2 == 0 {
                            let mut g = l.write();
                            g.0 += 1;
                            g.1 += 1;
                        } else {
                            let g = l.read();
                            assert_eq!(g.0, g.1, "reader saw a torn write");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(l.read().0, 4_000);
    }
}
