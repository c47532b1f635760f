//! Mirrors of each thread's effective class into the kernel, so the
//! kernel's own work for a thread follows its class too:
//!
//! - **I/O priority** (optional, `context.kernel_mirror`, off by default):
//!   `ioprio_set`, so I/O the kernel issues on the thread's behalf
//!   (buffered writes, page-cache misses of the application itself) is
//!   prioritized too.
//! - **CPU** (`context.background_nice`, 10 by default): a thread the
//!   application marks background ([`set_background`]: a checkpointer, a
//!   snapshot, a cleaner, writeback) runs that many nice levels below its
//!   own (the nice it had when marked, the process's, which request
//!   threads keep: under `nice -n 5` 15, else 10) while it is
//!   non-critical, and at its own while it inherits criticality. On a busy
//!   machine background work then takes the CPU requests leave idle,
//!   while a background thread a request waits for (a lock it holds, an
//!   I/O it submits) runs at full speed: static CPU priorities would leave
//!   that request waiting on a starved thread; inheritance does not.
//!
//! - **CPU floor** (`context.background_cpu_min_share`, 0.5 by default,
//!   `floor.rs`): a background thread that gets less than that share of
//!   the CPU it wants runs at a lower nice than the background one (and
//!   not `SCHED_IDLE`) until it has it, so background work slows under
//!   busy requests but never starves.
//! - **Yield points** (`context.background_yield_us`, 500 µs by
//!   default, [`yield_point`]): a CPU-bound background loop (compressing
//!   a snapshot, scanning and copying the value log) calls
//!   [`yield_point`] between its steps, and a non-critical background
//!   thread there yields the CPU at most that long after its last yield,
//!   as the kernel's own long loops call `cond_resched`. The kernel's fair
//!   scheduler (EEVDF) lets a thread that wakes with less than its share
//!   owed to it wait for the next tick (4 ms at 250 Hz) behind the thread
//!   on its CPU, however low that one's priority: `perf sched` on
//!   critio-kv under BGSAVE and BGREWRITEAOF found the request worker,
//!   woken by its log write's completion, waiting up to 4.7 ms behind a
//!   nice-10 snapshot thread while the other CPU sat idle. A yield makes
//!   the scheduler pick again: a request thread owed its turn gets the
//!   CPU; one that is not waits as before, so background work keeps its
//!   share of the CPU.
//! - **Idle policy** (`context.background_idle`, off by default): a
//!   background thread also goes to `SCHED_IDLE` while non-critical. The
//!   kernel then counts a CPU running only such threads as idle when it
//!   places a waking request thread, instead of queueing the request
//!   behind the client on the other CPU. A trade: under a BGSAVE and
//!   BGREWRITEAOF loop on a 2-CPU machine (vda, two pairs), GETs went from
//!   28.7k and 33.4k/s to 41.9k and 39.9k/s and their p99.9 from 12.2 and
//!   10.5 ms to 6.9 and 6.9 ms, while the background completed 0.58 and
//!   0.54 jobs/s instead of 0.71 and 0.81.
//! - **Lock ceiling** (`context.lock_ceiling`, on by default): inheritance
//!   raises a lock holder once a request waits for it, but the kernel may
//!   already have preempted the holder midway through its section, and a
//!   raised thread still waits its turn on a busy CPU: the request waits
//!   milliseconds for microseconds of work. A background thread that takes
//!   locks requests use, many at a time (the cleaner holding a batch's key
//!   stripes), enters [`ceiling`] for that bounded, in-memory section: it
//!   runs `SCHED_FIFO` at the lowest real-time level until the guard
//!   drops, so no normal thread preempts it there (the priority ceiling
//!   protocol; POSIX's `PTHREAD_PRIO_PROTECT` does the same with the same
//!   system call). Without the right to (`CAP_SYS_NICE` or
//!   `RLIMIT_RTPRIO`), it stays off and says so.
//!
//! ```text
//!   class flip (foreground, inherit, revoke) ──> chain walk ──> ioprio_set(tid, prio of class)
//!                                                          └──> setpriority(tid, own | own + background_nice)
//!   ceiling() ... guard dropped               ──> sched_setscheduler(FIFO 1) ... (OTHER, nice kept)
//! ```

use std::cell::Cell;
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::RwLock;
use std::time::{Duration, Instant};

use super::task::{Nice, Task};
use crate::sys::{
    set_thread_ioprio, set_thread_ioprio_or_fallback, set_thread_policy, thread_policy,
    ClassPriorities, IoPriority, SchedPolicy,
};

static ON: AtomicBool = AtomicBool::new(false);
static PRIORITIES: RwLock<Option<ClassPriorities>> = RwLock::new(None);
static BACKGROUND_NICE: AtomicI32 = AtomicI32::new(0);
static BACKGROUND_IDLE: AtomicBool = AtomicBool::new(false);
static YIELD_EVERY_NS: AtomicU64 = AtomicU64::new(0);

/// Puts background threads, while non-critical, in `SCHED_IDLE` as well
/// as at the background nice (`on`), after checking that a thread can
/// leave `SCHED_IDLE` again. Threads already marked are re-mirrored.
pub fn set_background_idle(on: bool) -> Result<(), String> {
    if on {
        if let Err(why) = probe_policy(SchedPolicy::Idle) {
            BACKGROUND_IDLE.store(false, Ordering::SeqCst);
            return Err(format!("{why}; background threads stay SCHED_OTHER"));
        }
    }
    if BACKGROUND_IDLE.swap(on, Ordering::SeqCst) != on {
        for task in super::registry::all() {
            let applied = *task.nice().lock();
            if let Some(nice) = applied {
                let policy = match idles_at(nice.offset) {
                    true => SchedPolicy::Idle,
                    false => SchedPolicy::Normal,
                };
                let _ = set_thread_policy(task.os_tid(), policy);
            }
        }
    }
    Ok(())
}

/// Whether background threads go to `SCHED_IDLE` while non-critical.
pub fn background_idle() -> bool {
    BACKGROUND_IDLE.load(Ordering::SeqCst)
}

/// Sets how many nice levels background threads run below their own
/// (the nice they had when marked background, normally the process's, as
/// the request threads have) while non-critical (0: off), after checking
/// that a thread lowered so can be raised back (without `CAP_SYS_NICE` or
/// an `RLIMIT_NICE` allowing it, it cannot: then the CPU mirror stays off
/// and the error says why). Threads already marked are re-mirrored.
pub fn set_background_nice(nice: i32) -> Result<(), String> {
    assert!((0..=19).contains(&nice), "nice {nice} outside 0..=19");
    if nice > 0 {
        if let Err(why) = probe(move || {
            let me = Some(
                rustix::process::Pid::from_raw(rustix::thread::gettid().as_raw_nonzero().get())
                    .expect("a tid is a pid"),
            );
            let base = rustix::process::getpriority_process(me)
                .map_err(|e| format!("cannot read a thread's CPU priority: {e}"))?;
            rustix::process::setpriority_process(me, Nice::value(base, nice))
                .map_err(|e| format!("cannot lower a thread's CPU priority: {e}"))?;
            rustix::process::setpriority_process(me, base).map_err(|e| {
                format!(
                    "cannot raise a thread's CPU priority back (needs CAP_SYS_NICE or RLIMIT_NICE >= 20): {e}; \
                     background threads keep the normal CPU priority"
                )
            })
        }) {
            BACKGROUND_NICE.store(0, Ordering::SeqCst);
            return Err(why);
        }
    }
    BACKGROUND_NICE.store(nice, Ordering::SeqCst);
    for task in super::registry::all() {
        mirror_cpu(&task);
    }
    Ok(())
}

/// The background nice value in force (0: off).
pub fn background_nice() -> i32 {
    BACKGROUND_NICE.load(Ordering::SeqCst)
}

/// Sets how long a non-critical background thread runs at most between
/// two yields at [`yield_point`]s (zero: it never yields there).
pub fn set_background_yield(every: Duration) {
    let ns = u64::try_from(every.as_nanos()).unwrap_or(u64::MAX);
    YIELD_EVERY_NS.store(ns, Ordering::Relaxed);
}

/// How long a non-critical background thread runs at most between two
/// yields at [`yield_point`]s (zero: off).
pub fn background_yield() -> Duration {
    Duration::from_nanos(YIELD_EVERY_NS.load(Ordering::Relaxed))
}

thread_local! {
    /// When the current thread last passed a [`yield_point`] at which it
    /// could have yielded, and how often it yielded there.
    static LAST_YIELD: Cell<(Option<Instant>, u64)> = const { Cell::new((None, 0)) };
}

/// A point in a background loop where a request thread waiting for the
/// CPU gets it (see the module's doc): a non-critical background thread
/// (below its own nice: the CPU mirror is on) that last passed one at
/// least [`background_yield`] ago calls `sched_yield`. For CPU-bound
/// background loops, between steps of tens of microseconds; elsewhere,
/// and on every other thread, it reads the clock and returns. Under
/// EEVDF a yield moves the thread's virtual deadline a slice on, so the
/// scheduler picks any other thread that is owed its turn; one that is
/// not is not picked, and the yielding thread keeps its share of the CPU.
pub fn yield_point() {
    let every = YIELD_EVERY_NS.load(Ordering::Relaxed);
    if every == 0 {
        return;
    }
    LAST_YIELD.with(|last| {
        let now = Instant::now();
        let (then, yields) = last.get();
        if then.is_some_and(|then| now.duration_since(then).as_nanos() < u128::from(every)) {
            return;
        }
        let below = super::current().nice().lock().is_some_and(|n| n.offset > 0);
        last.set((Some(now), yields + u64::from(below)));
        if below {
            std::thread::yield_now();
        }
    })
}

/// How often the current thread yielded at [`yield_point`]s.
#[cfg(test)]
fn yields_here() -> u64 {
    LAST_YIELD.with(|last| last.get().1)
}

/// Marks the current thread as background work: while it is non-critical
/// it runs at the background nice value (if on). A wrong call never
/// changes correctness, only how fast the thread runs when nothing critical
/// depends on it.
pub fn set_background() {
    let task = super::current();
    {
        let mut nice = task.nice().lock();
        if nice.is_none() {
            // The thread's own nice, the one a request thread started the
            // same way has: critio only ever puts it below that, and back.
            let base = rustix::process::getpriority_process(None).unwrap_or(0);
            *nice = Some(Nice { base, offset: 0 });
        }
    }
    mirror_cpu(&task);
}

/// Applies `task`'s CPU nice for its class now, if it is marked background:
/// its own nice while critical, else that many levels below it that the
/// background nice less the CPU floor's relief (`floor.rs`) says.
pub(super) fn mirror_cpu(task: &Task) {
    let mut applied = task.nice().lock();
    let Some(old) = *applied else { return };
    let want = if task.is_critical() {
        0
    } else {
        (background_nice() - task.relief().load(Ordering::Relaxed)).max(0)
    };
    if want == old.offset {
        return;
    }
    let pid = rustix::process::Pid::from_raw(task.os_tid());
    // Best effort: a thread that exited, or a refused raise, changes only
    // speed (set_background_nice checked that raising works).
    // The policy is left alone while the thread is at the lock ceiling
    // (real-time): leaving the ceiling applies the one its class wants.
    // Only a thread at the full background nice is SCHED_IDLE (which
    // ignores the nice): one the floor relieves runs SCHED_OTHER.
    let policy =
        background_idle() && thread_policy(task.os_tid()).is_ok_and(|p| p != SchedPolicy::Realtime);
    let idle = idles_at(want);
    if !idle && policy {
        let _ = set_thread_policy(task.os_tid(), SchedPolicy::Normal);
    }
    if rustix::process::setpriority_process(pid, Nice::value(old.base, want)).is_ok() {
        *applied = Some(Nice {
            offset: want,
            ..old
        });
    }
    if idle && policy {
        let _ = set_thread_policy(task.os_tid(), SchedPolicy::Idle);
    }
}

/// Whether a background thread `offset` nice levels below its own belongs
/// in `SCHED_IDLE`: the idle policy is on and the thread is at the full
/// background nice.
fn idles_at(offset: i32) -> bool {
    offset > 0 && offset == background_nice() && background_idle()
}

static CEILING: AtomicBool = AtomicBool::new(false);

/// Runs `check` on a thread of its own (whose scheduling it may change and
/// leave behind): whether a setting can be applied and undone here.
fn probe(check: impl FnOnce() -> Result<(), String> + Send + 'static) -> Result<(), String> {
    std::thread::spawn(check)
        .join()
        .unwrap_or_else(|_| Err("the probe thread panicked".into()))
}

/// Whether a thread can be put under `policy` and back under
/// `SCHED_OTHER`; the error says which step was refused.
fn probe_policy(policy: SchedPolicy) -> Result<(), String> {
    probe(move || {
        set_thread_policy(0, policy)
            .map_err(|e| format!("cannot put a thread under {policy:?}: {e}"))?;
        set_thread_policy(0, SchedPolicy::Normal)
            .map_err(|e| format!("cannot take a thread out of {policy:?}: {e}"))
    })
}

thread_local! {
    /// Ceiling guards this thread holds, and whether its outermost one
    /// made it real-time.
    static CEILING_HELD: Cell<(u32, bool)> = const { Cell::new((0, false)) };
}

/// Turns the lock ceiling on or off. On only after checking that a thread
/// can enter the real-time class and leave it (needs `CAP_SYS_NICE` or an
/// `RLIMIT_RTPRIO` of at least 1): otherwise it stays off and the error
/// says why.
pub fn set_lock_ceiling(on: bool) -> Result<(), String> {
    if on {
        if let Err(why) = probe_policy(SchedPolicy::Realtime) {
            CEILING.store(false, Ordering::SeqCst);
            return Err(format!(
                "{why} (needs CAP_SYS_NICE or RLIMIT_RTPRIO >= 1); the lock ceiling stays off"
            ));
        }
    }
    CEILING.store(on, Ordering::SeqCst);
    Ok(())
}

/// Whether the lock ceiling is on.
pub fn lock_ceiling() -> bool {
    CEILING.load(Ordering::SeqCst)
}

/// Runs the current thread at the ceiling (real-time, above every normal
/// thread) until the guard drops, if the lock ceiling is on; nests (the
/// outermost guard decides). For short, bounded sections a request may
/// wait for, such as holding many of the locks requests take: a thread
/// that computes for long under it takes a CPU from everyone else
/// (the kernel's real-time throttling still leaves them 5%).
pub fn ceiling() -> CeilingGuard {
    CEILING_HELD.with(|held| {
        let (depth, raised) = held.get();
        let raised = match depth {
            0 => lock_ceiling() && set_thread_policy(0, SchedPolicy::Realtime).is_ok(),
            _ => raised,
        };
        held.set((depth + 1, raised));
    });
    CeilingGuard {
        _not_send: PhantomData,
    }
}

/// The section of [`ceiling`]: the thread leaves the ceiling when the
/// outermost guard drops.
pub struct CeilingGuard {
    _not_send: PhantomData<*const ()>,
}

impl Drop for CeilingGuard {
    fn drop(&mut self) {
        CEILING_HELD.with(|held| {
            let (depth, raised) = held.get();
            if depth == 1 && raised {
                // Best effort: leaving real-time cannot be refused. A
                // background thread goes back to SCHED_IDLE if that is
                // where its class puts it.
                let _ = set_thread_policy(0, SchedPolicy::Normal);
                let task = super::current();
                let applied = *task.nice().lock();
                if applied.is_some_and(|n| idles_at(n.offset)) {
                    let _ = set_thread_policy(0, SchedPolicy::Idle);
                }
            }
            held.set((depth - 1, raised && depth > 1));
        });
    }
}

/// Turns the mirror on with `priorities` (or off with `None`). Turning it on
/// sets every registered thread's kernel priority at once; turning it off
/// gives every registered thread the kernel's default back.
pub fn set_kernel_mirror(priorities: Option<ClassPriorities>) {
    *PRIORITIES.write().unwrap_or_else(|e| e.into_inner()) = priorities;
    let was_on = ON.swap(priorities.is_some(), Ordering::SeqCst);
    if priorities.is_none() && !was_on {
        return;
    }
    for task in super::registry::all() {
        match priorities {
            Some(_) => mirror(&task),
            None => {
                let _ = set_thread_ioprio(task.os_tid(), IoPriority::None);
            }
        }
    }
}

/// Whether the mirror is on.
pub fn kernel_mirror() -> Option<ClassPriorities> {
    *PRIORITIES.read().unwrap_or_else(|e| e.into_inner())
}

/// Sets `task`'s kernel priority to its class's, if the mirror is on. Best
/// effort: a thread that exited or a refused class is not an error here
/// (a refused real-time class falls back to best-effort 0).
pub(crate) fn mirror(task: &Task) {
    mirror_cpu(task);
    if !ON.load(Ordering::Relaxed) {
        return;
    }
    if let Some(p) = kernel_mirror() {
        let _ = set_thread_ioprio_or_fallback(task.os_tid(), p.of(task.class()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nice_of(tid: i32) -> i32 {
        rustix::process::getpriority_process(Some(rustix::process::Pid::from_raw(tid).unwrap()))
            .unwrap()
    }

    /// The CPU tests change the process-wide background settings: one at a
    /// time.
    static CPU_SETTINGS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// For a test that reads nice values: the CPU settings held, from nice
    /// 0, with the background nice at 10; None (having said why) if that
    /// cannot be.
    fn at_background_nice_10() -> Option<std::sync::MutexGuard<'static, ()>> {
        let one = CPU_SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
        if !at_nice_zero() {
            return None;
        }
        if let Err(why) = set_background_nice(10) {
            eprintln!("skipped: {why}");
            return None;
        }
        Some(one)
    }

    /// Whether the test runs at nice 0, as the tests that read nice values
    /// expect (not, say, under `nice -n 19 cargo test`); says so if not.
    fn at_nice_zero() -> bool {
        let own = rustix::process::getpriority_process(None).unwrap();
        if own != 0 {
            eprintln!("skipped: the test process runs at nice {own}, not 0");
        }
        own == 0
    }

    /// A background thread takes a lock; a foreground thread then waits for
    /// it. Returns what `seen` reads of the holder (by tid) while it is
    /// non-critical, while it inherits (once `seen` changes), and after it
    /// released the lock and was revoked.
    fn held_then_waited_for<T>(seen: fn(i32) -> T) -> (T, T, T)
    where
        T: PartialEq + Send + 'static,
    {
        held_at_then_waited_for(None, seen)
    }

    /// [`held_then_waited_for`] with the background thread starting at
    /// nice `own`, if some (as every thread of a server started under
    /// `nice` does).
    fn held_at_then_waited_for<T>(own: Option<i32>, seen: fn(i32) -> T) -> (T, T, T)
    where
        T: PartialEq + Send + 'static,
    {
        use crate::sync::Mutex;
        use std::sync::{mpsc, Arc};
        let lock = Arc::new(Mutex::named("t-cpu-mirror", ()));
        let (held_tx, held_rx) = mpsc::channel();
        let (go_tx, go_rx) = mpsc::channel::<()>();
        let bg = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                if let Some(own) = own {
                    rustix::process::setpriority_process(None, own).unwrap();
                }
                set_background();
                let tid = crate::context::current().os_tid();
                let guard = lock.lock();
                held_tx.send((tid, seen(tid))).unwrap();
                go_rx.recv().unwrap(); // a foreground waiter is queued now
                let boosted = seen(tid);
                drop(guard);
                (boosted, seen(tid))
            })
        };
        let (tid, idle) = held_rx.recv().unwrap();
        let fg = {
            let lock = lock.clone();
            std::thread::spawn(move || {
                crate::context::set_foreground();
                drop(lock.lock());
            })
        };
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while seen(tid) == idle && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        go_tx.send(()).unwrap();
        let (boosted, after) = bg.join().unwrap();
        fg.join().unwrap();
        (idle, boosted, after)
    }

    #[test]
    fn a_background_thread_runs_at_full_speed_while_a_request_waits_for_it() {
        let Some(_one) = at_background_nice_10() else {
            return;
        };
        let (idle, boosted, after) = held_then_waited_for(nice_of);
        set_background_nice(0).unwrap();
        assert_eq!(idle, 10, "non-critical: the background nice");
        assert_eq!(boosted, 0, "inheriting: full speed");
        assert_eq!(after, 10, "revoked: background again");
    }

    /// Calls [`yield_point`] on a thread of its own, marked by `mark`,
    /// until it yielded `want` times or 500 ms passed; the yields and the
    /// time it took.
    fn yields_of(mark: fn(), want: u64) -> (u64, Duration) {
        std::thread::spawn(move || {
            mark();
            let start = Instant::now();
            while yields_here() < want && start.elapsed() < Duration::from_millis(500) {
                yield_point();
            }
            (yields_here(), start.elapsed())
        })
        .join()
        .unwrap()
    }

    /// A non-critical background thread yields at yield points, at most
    /// once a period; one that inherits criticality and a request thread
    /// never do. (At the default period, which a stack opened by another
    /// test meanwhile sets too.)
    #[test]
    fn a_noncritical_background_thread_yields_at_most_once_a_period() {
        let Some(_one) = at_background_nice_10() else {
            return;
        };
        let default = crate::config::ContextConfig::default().background_yield_us;
        let every = Duration::from_micros(default.into());
        set_background_yield(every);
        let (bg, took) = yields_of(set_background, 4);
        let critical = yields_of(
            || {
                set_background();
                let task = crate::context::current();
                task.inherit(crate::context::InheritKind::Lock);
                mirror_cpu(&task);
            },
            1,
        );
        let foreground = yields_of(crate::context::set_foreground, 1);
        set_background_nice(0).unwrap();
        assert_eq!(bg, 4, "a background thread yields ({took:?})");
        // The first yield is at once: three more take three periods.
        assert!(took >= 3 * every, "4 yields in {took:?}");
        assert_eq!(critical.0, 0, "inheriting: no yield in {:?}", critical.1);
        assert_eq!(foreground.0, 0, "a request thread: {foreground:?}");
    }

    /// Under `nice -n 5` request threads run at 5: a background thread
    /// started there runs at 15 while non-critical and goes back to 5, not
    /// past the request threads, while it inherits.
    #[test]
    fn a_background_threads_nice_is_counted_from_its_own() {
        let Some(_one) = at_background_nice_10() else {
            return;
        };
        let (idle, boosted, after) = held_at_then_waited_for(Some(5), nice_of);
        set_background_nice(0).unwrap();
        assert_eq!(idle, 15, "non-critical: ten below its own");
        assert_eq!(boosted, 5, "inheriting: its own nice, the request threads'");
        assert_eq!(after, 15, "revoked: background again");
        // Ten below nice 15 is past the kernel's range: 19.
        set_background_nice(10).unwrap();
        let (idle, boosted, _) = held_at_then_waited_for(Some(15), nice_of);
        set_background_nice(0).unwrap();
        assert_eq!((idle, boosted), (19, 15));
    }

    /// The CPU floor: a background thread sharing one CPU with a busy
    /// request thread gets a tenth of it at nice 10; the floor lowers its
    /// nice until it has its share, and gives the nice back once the
    /// request thread stops.
    #[test]
    fn the_cpu_floor_lowers_a_crowded_background_threads_nice_and_gives_it_back() {
        use crate::context::set_background_cpu_min_share;
        use crate::sys::thread_cpu_times;
        use rustix::thread::{sched_getaffinity, sched_setaffinity, CpuSet};
        use std::sync::atomic::AtomicBool;
        use std::sync::{mpsc, Arc};
        use std::time::{Duration, Instant};

        let _one = CPU_SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
        // The test measures from nice 0: under `nice -n 19 cargo test` both
        // threads would start at 19, the background one could go no lower
        // than the request thread, and it would never be crowded.
        if !at_nice_zero() {
            return;
        }
        let on = set_background_nice(10).and_then(|()| set_background_cpu_min_share(0.5));
        if let Err(why) = on {
            eprintln!("skipped: {why}");
            return;
        }
        let allowed = sched_getaffinity(None).unwrap();
        let cpu = (0..CpuSet::MAX_CPU).find(|&c| allowed.is_set(c)).unwrap();
        let spin = |stop: Arc<AtomicBool>, background: bool, tid: mpsc::Sender<i32>| {
            std::thread::spawn(move || {
                let mut set = CpuSet::new();
                set.set(cpu);
                sched_setaffinity(None, &set).unwrap();
                match background {
                    true => set_background(),
                    false => crate::context::set_foreground(),
                }
                tid.send(crate::context::current().os_tid()).unwrap();
                while !stop.load(Ordering::Relaxed) {
                    std::hint::black_box(0);
                }
            })
        };
        let (stop_fg, stop_bg) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (tx, rx) = mpsc::channel();
        let fg = spin(stop_fg.clone(), false, tx.clone());
        rx.recv().unwrap();
        let bg = spin(stop_bg.clone(), true, tx);
        let tid = rx.recv().unwrap();
        let until = |what: &str, done: &dyn Fn() -> bool| {
            let start = Instant::now();
            while !done() {
                assert!(start.elapsed() < Duration::from_secs(20), "never: {what}");
                std::thread::sleep(Duration::from_millis(5));
            }
        };
        until("the floor relieves the crowded thread fully", &|| {
            nice_of(tid) == 0
        });
        let before = thread_cpu_times(tid).unwrap();
        std::thread::sleep(Duration::from_millis(500));
        let d = thread_cpu_times(tid).unwrap().since(before);
        let share = d.run_ns as f64 / (d.run_ns + d.wait_ns) as f64;
        stop_fg.store(true, Ordering::Relaxed);
        fg.join().unwrap();
        until("alone on its CPU, the thread is back at nice 10", &|| {
            nice_of(tid) == 10
        });
        stop_bg.store(true, Ordering::Relaxed);
        bg.join().unwrap();
        set_background_cpu_min_share(0.0).unwrap();
        set_background_nice(0).unwrap();
        // At nice 0 the two threads share the CPU evenly (at nice 10 it got
        // a tenth; other tests' threads may take some of it too).
        assert!(
            share > 0.2,
            "the relieved thread ran {share:.2} of the time it wanted"
        );
    }

    fn is_idle(tid: i32) -> bool {
        thread_policy(tid).unwrap() == SchedPolicy::Idle
    }

    #[test]
    fn a_background_thread_is_sched_idle_until_a_request_waits_for_it() {
        let _one = CPU_SETTINGS.lock().unwrap_or_else(|e| e.into_inner());
        let on = set_background_nice(10)
            .and_then(|()| set_background_idle(true))
            .and_then(|()| set_lock_ceiling(true));
        if let Err(why) = on {
            eprintln!("skipped: {why}");
            return;
        }
        let sections = std::thread::spawn(|| {
            set_background();
            let inside = {
                let _c = ceiling();
                is_idle(0)
            };
            (inside, is_idle(0))
        })
        .join()
        .unwrap();
        let (idle, boosted, after) = held_then_waited_for(is_idle);
        set_background_idle(false).unwrap();
        set_background_nice(0).unwrap();
        assert_eq!(
            sections,
            (false, true),
            "at the ceiling: not SCHED_IDLE; after it: SCHED_IDLE again"
        );
        assert!(idle, "non-critical: SCHED_IDLE");
        assert!(!boosted, "inheriting: SCHED_OTHER");
        assert!(after, "revoked: SCHED_IDLE again");
    }

    #[test]
    fn a_ceiling_section_runs_real_time_and_leaves_the_nice_as_it_was() {
        if let Err(why) = set_lock_ceiling(true) {
            eprintln!("skipped: {why}");
            return;
        }
        let seen = std::thread::spawn(|| {
            let tid = crate::context::current().os_tid();
            let pid = rustix::process::Pid::from_raw(tid);
            rustix::process::setpriority_process(pid, 5).unwrap();
            let rt = || thread_policy(0).unwrap() == SchedPolicy::Realtime;
            let before = rt();
            let outer = ceiling();
            let inside = rt();
            drop(ceiling()); // a nested section ends: still at the ceiling
            let nested_done = rt();
            drop(outer);
            (before, inside, nested_done, rt(), nice_of(tid))
        })
        .join()
        .unwrap();
        assert_eq!(seen, (false, true, true, false, 5));
    }

    use crate::context;
    use crate::sys::{thread_ioprio, IoPriority};

    #[test]
    fn a_threads_kernel_priority_follows_its_class() {
        let p = ClassPriorities::LEVELS;
        set_kernel_mirror(Some(p));
        let seen = std::thread::spawn(|| {
            let tid = context::current().os_tid();
            let before = thread_ioprio(tid).unwrap();
            context::set_foreground();
            let fg = thread_ioprio(tid).unwrap();
            context::clear_foreground();
            let bg = thread_ioprio(tid).unwrap();
            (before, fg, bg)
        })
        .join()
        .unwrap();
        set_kernel_mirror(None);
        // Registration happens before the mirror sees the thread, so its
        // priority starts as the kernel default; each flip then mirrors.
        assert_eq!(seen.1, IoPriority::BestEffort(0));
        assert_eq!(seen.2, IoPriority::BestEffort(7));
    }
}
