//! Checkpoints, recovery, and the background jobs (checkpointer, BGSAVE,
//! BGREWRITEAOF).
//!
//! ```text
//!  checkpoint:  epoch (exclusive): LSN C, new epoch, metadata extent, live bitmap
//!               flush data pages (non-critical unless someone critical waits)
//!               superblock seq+1 (durable) ─> free old pages, truncate log <= C
//!  recovery:    newest valid superblock ─> directory, bitmap, key count
//!               log records > C replayed ─> a checkpoint
//! ```

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::context;
use critio::device::AlignedBuf;
use critio::log::{Log, LogConfig};
use critio::sync::{Condvar, Mutex, RwLock};
use serde::Serialize;

use super::alloc::Allocator;
use super::entry::Reader;
use super::layout::{Layout, SUPERBLOCK_BYTES, SUPERBLOCK_OFFSET};
use super::superblock::Superblock;
use super::wal::{self, Op};
use super::{Engine, EngineConfig, EngineError, Inner, Parts, STRIPES};

const META_MAGIC: &[u8; 4] = b"CKVM";
/// How often the checkpointer looks at the clock and the log.
const CHECKPOINTER_TICK: Duration = Duration::from_millis(50);

/// The checkpoint sequence and the durable checkpoint's metadata extent.
pub(crate) struct State {
    seq: u64,
    meta: Option<(u64, u32)>,
    requested: bool,
}

/// Background jobs in progress.
#[derive(Default)]
pub(crate) struct Background {
    snapshot: bool,
    rewrite: bool,
    pub(crate) stats: BackgroundStats,
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
    /// Index rewrites (BGREWRITEAOF) completed.
    pub rewrites: u64,
    /// Buckets the last rewrite repacked.
    pub last_rewrite_buckets: u64,
    /// The last background error, if any.
    pub last_error: Option<String>,
}

fn encode_meta(dir: &[u64], keys: u64, live: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + 8 * (dir.len() + live.len()));
    out.extend_from_slice(META_MAGIC);
    out.extend_from_slice(&(dir.len() as u32).to_le_bytes());
    out.extend_from_slice(&keys.to_le_bytes());
    out.extend_from_slice(&(live.len() as u64).to_le_bytes());
    for v in dir.iter().chain(live) {
        out.extend_from_slice(&v.to_le_bytes());
    }
    out
}

fn decode_meta(bytes: &[u8]) -> Option<(Vec<u64>, u64, Vec<u64>)> {
    let mut r = Reader(bytes);
    if r.take(4)? != META_MAGIC {
        return None;
    }
    let buckets = r.u32()? as usize;
    let keys = r.u64()?;
    let words = r.u64()? as usize;
    let dir = (0..buckets).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
    let live = (0..words).map(|_| r.u64()).collect::<Option<Vec<_>>>()?;
    Some((dir, keys, live))
}

/// What recovery loaded from the newest checkpoint.
struct Loaded {
    sb: Option<Superblock>,
    dir: Vec<u64>,
    keys: u64,
    alloc: Allocator,
}

fn load_checkpoint(
    parts: &Parts,
    layout: &Layout,
    cfg: &EngineConfig,
) -> Result<Loaded, EngineError> {
    let read = |off: u64, len: usize| -> Result<Vec<u8>, EngineError> {
        Ok(parts.block.read(off, len)?.as_slice().to_vec())
    };
    let slots = [0, 1].map(|i| {
        read(
            SUPERBLOCK_OFFSET + i * SUPERBLOCK_BYTES,
            SUPERBLOCK_BYTES as usize,
        )
    });
    let mut best: Option<Superblock> = None;
    for s in slots {
        if let Some(sb) = Superblock::decode(&s?) {
            if best.is_none_or(|b| sb.seq > b.seq) {
                best = Some(sb);
            }
        }
    }
    let Some(sb) = best else {
        return Ok(Loaded {
            sb: None,
            dir: vec![0; cfg.buckets as usize],
            keys: 0,
            alloc: Allocator::new(layout.data.1),
        });
    };
    if sb.data_pages != layout.data.1 || u64::from(sb.page_bytes) != layout.page {
        return Err(EngineError::Config(format!(
            "the store was created with {} data pages of {} bytes, this layout has {} of {}: \
             use the same device size and engine.log_bytes / engine.dump_pct",
            sb.data_pages, sb.page_bytes, layout.data.1, layout.page
        )));
    }
    let meta_bytes = sb.meta_len.div_ceil(layout.page) * layout.page;
    let raw = read(
        layout.data.0 + sb.meta_page * layout.page,
        meta_bytes as usize,
    )?;
    let meta = &raw[..sb.meta_len as usize];
    if crc32c::crc32c(meta) != sb.meta_crc {
        return Err(EngineError::Corrupt(format!(
            "checkpoint {} metadata checksum",
            sb.seq
        )));
    }
    let (dir, keys, live) = decode_meta(meta)
        .ok_or_else(|| EngineError::Corrupt(format!("checkpoint {} metadata layout", sb.seq)))?;
    Ok(Loaded {
        sb: Some(sb),
        dir,
        keys,
        alloc: Allocator::restore(layout.data.1, &live),
    })
}

impl Engine {
    /// Opens (or creates) the store on `parts`: loads the newest checkpoint,
    /// replays the log after it, takes a checkpoint, and starts the
    /// checkpointer. `log_base` gives the log's settings; its region is the
    /// layout's.
    pub fn open(
        parts: Parts,
        cfg: EngineConfig,
        log_base: LogConfig,
    ) -> Result<Engine, EngineError> {
        cfg.validate()?;
        let record_min = (cfg.value_bytes_max + cfg.key_bytes_max + 64) as u64;
        if log_base.record_bytes_max < record_min {
            return Err(EngineError::Config(format!(
                "log.record_bytes_max ({}) must hold a write of the largest key and value ({record_min} bytes): \
                 raise it or lower engine.value_bytes_max",
                log_base.record_bytes_max
            )));
        }
        let capacity = parts.block.device().info().capacity;
        let layout = Layout::new(capacity, cfg.log_bytes, cfg.dump_pct, 4096)?;
        let data = parts
            .cache
            .add_file("data", layout.data.0, layout.data.1 * layout.page)?;
        let dump = parts.cache.add_file("dump", layout.dump.0, layout.dump.1)?;
        let loaded = load_checkpoint(&parts, &layout, &cfg)?;
        let buckets = loaded.dir.len() as u32;
        let log_cfg = LogConfig {
            region_offset_bytes: layout.log.0,
            region_bytes: layout.log.1,
            ..log_base
        };
        let (log, recovery) = Log::open(parts.block.clone(), &log_cfg, &parts.sync)?;
        let opts = |name| parts.sync.options(name);
        let inner = Arc::new(Inner {
            cfg: EngineConfig { buckets, ..cfg },
            layout,
            block: parts.block,
            cache: parts.cache,
            data,
            dump,
            log,
            epoch: RwLock::with_options((), opts("kv: epoch")),
            stripes: (0..STRIPES)
                .map(|_| Mutex::with_options((), opts("kv: bucket")))
                .collect(),
            directory: loaded.dir.into_iter().map(AtomicU64::new).collect(),
            alloc: Mutex::with_options(loaded.alloc, opts("kv: allocator")),
            keys: AtomicU64::new(loaded.keys),
            ckpt: Mutex::with_options(
                State {
                    seq: loaded.sb.map_or(0, |s| s.seq),
                    meta: loaded
                        .sb
                        .map(|s| (s.meta_page, s.meta_len.div_ceil(layout.page) as u32)),
                    requested: false,
                },
                opts("kv: checkpoint"),
            ),
            ckpt_cv: Condvar::with_options(opts("kv: checkpoint request")),
            bg: Mutex::with_options(Background::default(), opts("kv: background")),
            closing: AtomicBool::new(false),
            failed: parking_lot::Mutex::new(None),
        });
        let after = loaded.sb.map_or(0, |s| s.lsn);
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
                .spawn(move || inner.checkpointer())
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

    /// Starts a rewrite of the index: drops expired keys and repacks
    /// chains (BGREWRITEAOF).
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

    /// Data pages in use and in all.
    pub fn pages(&self) -> (u64, u64) {
        let a = self.inner.alloc.lock();
        (a.in_use(), a.pages())
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
    /// Applies replayed operations (no logging: they are in the log).
    fn replay(&self, ops: &[Op]) -> Result<(), EngineError> {
        for op in ops {
            match op {
                Op::FlushAll => self.reset_all(),
                Op::Put(e) => self.replay_one(&e.key, op)?,
                Op::Del(k) => self.replay_one(k, op)?,
            }
        }
        Ok(())
    }

    fn replay_one(&self, key: &[u8], op: &Op) -> Result<(), EngineError> {
        let mut b = self.load_bucket(self.bucket_of(key))?;
        self.apply(&mut b, op)?;
        self.store_bucket(b)
    }

    /// Empties the store (the epoch lock is held exclusively, or this is
    /// recovery).
    fn reset_all(&self) {
        for d in &self.directory {
            d.store(0, Ordering::Release);
        }
        let keep: Vec<(u64, u32)> = self.ckpt.lock().meta.into_iter().collect();
        self.alloc.lock().free_all_live(&keep);
        self.keys.store(0, Ordering::Relaxed);
    }

    /// FLUSHALL.
    pub(crate) fn flushall(&self) -> Result<(), EngineError> {
        let payload = wal::encode(&[Op::FlushAll]);
        loop {
            // Every stripe first (a writer holding one has loaded buckets
            // that this would make stale), then the epoch.
            let stripes: Vec<_> = self.stripes.iter().map(|s| s.lock()).collect();
            let epoch = self.epoch.write();
            let Some(lsn) = self.log.try_append(&payload)? else {
                drop(epoch);
                drop(stripes);
                self.log.wait_for_space(payload.len())?;
                continue;
            };
            self.reset_all();
            drop(epoch);
            drop(stripes);
            return Ok(self.log.commit(lsn)?);
        }
    }

    /// Takes a checkpoint (one at a time).
    pub(crate) fn checkpoint(&self) -> Result<CheckpointReport, EngineError> {
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
        result.map(|lsn| CheckpointReport {
            lsn,
            duration_ms: ms,
        })
    }

    fn checkpoint_locked(&self, st: &mut State) -> Result<u64, EngineError> {
        let page = self.layout.page;
        let (lsn, boundary, meta, meta_page, meta_pages) = {
            let _epoch = self.epoch.write();
            let lsn = self.log.next_lsn() - 1;
            let dir: Vec<u64> = self
                .directory
                .iter()
                .map(|d| d.load(Ordering::Acquire))
                .collect();
            let keys = self.keys.load(Ordering::Relaxed);
            let mut a = self.alloc.lock();
            let boundary = a.advance();
            let words = a.live_bitmap().len();
            let pages = (16 + 8 * (dir.len() + words)).div_ceil(page as usize) as u32;
            let meta_page = a.alloc(pages).ok_or(EngineError::NoSpace)?;
            let meta = encode_meta(&dir, keys, &a.live_bitmap());
            (lsn, boundary, meta, meta_page, pages)
        };
        let mut padded = meta.clone();
        padded.resize(meta_pages as usize * page as usize, 0);
        self.cache.write(self.data, meta_page * page, &padded)?;
        self.cache.flush_file(self.data)?;
        let sb = Superblock {
            seq: st.seq + 1,
            lsn,
            meta_page,
            meta_len: meta.len() as u64,
            meta_crc: crc32c::crc32c(&meta),
            buckets: self.cfg.buckets,
            page_bytes: page as u32,
            data_pages: self.layout.data.1,
        };
        let slot = SUPERBLOCK_OFFSET + (sb.seq % 2) * SUPERBLOCK_BYTES;
        let image = AlignedBuf::from_slice(&sb.encode(SUPERBLOCK_BYTES as usize));
        self.block.write(slot, image)?;
        self.block.flush()?;
        st.seq = sb.seq;
        {
            let mut a = self.alloc.lock();
            if let Some((p, n)) = st.meta.replace((meta_page, meta_pages)) {
                a.free(p, n);
            }
            a.checkpoint_durable(boundary);
        }
        self.log.truncate(lsn)?;
        Ok(lsn)
    }

    /// The checkpointer: every `checkpoint_interval_ms`, or when the log is
    /// `checkpoint_log_pct` full, or when asked.
    fn checkpointer(self: Arc<Self>) {
        self.log.register_space_helper(context::current());
        let interval = Duration::from_millis(self.cfg.checkpoint_interval_ms);
        let mut last = Instant::now();
        loop {
            {
                let st = self.ckpt.lock();
                let (st, _) = self.ckpt_cv.wait_timeout(st, CHECKPOINTER_TICK);
                drop(st);
            }
            if self.closing.load(Ordering::SeqCst) {
                return;
            }
            let log_full = self.log.used_pct() >= self.cfg.checkpoint_log_pct as f64;
            let due = !interval.is_zero() && last.elapsed() >= interval;
            let requested = std::mem::take(&mut self.ckpt.lock().requested);
            if log_full || due || requested {
                let _ = self.checkpoint(); // counted in the stats
                last = Instant::now();
            }
        }
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
        }
        let name = if snapshot {
            "kv-bgsave"
        } else {
            "kv-bgrewrite"
        };
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                let result = if snapshot {
                    self.snapshot()
                } else {
                    self.rewrite()
                };
                let mut bg = self.bg.lock();
                if let Err(e) = result {
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
