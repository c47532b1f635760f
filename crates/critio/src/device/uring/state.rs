//! Everything behind the ring's lock: the ring, the file, the in-flight
//! table, and the queues of work that did not fit yet.
//!
//! ```text
//!  submit ──> admit ──table full?──> waiting (FIFO, bounded) ──┐ slot freed
//!               │ slot                                          │
//!               v                                               │
//!             push SQE ──SQ full?──> unpushed (retried) ──┐     │
//!               │                                         │     │
//!               v                                         v     │
//!             io_uring_enter  <───────────── reaper: reap, retry, admit
//! ```
//!
//! A CQE ends its command unless it asks for another SQE on the same slot:
//! a short transfer (the rest is resubmitted, up to [`ATTEMPTS_MAX`] SQEs),
//! EAGAIN/EINTR, or EPERM for a real-time `ioprio` (the class falls back to
//! [`IoPriority::fallback`] for this and every later request).

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

use io_uring::{opcode, squeue, types, IoUring};

use super::table::{Slot, Table};
use crate::class::Class;
use crate::device::{Command, Completer, Completion, DeviceError, DeviceInfo, Op};
use crate::sys::{ClassPriorities, IoPriority};

/// SQEs one command may take (short transfers and retries) before it fails.
pub(super) const ATTEMPTS_MAX: u32 = 16;
/// Commands that may wait for a slot, per ring entry. The block layer never
/// dispatches more than `queue_depth`; more than this many extra is a bug.
pub(super) const WAITING_PER_ENTRY: usize = 64;

/// A finished command, its completer called outside the lock.
pub(super) type Finished = (Completer, Completion);

/// The ring and its bookkeeping; lives in a mutex.
pub(super) struct State {
    ring: IoUring,
    table: Table,
    /// Slots whose SQE did not fit in the SQ yet.
    unpushed: VecDeque<u32>,
    /// Commands that arrived while every slot was taken.
    waiting: VecDeque<(Command, Completer)>,
    waiting_max: usize,
    /// Priorities in use (after any fallback); `None` sends 0.
    priorities: Option<ClassPriorities>,
    /// Set by `Drop`: the reaper exits once nothing is in flight.
    pub closing: bool,
    // Declared last: dropped after the ring, so never closed under an I/O.
    file: File,
}

impl State {
    /// Bookkeeping for `ring` over `file`, one slot per SQ entry (so
    /// in-flight commands never exceed the SQ, nor the CQ, twice its size).
    pub fn new(ring: IoUring, file: File, priorities: Option<ClassPriorities>) -> Self {
        let entries = ring.params().sq_entries();
        assert!(ring.params().cq_entries() >= entries);
        Self {
            table: Table::new(entries),
            unpushed: VecDeque::with_capacity(entries as usize),
            waiting: VecDeque::new(),
            waiting_max: entries as usize * WAITING_PER_ENTRY,
            priorities,
            closing: false,
            ring,
            file,
        }
    }

    /// The priorities in use; `None` when per-request ioprio is off.
    pub fn priorities(&self) -> Option<ClassPriorities> {
        self.priorities
    }

    /// Whether nothing is in flight or waiting.
    pub fn is_idle(&self) -> bool {
        self.table.is_empty() && self.waiting.is_empty()
    }

    /// Whether SQEs wait to be pushed or entered (the reaper retries them).
    pub fn needs_retry(&mut self) -> bool {
        !self.unpushed.is_empty() || !self.ring.submission().is_empty()
    }

    /// Starts a valid command, or queues it until a slot is free.
    pub fn admit(&mut self, cmd: Command, done: Completer) {
        if self.table.is_full() {
            assert!(
                self.waiting.len() < self.waiting_max,
                "more than {} commands submitted beyond the queue depth",
                self.waiting_max
            );
            self.waiting.push_back((cmd, done));
            return;
        }
        let ioprio = self.ioprio(cmd.class);
        let id = self.table.insert(Slot {
            op: cmd.op,
            offset: cmd.offset,
            buf: cmd.buf,
            class: cmd.class,
            done,
            transferred: 0,
            ioprio,
            attempts: 0,
        });
        self.push(id);
    }

    /// The `ioprio` a request of `class` is sent with now.
    pub(super) fn ioprio(&self, class: Class) -> u16 {
        self.priorities.map_or(0, |p| p.of(class).encode())
    }

    /// The SQE for the next (or only) part of slot `id`.
    fn entry(&mut self, id: u32) -> squeue::Entry {
        let fd = types::Fd(self.file.as_raw_fd());
        let slot = self.table.get_mut(id);
        let (done, ioprio) = (slot.transferred, slot.ioprio);
        let offset = slot.offset + done as u64;
        let rest = &mut slot.buf.as_mut_slice()[done..];
        sqe(slot.op, fd, rest, offset, ioprio).user_data(u64::from(id))
    }

    /// Pushes slot `id`'s SQE, or queues it behind earlier unpushed ones.
    fn push(&mut self, id: u32) {
        self.table.get_mut(id).attempts += 1;
        self.unpushed.push_back(id);
        self.flush();
    }

    /// Moves unpushed SQEs into the SQ and enters the kernel.
    pub fn flush(&mut self) {
        while let Some(&id) = self.unpushed.front() {
            let entry = self.entry(id);
            // SAFETY: the SQE reads from or writes into slot `id`'s buffer,
            // bytes [transferred, len) of its heap allocation, and names
            // `self.file`'s descriptor. The slot owns the buffer until the
            // reaper takes the final CQE for `user_data == id`
            // (`Table::remove`); meanwhile nothing else reads, writes,
            // resizes or frees it (the table leaks it if dropped early), and
            // moving the `AlignedBuf` struct never moves its heap data. The
            // file is dropped only after the ring, and the ring only after
            // `Drop` has waited for the table to empty.
            let pushed = unsafe { self.ring.submission().push(&entry) };
            if pushed.is_err() {
                // SQ full: hand what is there to the kernel, then retry.
                if !self.enter() {
                    return;
                }
                continue;
            }
            self.unpushed.pop_front();
        }
        self.enter();
    }

    /// Submits the SQ; `false` if the kernel is busy (the reaper retries).
    fn enter(&mut self) -> bool {
        for _ in 0..=self.table.len() {
            if self.ring.submission().is_empty() {
                return true;
            }
            match self.ring.submit() {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EAGAIN | libc::EBUSY)) => {
                    return false;
                }
                Err(e) => panic!("io_uring_enter failed: {e}; the ring is unusable"),
            }
        }
        self.ring.submission().is_empty()
    }

    /// Takes every CQE; each finished command goes to `out`. Then starts
    /// commands that waited for a slot and retries unpushed SQEs.
    pub fn reap(&mut self, info: &DeviceInfo, out: &mut Vec<Finished>) {
        let cqes: Vec<(u64, i32)> = self
            .ring
            .completion()
            .map(|c| (c.user_data(), c.result()))
            .collect();
        for (user_data, result) in cqes {
            let id = u32::try_from(user_data).expect("user_data is a slot id");
            if let Some(finished) = self.complete(info, id, result) {
                out.push(finished);
            }
        }
        while !self.table.is_full() {
            let Some((cmd, done)) = self.waiting.pop_front() else {
                break;
            };
            self.admit(cmd, done);
        }
        self.flush();
    }

    /// Handles slot `id`'s CQE: the command finishes, or goes round again.
    fn complete(&mut self, info: &DeviceInfo, id: u32, result: i32) -> Option<Finished> {
        let outcome = if result < 0 {
            self.on_error(id, -result)
        } else {
            on_transfer(self.table.get_mut(id), result as usize)
        };
        match outcome {
            Outcome::Again if self.table.get(id).attempts < ATTEMPTS_MAX => {
                self.push(id);
                None
            }
            Outcome::Again => Some(self.finish(info, id, Err(too_many_attempts()))),
            Outcome::Done(r) => Some(self.finish(info, id, r)),
        }
    }

    /// A negative CQE result: retry (EAGAIN, EINTR, refused RT) or fail.
    fn on_error(&mut self, id: u32, errno: i32) -> Outcome {
        let slot = self.table.get(id);
        let sent = IoPriority::decode(slot.ioprio);
        match errno {
            libc::EAGAIN | libc::EINTR => Outcome::Again,
            libc::EPERM if sent.is_some_and(IoPriority::is_realtime) => {
                let class = slot.class;
                let fallback = self.fall_back(class);
                self.table.get_mut(id).ioprio = fallback.encode();
                Outcome::Again
            }
            _ => Outcome::Done(Err(io::Error::from_raw_os_error(errno))),
        }
    }

    /// RT was refused for `class`: use the fallback from now on.
    pub(super) fn fall_back(&mut self, class: Class) -> IoPriority {
        let p = self
            .priorities
            .as_mut()
            .expect("an RT ioprio was sent, so per-request ioprio is on");
        let slot = match class {
            Class::Critical => &mut p.critical,
            Class::NonCritical => &mut p.non_critical,
        };
        *slot = slot.fallback();
        *slot
    }

    fn finish(&mut self, info: &DeviceInfo, id: u32, r: io::Result<()>) -> Finished {
        let slot = self.table.remove(id);
        let result = r.map_err(|source| DeviceError::Io {
            device: info.name.clone(),
            op: slot.op,
            offset: slot.offset,
            source,
        });
        (
            slot.done,
            Completion {
                result,
                buf: slot.buf,
            },
        )
    }
}

/// The SQE of `op` on `fd` for the bytes of `rest` at `offset`, with
/// `ioprio` (a flush takes neither bytes nor priority). Pushing it is the
/// caller's `unsafe`: the kernel uses `rest` until the SQE's CQE.
pub(super) fn sqe(
    op: Op,
    fd: types::Fd,
    rest: &mut [u8],
    offset: u64,
    ioprio: u16,
) -> squeue::Entry {
    let len = u32::try_from(rest.len()).expect("a transfer fits in 4 GiB");
    match op {
        Op::Read => opcode::Read::new(fd, rest.as_mut_ptr(), len)
            .offset(offset)
            .ioprio(ioprio)
            .build(),
        Op::Write => opcode::Write::new(fd, rest.as_ptr(), len)
            .offset(offset)
            .ioprio(ioprio)
            .build(),
        Op::Flush => opcode::Fsync::new(fd)
            .flags(types::FsyncFlags::DATASYNC)
            .build(),
    }
}

/// What a CQE means for its command.
pub(super) enum Outcome {
    /// Issue another SQE for the same slot.
    Again,
    /// The command is over.
    Done(io::Result<()>),
}

/// A non-negative CQE result: `n` more bytes (a flush returns 0).
fn on_transfer(slot: &mut Slot, n: usize) -> Outcome {
    transfer_outcome(slot.op, slot.buf.len(), &mut slot.transferred, n)
}

/// A command of `op` over `len` bytes, `transferred` of them done so far,
/// moved `n` more (a flush returns 0).
pub(super) fn transfer_outcome(op: Op, len: usize, transferred: &mut usize, n: usize) -> Outcome {
    if op == Op::Flush {
        return Outcome::Done(Ok(()));
    }
    *transferred += n;
    assert!(*transferred <= len, "the kernel moved more than asked");
    if *transferred == len {
        return Outcome::Done(Ok(()));
    }
    if n > 0 {
        return Outcome::Again;
    }
    let (kind, what) = match op {
        Op::Read => (io::ErrorKind::UnexpectedEof, "read hit the end of the file"),
        _ => (io::ErrorKind::WriteZero, "write made no progress"),
    };
    Outcome::Done(Err(io::Error::new(
        kind,
        format!(
            "{what} after {} of {len} bytes; was the file truncated below the device's capacity?",
            *transferred
        ),
    )))
}

pub(super) fn too_many_attempts() -> io::Error {
    io::Error::other(format!(
        "still incomplete after {ATTEMPTS_MAX} attempts (short transfers or EAGAIN); \
         check the device"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::device::AlignedBuf;

    fn slot(op: Op, len: usize) -> Slot {
        Slot {
            op,
            offset: 0,
            buf: AlignedBuf::zeroed(len),
            class: Class::Critical,
            done: Box::new(|_| {}),
            transferred: 0,
            ioprio: 0,
            attempts: 1,
        }
    }

    #[test]
    fn a_short_transfer_goes_round_again_for_the_rest() {
        let mut s = slot(Op::Read, 8192);
        assert!(matches!(on_transfer(&mut s, 4096), Outcome::Again));
        assert_eq!(s.transferred, 4096);
        assert!(matches!(on_transfer(&mut s, 4096), Outcome::Done(Ok(()))));
    }

    #[test]
    fn no_progress_is_an_error_that_says_why() {
        let mut s = slot(Op::Read, 8192);
        assert!(matches!(on_transfer(&mut s, 4096), Outcome::Again));
        let Outcome::Done(Err(e)) = on_transfer(&mut s, 0) else {
            panic!("a read returning 0 must fail");
        };
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("after 4096 of 8192 bytes"), "{e}");
        let mut w = slot(Op::Write, 4096);
        let Outcome::Done(Err(e)) = on_transfer(&mut w, 0) else {
            panic!("a write of 0 bytes must fail");
        };
        assert_eq!(e.kind(), io::ErrorKind::WriteZero);
    }

    #[test]
    fn a_flush_is_done_at_its_first_cqe() {
        let mut f = slot(Op::Flush, 0);
        assert!(matches!(on_transfer(&mut f, 0), Outcome::Done(Ok(()))));
    }
}
