//! The state the appenders, committers, the writer and truncation share,
//! and the poison that a failed write or flush leaves in it.
//!
//! ```text
//!  LSNs:  head_lsn ... durable_lsn | in flight (placed) | pending (not placed) | next_lsn
//!         <---- in the ring ------------------------->   <-- in memory -->
//! ```

use std::collections::VecDeque;
use std::sync::Arc;

use super::header::Header;
use super::ring::{Geometry, Ring};
use super::{LogError, LogStats, Lsn};
use crate::block::{BlockError, BlockLayer};
use crate::sync::{Condvar, Mutex};

/// The bounds the log enforces (from the config, checked against the block
/// size by `open`).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The largest payload.
    pub(crate) record_max: u64,
    /// The largest batch, in bytes of whole blocks.
    pub(crate) batch_max: u64,
    /// The most encoded bytes waiting for the writer.
    pub(crate) pending_max: u64,
    /// A foreground committer writes its batch itself
    /// (`log.committer_writes`).
    pub(crate) committer_writes: bool,
}

/// Why the log stopped accepting records.
#[derive(Clone, Debug)]
pub(crate) struct Poison {
    pub(crate) failed: String,
    pub(crate) first_unacked: Lsn,
    pub(crate) cause: BlockError,
}

impl Poison {
    pub(crate) fn error(&self) -> LogError {
        LogError::Poisoned {
            failed: self.failed.clone(),
            first_unacked: self.first_unacked,
            cause: self.cause.clone(),
        }
    }
}

/// Everything under the "log: state" lock.
pub(crate) struct State {
    /// The LSN the next append gets.
    pub(crate) next_lsn: Lsn,
    /// Every record up to this one is written and flushed.
    pub(crate) durable_lsn: Lsn,
    /// Sealed records not yet taken by the writer: LSNs
    /// `next_lsn - pending.len() .. next_lsn`.
    pub(crate) pending: VecDeque<Vec<u8>>,
    pub(crate) pending_bytes: u64,
    /// The batch being written: (first, last) LSN.
    pub(crate) inflight: Option<(Lsn, Lsn)>,
    /// Batches the writer has taken so far; the one in flight is number
    /// `batches_taken - 1`, the next one `batches_taken`.
    pub(crate) batches_taken: u64,
    pub(crate) ring: Ring,
    pub(crate) poison: Option<Poison>,
    /// Set by close: no more appends; the writer drains and exits.
    pub(crate) closing: bool,
    /// Set by [`Log::refuse_appends`](super::Log::refuse_appends): no more
    /// appends, and why; the writer goes on making the appended ones durable.
    pub(crate) refused: Option<String>,
    /// The writer exited: commits of records not durable by now fail.
    pub(crate) writer_done: bool,
    /// The writer waits for work (appenders wake it).
    pub(crate) writer_idle: bool,
    /// Some pending record waits for the writer: one appended by a task
    /// that will not write it itself (not foreground, or
    /// `committer_writes` off), one committed by a task that does not
    /// write batches itself, one whose committer could not (the ring
    /// full), or any, once someone waits for log space. Records only
    /// foreground tasks appended are left to their commits: the writer
    /// does not take them while this is false.
    pub(crate) writer_needed: bool,
    /// The last record a critical task appended (0: none yet). A batch
    /// from `first` on is written critical if this is at least `first`:
    /// that task is about to wait for it, or for a later record that
    /// cannot be durable before it.
    pub(crate) critical_lsn: Lsn,
    pub(crate) stats: LogStats,
}

impl State {
    /// The first LSN not yet placed in the ring.
    pub(crate) fn placed_next(&self) -> Lsn {
        self.next_lsn - self.pending.len() as u64
    }

    /// The error an append gets now, if any.
    pub(crate) fn refusal(&self) -> Option<LogError> {
        match (&self.poison, &self.refused, self.closing) {
            (Some(p), _, _) => Some(p.error()),
            (None, Some(why), _) => Some(LogError::Refused { why: why.clone() }),
            (None, None, true) => Some(LogError::Closed),
            (None, None, false) => None,
        }
    }

    /// Whether a record of `len` encoded bytes may be appended now: it fits
    /// the pending bound, and the ring (not counting batch padding, which
    /// the writer checks exactly when it places the batch).
    pub(crate) fn room_for(&self, len: u64, limits: &Limits) -> bool {
        let pending = self.pending_bytes + len;
        pending <= limits.pending_max && self.ring.used() + pending <= self.ring.capacity()
    }

    /// Marks the pending records as waiting for the writer; true if the
    /// writer is idle and must be woken (after the lock is released).
    pub(crate) fn call_writer(&mut self) -> bool {
        self.writer_needed = true;
        std::mem::take(&mut self.writer_idle)
    }

    /// Counts and LSN order agree.
    pub(crate) fn check_invariants(&self) {
        assert!(self.durable_lsn < self.next_lsn);
        assert!(self.durable_lsn + 1 >= self.ring.head_lsn());
        assert!(self.placed_next() > self.durable_lsn);
        if let Some((first, last)) = self.inflight {
            assert_eq!(first, self.durable_lsn + 1);
            assert_eq!(last + 1, self.placed_next());
        }
        #[cfg(debug_assertions)]
        {
            let sum: u64 = self.pending.iter().map(|r| r.len() as u64).sum();
            assert_eq!(sum, self.pending_bytes);
        }
    }
}

/// The header block as on disk and the header in it; under the "log:
/// header" lock, held across the header's write and flush.
pub(crate) struct HeaderState {
    pub(crate) header: Header,
    pub(crate) image: Vec<u8>,
}

/// What the `Log` handle and the writer thread share.
pub(crate) struct Shared {
    pub(crate) block: Arc<BlockLayer>,
    pub(crate) geo: Geometry,
    pub(crate) limits: Limits,
    pub(crate) log_id: u64,
    pub(crate) epoch: u64,
    pub(crate) state: Mutex<State>,
    /// "log: commit wait": committers wait on the queue of the batch their
    /// record is (or will be) in, by batch number parity; the writer is the
    /// helper of both. See [`Shared::commit_queue`].
    pub(crate) commit_cv: [Condvar; 2],
    /// "log: space wait": appenders (and the writer) wait for room.
    pub(crate) space_cv: Condvar,
    /// "log: writer idle": the writer waits for records (no inheritance; a
    /// wait for work, recorded as non-critical even while the writer is
    /// still boosted from its last batch).
    pub(crate) work_cv: Condvar,
    pub(crate) header: Mutex<HeaderState>,
}

impl Shared {
    /// The commit queue of batch number `batch`.
    ///
    /// Why two: a completion wakes only the committers of the batch that
    /// completed. With one queue it would wake (dequeue) a critical
    /// committer whose record is in the *next* batch too, revoking the
    /// writer's inheritance until that committer waits again, and in that
    /// window the writer would submit the next batch's write as
    /// non-critical: exactly the inversion the helper is there to prevent.
    /// (A record that overflows into a later batch than expected is woken
    /// once early and waits again on the right queue.)
    pub(crate) fn commit_queue(&self, batch: u64) -> &Condvar {
        &self.commit_cv[(batch % 2) as usize]
    }

    /// Wakes every committer (poison, writer exit).
    pub(crate) fn wake_all_committers(&self) {
        for cv in &self.commit_cv {
            cv.notify_all();
        }
    }

    /// Writes `next` into the header block and makes it durable (write +
    /// flush), in the caller's class. On failure the log is poisoned.
    pub(crate) fn write_header(&self, hs: &mut HeaderState, next: Header) -> Result<(), LogError> {
        assert_eq!(next.seq, hs.header.seq + 1, "header updates are sequential");
        let mut image = hs.image.clone();
        next.write_into(&mut image);
        let buf = crate::device::AlignedBuf::from_slice(&image);
        let offset = self.geo.region_offset;
        let result = self
            .block
            .write(offset, buf)
            .map_err(|e| ("write", e))
            .and_then(|()| self.block.flush().map_err(|e| ("flush", e)));
        match result {
            Ok(()) => {
                hs.header = next;
                hs.image = image;
                Ok(())
            }
            Err((op, cause)) => {
                let poison = Poison {
                    failed: format!("header {op} at offset {offset}"),
                    first_unacked: self.state.lock().durable_lsn + 1,
                    cause,
                };
                let err = poison.error();
                self.poison(poison);
                Err(err)
            }
        }
    }

    /// Poisons the log (the first cause wins) and wakes every waiter.
    pub(crate) fn poison(&self, poison: Poison) {
        self.poison_and(poison, |_| {});
    }

    /// [`Shared::poison`], doing `also` to the state in the same critical
    /// section (a failed batch leaves the in-flight slot there: no one may
    /// see it free and the log not yet poisoned, and take a batch past the
    /// failed one).
    pub(crate) fn poison_and(&self, poison: Poison, also: impl FnOnce(&mut State)) {
        {
            let mut st = self.state.lock();
            also(&mut st);
            if st.poison.is_none() {
                st.poison = Some(poison);
            }
        }
        self.wake_all_committers();
        self.space_cv.notify_all();
        self.work_cv.notify_all();
    }
}
