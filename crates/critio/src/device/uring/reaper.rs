//! The reaper: one thread that waits for completions and hands them out.
//!
//! ```text
//!   kernel posts CQE ──> eventfd += 1
//!   reaper: poll(eventfd) ─> read (reset) ─> lock: reap CQEs, resubmit,
//!           admit waiting ─> unlock ─> call completers ─> closing and idle? exit
//! ```
//!
//! The reaper blocks outside the lock, so submitters never wait for it.
//! Completers run outside the lock too: they may submit again (the block
//! layer dispatches its next command from a completion) and may even drop
//! the device; a completer that panics is reported by the panic hook and
//! the reaper carries on, so other commands still complete.

use std::os::fd::OwnedFd;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rustix::event::{poll, PollFd, PollFlags, Timespec};

use super::state::{Finished, State};
use crate::device::DeviceInfo;

/// How often the reaper retries SQEs the kernel was too busy to take.
pub(super) const RETRY_PERIOD: Duration = Duration::from_millis(1);

/// What the device and its reaper share.
pub(super) struct Shared {
    pub info: DeviceInfo,
    pub state: Mutex<State>,
    /// Signalled by the kernel on every CQE, and by [`Shared::wake`].
    pub eventfd: OwnedFd,
    /// The file again (the same open file, O_DIRECT), for flushes, reads
    /// and writes done by their caller ([`crate::device::Device::flush_here`],
    /// [`crate::device::Device::submit_here`]).
    pub caller_file: std::fs::File,
    /// This device among every one opened in the process (each thread
    /// keeps its own small rings per device, see `here.rs`).
    pub id: u64,
}

impl Shared {
    /// Wakes the reaper (to retry SQEs, or to notice `closing`).
    pub fn wake(&self) {
        // A full counter (2^64 - 2 wakes pending) is the only failure, and
        // then the reaper is awake anyway.
        let _ = rustix::io::write(&self.eventfd, &1u64.to_ne_bytes());
    }

    /// Blocks until the kernel or [`Shared::wake`] signals, or for
    /// [`RETRY_PERIOD`] if `retry`, then resets the signal.
    fn wait(&self, retry: bool) {
        let timeout = Timespec {
            tv_sec: 0,
            tv_nsec: RETRY_PERIOD.as_nanos() as _,
        };
        let mut fds = [PollFd::new(&self.eventfd, PollFlags::IN)];
        // EINTR is a spurious wake-up: the loop reaps and waits again.
        let _ = poll(&mut fds, retry.then_some(&timeout));
        let mut count = [0u8; 8];
        // EAGAIN (nothing signalled: a timeout) is fine too.
        let _ = rustix::io::read(&self.eventfd, &mut count);
    }
}

/// The reaper thread's body.
pub(super) fn run(shared: Arc<Shared>) {
    let mut finished: Vec<Finished> = Vec::new();
    let mut retry = false;
    loop {
        shared.wait(retry);
        {
            let mut state = shared.state.lock();
            state.reap(&shared.info, &mut finished);
            retry = state.needs_retry();
        }
        for (done, completion) in finished.drain(..) {
            // The panic hook has already printed the message; keep reaping.
            let _ = panic::catch_unwind(AssertUnwindSafe(|| done(completion)));
        }
        let state = shared.state.lock();
        if state.closing && state.is_idle() {
            return;
        }
    }
}
