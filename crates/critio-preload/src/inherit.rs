//! Priority inheritance through `pthread_mutex_lock` and
//! `pthread_rwlock_rdlock`/`wrlock` (paper 000, Section 4.2.1, for a
//! program's own locks): a foreground thread that finds a lock held by a
//! background thread of its process makes that thread
//! critical until it gets the lock: the owner's I/O priority becomes
//! best-effort 0, its CPU nice 0, and its writes go unpaced. When the last
//! such waiter has the lock, the owner is background again.
//!
//! The owner is read from glibc's mutex (`__data.__owner`, the third int,
//! which glibc keeps for every mutex kind), and from a read-write lock its
//! writer (`__cur_writer`, the seventh int). glibc records no readers, so
//! the library records the reader that took each lock last, until that one
//! unlocks it (`note_reader`): a foreground writer that finds the lock held
//! for reading boosts that one (other readers still inside are not known).
//! Threads' classes are kept in a
//! small process-wide table (`note_class`), since a waiter must know
//! whether the owner is background.
//!
//! A condition variable records no owner, so a foreground thread that
//! waits on one boosts the thread that last signalled it (paper 000's
//! heuristic for condition variables: the thread that signalled before is
//! the one expected to signal again, as a log writer signals committers).
//! `pthread_cond_signal` and `pthread_cond_broadcast` are interposed only
//! to record that thread; the boost lasts the wait.
//!
//! The same boost serves a foreground thread that blocks in `waitpid` for
//! a background child process (its main thread is boosted until the wait
//! returns); the child's class comes from the block's classification log,
//! and the boosted set lives in the block so the child sees it.
//!
//! Chains: every thread that blocks in an interposed wait with a known
//! owner records whom it waits for in the block (`note_wait`, whatever its
//! class, so a chain crosses processes), and
//! a boost follows those records up to [`CHAIN_MAX`] threads, boosting
//! each background one (foreground waits for bg-mid's lock, bg-mid waits
//! for the writer's: both are boosted). Only a foreground thread starts a
//! boost, so a link made after the walk (a boosted thread that starts a
//! new wait) is not followed: following it would keep its owner boosted
//! for that whole wait, after the boost that led there ended.
//!
//! A boost ends when its wait returns, when the waiting thread exits
//! (cancelled: a thread-local's destructor), or, for a waiter killed in its
//! wait, when `critio run` finds it dead: every boost is recorded with its
//! waiter in the block (`Control::boosters`), and `critio run` reaps the
//! records of dead waiters every controller window. A killed thread's
//! wait and pipe-writer records are cleared by `critio run` too, within a
//! second (`Control::reap_dead_records`), before the kernel can give its
//! tid to another thread.
//!
//! Pipes follow the same heuristic across processes: every write to a
//! pipe (`write`, `writev`) records its thread in the block
//! (`Control::pipe_writers`, keyed by the pipe's inode), every `read` of a
//! pipe records that writer as whom the reader waits for, and a foreground
//! thread whose `read` of an empty, blocking pipe is about to block boosts
//! that writer for the read. stdio, `send` and `splice` are not seen; a
//! descriptor replaced by `dup2`, `dup3` or `close_range` is looked at
//! afresh.
//!
//! Not covered (yet): a condition variable nobody has signalled yet (or a
//! pipe nobody wrote to), readers of a read-write lock other than its last
//! one, process-shared mutexes, and `poll`/`epoll` waits. The condition variable hooks are unversioned
//! and call glibc's GLIBC_2.3.2 functions, so a binary linked against the
//! condition variables of glibc before 2.3.2 (2003) must run with
//! `inherit_locks = false`.

use std::sync::atomic::{AtomicU64, Ordering};

use critio_control::{tid_slot, Class, Control, LastThread};

/// Threads whose class is known (open addressing by tid).
const CLASS_SLOTS: usize = 4096;
static CLASSES: [AtomicU64; CLASS_SLOTS] = [const { AtomicU64::new(0) }; CLASS_SLOTS];

// Threads boosted now live in the control block (`Control::boosted`), so
// that a boost by another process (waitpid) is seen by the boosted one;
// each boost is also recorded with its waiter (`Control::boosters`), so
// that `critio run` ends the boosts of a waiter that died in its wait.

/// Records `tid`'s class (called when a thread is classified).
pub fn note_class(tid: i32, class: Class) {
    let value = (u64::from(tid as u32) << 8) | class as u64;
    let start = tid_slot(tid, CLASS_SLOTS);
    for i in 0..CLASS_SLOTS {
        let slot = &CLASSES[(start + i) % CLASS_SLOTS];
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            if cur != 0 && (cur >> 8) as u32 != tid as u32 {
                break; // another thread's slot: probe on
            }
            match slot.compare_exchange(cur, value, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(seen) => cur = seen,
            }
        }
    }
    // Full: the thread is simply not boostable.
}

/// `tid`'s class: from this process's table, else from the block's log
/// (a thread of another process of the tree).
pub fn class_of_any(tid: i32, c: &Control) -> Option<Class> {
    class_of(tid).or_else(|| c.logged_class(tid))
}

/// `tid`'s class, if recorded by this process.
pub fn class_of(tid: i32) -> Option<Class> {
    let start = tid_slot(tid, CLASS_SLOTS);
    for i in 0..CLASS_SLOTS {
        let cur = CLASSES[(start + i) % CLASS_SLOTS].load(Ordering::Relaxed);
        if cur == 0 {
            return None;
        }
        if (cur >> 8) as u32 == tid as u32 {
            return match cur & 0xff {
                1 => Some(Class::Foreground),
                2 => Some(Class::Background),
                _ => None,
            };
        }
    }
    None
}

/// Applies a class's kernel priorities to `tid`.
pub fn apply(tid: i32, class: Class, c: &Control) {
    let (prio, nice) = match class {
        Class::Foreground => (libc::c_long::from(critio_control::ioprio_best_effort(0)), 0),
        Class::Background => (libc::c_long::from(c.background_ioprio), c.background_nice),
    };
    // SAFETY: ioprio_set, setpriority and sched_setscheduler take
    // integers (and a sched_param that lives across the call) and change
    // only thread `tid`'s priorities.
    unsafe {
        libc::syscall(
            libc::SYS_ioprio_set,
            1 as libc::c_long,
            tid as libc::c_long,
            prio,
        );
        if c.background_nice != 0 && crate::may_nice() {
            libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice);
        }
        // Leaving SCHED_IDLE needs the right to the nice value, as
        // un-nicing does: the same processes do both. Only the two normal
        // policies are switched (a real-time thread keeps its policy).
        if c.background_idle != 0 && crate::may_nice() {
            let now = libc::sched_getscheduler(tid);
            let policy = match class {
                Class::Foreground => (now == libc::SCHED_IDLE).then_some(libc::SCHED_OTHER),
                Class::Background => (now == libc::SCHED_OTHER).then_some(libc::SCHED_IDLE),
            };
            if let Some(policy) = policy {
                let param = libc::sched_param { sched_priority: 0 };
                libc::sched_setscheduler(tid, policy, &param);
            }
        }
    }
}

/// The owner of a glibc mutex (0: unlocked or unknown).
///
/// # Safety
/// `m` points to a live, initialized `pthread_mutex_t`.
pub unsafe fn owner(m: *mut libc::pthread_mutex_t) -> i32 {
    // SAFETY: glibc's pthread_mutex_t begins with `int __lock; unsigned
    // __count; int __owner;`, so the owner is the third int, 4-aligned
    // like the mutex; it is written by other threads, so it is read as an
    // atomic.
    let p = m.cast::<std::sync::atomic::AtomicI32>().add(2);
    (*p).load(Ordering::Relaxed)
}

/// The thread holding read-write lock `l` for writing (0: none, or held
/// for reading: readers are not recorded).
///
/// # Safety
/// `l` points to a live, initialized `pthread_rwlock_t`.
pub unsafe fn writer(l: *mut libc::pthread_rwlock_t) -> i32 {
    // glibc's pthread_rwlock_t begins with six unsigned ints (`__readers`,
    // `__writers`, `__wrphase_futex`, `__writers_futex`, `__pad3`,
    // `__pad4`); then x86-64 has `int __cur_writer`, and the generic layout
    // (aarch64, riscv64, loongarch64) four bytes of flags first. Elsewhere
    // the layout is not known here: no writer, so no boost.
    #[cfg(target_arch = "x86_64")]
    const CUR_WRITER: usize = 6;
    #[cfg(any(
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64"
    ))]
    const CUR_WRITER: usize = 7;
    #[cfg(not(any(
        target_arch = "x86_64",
        target_arch = "aarch64",
        target_arch = "riscv64",
        target_arch = "loongarch64"
    )))]
    return 0;
    // SAFETY: `__cur_writer` is the int at CUR_WRITER (above), inside the
    // lock, 4-aligned like it; it is written by other threads, so it is
    // read as an atomic.
    #[allow(unreachable_code)]
    {
        let p = l.cast::<std::sync::atomic::AtomicI32>().add(CUR_WRITER);
        (*p).load(Ordering::Relaxed)
    }
}

/// The last thread that signalled each condition variable, a
/// [`LastThread`] table keyed by the variable's address (per process: a
/// process-private variable has no meaning elsewhere).
const COND_SLOTS: usize = 1024;
static SIGNALERS: [AtomicU64; COND_SLOTS] = [const { AtomicU64::new(0) }; COND_SLOTS];

/// `tid` signalled (or broadcast) `cond`.
pub fn note_signaler(cond: *const libc::pthread_cond_t, tid: i32) {
    LastThread::note(&SIGNALERS, cond as usize as u64, tid);
}

/// The last thread that signalled `cond` (0: none recorded).
pub fn signaler(cond: *const libc::pthread_cond_t) -> i32 {
    LastThread::get(&SIGNALERS, cond as usize as u64)
}

/// The last thread that took each read-write lock for reading and has not
/// yet unlocked it, a [`LastThread`] table keyed by the lock's address
/// (per process). A foreground writer that finds the lock held for reading
/// boosts that reader: the one most likely still in its critical section.
/// Other readers that still hold the lock are not recorded.
const RWLOCK_SLOTS: usize = 1024;
static READERS: [AtomicU64; RWLOCK_SLOTS] = [const { AtomicU64::new(0) }; RWLOCK_SLOTS];

/// `tid` took `l` for reading.
pub fn note_reader(l: *const libc::pthread_rwlock_t, tid: i32) {
    LastThread::note(&READERS, l as usize as u64, tid);
}

/// `tid` unlocks `l`: no longer its last reader.
pub fn reader_left(l: *const libc::pthread_rwlock_t, tid: i32) {
    LastThread::forget(&READERS, l as usize as u64, tid);
}

/// Whom a writer of `l` waits for: the writer holding it, else the last
/// reader recorded (0: none known).
///
/// # Safety
/// As [`writer`].
pub unsafe fn holder(l: *mut libc::pthread_rwlock_t) -> i32 {
    match writer(l) {
        0 => LastThread::get(&READERS, l as usize as u64),
        w => w,
    }
}

/// `tid` wrote to the pipe whose key is `pipe` (see `pace::pipe_key`).
pub fn note_pipe_writer(pipe: u64, tid: i32, c: &Control) {
    LastThread::note(&c.pipe_writers, pipe, tid);
}

/// The last thread of the tree that wrote to the pipe `pipe` (0: none).
pub fn pipe_writer(pipe: u64, c: &Control) -> i32 {
    LastThread::get(&c.pipe_writers, pipe)
}

/// Who each blocked thread of the tree waits for, so that a boost follows
/// a chain, also into another process (a foreground `waitpid` for a child
/// whose main thread waits for its own background writer): the block's
/// `waits`, `(tid << 32) | owner` per slot, direct-mapped by tid (a
/// collision loses one link of a chain, never correctness). Set by every
/// thread that blocks in an interposed wait with a known owner (a lock's
/// owner, a condition variable's last signaller, a pipe's last writer, a
/// child), whatever its class, and cleared when the wait ends.
///
/// `tid` blocks until `owner` lets it go (0: the wait ended; the slot is
/// cleared only if it still holds `tid`'s record, not a colliding thread's).
pub fn note_wait(tid: i32, owner: i32, c: &Control) {
    let slot = &c.waits[tid_slot(tid, critio_control::WAIT_SLOTS)];
    if owner > 0 {
        slot.store(
            (u64::from(tid as u32) << 32) | u64::from(owner as u32),
            Ordering::Relaxed,
        );
    } else {
        let cur = slot.load(Ordering::Relaxed);
        if (cur >> 32) as u32 == tid as u32 {
            let _ = slot.compare_exchange(cur, 0, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

/// Whom `tid` waits for now (0: nobody known).
pub fn waiting_for(tid: i32, c: &Control) -> i32 {
    let v = c.waits[tid_slot(tid, critio_control::WAIT_SLOTS)].load(Ordering::Relaxed);
    if (v >> 32) as u32 == tid as u32 {
        (v & 0xffff_ffff) as i32
    } else {
        0
    }
}

/// The most threads one boost follows along a chain.
pub const CHAIN_MAX: usize = 4;

/// A waiter's boost of a background owner and, along the chain, of the
/// background threads that owner itself waits for; undone on drop.
pub struct Boost<'a> {
    tids: [i32; CHAIN_MAX],
    /// Whether each boost is on record with its waiter (the table may be
    /// full: such a boost cannot be reaped if the waiter dies).
    recorded: [bool; CHAIN_MAX],
    n: usize,
    me: i32,
    c: &'a Control,
}

impl<'a> Boost<'a> {
    /// Boosts `owner` if it is a background thread, and the background
    /// threads it waits for in turn, up to [`CHAIN_MAX`] (None: nobody).
    pub fn of(owner: i32, me: i32, c: &'a Control) -> Option<Boost<'a>> {
        let mut b = Boost {
            tids: [0; CHAIN_MAX],
            recorded: [false; CHAIN_MAX],
            n: 0,
            me,
            c,
        };
        let mut cur = owner;
        for _ in 0..CHAIN_MAX {
            if cur <= 0 || cur == me || b.tids[..b.n].contains(&cur) {
                break; // the chain ends, or loops back
            }
            if class_of_any(cur, c) == Some(Class::Background) && c.add_boost_waiter(cur) {
                b.recorded[b.n] = c.add_booster(me, cur);
                apply(cur, Class::Foreground, c);
                c.boosts.fetch_add(1, Ordering::Relaxed);
                b.tids[b.n] = cur;
                b.n += 1;
            }
            cur = waiting_for(cur, c);
        }
        (b.n > 0).then_some(b)
    }
}

impl Drop for Boost<'_> {
    fn drop(&mut self) {
        for (&tid, &recorded) in self.tids[..self.n].iter().zip(&self.recorded) {
            if recorded && !self.c.remove_booster(self.me, tid) {
                continue; // reaped: `critio run` took this waiter for dead
            }
            let bg = class_of_any(tid, self.c) == Some(Class::Background);
            if self.c.remove_boost_waiter(tid) == 0 && bg {
                apply(tid, Class::Background, self.c);
                // A waiter that boosted it meanwhile keeps it foreground.
                if self.c.boosted(tid) {
                    apply(tid, Class::Foreground, self.c);
                }
            }
        }
    }
}
