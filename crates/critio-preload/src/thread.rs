//! The calling thread's class: decided by the control block's rules from
//! its process title, its name and whether it is the launched process's
//! main thread; cached per thread, re-checked every [`RECHECK_NS`] (a
//! program may retitle itself after a fork, as PostgreSQL's backends do),
//! after a fork, and after any thread of the process is renamed. A change is applied as the thread's kernel I/O
//! priority (best-effort 0, or the block's `background_ioprio`), CPU nice value (0 or the block's
//! `background_nice`) and, with the block's `background_idle`, CPU policy (`SCHED_OTHER`, or
//! `SCHED_IDLE` for a background thread), and logged in the block for `critio run --explain`.

use std::cell::Cell;
use std::sync::atomic::Ordering;

use critio_control::{classify, Class, Control, ThreadView};

use crate::{now_coarse_ns, FORK_GEN};

/// Thread renames seen in this process (`prctl(PR_SET_NAME)`,
/// `pthread_setname_np`): a rename makes every thread re-check its class,
/// since `thread=` rules look at names.
pub static NAME_GEN: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How long a thread's class is trusted before it is re-checked.
pub const RECHECK_NS: u64 = 250_000_000;

thread_local! {
    static CLASS: Cell<u32> = const { Cell::new(0) };
    /// The deciding rule's index + 1 (0: the default), logged with changes.
    static RULE: Cell<u32> = const { Cell::new(u32::MAX) };
    static GEN: Cell<u64> = const { Cell::new(u64::MAX) };
    static CHECKED: Cell<u64> = const { Cell::new(0) };
    static IN_LIBRARY: Cell<bool> = const { Cell::new(false) };
    /// The thread's id and the fork generation it was read in.
    static TID: Cell<(u64, i32)> = const { Cell::new((u64::MAX, 0)) };
}

/// The calling thread's id, cached (a fork child's thread has a new one:
/// the cache is keyed by the fork generation `pthread_atfork` counts, so a
/// child made by a raw `clone` or glibc's `_Fork`, which run no fork
/// handlers, would keep its parent's id).
pub fn tid() -> i32 {
    let gen = FORK_GEN.load(Ordering::Relaxed);
    TID.with(|t| match t.get() {
        (g, tid) if g == gen => tid,
        _ => {
            // SAFETY: gettid has no preconditions.
            let tid = unsafe { libc::gettid() };
            t.set((gen, tid));
            tid
        }
    })
}

/// Marks the thread as inside the library until dropped; None if it
/// already is (a call the library itself made: pass it through).
pub struct Inside(());

impl Inside {
    pub fn enter() -> Option<Inside> {
        // The guard is made only when the flag was clear: a guard made and
        // dropped for a nested call would clear the outer call's flag.
        IN_LIBRARY.with(|f| {
            if f.replace(true) {
                None
            } else {
                Some(Inside(()))
            }
        })
    }
}

impl Drop for Inside {
    fn drop(&mut self) {
        IN_LIBRARY.with(|f| f.set(false));
    }
}

/// The calling thread's class, (re)deciding it when due.
pub fn class(c: &Control) -> Class {
    let gen = FORK_GEN.load(Ordering::Relaxed) << 32 | NAME_GEN.load(Ordering::Relaxed);
    let now = now_coarse_ns();
    let cached = CLASS.with(Cell::get);
    if cached != 0
        && GEN.with(Cell::get) == gen
        && now.saturating_sub(CHECKED.with(Cell::get)) < RECHECK_NS
    {
        return if cached == Class::Foreground as u32 {
            Class::Foreground
        } else {
            Class::Background
        };
    }
    let forked = GEN.with(Cell::get) >> 32 != gen >> 32;
    let before = if forked {
        // A new process (the thread is its copy): decide and log afresh.
        RULE.with(|r| r.set(u32::MAX));
        0
    } else {
        cached
    };
    let decided = decide(c, before);
    CLASS.with(|v| v.set(decided as u32));
    GEN.with(|v| v.set(gen));
    CHECKED.with(|v| v.set(now));
    decided
}

fn decide(c: &Control, before: u32) -> Class {
    // SAFETY: getpid/gettid have no preconditions.
    let (pid, tid) = unsafe { (libc::getpid(), libc::gettid()) };
    let mut title = [0u8; 256];
    let title = read_title(&mut title);
    let mut name = [0u8; 16];
    // SAFETY: PR_GET_NAME writes at most 16 bytes into `name`.
    unsafe { libc::syscall(libc::SYS_prctl, libc::PR_GET_NAME, name.as_mut_ptr()) };
    let name_len = name.iter().position(|&b| b == 0).unwrap_or(16);
    let view = ThreadView {
        root_main: pid == tid && pid == c.root_pid.load(Ordering::Relaxed),
        title,
        name: &name[..name_len],
    };
    let (class, rule) = classify(c.rules(), &view);
    let rule_tag = rule.map_or(0, |r| r as u32 + 1);
    if RULE.with(|r| r.replace(rule_tag)) != rule_tag {
        // Another rule decides now (also when the class stays): log it.
        c.log_thread(pid, tid, class, rule, view.name, title);
    }
    if class as u32 != before {
        crate::inherit::note_class(tid, class);
        // A thread boosted by a foreground waiter keeps its boost until
        // the waiter has the lock.
        if !c.boosted(tid) {
            crate::inherit::apply(tid, class, c);
        }
    }
    class
}

/// The process title (`/proc/self/cmdline`, NULs as spaces, trailing
/// spaces trimmed), read with raw system calls.
fn read_title(buf: &mut [u8; 256]) -> &[u8] {
    // SAFETY: the path is NUL-terminated; open and close are not
    // interposed; SYS_read writes at most `buf.len()` bytes into `buf`.
    let n = unsafe {
        let fd = libc::open(
            c"/proc/self/cmdline".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        );
        if fd < 0 {
            return &[];
        }
        let n = libc::syscall(libc::SYS_read, fd, buf.as_mut_ptr(), buf.len());
        libc::syscall(libc::SYS_close, fd);
        n
    };
    let n = usize::try_from(n).unwrap_or(0).min(buf.len());
    for b in &mut buf[..n] {
        if *b == 0 {
            *b = b' ';
        }
    }
    let end = buf[..n]
        .iter()
        .rposition(|&b| b != b' ')
        .map_or(0, |i| i + 1);
    &buf[..end]
}
