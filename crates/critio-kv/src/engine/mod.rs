//! The storage engine: a log-structured store. Values live in a value log
//! (the data region, through critio's page cache); an in-memory index maps
//! each key to its latest record; every change is first made durable in
//! critio's write-ahead log.
//!
//! ```text
//!  request (foreground) ─┬─ read:  stripe lock ─> index ─> record (cache) ─> unlock
//!                        └─ write: stripe locks ─> room? ─> epoch (shared) ─> WAL append
//!                                  ─> value-log append (cache) ─> index ─> unlock
//!                                  ─> WAL commit (durable) ─> acknowledge
//!                                     (or deferred to the caller's round of
//!                                      group commit: group.rs)
//!  checkpointer (background): epoch (exclusive): LSN C, value log (tail T, head P)
//!        ─> flush the value log's pages ─> superblock {C, T, P} (durable)
//!        ─> space below T reusable, WAL truncated to C; cleans when space runs low
//!  cleaner (checkpointer, BGREWRITEAOF): oldest records ─> live ones copied to the head
//!  BGSAVE: the records as of its start ─> dump file
//! ```
//!
//! Durability: a write is acknowledged only after its WAL record is
//! durable. Crash consistency: recovery reads the newest valid superblock,
//! rebuilds the index by scanning the value log from its T to its P (every
//! record there was flushed before the superblock was written, and space is
//! reused only below the durable T), then replays the WAL records after its
//! C. A page rewritten after a checkpoint keeps the bytes below P it held,
//! so a torn write of the page at P cannot damage durable records.
//!
//! Cost per operation: a read is a hash lookup and a cache read of one
//! record; a write appends one record to the WAL and one to the value log
//! (sequential pages, written back in long runs). Nothing is proportional
//! to the number of keys or the size of the cache.
//!
//! Every lock and wait is critio's, so a foreground request waiting for a
//! background thread (a checkpoint holding the epoch lock, the cleaner
//! holding a stripe or the value log in dirty throttling) makes it
//! critical, and its I/O with it.
//!
//! Failure: when a logged write cannot be applied, the cleaner cannot
//! write copies it has placed, the device fails a checkpoint, or a
//! background thread (the checkpointer, BGSAVE, BGREWRITEAOF) panics, the
//! engine fails
//! ([`EngineError::Failed`]): writes, and writers already waiting for
//! space in either log, get the error instead of waiting for a thread
//! that will never make room; reads go on; no checkpoint is taken past the
//! failure, so a restart recovers from the last one and the WAL.

mod checkpoint;
mod clean;
mod entry;
mod group;
mod index;
mod jobs;
mod layout;
mod ops;
mod record;
#[cfg(test)]
mod snapshot_tests;
mod superblock;
mod txn;
mod vlog;
mod wal;

use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::thread::JoinHandle;

use critio::block::{BlockError, BlockLayer};
use critio::cache::{CacheError, FileId, PageCache};
use critio::log::{Log, LogError};
use critio::sync::{Condvar, Mutex, RwLock};
use serde::{Deserialize, Serialize};

pub use checkpoint::{BackgroundStats, CheckpointReport, Progress};
pub use entry::{Entry, Value};
pub use group::Deferred;
pub use jobs::{image_dump, DumpEntries, DumpId};
pub use layout::Layout;
pub use ops::{FieldValues, Prefetch, SetOptions};
pub use txn::{ExpireIf, Kind, SetOutcome, Txn};

use index::Index;
use vlog::Vlog;

/// The engine's configuration (the `engine` section of a config file).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// The longest key, in bytes. Default 1024 (at most 2048). A write of
    /// a longer key is refused (`KeyTooLarge`); a read finds it absent.
    pub key_bytes_max: usize,
    /// The largest value (a string, or a hash's encoding), in bytes.
    /// Default 1 MiB; a write must also fit one log record
    /// (`log.record_bytes_max`).
    pub value_bytes_max: usize,
    /// A checkpoint runs this often, in ms (0: only when the log fills).
    /// Default 10000.
    pub checkpoint_interval_ms: u64,
    /// A checkpoint runs when the log ring is this full, in percent.
    /// Default 50.
    pub checkpoint_log_pct: u64,
    /// The log region, in bytes. Default 64 MiB.
    pub log_bytes: u64,
    /// The dump file (BGSAVE), in percent of the space after the log.
    /// Default 33 (the value log gets the rest). A BGSAVE keeps the last
    /// dump until it is complete where the two fit in it together.
    pub dump_pct: u64,
    /// Writes that would make the live data exceed this percentage of the
    /// value log fail ("no space"): the rest is room for garbage, so the
    /// cleaner copies little per byte it frees. Default 50, at most 80.
    pub live_max_pct: u64,
    /// The checkpointer cleans the oldest records when writers' free space
    /// in the value log falls below this percentage. Default 25.
    pub clean_free_pct: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            key_bytes_max: 1024,
            value_bytes_max: 1 << 20,
            checkpoint_interval_ms: 10_000,
            checkpoint_log_pct: 50,
            log_bytes: 64 << 20,
            dump_pct: 33,
            live_max_pct: 50,
            clean_free_pct: 25,
        }
    }
}

impl EngineConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |f: &str, why: &str| Err(EngineError::Config(format!("engine.{f}: {why}")));
        if !(1..=2048).contains(&self.key_bytes_max) {
            return bad("key_bytes_max", "must be within 1..=2048");
        }
        if !(1..=64 << 20).contains(&self.value_bytes_max) {
            return bad("value_bytes_max", "must be within 1..=67108864");
        }
        if !(1..=90).contains(&self.checkpoint_log_pct) {
            return bad("checkpoint_log_pct", "must be within 1..=90");
        }
        if !(1..=90).contains(&self.dump_pct) {
            return bad("dump_pct", "must be within 1..=90");
        }
        if !(1..=80).contains(&self.live_max_pct) {
            return bad("live_max_pct", "must be within 1..=80");
        }
        if !(1..=90).contains(&self.clean_free_pct) {
            return bad("clean_free_pct", "must be within 1..=90");
        }
        Ok(())
    }
}

/// Why an engine operation failed. The messages are what a Redis client
/// sees after `-`.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EngineError {
    /// The key holds another kind of value.
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    WrongType,
    /// The value is not an integer (INCR).
    #[error("ERR value is not an integer or out of range")]
    NotInteger,
    /// The value is not a float (INCRBYFLOAT).
    #[error("ERR value is not a valid float")]
    NotFloat,
    /// A hash field is not an integer (HINCRBY).
    #[error("ERR hash value is not an integer")]
    HashNotInteger,
    /// A hash field is not a float (HINCRBYFLOAT).
    #[error("ERR hash value is not a float")]
    HashNotFloat,
    /// INCRBYFLOAT would give NaN or an infinity.
    #[error("ERR increment would produce NaN or Infinity")]
    NanOrInfinity,
    /// INCRBY would overflow.
    #[error("ERR increment or decrement would overflow")]
    Overflow,
    /// The key is too long.
    #[error("ERR key of {len} bytes exceeds the {max}-byte limit")]
    KeyTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The value is too large: a string, or a hash's fields and values
    /// together (a hash is stored as one value).
    #[error("ERR {what} of {len} bytes exceeds the {max}-byte limit (engine.value_bytes_max)")]
    ValueTooLarge {
        /// "value", or "hash (its fields and values together)".
        what: &'static str,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The data region is full.
    #[error("ERR no space left in the data region (engine.live_max_pct of the value log is live data); delete keys or use a larger device")]
    NoSpace,
    /// A background job is already running.
    #[error("ERR {0}")]
    Busy(&'static str),
    /// Bad configuration.
    #[error("ERR config: {0}")]
    Config(String),
    /// An earlier write failed after it was logged, so the in-memory state
    /// is no longer trusted; recovery from the log is needed.
    #[error("ERR the store stopped accepting writes after a failure ({0}); restart to recover from the log")]
    Failed(String),
    /// Stored data failed its checksum.
    #[error("ERR corrupt data: {0}")]
    Corrupt(String),
    /// A file could not be opened or read (a store's image read on its
    /// own: [`jobs::image_dump`]).
    #[error("ERR {0}")]
    Io(String),
    /// The log refused the write (it is not acknowledged).
    #[error("ERR write not logged: {0}")]
    Log(LogError),
    /// The cache failed.
    #[error("ERR {0}")]
    Cache(#[from] CacheError),
    /// The device failed.
    #[error("ERR {0}")]
    Block(#[from] BlockError),
}

impl From<LogError> for EngineError {
    /// A log that refuses appends does so because the engine failed.
    fn from(e: LogError) -> Self {
        match e {
            LogError::Refused { why } => EngineError::Failed(why),
            other => EngineError::Log(other),
        }
    }
}

impl From<critio::StackError> for EngineError {
    fn from(e: critio::StackError) -> Self {
        match e {
            critio::StackError::Log(e) => EngineError::Log(e),
            critio::StackError::Cache(e) => EngineError::Cache(e),
            // Its text may name itself a config error already.
            other => {
                let text = other.to_string();
                let text = text.strip_prefix("config: ").unwrap_or(&text);
                EngineError::Config(text.to_owned())
            }
        }
    }
}

pub(crate) struct Inner {
    cfg: EngineConfig,
    layout: Layout,
    block: Arc<BlockLayer>,
    cache: Arc<PageCache>,
    dump: FileId,
    log: Log,
    /// Writers hold it shared while they log and apply; a checkpoint's
    /// boundary holds it exclusively.
    epoch: RwLock<()>,
    index: Index,
    vlog: Vlog,
    /// One cleaner at a time (the checkpointer's, or BGREWRITEAOF).
    cleaner: Mutex<()>,
    ckpt: Mutex<checkpoint::State>,
    ckpt_cv: Condvar,
    bg: Mutex<checkpoint::Background>,
    /// How far the running BGSAVE (0) and BGREWRITEAOF (1) have gone.
    progress: [checkpoint::JobProgress; 2],
    closing: AtomicBool,
    /// Why the engine failed, once it has ([`Inner::fail`]).
    failed: std::sync::OnceLock<String>,
    /// A background thread of this name panics at its next step (tests).
    #[cfg(test)]
    inject_panic: parking_lot::Mutex<Option<&'static str>>,
}

impl Inner {
    /// Fails the engine (see the module docs), for `why`; the first
    /// reason is kept. Wakes every writer waiting for space.
    pub(crate) fn fail(&self, why: String) {
        let _ = self.failed.set(why.clone());
        self.vlog.refuse(why.clone());
        self.log.refuse_appends(why);
    }

    /// The error every write gets once the engine failed (one atomic
    /// load on a write's path until then).
    pub(crate) fn failure(&self) -> Option<EngineError> {
        self.failed.get().cloned().map(EngineError::Failed)
    }

    /// Panics if a test asked the background thread `name` to.
    #[cfg(test)]
    pub(crate) fn injected_panic(&self, name: &str) {
        let mut inject = self.inject_panic.lock();
        if *inject == Some(name) {
            *inject = None;
            drop(inject);
            panic!("a panic injected into {name}");
        }
    }

    /// Runs the body of background thread `name`; if it panics, fails the
    /// engine, and returns the error, rather than leave writers waiting
    /// for what the thread would have done.
    pub(crate) fn guarded<T>(
        &self,
        name: &str,
        body: impl FnOnce() -> T,
    ) -> Result<T, EngineError> {
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(body)).map_err(|payload| {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "no message".into());
            let why = format!("{name} panicked: {what}");
            self.bg.lock().stats.last_error = Some(why.clone());
            self.fail(why);
            self.failure().expect("just failed")
        })
    }
}

/// The storage engine. Share it with `Arc`; call [`Engine::close`] to stop
/// its checkpointer cleanly (a final checkpoint).
pub struct Engine {
    inner: Arc<Inner>,
    checkpointer: parking_lot::Mutex<Option<JoinHandle<()>>>,
}
