//! A mutex whose owner inherits criticality from critical waiters.
//!
//! The lock word holds the owner's task id, so the owner is always known
//! exactly and the uncontended path is one compare-and-swap each way, like
//! parking_lot's:
//!
//! ```text
//!   bits 2..64      bit 1        bit 0
//!  +-------------+------------+--------+
//!  | owner id    | CONTENDED  | LOCKED |     0 == free, no waiter
//!  +-------------+------------+--------+     CONTENDED alone == free, waiters queued
//! ```
//!
//! Once a waiter sets CONTENDED (under the side lock), the owner can no longer
//! release with its fast CAS: it takes the slow path, revokes its inherited
//! criticality and either hands the lock to the first waiter or releases it
//! and wakes the first waiter to retry, by the rule in `fair.rs`:
//!
//! ```text
//!  unlock_slow ──critical waiter queued, or the first one due──> owner := first waiter (FIFO)
//!       └──────otherwise──> free; first waiter dequeued and woken ──> barge ──won──> owner
//!                                                                     └─lost─> queue front again
//! ```
//!
//! So a running thread may re-take a lock nobody critical waits for (as with
//! parking_lot: no context switch per transfer), a critical waiter is never
//! barged past, and a non-critical one is handed the lock once it has waited
//! 0.5 ms or lost [`LOST_MAX`](super::fair::LOST_MAX) races. A queued waiter
//! that turns critical while the lock is free is handed it at once.
//!
//! | waiters              | owner's class                | contended release       |
//! |----------------------|------------------------------|-------------------------|
//! | none                 | its own                      | (fast path)             |
//! | only non-critical    | its own                      | release + wake, or hand-off when due |
//! | at least 1 critical  | critical (inherits once)     | hand-off, FIFO          |

use std::marker::PhantomData;
use std::sync::Arc;

use atomic_refcell::{AtomicRefCell, AtomicRefMut};

use super::fair::Turn;
use super::waiters::{BoostSet, WaiterQueue};
use super::SyncOptions;
use crate::class::Class;
use crate::context::{
    self, propagate, Blocker, BlockingStatus, InheritKind, TaskId, TaskRef, WaitScope,
};
use crate::shim::{thread, AtomicU64, Ordering, SideMutex};

const LOCKED: u64 = 1;
const CONTENDED: u64 = 2;
const OWNER_SHIFT: u32 = 2;

/// Rounds of exponentially longer busy-waiting, then rounds of yielding the
/// CPU (non-critical contenders only, see [`SpinWait::new`]), before a
/// contender queues (parking_lot's `SpinWait`); none under loom, where
/// every spin would be a modelled step.
#[cfg(not(loom))]
const SPIN_ROUNDS: u32 = 3;
#[cfg(not(loom))]
const YIELD_ROUNDS: u32 = 7;
#[cfg(loom)]
const SPIN_ROUNDS: u32 = 0;
#[cfg(loom)]
const YIELD_ROUNDS: u32 = 0;

/// How many times a queued *critical* waiter checks for the hand-off before
/// parking (it is handed the lock at the next release, so a short spin
/// often saves the park and the wake-up). Non-critical waiters park at once:
/// one that spun would be back racing the holder for every release.
#[cfg(not(loom))]
const HANDOFF_SPINS: u32 = 64;
#[cfg(loom)]
const HANDOFF_SPINS: u32 = 0;

const _: () = assert!(SPIN_ROUNDS < 16);

/// A contender's bounded spinning before it queues.
struct SpinWait {
    rounds: u32,
    /// Spins, then yields the CPU, up to this many rounds.
    budget: u32,
}

impl SpinWait {
    /// The budget of a contender of `class`. A critical one does not
    /// yield: a yield hands the CPU to whoever the scheduler picks, often
    /// a background holder that then runs out its slice (18 ms on a busy
    /// two-core machine, measured) while the critical thread, which has
    /// had the more CPU of the two, waits to be picked again. Queued, it
    /// makes the holder critical and is handed the lock at its release.
    fn new(class: Class) -> SpinWait {
        let budget = match class {
            Class::Critical => SPIN_ROUNDS,
            Class::NonCritical => SPIN_ROUNDS + YIELD_ROUNDS,
        };
        SpinWait { rounds: 0, budget }
    }

    /// Spins or yields once more; false once the budget is spent.
    fn spin(&mut self) -> bool {
        if self.rounds >= self.budget {
            return false;
        }
        self.rounds += 1;
        if self.rounds <= SPIN_ROUNDS {
            for _ in 0..1u32 << self.rounds {
                thread::spin_hint();
            }
        } else {
            thread::yield_now();
        }
        true
    }
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
    waiters: WaiterQueue<Turn>,
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

    /// Acquires the lock if it is free or becomes free within `spin`,
    /// spinning (never sleeping, never making the holder inherit): for an
    /// event loop that would rather hand a request to a thread that may
    /// wait than wait itself, but whose wait for a holder's step of a few
    /// microseconds costs less than that hand-off.
    pub fn try_lock_spinning(&self, spin: std::time::Duration) -> Option<MutexGuard<'_, T>> {
        if let Some(g) = self.try_lock() {
            return Some(g);
        }
        let until = std::time::Instant::now() + spin;
        loop {
            std::hint::spin_loop();
            // A held lock's word is only read, not written.
            if let Some(g) = self.try_lock() {
                return Some(g);
            }
            if std::time::Instant::now() >= until {
                return None;
            }
        }
    }

    /// An event loop's lock: waits for a foreground holder (another
    /// request's hold, microseconds), spins up to `spin` for a background
    /// one ([`Mutex::try_lock_spinning`]), and past that gives up (None):
    /// the caller hands its request to a thread that may wait.
    pub fn lock_unless_background(&self, spin: std::time::Duration) -> Option<MutexGuard<'_, T>> {
        if let Some(g) = self.try_lock() {
            return Some(g);
        }
        if !self.held_by_background() {
            return Some(self.lock());
        }
        self.try_lock_spinning(spin)
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

    /// Whether a task that is not foreground holds the lock (a background
    /// thread's hold, boosted or not): one worth handing a request's wait
    /// to a thread that may wait, rather than waiting in an event loop.
    /// False if it is free, or held by a foreground task.
    pub fn held_by_background(&self) -> bool {
        (self.owner().and_then(context::lookup)).is_some_and(|t| !t.is_foreground())
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

    /// Takes the lock if it is free, even with waiters queued (barging; a
    /// free lock with waiters means none of them is critical or due).
    #[inline]
    fn try_lock(&self, me: TaskId) -> bool {
        let mut s = self.state.load(Ordering::Relaxed);
        while s & LOCKED == 0 {
            debug_assert_eq!(owner_of(s), 0, "a free lock word names no owner");
            match self.state.compare_exchange_weak(
                s,
                s | locked_by(me),
                Ordering::Acquire,
                Ordering::Relaxed,
            ) {
                Ok(_) => return true,
                Err(now) => s = now,
            }
        }
        false
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

    /// Barges, queues, parks; a waiter woken to retry that loses the race
    /// queues again at the front with its turn, until it wins or is handed
    /// the lock. The wait scope spans all of it (one wait, one record).
    #[cold]
    fn lock_slow(self: &Arc<Self>, me: TaskId) {
        let mut scope = None;
        let mut turn = None;
        loop {
            if self.barge(me) {
                return;
            }
            if self.enqueue(me, &mut scope, &mut turn) {
                return; // acquired on the way in
            }
            let task = scope.as_ref().expect("a queued waiter has a scope").task();
            if self.wait_turn(me, task) {
                return; // handed over
            }
            turn = turn.map(Turn::lost_once);
        }
    }

    /// Takes the lock if it is free, spinning a little while nobody is
    /// queued. False once the caller should queue.
    fn barge(&self, me: TaskId) -> bool {
        let mut spin = SpinWait::new(context::current_class());
        loop {
            if self.try_lock(me) {
                return true;
            }
            if self.state.load(Ordering::Relaxed) & CONTENDED != 0 || !spin.spin() {
                return false; // others are parked: take a place in line
            }
        }
    }

    /// Takes the lock if free, else queues the current task (setting
    /// CONTENDED): at the back the first time, back at the front with its
    /// `turn` after a lost retry. Makes the owner inherit if the queue now
    /// holds a critical waiter. Returns true if the lock was acquired.
    fn enqueue(
        self: &Arc<Self>,
        me: TaskId,
        scope: &mut Option<WaitScope>,
        turn: &mut Option<Turn>,
    ) -> bool {
        let mut flipped = Vec::new();
        {
            let mut side = self.side.lock();
            loop {
                if self.try_lock(me) {
                    return true;
                }
                let s = self.state.load(Ordering::Acquire);
                assert!(
                    s & LOCKED == 0 || owner_of(s) != me,
                    "critio Mutex `{}` locked twice by task {me}: this would deadlock",
                    self.opts.name
                );
                if s & LOCKED == 0 {
                    continue; // released meanwhile: try again
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
            match *turn {
                None => {
                    let status = BlockingStatus::Lock {
                        name: self.opts.name,
                    };
                    let recorded = WaitScope::record(status, self.clone());
                    let first = Turn::new();
                    side.waiters.push_back(recorded.task().clone(), first);
                    *scope = Some(recorded);
                    *turn = Some(first);
                }
                Some(t) => {
                    let task = scope.as_ref().expect("a queued waiter has a scope").task();
                    side.waiters.push_front(task.clone(), t);
                }
            }
            self.sync_boost(&mut side, &mut flipped);
        }
        propagate(flipped);
        false
    }

    /// Parks until the lock is handed over (true) or the task was woken to
    /// retry (false). A stray unpark finds the task still queued and parks
    /// again.
    fn wait_turn(&self, me: TaskId, task: &TaskRef) -> bool {
        if task.is_critical() {
            for _ in 0..HANDOFF_SPINS {
                if self.owned_by(me) {
                    return true;
                }
                thread::spin_hint();
            }
        }
        loop {
            if self.owned_by(me) {
                return true;
            }
            thread::park();
            // Hand-off and wake-to-retry both dequeue under the side lock.
            let side = self.side.lock();
            if self.owned_by(me) {
                return true;
            }
            if !side.waiters.contains(me) {
                return false;
            }
        }
    }

    fn owned_by(&self, me: TaskId) -> bool {
        owner_of(self.state.load(Ordering::Acquire)) == me
    }

    /// A release with waiters queued: hands the lock to the first one if a
    /// critical waiter is queued or the first one is due; otherwise releases
    /// it and wakes the first one to retry (see `fair.rs`).
    #[cold]
    fn unlock_slow(&self, me: TaskId) {
        let mut flipped = Vec::new();
        let next = {
            let mut side = self.side.lock();
            let s = self.state.load(Ordering::Acquire);
            assert_eq!(owner_of(s), me, "critio Mutex unlocked by a non-owner");
            assert!(s & CONTENDED != 0, "slow unlock without contention");
            side.boosts.revoke(me, &mut flipped);
            let front = side
                .waiters
                .front()
                .expect("CONTENDED is set only while a waiter is queued");
            let hand_off = side.waiters.critical() > 0 || front.extra.due();
            let next = side.waiters.pop_front().expect("front exists");
            let rest = if side.waiters.is_empty() {
                0
            } else {
                CONTENDED
            };
            let word = if hand_off {
                locked_by(next.task.id()) | rest
            } else {
                rest
            };
            self.state.store(word, Ordering::Release);
            self.sync_boost(&mut side, &mut flipped);
            next.task
        };
        next.unpark();
        propagate(flipped);
    }

    /// A queued waiter turned critical while the lock is free (released for
    /// barging, the woken waiter not back yet): hands the lock to the first
    /// waiter now, so nobody barges past the critical one. Returns the task
    /// to wake.
    fn hand_off_if_free(&self, side: &mut MutexSide) -> Option<TaskRef> {
        if side.waiters.critical() == 0 {
            return None;
        }
        let front = side.waiters.front()?.task.id();
        let rest = if side.waiters.len() > 1 { CONTENDED } else { 0 };
        let mut s = self.state.load(Ordering::Acquire);
        while s & LOCKED == 0 {
            match self.state.compare_exchange(
                s,
                locked_by(front) | rest,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return side.waiters.pop_front().map(|w| w.task),
                Err(now) => s = now,
            }
        }
        None // a barger won the race: it inherits instead
    }

    /// Boosts the owner while a critical waiter waits; revokes otherwise.
    fn sync_boost(&self, side: &mut MutexSide, flipped: &mut Vec<TaskRef>) {
        let s = self.state.load(Ordering::Acquire);
        let want_boost = self.opts.inherit && side.waiters.critical() > 0 && s & LOCKED != 0;
        let owner = [owner_of(s)];
        let desired: &[TaskId] = if want_boost { &owner } else { &[] };
        side.boosts.sync(desired, flipped, context::lookup);
        #[cfg(debug_assertions)]
        {
            side.waiters.check_invariants();
            assert!(side.boosts.is_empty() || s & CONTENDED != 0);
            assert!(side.waiters.is_empty() || s & CONTENDED != 0);
        }
    }
}

impl Blocker for MutexCore {
    fn record_wait(&self, point: &'static str, class: Class, waited: std::time::Duration) {
        self.opts.metrics.get().record_wait(point, class, waited);
    }
    fn resolve(&self, waiter: &TaskRef, flipped: &mut Vec<TaskRef>) {
        let wake = {
            let mut side = self.side.lock();
            side.waiters.recount(waiter);
            let wake = self.hand_off_if_free(&mut side);
            self.sync_boost(&mut side, flipped);
            wake
        };
        if let Some(t) = wake {
            t.unpark();
        }
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

    /// Releases the lock and takes it again if a waiter is queued
    /// (parking_lot's `MutexGuard::bump`): for a holder that works in many
    /// short steps, so that a critical waiter waits for one step, not all
    /// of them. A critical waiter is handed the lock at the release and
    /// the holder queues behind it; a non-critical one is woken under the
    /// usual rule (it may find the lock taken again, until it is due). With
    /// none queued this is one load.
    pub fn bump(self) -> Self {
        if self.raw.core.state.load(Ordering::Relaxed) & CONTENDED == 0 {
            return self;
        }
        self.unlock().lock()
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
    use std::time::Duration;

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

    /// A bump with a critical waiter queued lets the waiter in first, then
    /// takes the lock back; with none queued it keeps the lock.
    #[test]
    fn bump_lets_a_queued_waiter_in_and_takes_the_lock_back() {
        let m = Arc::new(Mutex::named("t-bump", Vec::new()));
        let mut g = m.lock().bump();
        g.push("holder");
        let waiter = std::thread::spawn({
            let m = m.clone();
            move || {
                context::set_foreground();
                m.lock().push("waiter");
            }
        });
        while m.core.state.load(Ordering::SeqCst) & CONTENDED == 0 {
            std::thread::yield_now();
        }
        let mut g = g.bump();
        g.push("holder again");
        drop(g);
        waiter.join().unwrap();
        assert_eq!(*m.lock(), ["holder", "waiter", "holder again"]);
    }

    /// A spinning try takes a free lock at once, one its holder lets go
    /// of while it spins, and gives up on one held past its spin.
    #[test]
    fn a_spinning_try_takes_a_lock_let_go_within_its_spin_and_no_other() {
        let m = Arc::new(Mutex::named("t-spin", 0));
        *m.try_lock_spinning(Duration::ZERO).expect("free") += 1;
        for let_go in [true, false] {
            let (held_tx, held_rx) = std::sync::mpsc::channel();
            let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
            let holder = std::thread::spawn({
                let m = m.clone();
                move || {
                    let g = m.lock();
                    held_tx.send(()).unwrap();
                    if let_go {
                        std::thread::sleep(Duration::from_millis(5));
                    } else {
                        go_rx.recv().unwrap();
                    }
                    drop(g);
                }
            });
            held_rx.recv().unwrap();
            let started = std::time::Instant::now();
            if let_go {
                // Far longer than the holder's hold: it lets go meanwhile.
                let g = m.try_lock_spinning(Duration::from_secs(30));
                assert_eq!(g.as_deref(), Some(&1));
                assert!(started.elapsed() < Duration::from_secs(30));
            } else {
                let g = m.try_lock_spinning(Duration::from_millis(3));
                assert!(g.is_none());
                assert!(started.elapsed() >= Duration::from_millis(3));
                assert!(m.owner().is_some(), "still the holder's");
                go_tx.send(()).unwrap();
            }
            holder.join().unwrap();
        }
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
