//! Background writes, paced and handed to writeback by their writer.
//!
//! A background thread's writes are counted per file descriptor. Each time
//! one descriptor has `chunk_bytes` written, the chunk is either appended
//! (it reaches the file's end: a dump, a log rewrite) or written in place
//! (a database writing out pages).
//!
//! An appended chunk's writer
//! 1. waits for its turn on the shared pacing clock (`rate_bytes_per_sec`,
//!    set by the controller in `critio run`; every background writer of
//!    the tree shares it; one wait is at most [`PACE_WAIT_MAX_NS`]; none
//!    while a foreground thread waits for a lock it holds),
//! 2. starts the chunk's writeback itself (`sync_file_range` WRITE), so
//!    the I/O carries the writer's background I/O priority,
//! 3. waits for the chunk before it (WAIT_BEFORE | WRITE | WAIT_AFTER):
//!    at most two chunks per writer are in flight, no foreground `fsync`
//!    later finds these pages dirty, and the writer keeps producing the
//!    next chunk while one is written (a wait for its own chunk made a
//!    Redis rewrite with no load at all take 1.4x as long as stock),
//! 4. drops that earlier chunk from the page cache (`POSIX_FADV_DONTNEED`):
//!    a dump or log rewrite is not read again.
//!
//! A descriptor's last chunk is left to the kernel's writeback (and to the
//! program's own `fsync`, which a dump or a rewrite does before it renames
//! the file).
//!
//! A chunk written in place is only started on its way to the device
//! (`sync_file_range` with WRITE alone), at the writer's priority, and
//! nothing waits: a program writes pages out while it holds its own lock
//! on them (PostgreSQL's checkpointer holds a buffer's content lock and its
//! I/O-in-progress flag across the `pwrite`), a lock critio cannot see, so
//! a pacing wait there would make every request that touches that page
//! wait for the background's pace. Those pages stay cached (they may be
//! read again).

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use critio_control::{Class, Control, Op};

use crate::now_ns;

/// The longest one pacing wait may be: background progress is never
/// stopped for longer, whatever the rate.
pub const PACE_WAIT_MAX_NS: u64 = 1_000_000_000;

/// Descriptors tracked (writes to higher ones are not paced).
const FDS: usize = 16384;

struct FdState {
    /// 0: not known yet, 1: a regular file, 2: a pipe (or FIFO), 3:
    /// anything else.
    kind: AtomicU8,
    /// A pipe's key: its inode and device, hashed (0: not a pipe).
    pipe: AtomicU64,
    pending: AtomicU64,
    lo: AtomicU64,
    hi: AtomicU64,
    /// The appended chunk started last and not waited for yet, `[lo, hi)`
    /// (`lo >= hi`: none).
    started_lo: AtomicU64,
    started_hi: AtomicU64,
    /// When this descriptor's writer last came out of a pacing wait
    /// (0: not yet): the time since, up to its next chunk, is its own.
    resumed: AtomicU64,
}

#[allow(clippy::declare_interior_mutable_const)]
const FD_INIT: FdState = FdState {
    kind: AtomicU8::new(0),
    pipe: AtomicU64::new(0),
    pending: AtomicU64::new(0),
    lo: AtomicU64::new(u64::MAX),
    hi: AtomicU64::new(0),
    started_lo: AtomicU64::new(u64::MAX),
    started_hi: AtomicU64::new(0),
    resumed: AtomicU64::new(0),
};

static STATE: [FdState; FDS] = [FD_INIT; FDS];

fn slot(fd: libc::c_int) -> Option<&'static FdState> {
    STATE.get(usize::try_from(fd).ok()?)
}

const FILE: u8 = 1;
const PIPE: u8 = 2;
const OTHER: u8 = 3;

/// What `fd` is (`FILE`, `PIPE` or `OTHER`) and, for a pipe, its key.
/// Cached per descriptor until it is closed.
fn kind(fd: libc::c_int) -> (u8, u64) {
    // (0, 0): fstat failed (not open yet): nothing is cached.
    let stat = || {
        // SAFETY: `st` is a valid out-pointer; fstat is not interposed.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return (0, 0);
        }
        match st.st_mode & libc::S_IFMT {
            libc::S_IFREG => (FILE, 0),
            libc::S_IFIFO => {
                // Both ends of a pipe share its inode; never 0.
                let key = (st.st_ino ^ st.st_dev.rotate_left(40)) | 1 << 63;
                (PIPE, key)
            }
            _ => (OTHER, 0),
        }
    };
    let Some(s) = slot(fd) else {
        return stat();
    };
    match s.kind.load(Ordering::Acquire) {
        0 => {
            let (kind, key) = stat();
            if kind != 0 {
                s.pipe.store(key, Ordering::Relaxed);
                s.kind.store(kind, Ordering::Release);
            }
            (kind, key)
        }
        kind => (kind, s.pipe.load(Ordering::Relaxed)),
    }
}

/// Whether `fd` is a regular file (the only I/O the library times or
/// paces: sockets and pipes block for reasons that are not I/O).
pub fn is_file(fd: libc::c_int) -> bool {
    kind(fd).0 == FILE
}

/// The key of the pipe (or FIFO) `fd` is an end of, the same at both ends
/// and in every process (None: not a pipe).
pub fn pipe_key(fd: libc::c_int) -> Option<u64> {
    match kind(fd) {
        // (A key of 0 is a pipe forgotten by a `close` meanwhile.)
        (PIPE, key) if key != 0 => Some(key),
        _ => None,
    }
}

/// `fd` is being closed, or replaced (`dup2`, `dup3`, `close_range`):
/// forget what was known about it.
pub fn closed(fd: libc::c_int) {
    if let Some(s) = slot(fd) {
        s.kind.store(0, Ordering::Relaxed);
        s.pipe.store(0, Ordering::Relaxed);
        s.pending.store(0, Ordering::Relaxed);
        s.lo.store(u64::MAX, Ordering::Relaxed);
        s.hi.store(0, Ordering::Relaxed);
        s.started_lo.store(u64::MAX, Ordering::Relaxed);
        s.started_hi.store(0, Ordering::Relaxed);
        s.resumed.store(0, Ordering::Relaxed);
    }
}

/// Descriptors `first..=last` are being closed: see [`closed`].
pub fn closed_range(first: libc::c_uint, last: libc::c_uint) {
    let last = (last as usize).min(FDS - 1);
    for fd in first as usize..=last {
        closed(fd as libc::c_int);
    }
}

/// Where a write landed.
#[derive(Clone, Copy, Debug)]
pub enum Position {
    /// At this offset (pwrite).
    At(u64),
    /// Just before the descriptor's position (write, writev).
    BeforeCursor,
    /// In a stdio buffer: where it lands is known once flushed, and the
    /// chunk is then taken to end at the position (a stream appends).
    Buffered,
}

/// The descriptor's position.
fn cursor(fd: libc::c_int) -> Option<u64> {
    // SAFETY: lseek is not interposed; SEEK_CUR by 0 only reads it.
    u64::try_from(unsafe { libc::lseek(fd, 0, libc::SEEK_CUR) }).ok()
}

/// `n` bytes were written to `fd` by a background thread, at `at`.
/// Returns whether a chunk is due (call [`hand_off`]).
pub fn written(fd: libc::c_int, n: u64, at: Position, c: &Control) -> bool {
    let Some(s) = slot(fd) else {
        return false;
    };
    let start = match at {
        Position::At(off) => Some(off),
        Position::BeforeCursor => cursor(fd).and_then(|pos| pos.checked_sub(n)),
        Position::Buffered => None,
    };
    if let Some(start) = start {
        s.lo.fetch_min(start, Ordering::Relaxed);
        s.hi.fetch_max(start + n, Ordering::Relaxed);
    }
    let pending = s.pending.fetch_add(n, Ordering::Relaxed) + n;
    pending >= c.chunk_bytes.load(Ordering::Relaxed).max(1)
}

/// Paces, writes back and (if appended) drops what `fd` has pending.
pub fn hand_off(fd: libc::c_int, c: &Control) {
    let Some(s) = slot(fd) else {
        return;
    };
    let bytes = s.pending.swap(0, Ordering::Relaxed);
    let (mut lo, mut hi) = (
        s.lo.swap(u64::MAX, Ordering::Relaxed),
        s.hi.swap(0, Ordering::Relaxed),
    );
    if bytes == 0 || !is_file(fd) {
        return;
    }
    if lo >= hi {
        // Buffered writes: the chunk ends at the (flushed) position.
        if let Some(pos) = cursor(fd) {
            (lo, hi) = (pos.saturating_sub(bytes), pos);
        }
    }
    let (off, len) = if lo < hi { (lo, hi - lo) } else { (0, 0) };
    // SAFETY: `st` is a valid out-pointer; fstat is not interposed.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    let ok = unsafe { libc::fstat(fd, &mut st) } == 0;
    let size = if ok { st.st_size as u64 } else { u64::MAX };
    let appended = len > 0 && hi >= size;
    if !appended {
        // Written in place: the program may hold its own lock over this
        // write (a database's buffer lock while it writes the page out), so
        // nothing here waits: the range is only started on its way to the
        // device, and the call returns.
        if start_writeback(fd, off, len) {
            c.kicked_chunks.fetch_add(1, Ordering::Relaxed);
            c.kicked_bytes.fetch_add(bytes, Ordering::Relaxed);
        }
        return;
    }
    own_time(s, bytes, c);
    wait_turn(bytes, c);
    s.resumed.store(now_ns(), Ordering::Relaxed);
    if !start_writeback(fd, off, len) {
        return;
    }
    c.paced_chunks.fetch_add(1, Ordering::Relaxed);
    c.paced_bytes.fetch_add(bytes, Ordering::Relaxed);
    let (before_lo, before_hi) = (
        s.started_lo.swap(off, Ordering::Relaxed),
        s.started_hi.swap(off + len, Ordering::Relaxed),
    );
    if before_lo < before_hi {
        finish(fd, before_lo, before_hi - before_lo, c);
    }
}

/// The longest time between two chunks of one writer that counts as its
/// own (a writer idle longer has no data, it is not slow).
const OWN_GAP_MAX_NS: u64 = 2_000_000_000;

/// Counts the time `s`'s writer took for a chunk of `bytes` outside
/// pacing waits: producing it, and waiting for the chunk before it to be
/// written back. Bytes over that time are what it would write unpaced.
fn own_time(s: &FdState, bytes: u64, c: &Control) {
    let resumed = s.resumed.load(Ordering::Relaxed);
    let took = now_ns().saturating_sub(resumed);
    if resumed != 0 && took < OWN_GAP_MAX_NS {
        c.own_bytes.fetch_add(bytes, Ordering::Relaxed);
        c.own_ns.fetch_add(took, Ordering::Relaxed);
    }
}

/// Starts the writeback of `[off, off + len)` of `fd` without waiting;
/// false if the kernel refused.
fn start_writeback(fd: libc::c_int, off: u64, len: u64) -> bool {
    // SAFETY: sync_file_range takes integers; it is not interposed.
    unsafe {
        libc::sync_file_range(
            fd,
            off as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WRITE,
        ) == 0
    }
}

/// Waits for the appended range `[off, off + len)` of `fd` to reach the
/// device, then drops it from the page cache.
fn finish(fd: libc::c_int, off: u64, len: u64, c: &Control) {
    let t0 = now_ns();
    // SAFETY: sync_file_range takes integers; it is not interposed.
    let r = unsafe {
        libc::sync_file_range(
            fd,
            off as libc::off64_t,
            len as libc::off64_t,
            libc::SYNC_FILE_RANGE_WAIT_BEFORE
                | libc::SYNC_FILE_RANGE_WRITE
                | libc::SYNC_FILE_RANGE_WAIT_AFTER,
        )
    };
    let took = now_ns() - t0;
    if r != 0 {
        return;
    }
    c.writeback_wait_ns.fetch_add(took, Ordering::Relaxed);
    c.record(Class::Background, Op::Sync, took);
    // Appended: not read again, so dropped from the page cache.
    // SAFETY: posix_fadvise takes integers; it is not interposed.
    let r = unsafe {
        libc::posix_fadvise(
            fd,
            off as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_DONTNEED,
        )
    };
    if r == 0 {
        c.dropped_bytes.fetch_add(len, Ordering::Relaxed);
    }
}

/// Takes `bytes` of the shared pace: waits until the pacing clock reaches
/// this writer's turn (at most [`PACE_WAIT_MAX_NS`]).
fn wait_turn(bytes: u64, c: &Control) {
    let rate = c.rate_bytes_per_sec.load(Ordering::Relaxed);
    let me = crate::thread::tid();
    if rate == 0 || c.boosted(me) {
        return; // unpaced, or a foreground thread waits for this one
    }
    let cost = (u128::from(bytes) * 1_000_000_000 / u128::from(rate)) as u64;
    let now = now_ns();
    let mut next = c.pace_next_ns.load(Ordering::Relaxed);
    let start = loop {
        // A turn is never booked further ahead than one longest wait, so
        // the clock carries no debt past what a writer actually waits.
        let start = next.max(now).min(now + PACE_WAIT_MAX_NS);
        match c.pace_next_ns.compare_exchange_weak(
            next,
            start + cost,
            Ordering::Relaxed,
            Ordering::Relaxed,
        ) {
            Ok(_) => break start,
            Err(seen) => next = seen,
        }
    };
    let wait = (start - now).min(PACE_WAIT_MAX_NS);
    // In slices, so a foreground thread that starts waiting for this one
    // (a lock it holds) ends the wait within a slice.
    const SLICE_NS: u64 = 20_000_000;
    let mut left = wait;
    while left > 0 && !c.boosted(me) {
        let step = left.min(SLICE_NS);
        let ts = libc::timespec {
            tv_sec: (step / 1_000_000_000) as libc::time_t,
            tv_nsec: (step % 1_000_000_000) as libc::c_long,
        };
        // SAFETY: nanosleep reads `ts`; a signal ending it early only
        // shortens the wait. It is not interposed.
        unsafe { libc::nanosleep(&ts, std::ptr::null_mut()) };
        left -= step;
    }
    c.pace_wait_ns.fetch_add(wait - left, Ordering::Relaxed);
}
