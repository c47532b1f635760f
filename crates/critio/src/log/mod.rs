//! `log`: the write-ahead log. Records are appended, committed in groups by
//! one log-writer thread, and recovered after a crash up to the last valid
//! record.
//!
//! The log writer is the journaling daemon of paper 000 (Sections 2.2,
//! 4.2.1 and 5): it is registered as the *helper* of the commit condition
//! variables, so while a critical task waits for its commit, the writer
//! inherits criticality, and the batch write and flush it issues (or is
//! blocked on) become critical at every layer below.
//!
//! # The commit path
//!
//! ```text
//!  append(payload) ──lock "log: state"──> pending: [r7 r8 r9]   (next_lsn++)
//!        │                                   │ wake the writer if idle (a background
//!        │                                   │ appender, or committer_writes off)
//!        │                                   v
//!  commit(lsn) ──wait "log: commit wait"──   log writer ("critio-log-writer", one thread)
//!        ^     until durable_lsn >= lsn      1. take every pending record (<= batch_bytes_max)
//!        │     (a critical waiter makes       2. place the batch in the ring ("log: space wait" if full)
//!        │      the writer inherit, so        3. BlockLayer::write(batch)   in the writer's class
//!        │      3. and 4. are critical)       4. BlockLayer::flush()        in the writer's class
//!        └── notify that batch's queue ─────── 5. durable_lsn = last; or poison on failure
//! ```
//!
//! A foreground committer with `log.committer_writes` (the default) does
//! steps 1 to 5 itself, in its own thread, when no batch is in flight, and
//! its appends do not wake the writer: a server's round of appends and its
//! one commit cost one write and one flush, with no wake-up of the writer
//! and back on the request's path (PostgreSQL's backends flush the WAL
//! themselves the same way). If a batch is in flight, it waits for that
//! one (the writer inheriting, if it is the writer's), then writes its own.
//!
//! Records appended while a batch is in flight form the next batch, so one
//! write and one flush acknowledge every commit that arrived meanwhile.
//! Committers wait on one of two "log: commit wait" queues, by the parity
//! of the batch their record is in, and a completion wakes only its own
//! batch's queue: a critical committer of the next batch stays queued, so
//! the writer keeps inheriting while it issues that batch's write (with one
//! queue, the wake-up would revoke it right then). A
//! commit returns `Ok` only when its record is durable (written *and*
//! flushed). A failed write or flush poisons the log: that batch's commits
//! and every later append or commit fail with [`LogError::Poisoned`], whose
//! message says what failed and to restart and recover. So does a
//! committer that panics while it writes its batch (a bug in the device or
//! below): its batch would otherwise stay in flight, and every later commit
//! wait for it forever.
//!
//! # The ring
//!
//! The log owns the byte range `[region_offset, region_offset +
//! region_bytes)` of the block layer's device, cut into blocks of
//! `max(4096, device block size)` bytes (4096 satisfies O_DIRECT):
//!
//! ```text
//!  block 0   block 1 ............................................ block n-1
//!  +--------+--------------------------------------------------------------+
//!  | header |  b7 b7 b8 | b9 b9 b9 b9 |0000| (old lap) .... | b5 | b6 b6   |
//!  +--------+--------------------------------------------------------------+
//!   2 slots        ^ head                   ^ write position       (wraps to block 1)
//!             live: head .. write position, circularly; a batch never
//!             straddles the end (it pads there and starts again at block 1)
//! ```
//!
//! - The **header** holds two slots (bytes 0 and 512 of block 0), each with
//!   magic, version, geometry, the head and a checksum; an update rewrites
//!   the older slot and leaves the other byte-identical, so a torn header
//!   write always leaves one valid slot. It is written (write + flush) when
//!   the region is formatted, at every open, and on truncation.
//! - A **batch** is written as whole blocks, its last block padded with
//!   zeros; the log never rewrites a block that holds acknowledged records
//!   (a torn rewrite would destroy them).
//! - Space is freed only by [`Log::truncate`], after a checkpoint made the
//!   records up to an LSN obsolete: the head moves to the first record
//!   after it and the header is written durably before the space is reused.
//!
//! # Records and recovery
//!
//! A record is `{len, crc32c, lsn, epoch}` and the payload, 8-byte aligned
//! (see `record.rs`). LSNs are consecutive from 1. The *epoch* counts the
//! opens of the log: the header says which LSN the current incarnation
//! started at, so a record left over from an earlier incarnation (a
//! not-acknowledged record whose LSN was reused after a crash) can never be
//! replayed. The checksum also covers the log's random id, so records of an
//! earlier log formatted in the same region never check.
//!
//! [`Log::open`] scans from the head and returns a [`Recovery`]: every
//! record in order and how the log ended ([`Tail`]):
//!
//! | what follows the last valid record            | tail      | open               |
//! |-----------------------------------------------|-----------|--------------------|
//! | zeros, padding, or an older lap's records     | `Clean`   | resumes            |
//! | the next record, with a bad checksum or cut short, and nothing valid after it | `Torn` | resumes over it (it was never acknowledged) |
//! | a bad record *followed by* valid later records | `Corrupt` | refuses, unless `allow_corrupt_truncate` |
//!
//! Appending resumes at the block after the last valid record, so nothing
//! after a torn or corrupt record is ever replayed.
//!
//! # What each class gets
//!
//! A batch holding a record a critical task appended (or followed by one)
//! is written and flushed critical from the start: that task is about to
//! wait for it. Otherwise the writer runs in its own (background) class
//! until a critical task waits on "log: commit wait"; then it inherits
//! until that commit is acknowledged, and its write and flush (and any of
//! its I/O already queued, through promotion) are served as critical. A
//! background commit never slows a foreground one beyond the batch already at the device. Appenders
//! blocked for space ("log: space wait") make its helpers inherit: the
//! writer, and the checkpointer the engine registers with
//! [`Log::register_space_helper`].

mod commit;
mod config;
mod error;
mod header;
mod open;
mod record;
mod recovery;
mod ring;
mod state;
mod writer;

use std::sync::Arc;
use std::thread::JoinHandle;

pub use config::{LogConfig, REGION_BYTES_MIN};
pub use error::LogError;
pub use record::{RECORD_ALIGN, RECORD_HEADER_BYTES};
pub use recovery::{Recovery, Tail};

use crate::block::IO_LEN_MAX;
use crate::context::TaskRef;
use state::Shared;

/// A log sequence number: records are numbered 1, 2, 3, ... in append order.
pub type Lsn = u64;

/// The wait point (and condvar name) of commits waiting for durability.
pub const COMMIT_POINT: &str = "log: commit wait";
/// The wait point of appenders (and the writer) waiting for ring space.
pub const SPACE_POINT: &str = "log: space wait";
/// The wait point of the writer waiting for records (no inheritance).
pub const WRITER_IDLE_POINT: &str = "log: writer idle";
/// The wait point of the log's state lock.
pub const STATE_POINT: &str = "log: state";
/// The wait point of the lock serializing header writes (truncation).
pub const HEADER_POINT: &str = "log: header";
/// The log writer thread's name.
pub const WRITER_THREAD_NAME: &str = "critio-log-writer";

/// The smallest log block: the O_DIRECT alignment critio uses everywhere.
pub const LOG_BLOCK_MIN: u64 = 4096;
/// The largest payload any configuration allows (`record_bytes_max`); a
/// scan treats a longer length as garbage.
pub const RECORD_BYTES_LIMIT: u64 = 4 << 20;
/// The largest batch any configuration allows: one block-layer request.
pub const BATCH_BYTES_LIMIT: u64 = IO_LEN_MAX;

const _: () = assert!(RECORD_BYTES_LIMIT + RECORD_HEADER_BYTES + RECORD_ALIGN <= BATCH_BYTES_LIMIT);
const _: () = assert!(BATCH_BYTES_LIMIT % LOG_BLOCK_MIN == 0);

/// What the log did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct LogStats {
    /// Batches written and flushed.
    pub batches: u64,
    /// Of those, batches their foreground committer wrote itself
    /// (`log.committer_writes`); the log writer wrote the rest.
    pub committer_batches: u64,
    /// Records made durable.
    pub records: u64,
    /// Bytes written by batches (whole blocks, padding included).
    pub bytes_written: u64,
    /// Truncations that moved the head.
    pub truncations: u64,
    /// Ring bytes in use (head to write position, padding included).
    pub used_bytes: u64,
    /// Ring bytes in all (the region minus the header block).
    pub capacity_bytes: u64,
}

/// A write-ahead log in a region of a block layer's device; see the module
/// docs. Share it with `Arc`; dropping it (or [`Log::close`]) lets the writer
/// finish the pending batches, then stops it.
pub struct Log {
    shared: Arc<Shared>,
    writer: Option<JoinHandle<()>>,
    writer_task: TaskRef,
}

impl Log {
    /// The log writer's task: the helper of "log: commit wait" (for tests
    /// and tools that show who is critical).
    pub fn writer_task(&self) -> &TaskRef {
        &self.writer_task
    }

    /// Registers `task` (the engine's checkpointer, which truncates) as a
    /// helper of "log: space wait": it inherits while a critical appender
    /// waits for space.
    pub fn register_space_helper(&self, task: TaskRef) {
        self.shared.space_cv.register_helper(task);
    }

    /// The highest LSN known durable (0 before the first record).
    pub fn durable_lsn(&self) -> Lsn {
        self.shared.state.lock().durable_lsn
    }

    /// The LSN the next append gets.
    pub fn next_lsn(&self) -> Lsn {
        self.shared.state.lock().next_lsn
    }

    /// The first live LSN: records before it were truncated.
    pub fn head_lsn(&self) -> Lsn {
        self.shared.state.lock().ring.head_lsn()
    }

    /// Takes no more records: from now on every append, and every wait for
    /// space (waiting ones too), fails with [`LogError::Refused`] and `why`
    /// (the first reason given is kept). Records appended before are still
    /// written, flushed and committed as usual, and truncation goes on. For
    /// an owner that can no longer make room or apply records: an engine
    /// whose checkpointer died, say, whose writers would otherwise wait for
    /// space forever.
    pub fn refuse_appends(&self, why: impl Into<String>) {
        let mut st = self.shared.state.lock();
        if st.refused.is_none() {
            st.refused = Some(why.into());
        }
        drop(st);
        self.shared.space_cv.notify_all();
    }

    /// Whether a failed write or flush poisoned the log.
    pub fn is_poisoned(&self) -> bool {
        self.shared.state.lock().poison.is_some()
    }

    /// Ring bytes in use, in percent of the ring (for a checkpointer that
    /// truncates when the log fills up).
    pub fn used_pct(&self) -> f64 {
        let st = self.shared.state.lock();
        100.0 * st.ring.used() as f64 / st.ring.capacity() as f64
    }

    /// Counters and ring occupancy.
    pub fn stats(&self) -> LogStats {
        let st = self.shared.state.lock();
        LogStats {
            used_bytes: st.ring.used(),
            capacity_bytes: st.ring.capacity(),
            ..st.stats
        }
    }

    /// Stops accepting records, lets the writer write the pending ones, and
    /// joins it. Returns the poison error if the log was poisoned.
    pub fn close(mut self) -> Result<(), LogError> {
        self.shutdown();
        let st = self.shared.state.lock();
        match &st.poison {
            Some(p) => Err(p.error()),
            None => Ok(()),
        }
    }

    fn shutdown(&mut self) {
        let Some(writer) = self.writer.take() else {
            return;
        };
        self.shared.state.lock().closing = true;
        self.shared.work_cv.notify_all();
        self.shared.space_cv.notify_all();
        // A panic in the writer is a bug (its exit guard has failed every
        // waiter): raise it here too, unless this thread is unwinding already.
        if writer.join().is_err() && !std::thread::panicking() {
            panic!("critio log writer panicked");
        }
        let id = self.writer_task.id();
        for cv in &self.shared.commit_cv {
            cv.unregister_helper(id);
        }
        self.shared.space_cv.unregister_helper(id);
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl std::fmt::Debug for Log {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Log")
            .field("writer_task", &self.writer_task.id())
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<Log>();
};
