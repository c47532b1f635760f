//! Flushes: of the write cache (the cache device: every completed write's
//! data and metadata), and of the backing device, grouped, after bypassed
//! writes.
//!
//! ```text
//!  flush(cmd) ──> cache device flush ──> stale slots it covers are released (flush_end)
//!                                        (a failure poisons the cache: durability unknown)
//!  bypassed write done ──> waiting ──> one backing flush in flight at a time; writes that
//!                                       complete meanwhile wait for the next one
//! ```
//!
//! A bypassed write completes only once a backing flush submitted after it
//! completed, so a flush of the write cache never has to flush the slow
//! backing device: a request's commit pays only for the fast device, and
//! the backing flushes are paid by the background writes that bypass.

use std::sync::mpsc;
use std::sync::Arc;

use super::error::dup;
use super::stats::add;
use super::Shared;
use crate::class::Class;
use crate::device::{Command, Completer, Completion, DeviceError};

/// Called with a flush's outcome.
pub(super) type FlushDone = Box<dyn FnOnce(Result<(), DeviceError>) + Send>;

/// Bypassed writes waiting for a backing flush.
#[derive(Default)]
pub(super) struct GroupFlush {
    in_flight: bool,
    waiting: Vec<(Class, FlushDone)>,
}

impl Shared {
    /// A flush command.
    pub(super) fn flush(self: &Arc<Self>, cmd: Command, done: Completer) {
        add(&self.counters.flushes, 1);
        let buf = cmd.buf;
        self.flush_cache(
            cmd.class,
            Box::new(move |result| done(Completion { result, buf })),
        );
    }

    /// Flushes the cache device; the stale slots whose releasing records
    /// completed before are free after it.
    pub(super) fn flush_cache(self: &Arc<Self>, class: Class, then: FlushDone) {
        let taken = self.state.lock().core.flush_begin();
        let me = self.clone();
        let done = move |c: Completion| {
            let ok = c.result.is_ok();
            if !ok {
                me.poison("a flush of the cache device");
            }
            me.state.lock().core.flush_end(&taken, ok);
            if ok && !taken.is_empty() {
                me.admit_stalled();
            }
            then(c.result);
        };
        self.cache.submit(Command::flush(class), Box::new(done));
    }

    /// [`Shared::flush_cache`], waiting for it (writeback thread only).
    pub(super) fn flush_cache_wait(self: &Arc<Self>, class: Class) -> Result<(), DeviceError> {
        let (tx, rx) = mpsc::sync_channel(1);
        self.flush_cache(
            class,
            Box::new(move |r| {
                let _ = tx.send(r);
            }),
        );
        rx.recv().expect("a flush completion is never dropped")
    }

    /// A bypassed write of `class` completed at the backing device: `then`
    /// runs when a backing flush submitted after now completes.
    pub(super) fn after_backing_write(self: &Arc<Self>, class: Class, then: FlushDone) {
        let batch = {
            let mut g = self.bypass_flush.lock();
            g.waiting.push((class, then));
            if g.in_flight {
                return;
            }
            g.in_flight = true;
            std::mem::take(&mut g.waiting)
        };
        self.flush_backing(batch);
    }

    fn flush_backing(self: &Arc<Self>, batch: Vec<(Class, FlushDone)>) {
        assert!(!batch.is_empty());
        let class = batch.iter().map(|(c, _)| *c).min().expect("not empty"); // critical < non-critical
        let me = self.clone();
        let done = move |c: Completion| {
            for (_, then) in batch {
                then(c.result.as_ref().map(|_| ()).map_err(dup));
            }
            let next = {
                let mut g = me.bypass_flush.lock();
                if g.waiting.is_empty() {
                    g.in_flight = false;
                    None
                } else {
                    Some(std::mem::take(&mut g.waiting))
                }
            };
            if let Some(next) = next {
                me.flush_backing(next);
            }
        };
        self.backing.submit(Command::flush(class), Box::new(done));
    }
}
