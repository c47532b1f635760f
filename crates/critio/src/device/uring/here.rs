//! Reads and writes done by the thread that waits for them: a read on a
//! small ring of the thread's own per device, a write with `pwrite`.
//!
//! ```text
//!  read:  SQE{Read, fd, buf, offset, ioprio(class)} ─> io_uring_enter(submit 1, wait 1)
//!             ^                                               │ kernel ─> CQE, wakes the caller
//!             └── short transfer, EAGAIN/EINTR, refused RT ───┘ (up to ATTEMPTS_MAX SQEs)
//!  write: ioprio_set(self, ioprio(class)) ─> pwrite (short: again) ─> ioprio_set(self, own)
//! ```
//!
//! A read is the same SQE as through the shared ring (so the same
//! per-request I/O priority reaches the kernel's scheduler and the drive),
//! but no reaper: the `io_uring_enter` that submits it waits for its
//! completion, and the kernel wakes the caller itself. The caller's buffer
//! stays in this frame until its CQE has been taken; nothing returns while
//! the kernel may still use it. A write is a system call ([`write`] says
//! why), which carries the thread's I/O priority: the thread takes the
//! request's for it.
//!
//! A thread keeps at most [`RINGS_PER_THREAD`] rings, one per device it
//! used last (a ring is a file descriptor and two small mappings), and
//! drops them when it exits.

use std::cell::RefCell;
use std::io;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use io_uring::{types, IoUring};

use super::reaper::Shared;
use super::state::{sqe, too_many_attempts, transfer_outcome, Outcome, ATTEMPTS_MAX};
use crate::device::{AlignedBuf, Command, Completion, DeviceError, Op};
use crate::sys::{self, IoPriority};

/// Rings one thread keeps, one per device (the least recently used goes).
const RINGS_PER_THREAD: usize = 4;
/// SQ entries of a caller's ring: one request at a time, one spare.
const ENTRIES: u32 = 2;

static NEXT_DEVICE: AtomicU64 = AtomicU64::new(1);

thread_local! {
    /// This thread's rings, by device id, the most recently used last.
    static RINGS: RefCell<Vec<(u64, IoUring)>> = const { RefCell::new(Vec::new()) };
}

/// A new device's id.
pub(super) fn next_device_id() -> u64 {
    NEXT_DEVICE.fetch_add(1, Ordering::Relaxed)
}

/// Does the read or write `cmd` (validated) in this thread; hands it back
/// if it is a flush or the thread has no ring and cannot set one up.
pub(super) fn submit(shared: &Shared, cmd: Command) -> Result<Completion, Command> {
    match cmd.op {
        Op::Flush => return Err(cmd),
        Op::Write => return Ok(write(shared, cmd)),
        Op::Read => {}
    }
    RINGS.with(|rings| {
        let Ok(mut rings) = rings.try_borrow_mut() else {
            return Err(cmd);
        };
        let at = match rings.iter().position(|(id, _)| *id == shared.id) {
            Some(at) => at,
            None => {
                let Ok(ring) = IoUring::new(ENTRIES) else {
                    return Err(cmd);
                };
                if rings.len() >= RINGS_PER_THREAD {
                    rings.remove(0);
                }
                rings.push((shared.id, ring));
                rings.len() - 1
            }
        };
        let (id, mut ring) = rings.remove(at);
        let (completion, usable) = run(shared, &mut ring, cmd);
        if usable {
            rings.push((id, ring));
        }
        Ok(completion)
    })
}

/// Runs `cmd` to its end on `ring`; false with it if the ring failed (the
/// command's buffer is then leaked, since the kernel may still hold it).
fn run(shared: &Shared, ring: &mut IoUring, cmd: Command) -> (Completion, bool) {
    let Command {
        op,
        offset,
        mut buf,
        class,
        ..
    } = cmd;
    let fd = types::Fd(shared.caller_file.as_raw_fd());
    let len = buf.len();
    let mut ioprio = shared.state.lock().ioprio(class);
    let mut transferred = 0;
    let mut attempts = 0;
    let result = loop {
        attempts += 1;
        let rest = &mut buf.as_mut_slice()[transferred..];
        let entry = sqe(op, fd, rest, offset + transferred as u64, ioprio);
        // SAFETY: the SQE reads from or writes into `buf`'s heap data,
        // bytes [transferred, len), and names `caller_file`'s descriptor,
        // which lives as long as the device, which the caller borrows.
        // `buf` is owned by this frame and neither touched nor freed until
        // the CQE of this SQE has been taken below (`wait_one` returns only
        // then); if the ring fails before that, `buf` is leaked instead.
        // The SQ is empty before each push (one SQE at a time, each
        // submitted by `wait_one`), so the push cannot fail.
        unsafe {
            ring.submission()
                .push(&entry)
                .expect("an empty submission queue has room");
        }
        let res = match wait_one(ring) {
            Ok(res) => res,
            Err(e) => {
                std::mem::forget(buf);
                let result = Err(DeviceError::Io {
                    device: shared.info.name.clone(),
                    op,
                    offset,
                    source: io::Error::other(format!(
                        "the caller's io_uring failed ({e}); the request's buffer was leaked"
                    )),
                });
                let buf = AlignedBuf::empty();
                return (Completion { result, buf }, false);
            }
        };
        let outcome = if res < 0 {
            match -res {
                libc::EAGAIN | libc::EINTR => Outcome::Again,
                libc::EPERM if IoPriority::decode(ioprio).is_some_and(IoPriority::is_realtime) => {
                    ioprio = shared.state.lock().fall_back(class).encode();
                    Outcome::Again
                }
                errno => Outcome::Done(Err(io::Error::from_raw_os_error(errno))),
            }
        } else {
            transfer_outcome(op, len, &mut transferred, res as usize)
        };
        match outcome {
            Outcome::Again if attempts < ATTEMPTS_MAX => {}
            Outcome::Again => break Err(too_many_attempts()),
            Outcome::Done(r) => break r,
        }
    };
    let result = result.map_err(|source| DeviceError::Io {
        device: shared.info.name.clone(),
        op,
        offset,
        source,
    });
    (Completion { result, buf }, true)
}

/// Does the write `cmd` with `pwrite` in this thread, under the request's
/// I/O priority.
///
/// Why not the ring: the kernel completes an asynchronous `O_DIRECT` write
/// on ext4 in a kernel worker (`iomap_dio_complete_work` on the `dio/DISK`
/// workqueue), which then posts the CQE and wakes the caller: two thread
/// wake-ups where a synchronous write has one (the caller's own, which
/// finishes the write in its own context). `perf record -e
/// workqueue:workqueue_execute_start -a` over critio-kv's SET load counted
/// one such work item per log commit; that worker runs at the normal CPU
/// priority on whichever CPU the I/O completed, so on a busy machine each
/// commit also waited for it to be scheduled.
///
/// The priority: a synchronous write carries its thread's I/O priority
/// (`ioprio_set`), not a per-request one, so the thread takes the
/// request's for the write and gets its own back after it. With
/// per-request priorities off, the thread's own is used, as the ring does.
/// Where the kernel refuses RT, the class falls back as on the ring.
fn write(shared: &Shared, cmd: Command) -> Completion {
    let Command {
        op,
        offset,
        buf,
        class,
        ..
    } = cmd;
    let len = buf.len();
    let taken = TakenPriority::take(shared, class);
    let mut transferred = 0;
    let mut attempts = 0;
    let result = loop {
        attempts += 1;
        let rest = &buf.as_slice()[transferred..];
        let outcome =
            match rustix::io::pwrite(&shared.caller_file, rest, offset + transferred as u64) {
                Ok(n) => transfer_outcome(op, len, &mut transferred, n),
                Err(e) if e == rustix::io::Errno::INTR || e == rustix::io::Errno::AGAIN => {
                    Outcome::Again
                }
                Err(e) => Outcome::Done(Err(e.into())),
            };
        match outcome {
            Outcome::Again if attempts < ATTEMPTS_MAX => {}
            Outcome::Again => break Err(too_many_attempts()),
            Outcome::Done(r) => break r,
        }
    };
    drop(taken);
    let result = result.map_err(|source| DeviceError::Io {
        device: shared.info.name.clone(),
        op,
        offset,
        source,
    });
    Completion { result, buf }
}

/// The calling thread holding a request's I/O priority for a write
/// ([`write`]); its own back when this drops, also if the write panics.
/// Not where the thread's priority changed meanwhile (the context layer's
/// kernel mirror sets it from another thread, on a class change): that
/// newer setting stands.
struct TakenPriority {
    /// The thread's own, and the request's it took; None where it took
    /// none (it had the request's already, or per-request priorities are
    /// off).
    swap: Option<(u16, u16)>,
}

impl TakenPriority {
    fn take(shared: &Shared, class: crate::class::Class) -> Self {
        let mut ioprio = shared.state.lock().ioprio(class);
        let own = match ioprio {
            0 => None,
            _ => sys::ioprio_get(0).ok().filter(|&own| own != ioprio),
        };
        let Some(own) = own else {
            return Self { swap: None };
        };
        if let Err(e) = sys::ioprio_set(0, ioprio) {
            let refused = e.raw_os_error() == Some(libc::EPERM)
                && IoPriority::decode(ioprio).is_some_and(IoPriority::is_realtime);
            if refused {
                ioprio = shared.state.lock().fall_back(class).encode();
            }
            // Refused again, or for another reason: the write goes at the
            // thread's own priority rather than not at all.
            if sys::ioprio_set(0, ioprio).is_err() {
                return Self { swap: None };
            }
        }
        Self {
            swap: Some((own, ioprio)),
        }
    }
}

impl Drop for TakenPriority {
    fn drop(&mut self) {
        if let Some((own, taken)) = self.swap {
            if sys::ioprio_get(0).ok() == Some(taken) {
                let _ = sys::ioprio_set(0, own);
            }
        }
    }
}

/// Submits what is in `ring`'s SQ and waits for one CQE; its result.
fn wait_one(ring: &mut IoUring) -> io::Result<i32> {
    loop {
        if let Some(cqe) = ring.completion().next() {
            return Ok(cqe.result());
        }
        match ring.submit_and_wait(1) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                std::thread::yield_now();
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::Class;
    use crate::device::uring::{UringDevice, UringOptions};
    use crate::sys::{set_thread_ioprio, thread_ioprio};

    /// The priority a write in its caller's thread runs at: the request's,
    /// taken for the write, the thread's own given back after it; unless
    /// the thread's priority was changed meanwhile, which then stands.
    #[test]
    fn a_write_takes_its_requests_priority_and_gives_the_threads_back() {
        let path = std::env::temp_dir().join(format!("critio-here-prio-{}", std::process::id()));
        let options = UringOptions {
            create_size: Some(1 << 20),
            ..UringOptions::default()
        };
        let dev = match UringDevice::open(&path, options) {
            Ok(dev) => dev,
            Err(e) => {
                eprintln!("skipped: {e}");
                return;
            }
        };
        std::thread::spawn(move || {
            let own = IoPriority::BestEffort(5);
            set_thread_ioprio(0, own).unwrap();
            let background = dev.effective_priorities().non_critical;
            let taken = TakenPriority::take(&dev.shared, Class::NonCritical);
            assert_eq!(thread_ioprio(0).unwrap(), background, "for the write");
            drop(taken);
            assert_eq!(thread_ioprio(0).unwrap(), own, "given back");
            let taken = TakenPriority::take(&dev.shared, Class::NonCritical);
            set_thread_ioprio(0, IoPriority::BestEffort(3)).unwrap();
            drop(taken);
            assert_eq!(thread_ioprio(0).unwrap(), IoPriority::BestEffort(3));
        })
        .join()
        .unwrap();
        let _ = std::fs::remove_file(&path);
    }
}
