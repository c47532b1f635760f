//! Writeback: writing copies of dirty pages, in runs of contiguous pages.
//!
//! The writeback thread writes the oldest dirty pages asynchronously (so
//! non-critical, whatever its own class) when a class nears its dirty
//! limit, a writer is throttled, or a page has been dirty for
//! `dirty_expire_ms`. Flushes and direct reclaim use the same runs, written
//! synchronously in the caller's class.
//!
//! ```text
//!  oldest dirty pages ──sort by page──> runs of <= writeback_batch_pages
//!     each run: one PendingIo (helper: the submitter), pages -> Writeback
//!     submit (may wait for an admission slot) -> wait -> pages Clean (or
//!     Dirty again if written meanwhile, or on error)
//! ```

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::sync::MutexGuard;

use super::core::PageKey;
use super::pending::PendingIo;
use super::{CacheError, Core, Inner, WRITEBACK_POINT};
use crate::block::{BlockError, IoHandle};
use crate::class::Class;
use crate::context;
use crate::device::{AlignedBuf, Op};
use crate::time::MS;

/// How long the writeback thread sleeps between checks when idle.
const IDLE_CHECK: Duration = Duration::from_millis(100);
/// How long it backs off after a failed write.
const ERROR_BACKOFF: Duration = Duration::from_millis(20);

/// A run being written: its pages' frames and the shared pending I/O.
pub(crate) struct Run {
    shard: usize,
    pages: Vec<usize>,
    /// The classes its pages count against.
    classes: [bool; 2],
    offset: u64,
    buf: AlignedBuf,
    pending: Arc<PendingIo>,
}

/// A submitted run.
pub(crate) struct Submitted {
    shard: usize,
    pages: Vec<usize>,
    classes: [bool; 2],
    pending: Arc<PendingIo>,
    io: Result<IoHandle, BlockError>,
}

impl Inner {
    /// Starts writeback of dirty `frames` (given oldest first): splits them
    /// into runs of contiguous pages of one file (page order), marks every
    /// page under writeback in the order given, so the writeback line (what
    /// a task short of frames waits for) keeps the dirtying order, then
    /// copies each run into one buffer, letting waiters take the lock
    /// between pages: no lock hold copies more than one page. A page under writeback stays
    /// in its frame; one written between its mark and its copy is copied
    /// with the newer bytes and stays dirty (its write sequence is past the
    /// one the run records).
    pub(crate) fn plan_runs(
        &self,
        shard: usize,
        mut core: MutexGuard<'_, Core>,
        frames: Vec<usize>,
    ) -> Vec<Run> {
        let mut keyed: Vec<(PageKey, usize)> = frames
            .iter()
            .map(|&i| (core.frames.frame(i).key.expect("dirty page has a key"), i))
            .collect();
        keyed.sort_unstable();
        let batch = self.cfg.writeback_batch_pages as usize;
        let mut runs: Vec<Run> = Vec::new();
        let mut run_of = std::collections::HashMap::with_capacity(frames.len());
        let mut last: Option<PageKey> = None;
        for &(key, i) in &keyed {
            let follows = last.is_some_and(|l| l.file == key.file && l.page + 1 == key.page);
            let full = runs.last().is_some_and(|r| r.pages.len() == batch);
            if runs.is_empty() || !follows || full {
                runs.push(Run {
                    shard,
                    pages: Vec::new(),
                    classes: [false; 2],
                    offset: self.device_offset(key),
                    buf: AlignedBuf::zeroed(0),
                    pending: PendingIo::new(WRITEBACK_POINT, context::current(), &self.sync),
                });
            }
            let r = runs.len() - 1;
            run_of.insert(i, r);
            runs[r].pages.push(i);
            runs[r].classes[core.frames.frame(i).class.index()] = true;
            last = Some(key);
        }
        for &i in &frames {
            core.frames
                .begin_writeback(i, runs[run_of[&i]].pending.clone());
        }
        for run in &mut runs {
            let mut buf = AlignedBuf::with_capacity(run.pages.len() * self.page);
            for &i in &run.pages {
                core = core.bump();
                buf.extend_from_slice(core.frames.data(i));
            }
            run.buf = buf;
        }
        runs
    }

    /// Submits a run: synchronously in the caller's class (`sync`), or
    /// asynchronously (non-critical).
    pub(crate) fn submit_run(&self, run: Run, sync: bool) -> Submitted {
        let io = self
            .block
            .submit(Op::Write, run.offset, run.buf, sync, WRITEBACK_POINT);
        match &io {
            Ok(h) => run.pending.issued(h.clone()),
            Err(_) => run.pending.abandoned(),
        }
        Submitted {
            shard: run.shard,
            pages: run.pages,
            classes: run.classes,
            pending: run.pending,
            io,
        }
    }

    /// Waits for submitted runs and ends their pages' writeback (those a
    /// waiter for a page has not ended already, [`Inner::end_waited`]).
    /// Returns the first error (its pages stay dirty).
    pub(crate) fn finish_runs(&self, runs: Vec<Submitted>) -> Result<(), CacheError> {
        let mut first_err = None;
        for run in runs {
            let result = run.io.and_then(|h| h.wait());
            let ok = result.is_ok();
            let now = self.clock.now();
            {
                let mut core = self.shards[run.shard].lock();
                for &i in &run.pages {
                    core.frames.end_writeback(i, &run.pending, ok, now);
                }
                #[cfg(debug_assertions)]
                core.frames.check_invariants();
            }
            let c = &self.counters;
            if ok {
                c.writeback_pages
                    .fetch_add(run.pages.len() as u64, Ordering::Relaxed);
            } else {
                c.writeback_errors.fetch_add(1, Ordering::Relaxed);
            }
            {
                let mut errors = self.wb_error.lock();
                for (class, of_run) in errors.iter_mut().zip(run.classes) {
                    if of_run {
                        *class = result.as_ref().err().cloned();
                    }
                }
            }
            if let Err(e) = result {
                first_err.get_or_insert(e);
            }
        }
        self.throttle.wake_all();
        first_err.map_or(Ok(()), |e| Err(e.into()))
    }

    /// Waits for the writeback `io` of frame `i` of part `shard`, and ends
    /// the frame's writeback if its submitter has not yet: the submitter
    /// may be waiting for an earlier run of the same round, and a task
    /// that needs this page (a flush, a reader short of frames) would
    /// otherwise find it under writeback again and again with nothing left
    /// to wait for. Having ended it, wakes the throttled writers, as the
    /// submitter does, which would do so only after its earlier runs (they
    /// re-check on their own too, but only every 50 ms). Returns the
    /// write's error.
    pub(crate) fn end_waited(
        &self,
        shard: usize,
        i: usize,
        io: &Arc<PendingIo>,
    ) -> Result<(), BlockError> {
        let result = io.wait();
        // Abandoned (never submitted): nothing was written.
        let ok = result.is_ok() && io.was_issued();
        let now = self.clock.now();
        let ended = (self.shards[shard].lock().frames).end_writeback(i, io, ok, now);
        if ended && self.throttle.has_waiters() {
            self.throttle.wake_all();
        }
        result
    }

    /// The dirty pages at which a class's writeback starts.
    fn background(&self, pct: f64) -> usize {
        (self.limit(pct) as f64 * self.cfg.background_pct / 100.0).max(1.0) as usize
    }

    /// Whether writeback should start now without waiting for expiry: a
    /// throttled writer, or a class near its limit. O(1), no lock.
    pub(crate) fn near_limit(&self) -> bool {
        if self.throttle.has_waiters() {
            return true;
        }
        if self.cfg.dirty_limits {
            self.dirty(Class::Critical) >= self.background(self.cfg.critical_dirty_pct)
                || self.dirty(Class::NonCritical) >= self.background(self.cfg.noncritical_dirty_pct)
        } else {
            self.dirty(Class::Critical) + self.dirty(Class::NonCritical)
                >= self.background(self.cfg.shared_dirty_pct)
        }
    }

    /// When each part's page first in line for writeback was dirtied:
    /// (dirtied at, part), oldest first. One short lock hold per part.
    fn dirty_heads(&self) -> Vec<(u64, usize)> {
        let mut heads: Vec<(u64, usize)> = (self.shards.iter().enumerate())
            .filter_map(|(s, shard)| shard.lock().frames.oldest_dirty_at().map(|t| (t, s)))
            .collect();
        heads.sort_unstable();
        heads
    }

    /// The writeback thread's body. Each round takes up to
    /// `writeback_batch_pages * writeback_inflight` of the oldest dirty
    /// pages: the parts are visited oldest head first, each giving its
    /// oldest pages up to an equal share (at least one batch), so the
    /// round is close to the oldest pages of the whole cache while no lock
    /// hold grows with it.
    pub(crate) fn writeback_loop(self: Arc<Self>) {
        context::set_background();
        let most = (self.cfg.writeback_batch_pages * self.cfg.writeback_inflight) as usize;
        let batch = self.cfg.writeback_batch_pages as usize;
        let expire = self.cfg.dirty_expire_ms * MS;
        loop {
            let heads = {
                let mut wb = self.wb.lock();
                if wb.shutdown {
                    return;
                }
                let kicked = std::mem::take(&mut wb.kicked);
                drop(wb);
                let heads = self.dirty_heads();
                let expired = heads
                    .first()
                    .is_some_and(|&(t, _)| self.clock.now().saturating_sub(t) >= expire);
                if !(kicked || expired || self.near_limit()) {
                    let mut wb = self.wb.lock();
                    if !wb.kicked && !wb.shutdown {
                        self.wb_cv.wait_for(&mut wb, IDLE_CHECK);
                    }
                    continue;
                }
                heads
            };
            let share = (most / heads.len().max(1)).max(batch);
            let mut runs = Vec::new();
            let mut left = most;
            for &(_, shard) in &heads {
                if left == 0 {
                    break;
                }
                let core = self.shards[shard].lock();
                let pick = core.frames.oldest_dirty(share.min(left));
                left -= pick.len();
                runs.extend(self.plan_runs(shard, core, pick));
                context::yield_point();
            }
            if runs.is_empty() {
                // Everything dirty is under writeback already: wait a bit.
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            // A round copies up to `most` pages: a request thread waiting
            // for this CPU gets it between runs (`context::yield_point`).
            let submitted = runs
                .into_iter()
                .map(|r| {
                    let run = self.submit_run(r, false);
                    context::yield_point();
                    run
                })
                .collect();
            if self.finish_runs(submitted).is_err() {
                std::thread::sleep(ERROR_BACKOFF);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;

    use super::*;
    use crate::block::{BlockConfig, BlockLayer};
    use crate::cache::throttle::{RECHECK_IN_TEST, THROTTLE_POINT};
    use crate::cache::{CacheConfig, PageCache};
    use crate::context::BlockingStatus;
    use crate::device::mem::MemDevice;
    use crate::sync::SyncConfig;

    const PAGE: usize = 4096;
    const PATIENCE: Duration = Duration::from_secs(20);

    /// A flush or a reader that ends a run's pages while the run's
    /// submitter still waits for an earlier run wakes the writers
    /// throttled on those pages: the writer here would otherwise park for
    /// an hour (its re-check in this test) with its class below its limit.
    #[test]
    fn a_waiter_that_ends_a_run_wakes_the_writers_throttled_on_its_pages() {
        let dev = Arc::new(MemDevice::new(1 << 20));
        let block = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
        let cfg = CacheConfig {
            capacity_bytes: 1 << 20,
            noncritical_dirty_pct: 0.4, // 256 frames: one dirty page
            dirty_expire_ms: 3_600_000,
            ..CacheConfig::default()
        };
        let mut cache = PageCache::new(block, cfg, &SyncConfig::default()).unwrap();
        // No writeback thread: this test is the run's submitter.
        cache.inner.wb.lock().shutdown = true;
        cache.inner.wb_cv.notify_all();
        cache.writeback.take().unwrap().join().unwrap();
        let cache = Arc::new(cache);
        let inner = cache.inner.clone();
        let f = cache.add_file("f", 0, 1 << 20).unwrap();
        cache.write(f, 0, &[1; PAGE]).unwrap();
        let key = PageKey { file: f, page: 0 };
        let shard = inner.shard_index(key);
        let (i, runs) = {
            let core = inner.shards[shard].lock();
            let i = core.frames.lookup(key).unwrap();
            (i, inner.plan_runs(shard, core, vec![i]))
        };
        let run: Vec<Submitted> = runs
            .into_iter()
            .map(|r| inner.submit_run(r, false))
            .collect();
        let (tx, rx) = channel();
        let (task_tx, task_rx) = channel();
        std::thread::spawn({
            let cache = cache.clone();
            move || {
                RECHECK_IN_TEST.with(|r| r.set(Some(Duration::from_secs(3600))));
                task_tx.send(context::current()).unwrap();
                let _ = tx.send(cache.write(f, PAGE as u64, &[2; PAGE]).is_ok());
            }
        });
        let writer = task_rx.recv().unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        let throttled = Some(BlockingStatus::Admission {
            stage: THROTTLE_POINT,
        });
        while writer.blocking_status() != throttled {
            assert!(
                std::time::Instant::now() < deadline,
                "the writer is not throttled"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        // The run's write is complete (a memory device completes at once)
        // but not ended: a flush of the page sees it first, and ends it.
        inner.end_waited(shard, i, &run[0].pending).unwrap();
        assert_eq!(
            rx.recv_timeout(PATIENCE),
            Ok(true),
            "the throttled writer is woken"
        );
    }
}
