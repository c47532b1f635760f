//! Appending, committing and truncating: what the engine's threads call.
//!
//! | call              | blocks on                         | until                              |
//! |-------------------|-----------------------------------|------------------------------------|
//! | `append`          | "log: space wait" (rarely)        | pending bytes and the ring have room |
//! | `try_append`      | nothing                           | (`None` when `append` would wait)  |
//! | `wait_for_space`  | "log: space wait"                 | a record of that size would fit    |
//! | `commit(lsn)`     | "log: commit wait"                | `durable_lsn >= lsn`, or poisoned  |
//! | `truncate(upto)`  | "log: commit wait", then the header write and flush ("log: header" lock) | the new head is durable |
//!
//! A critical task blocked in any of them passes its criticality on: to the
//! writer (commit, space), to the registered space helpers (space), to the
//! truncating task (header lock).
//!
//! The log is full when the ring or the pending bytes are; only
//! [`Log::truncate`] makes room. A caller that appends while holding a lock
//! its checkpointer needs must not wait for space under that lock (the
//! checkpointer could never truncate): it uses `try_append`, and on `None`
//! releases the lock, calls `wait_for_space`, and retries.

use super::header::Header;
use super::record::{encoded_len, Draft};
use super::state::{Shared, State};
use super::writer::{self, By};
use super::{Log, LogError, Lsn};
use crate::sync::MutexGuard;

impl Log {
    /// Appends a record and returns its LSN; it becomes durable with a later
    /// batch ([`Log::commit`] waits for that). Fails at once if the payload
    /// exceeds `log.record_bytes_max`, and after the log is poisoned,
    /// refuses appends ([`Log::refuse_appends`]) or is closed. Waits on
    /// "log: space wait" while the pending bytes or the ring are full.
    pub fn append(&self, payload: &[u8]) -> Result<Lsn, LogError> {
        let lsn = self.append_inner(payload, true)?;
        Ok(lsn.expect("a waiting append always appends"))
    }

    /// [`Log::append`] without waiting: `Ok(None)` when the log is full
    /// right now (see the module docs for the retry pattern).
    pub fn try_append(&self, payload: &[u8]) -> Result<Option<Lsn>, LogError> {
        self.append_inner(payload, false)
    }

    /// Waits on "log: space wait" until a record with a `payload_len`-byte
    /// payload would fit (another appender may take the room first: retry).
    /// Fails like [`Log::append`] (too large, poisoned, refused, closed),
    /// a waiting one as soon as the log is poisoned, refuses or closes.
    pub fn wait_for_space(&self, payload_len: usize) -> Result<(), LogError> {
        let sh = &self.shared;
        let len = self.checked_len(payload_len)?;
        let mut st = sh.state.lock();
        loop {
            if let Some(e) = st.refusal() {
                return Err(e);
            }
            if st.room_for(encoded_len(len), &sh.limits) {
                return Ok(());
            }
            st = wait_space(sh, st);
        }
    }

    fn checked_len(&self, payload_len: usize) -> Result<u64, LogError> {
        let (len, max) = (payload_len as u64, self.shared.limits.record_max);
        match len > max {
            true => Err(LogError::RecordTooLarge { len, max }),
            false => Ok(len),
        }
    }

    fn append_inner(&self, payload: &[u8], wait: bool) -> Result<Option<Lsn>, LogError> {
        let sh = &self.shared;
        let len = self.checked_len(payload.len())?;
        let draft = Draft::new(sh.log_id, payload);
        debug_assert_eq!(draft.len(), encoded_len(len));
        let mut st = sh.state.lock();
        loop {
            if let Some(e) = st.refusal() {
                return Err(e);
            }
            if st.room_for(draft.len(), &sh.limits) {
                break;
            }
            if !wait {
                return Ok(None);
            }
            st = wait_space(sh, st);
        }
        let lsn = st.next_lsn;
        let record = draft.seal(lsn, sh.epoch);
        st.pending_bytes += record.len() as u64;
        st.pending.push_back(record);
        let critical = crate::context::current_class() == crate::class::Class::Critical;
        if critical {
            st.critical_lsn = lsn;
        }
        st.next_lsn += 1;
        // A foreground appender's commit writes the record itself.
        let wake = !(critical && sh.limits.committer_writes) && st.call_writer();
        st.check_invariants();
        drop(st);
        if wake {
            sh.work_cv.notify_one();
        }
        Ok(Some(lsn))
    }

    /// Waits until record `lsn` is durable (written and flushed). Fails if
    /// its batch's write or flush failed (or an earlier one did: the log is
    /// poisoned), or if the log closed before it was written.
    ///
    /// A foreground (critical) caller, with `log.committer_writes` on,
    /// writes the batch itself when no batch is in flight: every pending
    /// record up to its own (and after, up to `batch_bytes_max`), one write
    /// and one flush in its own thread. Otherwise it waits on "log: commit
    /// wait" for the batch in flight (whose writer inherits its
    /// criticality), or for the log writer's next batch.
    ///
    /// # Panics
    /// If `lsn` was never appended.
    pub fn commit(&self, lsn: Lsn) -> Result<(), LogError> {
        let sh = &self.shared;
        let lead = sh.limits.committer_writes
            && crate::context::current_class() == crate::class::Class::Critical;
        let mut st = sh.state.lock();
        assert!(
            lsn >= 1 && lsn < st.next_lsn,
            "commit of LSN {lsn}, which was never appended (next LSN {})",
            st.next_lsn
        );
        loop {
            if st.durable_lsn >= lsn {
                return Ok(());
            }
            if let Some(p) = &st.poison {
                return Err(p.error());
            }
            if st.writer_done {
                return Err(LogError::Closed);
            }
            if lsn >= st.placed_next() {
                // Not taken yet: this caller writes it, or the writer must.
                let free = st.inflight.is_none();
                if lead && free {
                    if let Some(batch) = writer::take_batch(sh, &mut st) {
                        drop(st);
                        // A panic from here to `done` fails the batch.
                        let unfinished = writer::Unfinished::new(sh, &batch);
                        sh.space_cv.notify_all(); // pending room freed
                                                  // Critical for the whole write and flush if a
                                                  // critical task appended to it, as the writer
                                                  // writes it: this caller may have led only by an
                                                  // inheritance that ends midway, while foreground
                                                  // commits wait for this batch.
                        let critical = batch.critical.then(crate::context::foreground);
                        let result = writer::write_batch(sh, &batch);
                        drop(critical);
                        writer::finish(sh, &batch, result, By::Committer);
                        unfinished.done();
                        st = sh.state.lock();
                        continue;
                    }
                    // The ring is full: the writer waits for room, and
                    // inherits from this wait while it does.
                }
                if (!lead || free) && st.call_writer() {
                    sh.work_cv.notify_one();
                }
            }
            // The batch to wait for: the one in flight if the record is in
            // it, or if this caller will write the next one itself once it
            // completes; else the next one (the writer's).
            let batch = match st.inflight {
                Some((_, last)) if lsn <= last || lead => st.batches_taken - 1,
                _ => st.batches_taken,
            };
            st = sh.commit_queue(batch).wait(st);
        }
    }

    /// Appends a record and waits until it is durable.
    pub fn append_commit(&self, payload: &[u8]) -> Result<Lsn, LogError> {
        let lsn = self.append(payload)?;
        self.commit(lsn)?;
        Ok(lsn)
    }

    /// Drops the records up to `upto` (a checkpoint made them obsolete): it
    /// waits until they are durable (as [`Log::commit`]), then the head
    /// moves to the first record after `upto`, the header is written and
    /// flushed in the caller's class, and then the space is reused. Records
    /// before `upto + 1` that share the head's batch are kept on disk
    /// (space is freed by whole batches) but no longer recovered. A no-op if
    /// the head is already past `upto`.
    ///
    /// While some of them are not durable yet, the durable ones are
    /// dropped, then the next batch is waited for, and again: the rest may
    /// be waiting for the very ring space the durable ones hold (the ring
    /// full, and only this truncation able to free it), and records let in
    /// by their size may need more than the whole ring once batched and
    /// padded, so one drop before waiting for all of them is not enough.
    ///
    /// # Panics
    /// If `upto` was never appended.
    pub fn truncate(&self, upto: Lsn) -> Result<(), LogError> {
        loop {
            let durable = self.shared.state.lock().durable_lsn;
            if durable >= upto {
                break;
            }
            self.truncate_durable(durable)?;
            self.commit(durable + 1)?;
        }
        self.truncate_durable(upto)
    }

    /// [`Log::truncate`] of records already durable (a no-op for 0).
    fn truncate_durable(&self, upto: Lsn) -> Result<(), LogError> {
        let sh = &self.shared;
        if upto == 0 {
            return Ok(());
        }
        let mut hs = sh.header.lock();
        let target = upto + 1;
        let (v, pos_lsn) = {
            let st = sh.state.lock();
            if let Some(p) = &st.poison {
                return Err(p.error());
            }
            assert!(upto <= st.durable_lsn, "durable before truncated");
            if target <= st.ring.head_lsn() {
                return Ok(());
            }
            st.ring.head_for(target, st.placed_next())
        };
        let next = Header {
            seq: hs.header.seq + 1,
            head_pos: sh.geo.phys(v),
            head_pos_lsn: pos_lsn,
            head_lsn: target,
            ..hs.header
        };
        sh.write_header(&mut hs, next)?;
        {
            let mut st = sh.state.lock();
            st.ring.set_head(v, pos_lsn, target);
            assert_eq!(st.ring.head_pos(), (next.head_pos, next.head_pos_lsn));
            st.stats.truncations += 1;
            st.check_invariants();
        }
        drop(hs);
        sh.space_cv.notify_all();
        Ok(())
    }
}

/// Waits on "log: space wait". Records pending then go to the writer
/// first: whoever waits for space will not commit them meanwhile, and a
/// truncation may be waiting for them to be durable.
fn wait_space<'a>(sh: &'a Shared, mut st: MutexGuard<'a, State>) -> MutexGuard<'a, State> {
    if !st.pending.is_empty() && st.call_writer() {
        sh.work_cv.notify_one(); // it takes the state lock only after this wait releases it
    }
    sh.space_cv.wait(st)
}
