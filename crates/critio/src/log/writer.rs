//! The log writer: one thread that turns pending records into durable
//! batches (group commit), and the batch-taking, writing and
//! acknowledging that a foreground committer also does itself when
//! `log.committer_writes` is on ([`Log::commit`](super::Log::commit)).
//!
//! ```text
//!  loop:
//!    lock state ── nothing pending that waits for the writer, ──> wait "log: writer idle"
//!        │         or a committer's batch in flight                (exit if closing)
//!        │ take records from the front, up to batch_bytes_max
//!        │ place the batch in the ring ── no room ──> wait "log: space wait"
//!        │                                            (give up if closing)
//!    unlock; write the batch, flush        <- synchronous, in the writer's class:
//!        │                                    critical if a critical task appended
//!        │                                    one of its records (or a later one),
//!        │                                    or while it inherits from a
//!        │                                    critical committer
//!    lock state: durable_lsn = last, or poison; notify "log: commit wait"
//! ```
//!
//! The writer is the explicit helper of "log: commit wait" (registered by
//! `open`): whenever a critical task waits there, the writer inherits, and
//! the chain walk carries that to the I/O it is blocked on.
//!
//! A batch holding a record a critical task appended is written critical
//! from the start, without waiting for that task to reach its commit
//! wait: when the writer takes such a batch first (a background record
//! woke it, or `committer_writes` is off), its write would otherwise enter
//! the block layer as background, behind the background queue and on the
//! shared ring, until the commit wait promotes it.
//!
//! With `committer_writes` the writer takes only what waits for it
//! (`State::writer_needed`): records a foreground task appended are left
//! to that task's commit, which takes them as a batch of its own with
//! every record before them, so one round of a server's appends costs one
//! write and one flush, done by the thread that waits for them, with no
//! wake-up of the writer and back on the request's path. Only one batch is
//! in flight at a time, whoever wrote it: batches complete in LSN order.

use std::sync::Arc;

use super::state::{Poison, Shared, State};
use super::Lsn;
use crate::block::BlockError;
use crate::device::{AlignedBuf, DeviceError, Op};

/// A batch taken from the pending records and placed in the ring.
pub(crate) struct Batch {
    /// Its number (which commit queue waits for it).
    seq: u64,
    /// A critical task appended one of its records, or a later one.
    pub(crate) critical: bool,
    first: Lsn,
    last: Lsn,
    start_v: u64,
    records: Vec<Vec<u8>>,
    padded: u64,
}

/// Who wrote a batch.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum By {
    /// The log writer thread.
    Writer,
    /// A foreground committer, in its own thread (`log.committer_writes`).
    Committer,
}

/// The writer thread's body.
pub(crate) fn run(sh: Arc<Shared>) {
    let _exit = Exit(&sh);
    while let Some(batch) = next_batch(&sh) {
        let critical = batch.critical.then(crate::context::foreground);
        let result = write_batch(&sh, &batch);
        drop(critical);
        finish(&sh, &batch, result, By::Writer);
    }
}

/// Marks the writer gone when it exits, even by a panic (a bug): commits
/// that it will never make durable fail instead of waiting forever, and
/// appends are refused.
struct Exit<'a>(&'a Shared);

impl Drop for Exit<'_> {
    fn drop(&mut self) {
        {
            let mut st = self.0.state.lock();
            st.writer_done = true;
            st.closing = true;
        }
        self.0.wake_all_committers();
        self.0.space_cv.notify_all();
    }
}

/// Fails a committer's batch if the committer unwinds before it has
/// finished it (a panic in the device or the block layer: a bug). The
/// batch would otherwise stay in flight for good, and every later commit,
/// and the writer, would wait for it forever (the writer thread has its
/// own guard, [`Exit`]). What reached the device is unknown, as after a
/// failed write, so the log is poisoned; the panic goes on in the
/// committer's thread.
pub(crate) struct Unfinished<'a> {
    sh: &'a Shared,
    batch: &'a Batch,
}

impl<'a> Unfinished<'a> {
    /// Guards `batch`, just taken by a committer.
    pub(crate) fn new(sh: &'a Shared, batch: &'a Batch) -> Self {
        Self { sh, batch }
    }

    /// The batch was finished ([`finish`]): nothing left to do.
    pub(crate) fn done(self) {
        std::mem::forget(self);
    }
}

impl Drop for Unfinished<'_> {
    fn drop(&mut self) {
        let (sh, b) = (self.sh, self.batch);
        let offset = sh.geo.device_offset(b.start_v);
        let cause = DeviceError::Io {
            device: sh.block.device().info().name.clone(),
            op: Op::Write,
            offset,
            source: std::io::Error::other(
                "the committing thread panicked during the batch's write",
            ),
        };
        let poison = Poison {
            failed: format!(
                "write of records {}..={} ({} bytes at offset {offset}) by a committer that panicked",
                b.first, b.last, b.padded
            ),
            first_unacked: b.first,
            cause: cause.into(),
        };
        sh.poison_and(poison, |st| {
            if st.inflight == Some((b.first, b.last)) {
                st.inflight = None;
            }
        });
    }
}

/// Waits for records the writer should take, and room, then takes a batch.
/// `None` when the writer should exit: closing with nothing (writable)
/// pending and no committer's batch in flight, or poisoned.
fn next_batch(sh: &Shared) -> Option<Batch> {
    let mut st = sh.state.lock();
    loop {
        if st.poison.is_some() {
            return None;
        }
        let mine = !st.pending.is_empty() && (st.writer_needed || st.closing);
        if !mine || st.inflight.is_some() {
            // Nothing for the writer, or a committer's batch is in flight
            // (its finish wakes the writer if records wait for it).
            if st.closing && st.pending.is_empty() && st.inflight.is_none() {
                return None;
            }
            st.writer_idle = true;
            st = sh.work_cv.wait(st);
            continue;
        }
        if let Some(batch) = take_batch(sh, &mut st) {
            drop(st);
            sh.space_cv.notify_all(); // pending room freed
            return Some(batch);
        }
        if st.closing {
            return None; // the ring is full and nobody will truncate now
        }
        st = sh.space_cv.wait(st);
    }
}

/// Under the state lock, with records pending and no batch in flight:
/// takes the records from the front (up to `batch_bytes_max`) as the next
/// batch and places it in the ring. `None` if the ring has no room for it
/// (only [`Log::truncate`](super::Log::truncate) makes room).
pub(crate) fn take_batch(sh: &Shared, st: &mut State) -> Option<Batch> {
    debug_assert!(!st.pending.is_empty() && st.inflight.is_none());
    let block = sh.geo.block;
    let (count, bytes) = batch_extent(
        st.pending.iter().map(|r| r.len() as u64),
        sh.limits.batch_max,
    );
    let padded = bytes.div_ceil(block) * block;
    let start_v = st.ring.place(padded)?;
    let first = st.placed_next();
    let records: Vec<Vec<u8>> = st.pending.drain(..count).collect();
    st.pending_bytes -= bytes;
    if st.pending.is_empty() {
        st.writer_needed = false;
    }
    st.ring.push(first, start_v, padded);
    let last = first + count as u64 - 1;
    let critical = st.critical_lsn >= first;
    st.inflight = Some((first, last));
    let seq = st.batches_taken;
    st.batches_taken += 1;
    st.check_invariants();
    Some(Batch {
        seq,
        critical,
        first,
        last,
        start_v,
        records,
        padded,
    })
}

/// How many records from the front form a batch of at most `max` bytes
/// (at least one), and their bytes.
fn batch_extent(sizes: impl Iterator<Item = u64>, max: u64) -> (usize, u64) {
    let (mut count, mut bytes) = (0, 0);
    for size in sizes {
        assert!(size <= max, "a record larger than a batch was appended");
        if bytes + size > max {
            break;
        }
        count += 1;
        bytes += size;
    }
    assert!(count > 0);
    (count, bytes)
}

/// Writes and flushes a batch, in the writer's current class. On failure,
/// says which operation failed.
pub(crate) fn write_batch(sh: &Shared, b: &Batch) -> Result<(), Poison> {
    let mut buf = AlignedBuf::with_capacity(b.padded as usize);
    for r in &b.records {
        buf.extend_from_slice(r);
    }
    buf.extend_zeros(b.padded as usize - buf.len());
    let offset = sh.geo.device_offset(b.start_v);
    let fail = |op: &str, cause: BlockError| Poison {
        failed: format!(
            "{op} of records {}..={} ({} bytes at offset {offset})",
            b.first, b.last, b.padded
        ),
        first_unacked: b.first,
        cause,
    };
    sh.block.write(offset, buf).map_err(|e| fail("write", e))?;
    sh.block
        .flush()
        .map_err(|e| fail("flush after the write", e))
}

/// Acknowledges the batch, or poisons the log; wakes the committers, and
/// after a committer's batch, the writer if records wait for it.
pub(crate) fn finish(sh: &Shared, b: &Batch, result: Result<(), Poison>, by: By) {
    match result {
        Ok(()) => {
            let mut st = sh.state.lock();
            assert_eq!(st.inflight, Some((b.first, b.last)));
            st.inflight = None;
            // A header failure may have poisoned the log meanwhile: then
            // nothing more is acknowledged.
            if st.poison.is_none() {
                assert_eq!(st.durable_lsn + 1, b.first, "batches complete in order");
                st.durable_lsn = b.last;
                st.stats.batches += 1;
                st.stats.records += b.last - b.first + 1;
                st.stats.bytes_written += b.padded;
                if by == By::Committer {
                    st.stats.committer_batches += 1;
                }
            }
            st.check_invariants();
            // The writer may be waiting for this batch: to take records
            // that wait for it, or to exit once closing.
            let wake_writer = by == By::Committer
                && (st.closing || (st.writer_needed && !st.pending.is_empty()))
                && std::mem::take(&mut st.writer_idle);
            drop(st);
            if wake_writer {
                sh.work_cv.notify_one();
            }
            // Only this batch's committers: see `Shared::commit_queue`.
            sh.commit_queue(b.seq).notify_all();
        }
        Err(poison) => {
            // Wakes the writer too.
            sh.poison_and(poison, |st| st.inflight = None);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_takes_whole_records_up_to_the_limit() {
        assert_eq!(batch_extent([8, 8, 8].into_iter(), 20), (2, 16));
        assert_eq!(batch_extent([20, 8].into_iter(), 20), (1, 20));
        assert_eq!(batch_extent([8].into_iter(), 4096), (1, 8));
    }
}
