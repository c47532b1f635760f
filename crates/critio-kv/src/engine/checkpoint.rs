//! Checkpoints, recovery, and the checkpointer.
//!
//! ```text
//!  checkpoint:  epoch (exclusive): LSN C, value log (tail T, head P)
//!               flush the value log's pages (non-critical unless someone critical waits)
//!               superblock seq+1 {C, T, P} (durable) ─> space below T reusable, WAL truncated to C
//!  recovery:    newest valid superblock ─> scan the value log [T, P) into the index
//!               WAL records > C replayed ─> a checkpoint
//!  checkpointer: every checkpoint_interval_ms, when the WAL is checkpoint_log_pct full,
//!               when asked; and it cleans first when the value log runs short of space
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::context;
use critio::device::AlignedBuf;
use critio::log::{Log, LogConfig};
use critio::sync::{Condvar, Mutex, RwLock};
use serde::Serialize;

use super::index::{Index, Loc};
use super::layout::{Layout, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSET};
use super::ops::{now_ms, Encoded, Held};
use super::record::{KIND_DEL, KIND_FLUSHALL};
use super::superblock::{Slot, Superblock};
use super::vlog::{Flow, Vlog, Who};
use super::wal::{self, Op};
use super::{Engine, EngineConfig, EngineError, Inner};

/// How often the checkpointer looks at the clock and the log.
const CHECKPOINTER_TICK: Duration = Duration::from_millis(50);

/// The checkpoint sequence, and whether someone asked for a checkpoint
/// (or for cleaning).
pub(crate) struct State {
    seq: u64,
    pub(crate) requested: bool,
    /// A writer was refused for the live-data limit: a pass over the value
    /// log drops the expired keys, which count as live data until the
    /// cleaner drops them ([`Inner::sweep_expired`]).
    pub(crate) sweep: bool,
    /// No sweep before this: each sweep that drops nothing doubles the
    /// gap (up to [`SWEEP_GAP_MAX`]), so a store full of live keys is not
    /// rewritten over and over while writers keep being refused.
    sweep_after: Option<Instant>,
    sweep_gap: Duration,
}

/// The gap after a sweep that dropped expired keys, and the longest.
const SWEEP_GAP_MIN: Duration = Duration::from_secs(1);
const SWEEP_GAP_MAX: Duration = Duration::from_secs(64);

/// Background jobs in progress.
#[derive(Default)]
pub(crate) struct Background {
    snapshot: bool,
    rewrite: bool,
    pub(crate) stats: BackgroundStats,
}

/// How far a running BGSAVE or BGREWRITEAOF has gone, updated as it goes
/// through the value log (relaxed atomics: INFO reads a recent value, and
/// the job pays one store per record).
#[derive(Default)]
pub(crate) struct JobProgress {
    /// Bytes of the value log the job goes through, and has gone through.
    total: AtomicU64,
    done: AtomicU64,
    /// Keys written to the dump (BGSAVE) or live records copied
    /// (BGREWRITEAOF) so far, and the keys there were at the point the job
    /// reads up to (none of the keys it processes came later).
    keys: AtomicU64,
    keys_total: AtomicU64,
}

impl JobProgress {
    /// A job starts: nothing known yet.
    fn start(&self) {
        for a in [&self.total, &self.done, &self.keys, &self.keys_total] {
            a.store(0, Ordering::Relaxed);
        }
    }

    /// It goes through `bytes` of the value log, written while the store
    /// held `keys` keys. Called once, before the first
    /// [`JobProgress::advance`], under the epoch lock that fixed the range.
    pub(crate) fn set_total(&self, bytes: u64, keys: u64) {
        self.total.store(bytes, Ordering::Relaxed);
        self.keys_total.store(keys, Ordering::Relaxed);
    }

    /// It has gone through `bytes` of them and written or copied `keys`.
    /// Released with `done`: a reader that sees this `done` sees the
    /// totals set before it and these keys.
    pub(crate) fn advance(&self, bytes: u64, keys: u64) {
        self.keys.store(keys, Ordering::Relaxed);
        self.done.store(bytes, Ordering::Release);
    }

    fn read(&self) -> Progress {
        let done = self.done.load(Ordering::Acquire);
        let total = self.total.load(Ordering::Relaxed);
        Progress {
            fraction: if total == 0 {
                0.0
            } else {
                (done as f64 / total as f64).min(1.0)
            },
            keys_processed: self.keys.load(Ordering::Relaxed),
            keys_total: self.keys_total.load(Ordering::Relaxed),
        }
    }
}

/// A running BGSAVE's or BGREWRITEAOF's progress (INFO's
/// `current_fork_perc` and `current_save_keys_*`, named as Redis names
/// its child's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Progress {
    /// The share of its part of the value log gone through, 0 to 1 (the
    /// work is reading it: a BGSAVE reads every record between the log's
    /// tail and its head as of the BGSAVE, a rewrite every one from the
    /// clean tail to the head as of the rewrite).
    pub fraction: f64,
    /// Keys written to the dump (BGSAVE) or live records copied
    /// (BGREWRITEAOF) so far.
    pub keys_processed: u64,
    /// Keys in the store when the job fixed the part of the log it goes
    /// through (a BGSAVE at its snapshot, a rewrite when it starts
    /// reading): every key it processes is one of them.
    pub keys_total: u64,
}

/// What one checkpoint did.
#[derive(Clone, Copy, Debug, Default, Serialize)]
pub struct CheckpointReport {
    /// Log records up to this LSN are in the checkpoint.
    pub lsn: u64,
    /// How long it took, in ms.
    pub duration_ms: f64,
}

/// Counters of the background work.
#[derive(Clone, Debug, Default, Serialize)]
pub struct BackgroundStats {
    /// Checkpoints completed.
    pub checkpoints: u64,
    /// Their total duration, in ms.
    pub checkpoint_ms_total: f64,
    /// The longest, in ms.
    pub checkpoint_ms_max: f64,
    /// The last checkpoint's LSN.
    pub last_checkpoint_lsn: u64,
    /// Checkpoints that failed.
    pub checkpoint_errors: u64,
    /// Snapshots (BGSAVE) completed.
    pub snapshots: u64,
    /// The last snapshot's duration, in ms, and its key count.
    pub last_snapshot_ms: f64,
    /// Keys written by the last snapshot.
    pub last_snapshot_keys: u64,
    /// The last snapshot's body as stored in the dump file (compressed).
    pub last_snapshot_bytes: u64,
    /// The same entries before compression.
    pub last_snapshot_raw_bytes: u64,
    /// Value-log rewrites (BGREWRITEAOF) completed.
    pub rewrites: u64,
    /// Records the last rewrite copied (live ones).
    pub last_rewrite_records: u64,
    /// Records the cleaner copied in all (rewrites and cleaning for space).
    pub cleaned_records: u64,
    /// Value-log bytes the cleaner went through in all.
    pub cleaned_bytes: u64,
    /// Passes over the value log that dropped expired keys because a
    /// writer was refused for the live-data limit.
    pub expiry_sweeps: u64,
    /// The last background error, if any.
    pub last_error: Option<String>,
}

/// Reads both superblock slots: the newest valid one, if any.
/// The current checkpoint's superblock, of the two slots `read` returns
/// (given each one's offset): the valid one with the higher sequence, if
/// any; refused if a slot holds another format version.
pub(crate) fn current_superblock(
    mut read: impl FnMut(u64) -> Result<Vec<u8>, EngineError>,
) -> Result<Option<Superblock>, EngineError> {
    let mut best: Option<Superblock> = None;
    for i in 0..2 {
        let buf = read(SUPERBLOCK_OFFSET + i * SUPERBLOCK_BYTES)?;
        match Superblock::decode(&buf) {
            Slot::Valid(sb) if best.is_none_or(|b| sb.seq > b.seq) => best = Some(sb),
            Slot::OtherVersion(v) => {
                return Err(EngineError::Config(format!(
                    "the store was written by another version of critio-kv (format {v}); \
                     use that version, or start with an empty device"
                )))
            }
            _ => {}
        }
    }
    Ok(best)
}

fn load_superblock(
    block: &critio::block::BlockLayer,
    layout: &Layout,
) -> Result<Option<Superblock>, EngineError> {
    let best = current_superblock(|at| {
        Ok(block
            .read(at, SUPERBLOCK_BYTES as usize)?
            .as_slice()
            .to_vec())
    })?;
    if let Some(sb) = best {
        if sb.vlog_bytes != layout.data.1 * layout.page || u64::from(sb.page_bytes) != layout.page {
            return Err(EngineError::Config(format!(
                "the store was created with a {}-byte value log of {}-byte pages, this layout has \
                 {} of {}: use the same device size and engine.log_bytes / engine.dump_pct",
                sb.vlog_bytes,
                sb.page_bytes,
                layout.data.1 * layout.page,
                layout.page
            )));
        }
    }
    Ok(best)
}

/// A new store on a device that allocates blocks on their first write (a
/// file) has its dump file and value log written with zeros once, as the
/// log does its ring: a value log is written over lap after lap, and a
/// file's block written for the first time (a hole, or one reserved but
/// still unwritten) changes the file's metadata, which the next
/// `fdatasync` of every commit then writes too, behind the background
/// writes (on this project's machine, a commit's p99.9 under a 160 MiB/s
/// writer was 1.0 ms into reserved blocks, 0.6 ms into written ones).
/// Only when both the superblocks and the log's header are blank: nothing
/// of a store is there to lose. Before the log is formatted, so a crash
/// midway leaves it blank and the next open writes them again.
fn write_regions_once(
    block: &critio::block::BlockLayer,
    layout: &Layout,
) -> Result<(), EngineError> {
    let start = layout.dump.0;
    let end = layout.data.0 + layout.data.1 * layout.page;
    block.write_zeros(start, end - start)?;
    block.flush()?;
    Ok(())
}

/// Whether the log's header block is all zeros, which is when the log
/// formats its region (read a device block's worth: never blank where the
/// log's own, possibly smaller, header block is not).
fn log_is_blank(block: &critio::block::BlockLayer, layout: &Layout) -> Result<bool, EngineError> {
    let len = block.device().info().block_size.max(4096) as usize;
    let head = block.read(layout.log.0, len)?;
    Ok(head.as_slice().iter().all(|&b| b == 0))
}

impl Engine {
    /// Opens (or creates) the store on `stack`: lays out the device
    /// (superblocks, log, dump file, value log; each region checked by the
    /// stack; a new store on a file has its regions written once with
    /// zeros), reads the newest checkpoint, rebuilds the index from the
    /// value log, replays the WAL after it, takes a checkpoint, and starts
    /// the checkpointer. The stack's `[log]` section gives the WAL's
    /// limits; its region is the engine's layout.
    pub fn open(stack: &critio::Stack, cfg: EngineConfig) -> Result<Engine, EngineError> {
        let log_base = stack.config().log;
        cfg.validate()?;
        let record_min = (cfg.value_bytes_max + cfg.key_bytes_max + 64) as u64;
        if log_base.record_bytes_max < record_min {
            return Err(EngineError::Config(format!(
                "log.record_bytes_max ({}) must hold a write of the largest key and value ({record_min} bytes): \
                 raise it or lower engine.value_bytes_max",
                log_base.record_bytes_max
            )));
        }
        let capacity = stack.capacity();
        let layout = Layout::new(capacity, cfg.log_bytes, cfg.dump_pct, 4096)?;
        let vlog_bytes = layout.data.1 * layout.page;
        let record_max = super::record::size(cfg.key_bytes_max, cfg.value_bytes_max);
        if (record_max as u64) * 16 > vlog_bytes {
            return Err(EngineError::Config(format!(
                "the value log ({vlog_bytes} bytes) must hold at least 16 of the largest records \
                 ({record_max} bytes): use a larger device or lower engine.value_bytes_max"
            )));
        }
        stack.reserve("superblocks", SUPERBLOCK_OFFSET, 2 * SUPERBLOCK_BYTES)?;
        let data = stack.add_file_at("data", layout.data.0, vlog_bytes)?;
        let dump = stack.add_file_at("dump", layout.dump.0, layout.dump.1)?;
        let sb = load_superblock(stack.block(), &layout)?;
        let log_cfg = LogConfig {
            region_offset_bytes: layout.log.0,
            region_bytes: layout.log.1,
            ..log_base
        };
        if sb.is_none()
            && stack.block().device().info().allocates_on_first_write
            && log_is_blank(stack.block(), &layout)?
        {
            write_regions_once(stack.block(), &layout)?;
        }
        let (log, recovery) = stack.open_log_with(&log_cfg)?;
        let opts = |name| stack.sync_options(name);
        let range = sb.map_or((0, 0), |s| (s.tail, s.head));
        let vlog = Vlog::new(
            stack.cache().clone(),
            data,
            vlog_bytes,
            cfg.live_max_pct,
            record_max,
            range,
            opts,
        );
        let inner = Arc::new(Inner {
            cfg,
            layout,
            block: stack.block().clone(),
            cache: stack.cache().clone(),
            dump,
            log,
            epoch: RwLock::with_options((), opts("kv: epoch")),
            index: Index::new(opts("kv: key")),
            vlog,
            cleaner: Mutex::with_options((), opts("kv: cleaner")),
            ckpt: Mutex::with_options(
                State {
                    seq: sb.map_or(0, |s| s.seq),
                    requested: false,
                    sweep: false,
                    sweep_after: None,
                    sweep_gap: SWEEP_GAP_MIN,
                },
                opts("kv: checkpoint"),
            ),
            ckpt_cv: Condvar::with_options(opts("kv: checkpoint request")),
            bg: Mutex::with_options(Background::default(), opts("kv: background")),
            progress: Default::default(),
            closing: AtomicBool::new(false),
            failed: std::sync::OnceLock::new(),
            #[cfg(test)]
            inject_panic: parking_lot::Mutex::new(None),
        });
        inner.load_index(range)?;
        let after = sb.map_or(0, |s| s.lsn);
        for (lsn, payload) in recovery.records.iter().filter(|(l, _)| *l > after) {
            let ops = wal::decode(payload)
                .ok_or_else(|| EngineError::Corrupt(format!("log record {lsn} does not decode")))?;
            inner.replay(&ops)?;
        }
        inner.checkpoint()?;
        let checkpointer = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("kv-checkpointer".into())
                .spawn(move || {
                    let _ = inner.guarded("kv-checkpointer", || inner.clone().checkpointer());
                })
                .expect("cannot spawn the checkpointer")
        };
        Ok(Engine {
            inner,
            checkpointer: parking_lot::Mutex::new(Some(checkpointer)),
        })
    }

    /// Takes a checkpoint now, in the caller's thread (SAVE).
    pub fn save(&self) -> Result<CheckpointReport, EngineError> {
        self.inner.checkpoint()
    }

    /// Starts a snapshot of every key to the dump file (BGSAVE).
    pub fn bgsave(&self) -> Result<(), EngineError> {
        self.inner.clone().start_job(true)
    }

    /// Starts a rewrite of the value log: every live record written before
    /// it started is copied to the head, expired keys are dropped, and the
    /// space of the rest becomes free (BGREWRITEAOF).
    pub fn bgrewrite(&self) -> Result<(), EngineError> {
        self.inner.clone().start_job(false)
    }

    /// Counters of the background work.
    pub fn background_stats(&self) -> BackgroundStats {
        self.inner.bg.lock().stats.clone()
    }

    /// Whether a BGSAVE or BGREWRITEAOF is running.
    pub fn background_running(&self) -> (bool, bool) {
        let bg = self.inner.bg.lock();
        (bg.snapshot, bg.rewrite)
    }

    /// How far the running BGSAVE and BGREWRITEAOF have gone (None for
    /// one that is not running).
    pub fn background_progress(&self) -> (Option<Progress>, Option<Progress>) {
        let bg = self.inner.bg.lock();
        let [snapshot, rewrite] = &self.inner.progress;
        (
            bg.snapshot.then(|| snapshot.read()),
            bg.rewrite.then(|| rewrite.read()),
        )
    }

    /// Stops the checkpointer after a final checkpoint. Further writes fail.
    pub fn close(&self) -> Result<(), EngineError> {
        self.inner.closing.store(true, Ordering::SeqCst);
        self.inner.ckpt_cv.notify_all();
        if let Some(t) = self.checkpointer.lock().take() {
            let _ = t.join();
        }
        while self.background_running() != (false, false) {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.inner.checkpoint().map(|_| ())
    }

    /// The layout on the device.
    pub fn layout(&self) -> Layout {
        self.inner.layout
    }

    /// The value log's space: (live bytes, bytes between its tail and
    /// head, its size).
    pub fn space(&self) -> (u64, u64, u64) {
        let v = &self.inner.vlog;
        (v.live(), v.span(), v.region())
    }

    /// The log's stats.
    pub fn log(&self) -> &Log {
        &self.inner.log
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        self.inner.closing.store(true, Ordering::SeqCst);
        self.inner.ckpt_cv.notify_all();
        if let Some(t) = self.checkpointer.lock().take() {
            let _ = t.join();
        }
    }
}

impl Inner {
    /// Rebuilds the index from the value log's records in `[tail, head)`:
    /// the last record of each key wins (a deletion removes it).
    fn load_index(&self, (tail, head): (u64, u64)) -> Result<(), EngineError> {
        let (mut live, mut keys) = (0i64, 0i64);
        self.vlog.scan(tail, head, |addr, r, stored| {
            let size = stored.len() as u32;
            match r.kind {
                KIND_FLUSHALL => {
                    for s in 0..super::index::STRIPES {
                        self.index.lock(s).clear(false);
                    }
                    (live, keys) = (0, 0);
                }
                KIND_DEL => {
                    let old = self
                        .index
                        .lock(Index::stripe_of(r.key))
                        .set(r.key, None, false);
                    if let Some(o) = old {
                        live -= i64::from(o.size);
                        keys -= 1;
                    }
                }
                kind => {
                    let loc = Loc {
                        addr,
                        size,
                        kind,
                        expire_at_ms: r.expire_at_ms,
                    };
                    let stripe = Index::stripe_of(r.key);
                    match self.index.lock(stripe).set(r.key, Some(loc), false) {
                        Some(o) => live += i64::from(size) - i64::from(o.size),
                        None => {
                            live += i64::from(size);
                            keys += 1;
                        }
                    }
                }
            }
            Ok(Flow::Continue)
        })?;
        self.vlog.add_live(live);
        self.index.set_count(keys as u64);
        Ok(())
    }

    /// Applies replayed operations (no logging: they are in the WAL).
    fn replay(&self, ops: &[Op]) -> Result<(), EngineError> {
        if ops.iter().any(|op| matches!(op, Op::FlushAll)) {
            for op in ops {
                match op {
                    Op::FlushAll => self.reset_all()?,
                    other => self.replay(std::slice::from_ref(other))?,
                }
            }
            return Ok(());
        }
        let keys: Vec<&[u8]> = ops
            .iter()
            .map(|op| match op {
                Op::Put(e) => &e.key[..],
                Op::Del(k) => &k[..],
                Op::FlushAll => unreachable!("handled above"),
            })
            .collect();
        let mut held = Held::lock(&self.index, &keys);
        let enc = Encoded::of(ops);
        let bytes = enc.bytes.len() as u64;
        let mut res = loop {
            if let Some(r) = self
                .vlog
                .try_reserve(bytes, enc.largest(), 0, Who::Cleaner)?
            {
                break r;
            }
            // Recovery writes more than the log holds: clean (the space
            // becomes reusable at the next checkpoint, which this takes).
            drop(held);
            self.clean_for_space()?;
            held = Held::lock(&self.index, &keys);
        };
        self.apply(ops, &enc, &mut res, &mut held)
    }

    /// Empties the store: appends a FLUSHALL record and clears the index
    /// (every stripe is held by the caller, or this is recovery).
    fn reset_all(&self) -> Result<(), EngineError> {
        let enc = Encoded::of(&[Op::FlushAll]);
        let mut res = loop {
            if let Some(r) =
                self.vlog
                    .try_reserve(enc.bytes.len() as u64, enc.largest(), 0, Who::Cleaner)?
            {
                break r;
            }
            self.clean_for_space()?;
        };
        let (_, snapshot) = self.vlog.append(&mut res, &enc.bytes, &enc.sizes)?;
        for s in 0..super::index::STRIPES {
            let (_, bytes) = self.index.lock(s).clear(snapshot);
            self.vlog.add_live(-(bytes as i64));
        }
        self.index.set_count(0);
        Ok(())
    }

    /// FLUSHALL.
    pub(crate) fn flushall(&self) -> Result<(), EngineError> {
        let payload = wal::encode(&[Op::FlushAll]);
        let enc = Encoded::of(&[Op::FlushAll]);
        let bytes = enc.bytes.len() as u64;
        loop {
            // Every stripe first (in order, like any writer), then the epoch.
            let mut stripes: Vec<_> = (0..super::index::STRIPES)
                .map(|s| self.index.lock(s))
                .collect();
            let reserved = self
                .vlog
                .try_reserve(bytes, enc.largest(), 0, Who::Writer)?;
            let Some(mut res) = reserved else {
                drop(stripes);
                self.vlog
                    .wait_for_space(bytes, enc.largest(), || self.want_cleaning());
                continue;
            };
            let epoch = self.epoch.read();
            let Some(lsn) = self.log.try_append(&payload)? else {
                drop((res, epoch, stripes));
                self.log.wait_for_space(payload.len())?;
                continue;
            };
            let (_, snapshot) = match self.vlog.append(&mut res, &enc.bytes, &enc.sizes) {
                Ok(x) => x,
                Err(e) => {
                    self.fail(e.to_string());
                    return Err(e);
                }
            };
            for s in stripes.iter_mut() {
                let (_, freed) = s.clear(snapshot);
                self.vlog.add_live(-(freed as i64));
            }
            self.index.set_count(0);
            drop((res, epoch, stripes));
            return self.commit_or_defer(lsn);
        }
    }

    /// Takes a checkpoint (one at a time).
    /// Fails, taking none, once the engine failed: the state in memory
    /// may not be what the log says, and a restart recovers from the last
    /// checkpoint and the WAL.
    pub(crate) fn checkpoint(&self) -> Result<CheckpointReport, EngineError> {
        if let Some(e) = self.failure() {
            return Err(e);
        }
        let mut st = self.ckpt.lock();
        let started = Instant::now();
        let result = self.checkpoint_locked(&mut st);
        let ms = started.elapsed().as_secs_f64() * 1e3;
        let mut bg = self.bg.lock();
        match &result {
            Ok(lsn) => {
                bg.stats.checkpoints += 1;
                bg.stats.checkpoint_ms_total += ms;
                bg.stats.checkpoint_ms_max = bg.stats.checkpoint_ms_max.max(ms);
                bg.stats.last_checkpoint_lsn = *lsn;
            }
            Err(e) => {
                bg.stats.checkpoint_errors += 1;
                bg.stats.last_error = Some(format!("checkpoint: {e}"));
            }
        }
        drop(bg);
        // A checkpoint the device failed (its flush of the value log's
        // pages, the superblock's write or flush, the log's truncation)
        // fails the engine, as Redis stops taking writes when a save
        // fails: no space in the log or the value log comes back without
        // one, so writers waiting for room would wait for good on a dead
        // device; now they, and every later write, get the error.
        // Acknowledged writes are in the log: a restart recovers them.
        if let Err(e @ (EngineError::Cache(_) | EngineError::Block(_) | EngineError::Log(_))) =
            &result
        {
            self.fail(format!("checkpoint: {e}"));
        }
        result.map(|lsn| CheckpointReport {
            lsn,
            duration_ms: ms,
        })
    }

    fn checkpoint_locked(&self, st: &mut State) -> Result<u64, EngineError> {
        let (lsn, (tail, head)) = {
            let _epoch = self.epoch.write();
            // Asked again under the lock: whoever fails the engine (a
            // writer, the cleaner) does so while holding it shared.
            if let Some(e) = self.failure() {
                return Err(e);
            }
            (self.log.next_lsn() - 1, self.vlog.boundary())
        };
        self.cache.flush_file(self.vlog.file())?;
        let sb = Superblock {
            seq: st.seq + 1,
            lsn,
            tail,
            head,
            vlog_bytes: self.vlog.region(),
            page_bytes: self.layout.page as u32,
        };
        let slot = SUPERBLOCK_OFFSET + (sb.seq % 2) * SUPERBLOCK_BYTES;
        let image = AlignedBuf::from_slice(&sb.encode(SUPERBLOCK_BYTES as usize));
        self.block.write(slot, image)?;
        self.block.flush()?;
        st.seq = sb.seq;
        self.vlog.checkpoint_durable(tail);
        self.log.truncate(lsn)?;
        Ok(lsn)
    }

    /// The checkpointer: cleans when writers run short of value-log space,
    /// and checkpoints every `checkpoint_interval_ms`, when the WAL is
    /// `checkpoint_log_pct` full, or when asked.
    fn checkpointer(self: Arc<Self>) {
        context::set_background();
        self.log.register_space_helper(context::current());
        self.vlog.register_space_helper(context::current());
        let interval = Duration::from_millis(self.cfg.checkpoint_interval_ms);
        let mut last = Instant::now();
        loop {
            {
                let st = self.ckpt.lock();
                if !st.requested {
                    let (st, _) = self.ckpt_cv.wait_timeout(st, CHECKPOINTER_TICK);
                    drop(st);
                }
            }
            if self.closing.load(Ordering::SeqCst) {
                return;
            }
            if self.short_of_space() {
                if let Err(e) = self.clean_for_space() {
                    self.bg.lock().stats.last_error = Some(format!("cleaner: {e}"));
                }
            }
            if self.sweep_due() {
                if let Err(e) = self.sweep_expired() {
                    self.bg.lock().stats.last_error = Some(format!("expiry sweep: {e}"));
                }
            }
            let log_full = self.log.used_pct() >= self.cfg.checkpoint_log_pct as f64;
            let due = !interval.is_zero() && last.elapsed() >= interval;
            let requested = std::mem::take(&mut self.ckpt.lock().requested);
            if log_full || due || requested {
                #[cfg(test)]
                self.injected_panic("kv-checkpointer");
                let _ = self.checkpoint(); // counted in the stats
                last = Instant::now();
            }
        }
    }

    /// Whether a sweep was asked for and its gap has passed (it is then
    /// no longer asked for).
    fn sweep_due(&self) -> bool {
        let mut st = self.ckpt.lock();
        let due = st.sweep && st.sweep_after.is_none_or(|t| Instant::now() >= t);
        if due {
            st.sweep = false;
        }
        due
    }

    /// Drops the expired keys: one cleaning pass over the whole value log
    /// (live records are copied to the head, as BGREWRITEAOF does), then a
    /// checkpoint, so the space and the live-data budget they held come
    /// back. Expired keys count as live data until the cleaner drops them,
    /// and it otherwise runs only when the log is short of space: a store
    /// whose live data had all expired refused new keys for good.
    pub(crate) fn sweep_expired(&self) -> Result<(), EngineError> {
        let done = self.clean(self.vlog.head(), None)?;
        self.checkpoint()?;
        let mut st = self.ckpt.lock();
        st.sweep_gap = if done.expired > 0 {
            SWEEP_GAP_MIN
        } else {
            (st.sweep_gap * 2).min(SWEEP_GAP_MAX)
        };
        st.sweep_after = Some(Instant::now() + st.sweep_gap);
        drop(st);
        self.bg.lock().stats.expiry_sweeps += 1;
        Ok(())
    }

    /// Starts BGSAVE (`snapshot`) or BGREWRITEAOF on a thread of its own.
    fn start_job(self: Arc<Self>, snapshot: bool) -> Result<(), EngineError> {
        {
            let mut bg = self.bg.lock();
            let running = if snapshot {
                &mut bg.snapshot
            } else {
                &mut bg.rewrite
            };
            if *running {
                return Err(EngineError::Busy(if snapshot {
                    "Background save already in progress"
                } else {
                    "Background append only file rewriting already in progress"
                }));
            }
            *running = true;
            self.progress[usize::from(!snapshot)].start();
        }
        // A snapshot is of the moment BGSAVE is called, like Redis's fork.
        // Under the epoch lock no append is copying: every record the
        // snapshot reads is whole.
        // The keys it may write are those there are now, and the keys
        // that have expired are those that have now: its clock is read
        // here, not when its thread starts, or a key live at this moment
        // that expired before then would be left out of a dump that holds
        // no later write.
        let range = snapshot.then(|| {
            let _epoch = self.epoch.write();
            let (from, to) = self.vlog.begin_snapshot();
            self.progress[0].set_total(to - from, self.index.keys());
            ((from, to), now_ms())
        });
        let name = if snapshot {
            "kv-bgsave"
        } else {
            "kv-bgrewrite"
        };
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                context::set_background();
                // A panic is in the stats already (`guarded`).
                let result = self.guarded(name, || {
                    #[cfg(test)]
                    self.injected_panic(name);
                    match range {
                        Some((range, now)) => self.snapshot(range, now),
                        None => self.rewrite(),
                    }
                });
                let mut bg = self.bg.lock();
                if let Ok(Err(e)) = result {
                    bg.stats.last_error = Some(format!("{name}: {e}"));
                }
                if snapshot {
                    bg.snapshot = false;
                } else {
                    bg.rewrite = false;
                }
            })
            .expect("cannot spawn a background job");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{mpsc, Arc};
    use std::time::Duration;

    use critio::context::BlockingStatus;
    use critio::device::mem::MemDevice;

    use crate::engine::clean::tests::{open, open_over, open_with, wait_until, FailingMem};
    use crate::engine::{EngineError, SetOptions};

    fn key(i: usize) -> Vec<u8> {
        format!("k{i:05}").into_bytes()
    }

    fn value(i: usize) -> Vec<u8> {
        vec![i as u8; 16 << 10]
    }

    /// Polls `done` every millisecond for up to 30 s.
    /// A thread that writes new keys until a write is refused; returns
    /// once it waits for room in the WAL or the value log (the caller holds
    /// the checkpointer back). It reports how many writes were
    /// acknowledged, and the error.
    fn write_until_refused(
        e: &Arc<crate::engine::Engine>,
    ) -> (
        std::thread::JoinHandle<()>,
        mpsc::Receiver<(usize, EngineError)>,
    ) {
        let (tx, rx) = mpsc::channel();
        let (done_tx, done) = mpsc::channel();
        let writer = {
            let e = e.clone();
            std::thread::spawn(move || {
                tx.send(critio::context::current()).unwrap();
                let mut acked = 0;
                let err = loop {
                    match e.set(&key(acked), &value(acked), SetOptions::default()) {
                        Ok(_) => acked += 1,
                        Err(err) => break err,
                    }
                };
                done_tx.send((acked, err)).unwrap();
            })
        };
        let task = rx.recv().unwrap();
        wait_until("the writer waits for room", || {
            matches!(task.blocking_status(), Some(BlockingStatus::Condvar { name })
                if name == critio::log::SPACE_POINT || name == "kv: space")
        });
        (writer, done)
    }

    fn assert_failed(e: &EngineError, thread: &str) {
        let why = format!("{thread} panicked: a panic injected into {thread}");
        assert!(matches!(e, EngineError::Failed(w) if *w == why), "{e}");
        assert!(
            e.to_string().contains("restart to recover from the log"),
            "{e}"
        );
    }

    /// The checkpointer dies while a writer waits for it to make room: the
    /// writer gets the engine's failure instead of waiting forever, reads
    /// go on, and every acknowledged write is there after a restart.
    #[test]
    fn a_checkpointer_that_panics_fails_the_writers_waiting_for_room_and_loses_nothing() {
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = Arc::new(open(&dev));
        // Hold the checkpointer back until the writer waits for room.
        let held = e.inner.ckpt.lock();
        let (writer, done) = write_until_refused(&e);
        *e.inner.inject_panic.lock() = Some("kv-checkpointer");
        drop(held);
        let (acked, err) = done
            .recv_timeout(Duration::from_secs(60))
            .expect("the writer still waits for room a minute after the checkpointer died");
        assert_failed(&err, "kv-checkpointer");
        assert!(acked > 100, "{acked} writes before the log filled");
        let later = e.set(b"later", b"x", SetOptions::default()).unwrap_err();
        assert_failed(&later, "kv-checkpointer");
        assert_failed(&e.save().unwrap_err(), "kv-checkpointer");
        for i in (0..acked).step_by(17) {
            assert_eq!(e.get(&key(i)).unwrap(), Some(value(i)), "key {i}");
        }
        let stats = e.background_stats();
        assert!(
            stats
                .last_error
                .as_deref()
                .unwrap()
                .starts_with("kv-checkpointer panicked"),
            "{stats:?}"
        );
        assert_failed(&e.close().unwrap_err(), "kv-checkpointer");
        // Its clone of the engine goes with the thread, after it reported.
        writer.join().unwrap();
        drop(Arc::into_inner(e).unwrap());
        let e = open(&dev);
        for i in 0..acked {
            assert_eq!(e.get(&key(i)).unwrap(), Some(value(i)), "key {i}");
        }
        assert_eq!(e.get(b"later").unwrap(), None);
    }

    /// The device dies while a writer waits for room in the log or the
    /// value log: no checkpoint can make room any more, and the first one
    /// that fails fails the engine, so the writer gets an error instead of
    /// waiting for good (it used to: a failed checkpoint was only counted),
    /// and so does every later write; nothing acknowledged is lost.
    #[test]
    fn a_checkpoint_the_device_fails_fails_the_writers_waiting_for_room() {
        let dev = FailingMem::new();
        let e = Arc::new(open_over(dev.clone()).unwrap());
        let held = e.inner.ckpt.lock();
        let (writer, done) = write_until_refused(&e);
        dev.fail("the disk is gone", |op, _| op != critio::device::Op::Read);
        drop(held);
        let (acked, err) = done
            .recv_timeout(Duration::from_secs(30))
            .expect("the writer still waits for room 30 s after the device died");
        assert!(
            matches!(&err, EngineError::Failed(why) if why.contains("the disk is gone")),
            "{err}"
        );
        assert!(acked > 100, "{acked} writes before the log filled");
        assert!(matches!(
            e.set(b"later", b"x", SetOptions::default()),
            Err(EngineError::Failed(_))
        ));
        writer.join().unwrap();
        drop(Arc::into_inner(e).unwrap());
        dev.heal();
        let e = open_over(dev).unwrap();
        for i in 0..acked {
            assert_eq!(e.get(&key(i)).unwrap(), Some(value(i)), "key {i}");
        }
        assert_eq!(e.get(b"later").unwrap(), None);
    }

    /// A key live when BGSAVE is called is in the dump even if it expires
    /// before the job's thread starts (held back here): the dump's clock is
    /// read at the call, with its range of the value log. Read as the
    /// thread began, it left out the key, and a dump that held no write
    /// after the call held none of that moment either.
    #[test]
    fn a_key_live_when_bgsave_is_called_is_dumped_if_it_expires_before_the_job_starts() {
        use crate::engine::ops::now_ms;
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = open(&dev);
        let expire = now_ms() + 300;
        let ttl = SetOptions {
            expire_at_ms: Some(expire),
            ..SetOptions::default()
        };
        e.set(b"ttl", b"live at the call", ttl).unwrap();
        e.set(b"plain", b"x", SetOptions::default()).unwrap();
        // The job's thread looks for an injected panic first: it waits.
        let hold = e.inner.inject_panic.lock();
        e.bgsave().unwrap();
        assert!(now_ms() < expire, "the key is live when BGSAVE returns");
        while now_ms() <= expire + 20 {
            std::thread::sleep(Duration::from_millis(10));
        }
        drop(hold);
        wait_until("the BGSAVE ends", || {
            e.background_running() == (false, false)
        });
        let mut keys: Vec<Vec<u8>> = e.read_dump().unwrap().into_iter().map(|x| x.key).collect();
        keys.sort();
        assert_eq!(keys, [b"plain".to_vec(), b"ttl".to_vec()]);
        e.close().unwrap();
    }

    /// A writer waiting for room in the value log asks the checkpointer to
    /// clean without holding the value log's lock: a checkpoint holds the
    /// checkpointer's lock while it takes the value log's (its boundary,
    /// then to free the space), so a writer that asked holding it, while a
    /// checkpoint ran, deadlocked with it, and with them every writer, the
    /// cleaner and BGSAVE. Here the test holds the checkpointer's lock, as
    /// a checkpoint does, and reads the boundary, as it does next.
    #[test]
    fn a_writer_waiting_for_room_asks_for_cleaning_without_the_value_logs_lock() {
        use crate::engine::EngineConfig;
        // A value log of about 2.6 MiB behind an 8 MiB log: the value log
        // fills first.
        let cfg = EngineConfig {
            log_bytes: 8 << 20,
            checkpoint_interval_ms: 0,
            value_bytes_max: 64 << 10,
            ..EngineConfig::default()
        };
        let e = Arc::new(open_with(Arc::new(MemDevice::new(12 << 20)), cfg).unwrap());
        let held = e.inner.ckpt.lock();
        let (tx, rx) = mpsc::channel();
        let writer = {
            let e = e.clone();
            std::thread::spawn(move || {
                let _fg = critio::context::foreground();
                tx.send(critio::context::current()).unwrap();
                // One key: everything but its last value is garbage, so
                // the cleaner makes room once it may.
                for i in 0..400 {
                    e.set(b"k", &value(i), SetOptions::default()).unwrap();
                }
            })
        };
        let task = rx.recv().unwrap();
        wait_until("the writer asks for cleaning", || {
            matches!(task.blocking_status(), Some(BlockingStatus::Lock { name })
                if name == "kv: checkpoint")
        });
        let (done_tx, done) = mpsc::channel();
        let boundary = {
            let e = e.clone();
            std::thread::spawn(move || {
                done_tx.send(e.inner.vlog.boundary()).unwrap();
            })
        };
        let got = done.recv_timeout(Duration::from_secs(10));
        drop(held); // (lets a writer that held the lock go on)
        got.expect("the value log's lock is held by a writer waiting for the checkpointer's");
        boundary.join().unwrap();
        writer.join().unwrap();
        assert_eq!(e.get(b"k").unwrap(), Some(value(399)));
        drop(Arc::into_inner(e).unwrap());
    }

    /// A BGSAVE or BGREWRITEAOF that panics ends (a new one may be asked
    /// for) and fails the engine, as Redis stops taking writes after a
    /// failed background save; acknowledged writes survive a restart.
    #[test]
    fn a_background_job_that_panics_ends_and_fails_the_engine() {
        for (job, thread) in [(0, "kv-bgsave"), (1, "kv-bgrewrite")] {
            let dev = Arc::new(MemDevice::new(32 << 20));
            let e = open(&dev);
            for i in 0..50 {
                e.set(&key(i), &value(i), SetOptions::default()).unwrap();
            }
            *e.inner.inject_panic.lock() = Some(thread);
            match job {
                0 => e.bgsave().unwrap(),
                _ => e.bgrewrite().unwrap(),
            }
            wait_until("the job ends", || e.background_running() == (false, false));
            let stats = e.background_stats();
            assert_eq!(
                stats.last_error.as_deref(),
                Some(format!("{thread} panicked: a panic injected into {thread}").as_str())
            );
            assert_failed(
                &e.set(b"later", b"x", SetOptions::default()).unwrap_err(),
                thread,
            );
            assert_eq!(e.get(&key(7)).unwrap(), Some(value(7)));
            assert!(e.close().is_err());
            drop(e);
            let e = open(&dev);
            for i in 0..50 {
                assert_eq!(e.get(&key(i)).unwrap(), Some(value(i)), "{thread}: key {i}");
            }
            e.close().unwrap();
        }
    }

    /// A running BGSAVE or BGREWRITEAOF reports how far it has gone: held
    /// at a key halfway through the log (a request holding that key's
    /// stripe), a BGSAVE has written the keys before it and gone through
    /// about half the log; a rewrite has gone part of the way. Neither
    /// reports anything once it has ended.
    #[test]
    fn a_running_job_reports_how_far_it_has_gone() {
        use crate::engine::index::Index;
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = open(&dev);
        for i in 0..50 {
            e.set(&key(i), &value(i), SetOptions::default()).unwrap();
        }
        let held = Index::stripe_of(&key(25));
        assert!(
            (0..25).all(|i| Index::stripe_of(&key(i)) != held),
            "key 25's stripe is its own among the keys before it"
        );
        for job in [0, 1] {
            assert_eq!(e.background_progress(), (None, None));
            let stripe = e.inner.index.lock(held);
            match job {
                0 => e.bgsave().unwrap(),
                _ => e.bgrewrite().unwrap(),
            }
            let at = |e: &crate::engine::Engine| {
                let (snapshot, rewrite) = e.background_progress();
                if job == 0 { snapshot } else { rewrite }.expect("running")
            };
            if job == 0 {
                wait_until("the BGSAVE reaches key 25", || at(&e).keys_processed == 25);
                std::thread::sleep(Duration::from_millis(20));
                let p = at(&e);
                assert_eq!((p.keys_processed, p.keys_total), (25, 50));
                assert!((0.45..0.55).contains(&p.fraction), "{p:?}");
            } else {
                wait_until("the rewrite is under way", || at(&e).fraction > 0.0);
                std::thread::sleep(Duration::from_millis(20));
                let p = at(&e);
                assert!(p.fraction < 1.0 && p.keys_processed < 50, "{p:?}");
                assert_eq!(p.keys_total, 50);
            }
            drop(stripe);
            wait_until("the job ends", || e.background_running() == (false, false));
            assert_eq!(e.background_progress(), (None, None));
        }
        e.close().unwrap();
    }

    /// Keys written after BGSAVE or BGREWRITEAOF was called but before the
    /// job fixed what it reads are in its total: it never reports more
    /// keys processed than its total. (The job is held between the call
    /// and the start of its work by the background lock, and then at its
    /// last key by that key's stripe.)
    #[test]
    fn a_job_counts_in_its_total_the_keys_written_before_it_began_reading() {
        use crate::engine::index::Index;
        let dev = Arc::new(MemDevice::new(64 << 20));
        let e = open(&dev);
        for i in 0..50 {
            e.set(&key(i), &value(i), SetOptions::default()).unwrap();
        }
        let last = (60..1000)
            .find(|&j| (0..60).all(|i| Index::stripe_of(&key(i)) != Index::stripe_of(&key(j))))
            .expect("a key with a stripe of its own");
        for job in [0, 1] {
            std::thread::scope(|s| {
                let bg = e.inner.bg.lock();
                let caller = s.spawn(|| match job {
                    0 => e.bgsave(),
                    _ => e.bgrewrite(),
                });
                std::thread::sleep(Duration::from_millis(100));
                for i in 50..60 {
                    e.set(&key(i), &value(i), SetOptions::default()).unwrap();
                }
                e.set(&key(last), &value(last), SetOptions::default())
                    .unwrap();
                let stripe = e.inner.index.lock(Index::stripe_of(&key(last)));
                drop(bg);
                caller.join().unwrap().unwrap();
                let at = || {
                    let (snapshot, rewrite) = e.background_progress();
                    if job == 0 { snapshot } else { rewrite }.expect("running")
                };
                wait_until("the job is under way", || at().fraction > 0.0);
                std::thread::sleep(Duration::from_millis(50));
                let p = at();
                assert_eq!(p.keys_total, 61, "job {job}: {p:?}");
                assert!(p.keys_processed <= p.keys_total, "job {job}: {p:?}");
                drop(stripe);
                wait_until("the job ends", || e.background_running() == (false, false));
            });
            for i in 50..60 {
                e.del(&[&key(i)[..]]).unwrap();
            }
            e.del(&[&key(last)[..]]).unwrap();
        }
        e.close().unwrap();
    }
}
