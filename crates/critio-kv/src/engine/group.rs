//! Group commit by the caller: a thread that serves many clients (an
//! event loop) runs a round of their requests with commits *deferred*, then
//! waits once for the highest LSN it logged, before any of their replies
//! leave. This is what Redis does with `appendfsync always` (one fsync in
//! `beforeSleep` for every write of the event-loop iteration).
//!
//! ```text
//!  let round = engine.defer_commits();
//!  SET a ─> logged (LSN 7), applied, not waited for  ─┐
//!  SET b ─> logged (LSN 9), applied, not waited for   │ round.lsn() = 9
//!  GET a ─> reads the applied value                   │
//!  round.commit() ─> waits until LSN 9 is durable ────┘ then send the replies
//! ```
//!
//! Nothing about durability changes: a write is still acknowledged only
//! after its record is durable, because the caller sends no reply of the
//! round before [`Deferred::commit`] returns `Ok`. The wait is the same
//! `Log::commit` a write makes on its own, so a foreground caller makes the
//! log writer inherit exactly as before. Dropping a round with writes not
//! yet waited for waits for them (a reply can never leave early by
//! mistake).
//!
//! The deferral is per thread and per engine: a write to another engine on
//! the same thread, or on another thread, commits as usual.

use std::cell::Cell;
use std::marker::PhantomData;

use critio::log::Lsn;

use super::{Engine, EngineError, Inner};

thread_local! {
    /// This thread's open round: (the engine's address, highest LSN logged
    /// in the round; 0 if none yet).
    static ROUND: Cell<Option<(usize, Lsn)>> = const { Cell::new(None) };
}

/// A round of deferred commits on this thread (see the module doc).
#[must_use = "a round's writes are acknowledged only after commit()"]
pub struct Deferred<'a> {
    engine: &'a Engine,
    /// The round this one replaced (rounds nest, innermost wins).
    outer: Option<(usize, Lsn)>,
    /// Not `Send`: the round belongs to this thread.
    _thread: PhantomData<*const ()>,
}

impl Inner {
    fn key(&self) -> usize {
        self as *const Inner as usize
    }

    /// Waits for `lsn` to be durable, or leaves it to this thread's open
    /// round on this engine.
    pub(crate) fn commit_or_defer(&self, lsn: Lsn) -> Result<(), EngineError> {
        let me = self.key();
        let deferred = ROUND.with(|r| match r.get() {
            Some((e, max)) if e == me => {
                r.set(Some((e, max.max(lsn))));
                true
            }
            _ => false,
        });
        if deferred {
            Ok(())
        } else {
            Ok(self.log.commit(lsn)?)
        }
    }
}

impl Engine {
    /// Opens a round of deferred commits on this thread: until it is
    /// dropped, writes made here are logged and applied but not waited
    /// for; [`Deferred::commit`] waits for all of them. Send no reply of
    /// the round before it returns `Ok`.
    pub fn defer_commits(&self) -> Deferred<'_> {
        let outer = ROUND.with(|r| r.replace(Some((self.inner.key(), 0))));
        Deferred {
            engine: self,
            outer,
            _thread: PhantomData,
        }
    }
}

impl Deferred<'_> {
    /// The highest LSN the round logged and has not yet waited for (0:
    /// none).
    pub fn lsn(&self) -> Lsn {
        ROUND.with(|r| r.get().map_or(0, |(_, lsn)| lsn))
    }

    /// Waits until every write of the round so far is durable; the round
    /// stays open for more. An error means none of those writes may be
    /// acknowledged (the log is poisoned: restart and recover).
    pub fn commit(&self) -> Result<(), EngineError> {
        let lsn = self.lsn();
        if lsn == 0 {
            return Ok(());
        }
        let result = self.engine.inner.log.commit(lsn);
        ROUND.with(|r| r.set(Some((self.engine.inner.key(), 0))));
        Ok(result?)
    }
}

impl Drop for Deferred<'_> {
    fn drop(&mut self) {
        let _ = self.commit();
        ROUND.with(|r| r.set(self.outer));
    }
}
