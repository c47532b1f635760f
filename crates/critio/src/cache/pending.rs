//! An I/O that may not be submitted yet: a page load or a writeback run.
//!
//! Its submitter may still be blocked in block admission when someone needs
//! it, so there is no request to promote yet. Waiters first wait on an
//! [`Event`] whose explicit helper is the submitter (a critical waiter makes
//! it inherit, so it retries admission in the critical pool), then on the
//! request itself (a critical waiter promotes it):
//!
//! ```text
//!   waiter ──event "cache: ..."──> submitter (helper) ──admission──> slot
//!   waiter ──I/O n──────────────> request (promoted where it is)
//! ```

use std::sync::{Arc, OnceLock};

use crate::block::{BlockError, IoHandle};
use crate::context::TaskRef;
use crate::sync::{Event, SyncOptions};

/// A load or a writeback run, shared by its submitter and its waiters.
pub(crate) struct PendingIo {
    io: OnceLock<IoHandle>,
    issued: Event,
}

impl PendingIo {
    /// A pending I/O whose submitter is `submitter`; waits are accounted to
    /// wait point `point`.
    pub(crate) fn new(point: &'static str, submitter: TaskRef, sync: &SyncOptions) -> Arc<Self> {
        let issued = Event::with_options(SyncOptions {
            name: point,
            ..sync.clone()
        });
        issued.register_helper(submitter);
        Arc::new(Self {
            io: OnceLock::new(),
            issued,
        })
    }

    /// Records the submitted request and wakes those waiting for it.
    pub(crate) fn issued(&self, io: IoHandle) {
        assert!(self.io.set(io).is_ok(), "a pending I/O is issued once");
        self.issued.set();
    }

    /// Ends the pending I/O without a request (its submission failed).
    pub(crate) fn abandoned(&self) {
        self.issued.set();
    }

    /// Whether a request was submitted for it (false: not yet, or its
    /// submission failed and it was abandoned).
    pub(crate) fn was_issued(&self) -> bool {
        self.io.get().is_some()
    }

    /// Waits until the I/O completes (promoting it if the caller is
    /// critical). Returns its result; an abandoned I/O returns Ok (the
    /// caller re-checks the page).
    pub(crate) fn wait(&self) -> Result<(), BlockError> {
        self.issued.wait();
        match self.io.get() {
            Some(io) => io.wait(),
            None => Ok(()),
        }
    }
}

impl Drop for PendingIo {
    fn drop(&mut self) {
        // Unregistering keeps the submitter from inheriting through a
        // pending I/O nobody can wait for any more.
        for id in self.issued.helpers() {
            self.issued.unregister_helper(id);
        }
    }
}
