//! The cleaner: frees value-log space by copying the live records at the
//! tail to the head (FIFO cleaning of a circular log).
//!
//! ```text
//!  clean tail ─> record ─ stripe lock ─ still the key's latest? ─ no ──> dead: skip
//!                                     └─ yes ─ expired? ─ yes ──> drop the key
//!                                                       └─ no ───> copy to the head, repoint
//!  the clean tail moves past it; the space is reusable after the next checkpoint
//! ```
//!
//! Deletions and FLUSHALL records are dropped: everything older than them
//! is behind the tail already (FIFO), so nothing can come back. The
//! cleaner is background work: it reads past the cache (old records would
//! only evict what requests use), and its copies are non-critical dirty
//! pages, unless a request waits for a stripe it holds, or for space.
//!
//! It runs in the checkpointer when writers' free space falls below
//! `clean_free_pct`, and as BGREWRITEAOF (the whole log as of its start).

use super::index::Index;
use super::ops::now_ms;
use super::record::{self, Record};
use super::vlog::{Flow, Who};
use super::{EngineError, Inner};

/// Most rounds of cleaning per checkpointer wake-up (each ends with a
/// checkpoint).
const ROUNDS_MAX: usize = 8;

/// What one cleaning pass did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cleaned {
    /// Live records copied to the head.
    pub(crate) copied: u64,
    /// Expired keys dropped.
    pub(crate) expired: u64,
    /// Log bytes gone through.
    pub(crate) bytes: u64,
}

impl Inner {
    /// Whether writers' free space is below `clean_free_pct`.
    pub(crate) fn short_of_space(&self) -> bool {
        self.vlog.free() < self.vlog.region() / 100 * self.cfg.clean_free_pct
    }

    /// Cleans (and checkpoints) until writers have `clean_free_pct` of the
    /// log free, a snapshot holds the space, or [`ROUNDS_MAX`] rounds.
    pub(crate) fn clean_for_space(&self) -> Result<(), EngineError> {
        let batch = (self.vlog.region() / 16).max(1 << 20);
        for _ in 0..ROUNDS_MAX {
            if !self.short_of_space() {
                break;
            }
            if self.vlog.reclaimable() > 0 {
                self.checkpoint()?;
                continue;
            }
            if self.vlog.snapshot_running() {
                break; // the space comes back when it ends
            }
            let (tail, head) = self.vlog.boundary();
            if tail == head {
                break;
            }
            self.clean(tail + batch)?;
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Cleans from the clean tail through the records that start below
    /// `upto` (at most the head): every live one is copied to the head.
    pub(crate) fn clean(&self, upto: u64) -> Result<Cleaned, EngineError> {
        let _one = self.cleaner.lock();
        let (from, head) = self.vlog.boundary();
        let mut done = Cleaned::default();
        let reached = self.vlog.scan(from, head, |addr, r, size| {
            if addr >= upto || self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Flow::Stop);
            }
            if r.is_value() {
                self.clean_record(addr, &r, size, &mut done)?;
            }
            done.bytes += u64::from(size);
            Ok(Flow::Continue)
        })?;
        self.vlog.cleaned_to(reached);
        let mut bg = self.bg.lock();
        bg.stats.cleaned_records += done.copied;
        bg.stats.cleaned_bytes += done.bytes;
        Ok(done)
    }

    /// Copies the record at `addr` to the head if it is its key's latest.
    fn clean_record(
        &self,
        addr: u64,
        r: &Record<'_>,
        size: u32,
        done: &mut Cleaned,
    ) -> Result<(), EngineError> {
        let mut bytes = Vec::with_capacity(size as usize);
        record::encode(r, &mut bytes);
        loop {
            let mut stripe = self.index.lock(Index::stripe_of(r.key));
            let Some(loc) = stripe.get(r.key).filter(|l| l.addr == addr) else {
                return Ok(()); // superseded or deleted: dead
            };
            if loc.expired(now_ms()) {
                stripe.set(r.key, None, false);
                self.vlog.add_live(-i64::from(size));
                self.index.count(-1);
                done.expired += 1;
                return Ok(());
            }
            let reserved =
                self.vlog
                    .try_reserve(u64::from(size), u64::from(size), 0, Who::Cleaner)?;
            let Some(mut res) = reserved else {
                drop(stripe);
                self.make_room(addr, size)?;
                continue;
            };
            let (addrs, snapshot) = self.vlog.append(&mut res, &bytes, &[size as usize])?;
            let moved = super::index::Loc {
                addr: addrs[0],
                ..loc
            };
            stripe.set(r.key, Some(moved), snapshot);
            done.copied += 1;
            return Ok(());
        }
    }

    /// The log has no room for the cleaner's copy of the record at `addr`:
    /// a checkpoint makes the space cleaned so far reusable; if that is not
    /// enough, wait (a snapshot holds the space), or the store is full.
    fn make_room(&self, addr: u64, size: u32) -> Result<(), EngineError> {
        self.vlog.cleaned_to(addr);
        self.checkpoint()?;
        let size = u64::from(size);
        if self
            .vlog
            .try_reserve(size, size, 0, Who::Cleaner)?
            .is_some()
        {
            return Ok(());
        }
        if self.vlog.snapshot_running() {
            self.vlog.wait_for(size, size, Who::Cleaner, || {});
            return Ok(());
        }
        Err(EngineError::NoSpace)
    }
}
