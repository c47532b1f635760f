//! `critio-preload`: the library `critio run` puts in `LD_PRELOAD` so that
//! an unmodified program gets request-centric I/O priority on a stock
//! kernel.
//!
//! ```text
//!  program calls write/pwrite/writev/fwrite, read/pread, fsync/fdatasync,
//!  pthread_mutex_lock, pthread_rwlock_rdlock/wrlock, pthread_cond_*wait
//!  (a foreground waiter boosts a background owner, or the last signaller:
//!  inherit.rs)
//!        │
//!        v  (this library, first in the symbol lookup order)
//!  control block mapped and enabled? ── no ──> the real call, nothing else
//!        │ yes
//!        v
//!  the thread's class (rules; re-checked every 250 ms and after a fork;
//!  applied as the thread's kernel I/O priority: best-effort 0 / the
//!  background one, idle by default)
//!        │
//!        ├─ foreground: the real call, timed into the control block
//!        │  (histograms, and the window the controller reads; fwrite, a
//!        │  copy into a stdio buffer, is not timed)
//!        └─ background: the real call; a write is counted against its
//!           file, and each `chunk_bytes` written is
//!             appended (a dump, a log rewrite): paced by the shared rate
//!               and handed to writeback by the writer itself
//!               (sync_file_range, at its background priority, waited for), then
//!               dropped from the page cache
//!             in place (a database writing out pages): only started on
//!               its way to the device, never waited for (the writer may
//!               hold its own lock over the write)
//! ```
//!
//! Only regular files are timed and paced (sockets and pipes block for
//! reasons that are not I/O); a pipe's writes and reads only feed
//! inheritance (`inherit.rs`). What each descriptor is stays cached until
//! `close` or `fclose`, which are interposed for that alone.
//!
//! Every interposed call returns what the real one returned, with the same
//! `errno`; the library's own I/O (reading the process title, the control
//! block) goes through raw system calls or functions it does not
//! interpose (it closes its own descriptors with the raw system call), so it never
//! re-enters itself, and a call made while the thread is already inside the
//! library passes straight through.

mod hooks;
mod inherit;
mod pace;
mod real;
mod thread;

use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

use critio_control::{Control, ENV_CONTROL};

/// The mapped control block (null: absent or invalid, every call passes
/// through).
static CONTROL: AtomicPtr<Control> = AtomicPtr::new(std::ptr::null_mut());

/// Forks seen by this process image (a child re-classifies its threads).
static FORK_GEN: AtomicU64 = AtomicU64::new(0);

/// The control block, if mapped and enabled.
fn control() -> Option<&'static Control> {
    let p = CONTROL.load(Ordering::Acquire);
    if p.is_null() {
        return None;
    }
    // SAFETY: `p` was set once by `init` to a MAP_SHARED mapping of
    // `Control::SIZE` bytes that is never unmapped, page-aligned (so
    // aligned for Control), whose header was validated; every field other
    // programs change is atomic, and all-zero bytes are valid for each.
    let c = unsafe { &*p };
    c.is_enabled().then_some(c)
}

/// Whether this process may lower a nice value it raised (root, or
/// CAP_SYS_NICE-less processes may not): only then are background threads
/// niced, since a thread that turns foreground, or is boosted, must get
/// its CPU share back, and a forked child inherits its parent's value.
static MAY_UNNICE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Whether background threads may be niced (see [`MAY_UNNICE`]).
fn may_nice() -> bool {
    MAY_UNNICE.load(Ordering::Relaxed)
}

/// Resolves the real functions (always: a pass-through must not call the
/// dynamic linker later, from a signal handler or after a fork), then maps
/// the control block named by `CRITIO_RUN_CONTROL`, if any.
extern "C" fn init() {
    hooks::resolve_all();
    // SAFETY: geteuid has no preconditions.
    MAY_UNNICE.store(unsafe { libc::geteuid() } == 0, Ordering::Relaxed);
    // SAFETY: getenv reads the environment; the name is NUL-terminated.
    let path = unsafe { libc::getenv(c"CRITIO_RUN_CONTROL".as_ptr()) };
    debug_assert_eq!(ENV_CONTROL, "CRITIO_RUN_CONTROL");
    if path.is_null() {
        return;
    }
    // SAFETY: `path` is a NUL-terminated string from the environment;
    // open, mmap and close are not interposed by this library.
    unsafe {
        let fd = libc::open(path, libc::O_RDWR | libc::O_CLOEXEC);
        if fd < 0 {
            return;
        }
        let mut st: libc::stat = std::mem::zeroed();
        let big_enough = libc::fstat(fd, &mut st) == 0 && st.st_size as usize >= Control::SIZE;
        let p = if big_enough {
            libc::mmap(
                std::ptr::null_mut(),
                Control::SIZE,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            )
        } else {
            libc::MAP_FAILED
        };
        libc::syscall(libc::SYS_close, fd);
        if p == libc::MAP_FAILED {
            return;
        }
        let c = p.cast::<Control>();
        if !(*c).valid() {
            libc::munmap(p, Control::SIZE);
            return;
        }
        CONTROL.store(c, Ordering::Release);
        libc::pthread_atfork(None, None, Some(after_fork_child));
    }
}

extern "C" fn after_fork_child() {
    FORK_GEN.fetch_add(1, Ordering::Relaxed);
}

/// Runs `init` when the library is loaded, before the program's main.
#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = init;

/// CLOCK_MONOTONIC in ns.
fn now_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// A coarse monotonic time in ns (the kernel's tick, a few ms; cheaper
/// than [`now_ns`]): for timers, never for latencies.
fn now_coarse_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC_COARSE)
}

fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid out-pointer; clock_gettime is not interposed.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The calling thread's errno, saved across the library's own calls.
struct Errno(i32);

impl Errno {
    fn save() -> Self {
        // SAFETY: __errno_location returns the calling thread's errno slot.
        Errno(unsafe { *libc::__errno_location() })
    }

    fn restore(self) {
        // SAFETY: as in `save`.
        unsafe { *libc::__errno_location() = self.0 };
    }
}
