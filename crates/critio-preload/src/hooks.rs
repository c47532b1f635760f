//! The interposed functions. Each calls the real one and returns exactly
//! what it returned, with the same `errno`; around the call it times a
//! foreground thread's I/O and paces a background thread's writes (see
//! `pace.rs`). With no control block, a disabled one, or a call made from
//! inside the library, it is the real call and nothing else.

use libc::{c_int, c_void, iovec, off64_t, off_t, size_t, ssize_t, FILE};

use critio_control::{Class, Control, Op};

use crate::pace::Position;
use crate::real::real_fn;
use crate::thread::{self, Inside};
use crate::{control, now_ns, pace, Errno};

real_fn!(real_write = "write": fn(c_int, *const c_void, size_t) -> ssize_t);
real_fn!(real_pwrite = "pwrite": fn(c_int, *const c_void, size_t, off_t) -> ssize_t);
real_fn!(real_pwrite64 = "pwrite64": fn(c_int, *const c_void, size_t, off64_t) -> ssize_t);
real_fn!(real_writev = "writev": fn(c_int, *const iovec, c_int) -> ssize_t);
real_fn!(real_read = "read": fn(c_int, *mut c_void, size_t) -> ssize_t);
real_fn!(real_pread = "pread": fn(c_int, *mut c_void, size_t, off_t) -> ssize_t);
real_fn!(real_pread64 = "pread64": fn(c_int, *mut c_void, size_t, off64_t) -> ssize_t);
real_fn!(real_fsync = "fsync": fn(c_int) -> c_int);
real_fn!(real_fdatasync = "fdatasync": fn(c_int) -> c_int);
real_fn!(real_fwrite = "fwrite": fn(*const c_void, size_t, size_t, *mut FILE) -> size_t);
real_fn!(real_close = "close": fn(c_int) -> c_int);
real_fn!(real_dup2 = "dup2": fn(c_int, c_int) -> c_int);
real_fn!(real_dup3 = "dup3": fn(c_int, c_int, c_int) -> c_int);
real_fn!(real_close_range = "close_range": fn(libc::c_uint, libc::c_uint, c_int) -> c_int);
real_fn!(real_prctl = "prctl": fn(c_int, libc::c_ulong, libc::c_ulong, libc::c_ulong, libc::c_ulong) -> c_int);
real_fn!(real_setname = "pthread_setname_np": fn(libc::pthread_t, *const libc::c_char) -> c_int);
real_fn!(real_waitpid = "waitpid": fn(libc::pid_t, *mut c_int, c_int) -> libc::pid_t);
real_fn!(real_mutex_lock = "pthread_mutex_lock": fn(*mut libc::pthread_mutex_t) -> c_int);
real_fn!(real_mutex_trylock = "pthread_mutex_trylock": fn(*mut libc::pthread_mutex_t) -> c_int);
real_fn!(real_fclose = "fclose": fn(*mut FILE) -> c_int);
real_fn!(real_cond_signal = "pthread_cond_signal" @ "GLIBC_2.3.2": fn(*mut libc::pthread_cond_t) -> c_int);
real_fn!(real_cond_broadcast = "pthread_cond_broadcast" @ "GLIBC_2.3.2": fn(*mut libc::pthread_cond_t) -> c_int);
real_fn!(real_cond_wait = "pthread_cond_wait" @ "GLIBC_2.3.2": fn(*mut libc::pthread_cond_t, *mut libc::pthread_mutex_t) -> c_int);
real_fn!(real_cond_timedwait = "pthread_cond_timedwait" @ "GLIBC_2.3.2": fn(*mut libc::pthread_cond_t, *mut libc::pthread_mutex_t, *const libc::timespec) -> c_int);
real_fn!(real_cond_clockwait = "pthread_cond_clockwait": fn(*mut libc::pthread_cond_t, *mut libc::pthread_mutex_t, libc::clockid_t, *const libc::timespec) -> c_int);
real_fn!(real_rdlock = "pthread_rwlock_rdlock": fn(*mut libc::pthread_rwlock_t) -> c_int);
real_fn!(real_tryrdlock = "pthread_rwlock_tryrdlock": fn(*mut libc::pthread_rwlock_t) -> c_int);
real_fn!(real_wrlock = "pthread_rwlock_wrlock": fn(*mut libc::pthread_rwlock_t) -> c_int);
real_fn!(real_trywrlock = "pthread_rwlock_trywrlock": fn(*mut libc::pthread_rwlock_t) -> c_int);
real_fn!(real_rwunlock = "pthread_rwlock_unlock": fn(*mut libc::pthread_rwlock_t) -> c_int);

/// A call the library looks at: the block, the thread's class, the time
/// the real call started (0: not timed), and the re-entrancy mark.
struct Call {
    c: &'static Control,
    class: Class,
    t0: u64,
    _inside: Inside,
}

/// Starts looking at a call on `fd` (None: pass it straight through).
fn begin(fd: c_int) -> Option<Call> {
    begin_call(fd, true)
}

/// As [`begin`], for a call that is not timed: a buffered `fwrite` copies
/// into the stream's buffer, so its time says nothing about I/O (and three
/// clock reads would cost it several times the copy).
fn begin_untimed(fd: c_int) -> Option<Call> {
    begin_call(fd, false)
}

fn begin_call(fd: c_int, timed: bool) -> Option<Call> {
    let c = control()?;
    let inside = Inside::enter()?;
    let errno = Errno::save();
    let file = fd >= 0 && pace::is_file(fd);
    let class = if file { Some(thread::class(c)) } else { None };
    errno.restore();
    let class = class?;
    Some(Call {
        c,
        class,
        t0: if timed { now_ns() } else { 0 },
        _inside: inside,
    })
}

impl Call {
    /// After the real call: a foreground call is timed; a background write
    /// of `written` bytes (at `at`, or just before the position) is counted
    /// and, every chunk, paced and handed to writeback (`flush` first
    /// empties a stdio buffer).
    fn end(self, op: Op, fd: c_int, written: Option<(u64, Position)>, flush: Option<*mut FILE>) {
        let errno = Errno::save();
        if self.t0 != 0 {
            let took = now_ns() - self.t0;
            self.c.record(self.class, op, took);
        }
        if self.class == Class::Background {
            if let Some((n, at)) = written.filter(|w| w.0 > 0) {
                if pace::written(fd, n, at, self.c) {
                    if let Some(fp) = flush {
                        // SAFETY: `fp` is the stream the program just
                        // wrote to; fflush is not interposed.
                        unsafe { libc::fflush(fp) };
                    }
                    pace::hand_off(fd, self.c);
                }
            }
        }
        errno.restore();
    }
}

fn fail() -> ssize_t {
    Errno(libc::ENOSYS).restore();
    -1
}

fn bytes(r: ssize_t) -> u64 {
    u64::try_from(r).unwrap_or(0)
}

/// # Safety
/// As `write(2)`: `buf` is valid for `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, count: size_t) -> ssize_t {
    let Some(real) = real_write() else {
        return fail();
    };
    let Some(call) = begin(fd) else {
        writing_pipe(fd, count);
        return real(fd, buf, count);
    };
    let r = real(fd, buf, count);
    call.end(
        Op::Write,
        fd,
        Some((bytes(r), Position::BeforeCursor)),
        None,
    );
    r
}

/// # Safety
/// As `pwrite(2)`.
#[no_mangle]
pub unsafe extern "C" fn pwrite(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    off: off_t,
) -> ssize_t {
    let Some(real) = real_pwrite() else {
        return fail();
    };
    let Some(call) = begin(fd) else {
        return real(fd, buf, count, off);
    };
    let r = real(fd, buf, count, off);
    call.end(
        Op::Write,
        fd,
        Some((bytes(r), Position::At(off as u64))),
        None,
    );
    r
}

/// # Safety
/// As `pwrite64(2)`.
#[no_mangle]
pub unsafe extern "C" fn pwrite64(
    fd: c_int,
    buf: *const c_void,
    count: size_t,
    off: off64_t,
) -> ssize_t {
    let Some(real) = real_pwrite64() else {
        return fail();
    };
    let Some(call) = begin(fd) else {
        return real(fd, buf, count, off);
    };
    let r = real(fd, buf, count, off);
    call.end(
        Op::Write,
        fd,
        Some((bytes(r), Position::At(off as u64))),
        None,
    );
    r
}

/// # Safety
/// As `writev(2)`: `iov` points to `iovcnt` valid entries.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const iovec, iovcnt: c_int) -> ssize_t {
    let Some(real) = real_writev() else {
        return fail();
    };
    let Some(call) = begin(fd) else {
        writing_pipe(fd, usize::from(iovcnt > 0));
        return real(fd, iov, iovcnt);
    };
    let r = real(fd, iov, iovcnt);
    call.end(
        Op::Write,
        fd,
        Some((bytes(r), Position::BeforeCursor)),
        None,
    );
    r
}

/// # Safety
/// As `fwrite(3)`: `ptr` is valid for `size * nmemb` bytes, `stream` open.
#[no_mangle]
pub unsafe extern "C" fn fwrite(
    ptr: *const c_void,
    size: size_t,
    nmemb: size_t,
    stream: *mut FILE,
) -> size_t {
    let Some(real) = real_fwrite() else {
        Errno(libc::ENOSYS).restore();
        return 0;
    };
    let call = if control().is_some() && !stream.is_null() {
        let errno = Errno::save();
        let fd = libc::fileno(stream);
        errno.restore();
        begin_untimed(fd)
    } else {
        None
    };
    let Some(call) = call else {
        return real(ptr, size, nmemb, stream);
    };
    let r = real(ptr, size, nmemb, stream);
    let errno = Errno::save();
    let fd = libc::fileno(stream);
    errno.restore();
    call.end(
        Op::Write,
        fd,
        Some(((r * size) as u64, Position::Buffered)),
        Some(stream),
    );
    r
}

/// # Safety
/// As `read(2)`: `buf` is valid for `count` bytes.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, count: size_t) -> ssize_t {
    let Some(real) = real_read() else {
        return fail();
    };
    let Some(call) = begin(fd) else {
        return reading_pipe(fd, || real(fd, buf, count));
    };
    let r = real(fd, buf, count);
    call.end(Op::Read, fd, None, None);
    r
}

/// # Safety
/// As `pread(2)`.
#[no_mangle]
pub unsafe extern "C" fn pread(fd: c_int, buf: *mut c_void, count: size_t, off: off_t) -> ssize_t {
    let Some(real) = real_pread() else {
        return fail();
    };
    let Some(call) = begin(fd) else {
        return real(fd, buf, count, off);
    };
    let r = real(fd, buf, count, off);
    call.end(Op::Read, fd, None, None);
    r
}

/// # Safety
/// As `pread64(2)`.
#[no_mangle]
pub unsafe extern "C" fn pread64(
    fd: c_int,
    buf: *mut c_void,
    count: size_t,
    off: off64_t,
) -> ssize_t {
    let Some(real) = real_pread64() else {
        return fail();
    };
    let Some(call) = begin(fd) else {
        return real(fd, buf, count, off);
    };
    let r = real(fd, buf, count, off);
    call.end(Op::Read, fd, None, None);
    r
}

/// # Safety
/// As `fsync(2)`.
#[no_mangle]
pub unsafe extern "C" fn fsync(fd: c_int) -> c_int {
    let Some(real) = real_fsync() else {
        return fail() as c_int;
    };
    let Some(call) = begin(fd) else {
        return real(fd);
    };
    let r = real(fd);
    call.end(Op::Sync, fd, None, None);
    r
}

/// # Safety
/// As `fdatasync(2)`.
#[no_mangle]
pub unsafe extern "C" fn fdatasync(fd: c_int) -> c_int {
    let Some(real) = real_fdatasync() else {
        return fail() as c_int;
    };
    let Some(call) = begin(fd) else {
        return real(fd);
    };
    let r = real(fd);
    call.end(Op::Sync, fd, None, None);
    r
}

/// # Safety
/// As `close(2)`.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    let Some(real) = real_close() else {
        return fail() as c_int;
    };
    pace::closed(fd);
    real(fd)
}

/// # Safety
/// As `dup2(2)`. `newfd` is replaced: what was known about it is
/// forgotten (before, and after, as around `close`).
#[no_mangle]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    let Some(real) = real_dup2() else {
        return fail() as c_int;
    };
    pace::closed(newfd);
    let r = real(oldfd, newfd);
    pace::closed(newfd);
    r
}

/// # Safety
/// As `dup3(2)`; see [`dup2`].
#[no_mangle]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    let Some(real) = real_dup3() else {
        return fail() as c_int;
    };
    pace::closed(newfd);
    let r = real(oldfd, newfd, flags);
    pace::closed(newfd);
    r
}

/// # Safety
/// As `close_range(2)`: what was known about every descriptor it closes is
/// forgotten (with `CLOSE_RANGE_CLOEXEC` nothing closes before an exec,
/// which starts the library afresh).
#[no_mangle]
pub unsafe extern "C" fn close_range(
    first: libc::c_uint,
    last: libc::c_uint,
    flags: c_int,
) -> c_int {
    let Some(real) = real_close_range() else {
        return fail() as c_int;
    };
    if flags as libc::c_uint & libc::CLOSE_RANGE_CLOEXEC == 0 {
        pace::closed_range(first, last);
    }
    real(first, last, flags)
}

/// # Safety
/// As `fclose(3)`: `stream` is an open stream.
#[no_mangle]
pub unsafe extern "C" fn fclose(stream: *mut FILE) -> c_int {
    let Some(real) = real_fclose() else {
        Errno(libc::ENOSYS).restore();
        return libc::EOF;
    };
    let fd = if control().is_some() && !stream.is_null() {
        let errno = Errno::save();
        let fd = libc::fileno(stream);
        errno.restore();
        fd
    } else {
        -1
    };
    pace::closed(fd);
    let r = real(stream);
    pace::closed(fd);
    r
}

/// Resolves every real function now (from the library's constructor), so
/// that no interposed call resolves one while the dynamic linker's own
/// locks may be held.
pub fn resolve_all() {
    let _ = (
        real_write(),
        real_pwrite(),
        real_pwrite64(),
        real_writev(),
        real_read(),
    );
    let _ = (
        real_pread(),
        real_pread64(),
        real_fsync(),
        real_fdatasync(),
        real_fwrite(),
    );
    let _ = (real_dup2(), real_dup3(), real_close_range());
    let _ = (
        real_close(),
        real_fclose(),
        real_mutex_lock(),
        real_mutex_trylock(),
    );
    let _ = (real_prctl(), real_setname(), real_waitpid());
    let _ = (
        real_rdlock(),
        real_tryrdlock(),
        real_wrlock(),
        real_trywrlock(),
        real_rwunlock(),
    );
    let _ = (
        real_cond_signal(),
        real_cond_broadcast(),
        real_cond_wait(),
        real_cond_timedwait(),
        real_cond_clockwait(),
    );
}

/// A thread about to block until `owner` lets it go: records the wait (so
/// a boost of this thread follows on to `owner`) and, if the thread is
/// foreground, boosts `owner` and whatever `owner` waits for. Only a
/// foreground thread starts a boost: a background thread that is boosted
/// when it starts a wait would keep its owner boosted for the whole wait,
/// long after its own boost ended (an idle worker waiting on a condition
/// variable may wait forever); a chain that exists when a foreground
/// thread starts waiting is followed by the boost's walk instead.
///
/// The state lives in a thread-local until [`Blocked::end`]: a thread
/// cancelled in a wait (`pthread_cond_wait` and `waitpid` are cancellation
/// points) never returns to the hook, and the thread-local's destructor then
/// undoes the boost at thread exit.
struct Blocked {
    me: i32,
    c: &'static Control,
    /// Held for its drop: the boosted threads are background again.
    _boost: Option<crate::inherit::Boost<'static>>,
}

thread_local! {
    static BLOCKED: std::cell::RefCell<Option<Blocked>> = const { std::cell::RefCell::new(None) };
}

impl Blocked {
    fn start(c: &'static Control, owner: i32) {
        let me = thread::tid();
        crate::inherit::note_wait(me, owner, c);
        let boost = if thread::class(c) == Class::Foreground {
            crate::inherit::Boost::of(owner, me, c)
        } else {
            None
        };
        let b = Blocked {
            me,
            c,
            _boost: boost,
        };
        // A thread already tearing down its thread-locals, or a signal
        // handler that interrupted this very code: no record kept (`b` is
        // dropped: the wait is not boosted past this point).
        let _ = BLOCKED.try_with(|slot| {
            if let Ok(mut slot) = slot.try_borrow_mut() {
                *slot = Some(b);
            }
        });
    }

    /// Runs `wait`, a wait for `owner`, between [`Blocked::start`] and
    /// [`Blocked::end`], keeping the errno `wait` leaves.
    fn during<R>(c: &'static Control, owner: i32, wait: impl FnOnce() -> R) -> R {
        let errno = Errno::save();
        Blocked::start(c, owner);
        errno.restore();
        let r = wait();
        let errno = Errno::save();
        Blocked::end();
        errno.restore();
        r
    }

    /// The wait is over: the record and the boost end.
    fn end() {
        let taken = BLOCKED
            .try_with(|slot| slot.try_borrow_mut().ok().and_then(|mut s| s.take()))
            .ok()
            .flatten();
        drop(taken); // outside the borrow
    }
}

impl Drop for Blocked {
    fn drop(&mut self) {
        crate::inherit::note_wait(self.me, 0, self.c);
        // `_boost` is dropped next: its owners are background again.
    }
}

/// Takes lock `l` with `lock`; a caller that finds it busy (`try_lock`
/// fails with EBUSY) records whom it waits for (`owner` reads it from the
/// lock; 0: unknown) and, if foreground, boosts that thread until it has
/// the lock (see [`Blocked`]).
///
/// # Safety
/// `l` is an initialized lock of the kind `lock`, `try_lock` and `owner`
/// take.
unsafe fn lock_inheriting<T>(
    l: *mut T,
    lock: unsafe extern "C" fn(*mut T) -> c_int,
    try_lock: Option<unsafe extern "C" fn(*mut T) -> c_int>,
    owner: unsafe fn(*mut T) -> i32,
) -> c_int {
    let Some(c) = control().filter(|c| c.inherit_locks != 0) else {
        return lock(l);
    };
    let Some(_inside) = Inside::enter() else {
        return lock(l);
    };
    if let Some(try_lock) = try_lock {
        let r = try_lock(l);
        if r != libc::EBUSY {
            return r;
        }
    }
    Blocked::during(c, owner(l), || lock(l))
}

/// # Safety
/// As `pthread_mutex_lock(3)`: `m` is an initialized mutex.
#[no_mangle]
pub unsafe extern "C" fn pthread_mutex_lock(m: *mut libc::pthread_mutex_t) -> c_int {
    let Some(real) = real_mutex_lock() else {
        return libc::EINVAL;
    };
    lock_inheriting(m, real, real_mutex_trylock(), crate::inherit::owner)
}

/// # Safety
/// As `pthread_rwlock_rdlock(3)`: `l` is an initialized read-write lock.
/// A reader waits only for a writer, whose tid glibc records, so a
/// foreground reader boosts a background writer. A reader that has the
/// lock is recorded as its last reader (see [`pthread_rwlock_wrlock`]).
#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_rdlock(l: *mut libc::pthread_rwlock_t) -> c_int {
    let Some(real) = real_rdlock() else {
        return libc::EINVAL;
    };
    let r = lock_inheriting(l, real, real_tryrdlock(), crate::inherit::writer);
    if r == 0 && control().is_some_and(|c| c.inherit_locks != 0) {
        crate::inherit::note_reader(l, thread::tid());
    }
    r
}

/// # Safety
/// As `pthread_rwlock_wrlock(3)`: `l` is an initialized read-write lock.
/// A foreground writer boosts a background writer that holds it, or, if
/// it is held for reading, the reader that took it last, unless that one
/// has unlocked it already (glibc records no readers; the library does).
#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_wrlock(l: *mut libc::pthread_rwlock_t) -> c_int {
    let Some(real) = real_wrlock() else {
        return libc::EINVAL;
    };
    lock_inheriting(l, real, real_trywrlock(), crate::inherit::holder)
}

/// # Safety
/// As `pthread_rwlock_unlock(3)`: `l` is a read-write lock the caller
/// holds. A reader that unlocks is no longer the lock's last reader.
#[no_mangle]
pub unsafe extern "C" fn pthread_rwlock_unlock(l: *mut libc::pthread_rwlock_t) -> c_int {
    let Some(real) = real_rwunlock() else {
        return libc::EINVAL;
    };
    if control().is_some_and(|c| c.inherit_locks != 0) {
        crate::inherit::reader_left(l, thread::tid());
    }
    real(l)
}

/// Before a write of `count` bytes to `fd`, which is not a file: if `fd`
/// is a pipe, the caller is recorded as its last writer (if inheritance is
/// on), so that a thread that reads the pipe waits for it, and a
/// foreground one that blocks boosts it. Recorded before the real write:
/// a reader the write wakes must find the writer already recorded.
fn writing_pipe(fd: c_int, count: usize) {
    if count == 0 || fd < 0 {
        return;
    }
    let Some(c) = control().filter(|c| c.inherit_locks != 0) else {
        return;
    };
    let Some(_inside) = Inside::enter() else {
        return;
    };
    let errno = Errno::save();
    if let Some(pipe) = pace::pipe_key(fd) {
        thread::class(c); // classified, so a reader can tell it is background
        crate::inherit::note_pipe_writer(pipe, thread::tid(), c);
    }
    errno.restore();
}

/// Runs `read` on `fd`: a thread about to read a pipe waits for the
/// pipe's last writer (see [`pipe_wait`]); a foreground one boosts it if
/// background (see [`Blocked`]), as a waiter on a condition variable boosts
/// its last signaller.
///
/// The re-entrancy guard is not held across the read itself: a signal
/// handler that runs during it (one writing a self-pipe) or a `siglongjmp`
/// out of it finds the thread outside the library.
fn reading_pipe(fd: c_int, read: impl FnOnce() -> ssize_t) -> ssize_t {
    if fd < 0 {
        return read();
    }
    let Some(c) = control().filter(|c| c.inherit_locks != 0) else {
        return read();
    };
    let waits = {
        let Some(_inside) = Inside::enter() else {
            return read();
        };
        let errno = Errno::save();
        let writer = pipe_wait(fd, c);
        if writer > 0 {
            Blocked::start(c, writer);
        }
        errno.restore();
        writer > 0
    };
    let r = read();
    if waits {
        let errno = Errno::save();
        Blocked::end();
        errno.restore();
    }
    r
}

/// Whom the caller's read of `fd` waits for: the last writer of the pipe
/// `fd` is, if recorded and not the caller (0: nobody). A background
/// reader takes it as is, without a system call: its wait record is a link
/// of a chain (a foreground `waitpid` for it reaches the writer), and a
/// read that does not block ends the record at once. A foreground reader,
/// which boosts, first checks that the read will block: the pipe is empty
/// and the descriptor blocking.
fn pipe_wait(fd: c_int, c: &Control) -> i32 {
    let Some(pipe) = pace::pipe_key(fd) else {
        return 0;
    };
    let writer = crate::inherit::pipe_writer(pipe, c);
    if writer <= 0 || writer == thread::tid() {
        return 0;
    }
    if thread::class(c) != Class::Foreground {
        return writer;
    }
    let mut ready: c_int = 0;
    // SAFETY: FIONREAD writes one int to `ready`; F_GETFL only reads the
    // descriptor's flags. Neither is interposed.
    let will_block = unsafe {
        !(libc::ioctl(fd, libc::FIONREAD, &mut ready) == 0 && ready > 0)
            && libc::fcntl(fd, libc::F_GETFL) & libc::O_NONBLOCK == 0
    };
    if will_block {
        writer
    } else {
        0
    }
}

/// Records the caller as `cond`'s last signaller (if inheritance is on).
fn signalling(cond: *mut libc::pthread_cond_t) {
    let Some(c) = control().filter(|c| c.inherit_locks != 0) else {
        return;
    };
    let Some(_inside) = Inside::enter() else {
        return;
    };
    let errno = Errno::save();
    thread::class(c); // classified, so a waiter can tell it is background
    crate::inherit::note_signaler(cond, thread::tid());
    errno.restore();
}

/// Runs `wait` on `cond`: the caller waits for the thread that last
/// signalled `cond`, which it boosts if foreground (see [`Blocked`]).
fn cond_waiting(cond: *mut libc::pthread_cond_t, wait: impl FnOnce() -> c_int) -> c_int {
    let Some(c) = control().filter(|c| c.inherit_locks != 0) else {
        return wait();
    };
    let Some(_inside) = Inside::enter() else {
        return wait();
    };
    Blocked::during(c, crate::inherit::signaler(cond), wait)
}

/// # Safety
/// As `pthread_cond_signal(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_cond_signal(cond: *mut libc::pthread_cond_t) -> c_int {
    let Some(real) = real_cond_signal() else {
        return libc::EINVAL;
    };
    signalling(cond);
    real(cond)
}

/// # Safety
/// As `pthread_cond_broadcast(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_cond_broadcast(cond: *mut libc::pthread_cond_t) -> c_int {
    let Some(real) = real_cond_broadcast() else {
        return libc::EINVAL;
    };
    signalling(cond);
    real(cond)
}

/// # Safety
/// As `pthread_cond_wait(3)`: `cond` is initialized and `m` is locked by
/// the caller.
#[no_mangle]
pub unsafe extern "C" fn pthread_cond_wait(
    cond: *mut libc::pthread_cond_t,
    m: *mut libc::pthread_mutex_t,
) -> c_int {
    let Some(real) = real_cond_wait() else {
        return libc::EINVAL;
    };
    cond_waiting(cond, || real(cond, m))
}

/// # Safety
/// As `pthread_cond_timedwait(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_cond_timedwait(
    cond: *mut libc::pthread_cond_t,
    m: *mut libc::pthread_mutex_t,
    abstime: *const libc::timespec,
) -> c_int {
    let Some(real) = real_cond_timedwait() else {
        return libc::EINVAL;
    };
    cond_waiting(cond, || real(cond, m, abstime))
}

/// # Safety
/// As `pthread_cond_clockwait(3)` (what C++'s `std::condition_variable`
/// waits with a timeout call).
#[no_mangle]
pub unsafe extern "C" fn pthread_cond_clockwait(
    cond: *mut libc::pthread_cond_t,
    m: *mut libc::pthread_mutex_t,
    clock: libc::clockid_t,
    abstime: *const libc::timespec,
) -> c_int {
    let Some(real) = real_cond_clockwait() else {
        return libc::EINVAL;
    };
    cond_waiting(cond, || real(cond, m, clock, abstime))
}

fn renamed() {
    thread::NAME_GEN.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
}

/// # Safety
/// As `prctl(2)`. Declared with five integer arguments: on x86-64 and
/// aarch64 a variadic caller passes them in the same registers.
#[no_mangle]
pub unsafe extern "C" fn prctl(
    option: c_int,
    a2: libc::c_ulong,
    a3: libc::c_ulong,
    a4: libc::c_ulong,
    a5: libc::c_ulong,
) -> c_int {
    let Some(real) = real_prctl() else {
        return fail() as c_int;
    };
    let r = real(option, a2, a3, a4, a5);
    if option == libc::PR_SET_NAME && r == 0 {
        let errno = Errno::save();
        renamed();
        errno.restore();
    }
    r
}

/// # Safety
/// As `pthread_setname_np(3)`.
#[no_mangle]
pub unsafe extern "C" fn pthread_setname_np(
    t: libc::pthread_t,
    name: *const libc::c_char,
) -> c_int {
    let Some(real) = real_setname() else {
        return libc::ENOSYS;
    };
    let r = real(t, name);
    if r == 0 {
        renamed();
    }
    r
}

/// # Safety
/// As `waitpid(2)`: `status` is null or valid for writing.
#[no_mangle]
pub unsafe extern "C" fn waitpid(
    pid: libc::pid_t,
    status: *mut c_int,
    options: c_int,
) -> libc::pid_t {
    let Some(real) = real_waitpid() else {
        return fail() as libc::pid_t;
    };
    // Only a blocking wait for one known child can pass priority on.
    if pid <= 0 || options & libc::WNOHANG != 0 {
        return real(pid, status, options);
    }
    let Some(c) = control().filter(|c| c.inherit_locks != 0) else {
        return real(pid, status, options);
    };
    let Some(_inside) = Inside::enter() else {
        return real(pid, status, options);
    };
    Blocked::during(c, pid, || real(pid, status, options))
}
