//! The storage engine: a persistent hash index of copy-on-write bucket
//! pages, behind critio's page cache and write-ahead log.
//!
//! ```text
//!  request (foreground) ─┬─ read:  bucket stripe lock ─> bucket chain (cache) ─> blob (cache)
//!                        └─ write: epoch read lock ─> stripe locks ─> log append ─> apply ─> unlock
//!                                  ─> log commit (durable) ─> acknowledge
//!  checkpointer (background): epoch write lock: boundary (LSN, directory) ─> flush data pages
//!        ─> write metadata ─> superblock (durable) ─> free old pages, truncate log
//!  BGSAVE: boundary ─> read the frozen tree ─> dump file      BGREWRITEAOF: repack chains
//! ```
//!
//! Durability: a write is acknowledged only after its log record is
//! durable. Crash consistency: pages a durable checkpoint references are
//! never overwritten (changed chains go to fresh pages; freed pages are
//! reused only after the next checkpoint is durable), so recovery loads the
//! last checkpoint exactly and replays the log records after its LSN. Log
//! records state resulting values, so replay is exact.
//!
//! Every lock and wait is critio's, so a foreground request waiting for a
//! background thread (a checkpoint holding the epoch lock, a snapshot
//! holding a bucket stripe) makes it critical, and its I/O with it.

mod alloc;
mod bucket;
mod checkpoint;
mod entry;
mod jobs;
mod layout;
mod ops;
mod store;
mod superblock;
mod wal;

use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::Arc;
use std::thread::JoinHandle;

use critio::block::{BlockError, BlockLayer};
use critio::cache::{CacheError, FileId, PageCache};
use critio::config::SyncConfig;
use critio::log::{Log, LogError};
use critio::sync::{Condvar, Mutex, RwLock};
use serde::{Deserialize, Serialize};

pub use checkpoint::{BackgroundStats, CheckpointReport};
pub use entry::{Entry, Value};
pub use layout::Layout;
pub use ops::{FieldValues, SetOptions};

use alloc::Allocator;

/// The engine's configuration (the `engine` section of a config file).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EngineConfig {
    /// Hash buckets (fixed when the store is created). Default 65536.
    pub buckets: u32,
    /// The longest key, in bytes. Default 1024 (at most 2048).
    pub key_bytes_max: usize,
    /// The largest value (a string, or a hash's encoding), in bytes.
    /// Default 1 MiB; a write must also fit one log record
    /// (`log.record_bytes_max`). Values above 2 KiB live in blobs.
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
    /// Default 25.
    pub dump_pct: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            buckets: 65536,
            key_bytes_max: 1024,
            value_bytes_max: 1 << 20,
            checkpoint_interval_ms: 10_000,
            checkpoint_log_pct: 50,
            log_bytes: 64 << 20,
            dump_pct: 25,
        }
    }
}

impl EngineConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), EngineError> {
        let bad = |f: &str, why: &str| Err(EngineError::Config(format!("engine.{f}: {why}")));
        if !(16..=1 << 24).contains(&self.buckets) {
            return bad("buckets", "must be within 16..=16777216");
        }
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
    /// The value is too large.
    #[error("ERR value of {len} bytes exceeds the {max}-byte limit (engine.value_bytes_max)")]
    ValueTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// The data region is full.
    #[error("ERR no space left in the data region; delete keys or use a larger device")]
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
    /// The log refused the write (it is not acknowledged).
    #[error("ERR write not logged: {0}")]
    Log(#[from] LogError),
    /// The cache failed.
    #[error("ERR {0}")]
    Cache(#[from] CacheError),
    /// The device failed.
    #[error("ERR {0}")]
    Block(#[from] BlockError),
}

/// Stripes of bucket locks (a multi-key write holds several while it
/// loads its buckets: more stripes, fewer collisions).
const STRIPES: usize = 1024;

pub(crate) struct Inner {
    cfg: EngineConfig,
    layout: Layout,
    block: Arc<BlockLayer>,
    cache: Arc<PageCache>,
    data: FileId,
    dump: FileId,
    log: Log,
    /// Writers hold it shared while they log and apply; a boundary holds it
    /// exclusively.
    epoch: RwLock<()>,
    stripes: Vec<Mutex<()>>,
    directory: Vec<AtomicU64>,
    alloc: Mutex<Allocator>,
    keys: AtomicU64,
    ckpt: Mutex<checkpoint::State>,
    ckpt_cv: Condvar,
    bg: Mutex<checkpoint::Background>,
    closing: AtomicBool,
    /// Set when applying a logged write failed (see [`EngineError::Failed`]).
    failed: parking_lot::Mutex<Option<String>>,
}

/// The storage engine. Share it with `Arc`; call [`Engine::close`] to stop
/// its checkpointer cleanly (a final checkpoint).
pub struct Engine {
    inner: Arc<Inner>,
    checkpointer: parking_lot::Mutex<Option<JoinHandle<()>>>,
}

/// The critio layers an engine runs on.
pub struct Parts {
    /// The block layer of the device.
    pub block: Arc<BlockLayer>,
    /// The page cache over it.
    pub cache: Arc<PageCache>,
    /// Sync options (inheritance on or off) for the engine's locks.
    pub sync: SyncConfig,
}
