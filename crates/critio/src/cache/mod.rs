//! The page cache: criticality-aware caching of files over the block layer
//! (paper 000, Sections 2.1 and 4.3).
//!
//! ```text
//!  read  ──hit──> copy out
//!        └─miss─> frame (CLOCK) ──> sync read in the caller's class      "cache: page lock"
//!  write ──> dirty limit of the writer's class? ──over──> throttle        "cache: dirty throttle"
//!        └─> copy in; the page remembers its writer's class
//!  writeback thread: oldest dirty pages, contiguous runs, async (non-critical)
//!  flush_file(f): f's dirty pages only, in the caller's class, then a device flush
//! ```
//!
//! Where a task waits for background I/O, critio makes that I/O critical:
//!
//! | a critical task needs...                    | it waits on                 | which resolves to                  |
//! |---------------------------------------------|-----------------------------|------------------------------------|
//! | a page another task is loading              | the load ("cache: page lock") | the loader inherits; its read is promoted |
//! | a frame, and only pages under writeback remain | the writeback run ("cache: writeback wait") | the writeback is promoted     |
//! | to flush a file with a page under writeback  | the same run                | the same                           |
//! | to dirty a page, over its class's limit      | throttling (an admission stage) | woken to retry with the critical limit |
//! | a page of a part a background task has locked (a scan's copy, a writeback plan, a discard) | the part's lock ("cache: part lock") | the holder inherits until it lets go; an event loop's `read_cached` spins a few microseconds (a page copy's time), then returns `Busy`, for a thread that may |
//!
//! The cache is split into parts (`cache.shards`; by default one per 1024
//! frames, up to 64), each with its own lock, frames, CLOCK and dirty
//! lists; a page's part is a hash of its file and stripe. A request's hit
//! takes one part's lock for one page copy, so a background scan (a
//! snapshot reading every page, writeback copying runs) holds the lock
//! the request needs only a fraction of the time, and a background holder
//! preempted by the CPU scheduler stalls 1/parts of the requests instead of
//! all of them; the part locks are critio's [`Mutex`](crate::sync::Mutex),
//! so that holder also inherits from a request waiting for it, and the
//! request's wait shows in the wait-point table (INFO
//! `critical_wait_cache_part_lock` in critio-kv).
//! Dirty counts are summed across parts in atomics, so
//! throttling decisions take no lock.
//!
//! A part's frames are one zeroed allocation the kernel backs with memory
//! lazily; a background thread backs them ahead of use (`prefault.rs`,
//! `cache.prefault`), so the first write to a frame does not fault in and
//! zero a huge page in a request's thread.
//!
//! Writeback writes a *copy* of each page, so readers never wait for it and
//! writers re-dirty freely; only a second write of the same page waits for
//! the first (writes to one place stay ordered).
//!
//! What each class gets: critical writers may dirty up to 20% of the cache,
//! non-critical ones 1% (defaults), so a background task writing a large
//! file cannot fill the cache and make a foreground writer wait for
//! background writeback; and a flush of one file never waits for another
//! file's dirty pages.

mod config;
mod core;
mod list;
mod pending;
mod prefault;
mod throttle;
mod writeback;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, RwLock};
use serde::Serialize;

pub use config::CacheConfig;
pub use throttle::THROTTLE_POINT;

use self::core::{Alloc, Frames, PageKey, State};
use self::pending::PendingIo;
use self::prefault::Prefault;
use self::throttle::Throttle;
use crate::block::{BlockError, BlockLayer};
use crate::class::Class;
use crate::context;
use crate::device::{AlignedBuf, Op};
use crate::error::ConfigError;
use crate::sync::Mutex as PartLock;
use crate::sync::MutexGuard;
use crate::sync::SyncConfig;
use crate::sync::SyncOptions;
use crate::time::Clock;

/// A file's id in one cache.
pub type FileId = u32;

/// The wait point of waiting for another task's load of a page.
pub const PAGE_LOCK_POINT: &str = "cache: page lock";
/// The wait point of waiting for a page's writeback.
pub const WRITEBACK_POINT: &str = "cache: writeback wait";
/// The wait point of a page read on a miss.
pub const READ_POINT: &str = "cache: read";
/// The wait point of waiting for a part's lock (held for a page copy or
/// a short step of a scan, a writeback plan or a discard).
pub const PART_LOCK_POINT: &str = "cache: part lock";

/// A [`PageCache::start_read_through`] in flight: the bytes of cached
/// pages already copied, device reads of the others submitted.
pub struct ReadThrough {
    out: Vec<u8>,
    /// Each device read and its copies.
    reads: Vec<(crate::block::IoHandle, Vec<CopyOut>)>,
}

/// A piece of a device read to copy out: (offset in the read, length,
/// offset in the output).
type CopyOut = (usize, usize, usize);

impl ReadThrough {
    /// Waits for the device reads and returns the bytes.
    pub fn finish(mut self) -> Result<Vec<u8>, CacheError> {
        let mut promoted = false;
        for k in 0..self.reads.len() {
            promote_rest(&mut promoted, self.reads[k..].iter().map(|r| &r.0));
            let buf = self.reads[k].0.wait_buf()?;
            for &(src, n, dst) in &self.reads[k].1 {
                self.out[dst..dst + n].copy_from_slice(&buf.as_slice()[src..src + n]);
            }
        }
        Ok(self.out)
    }
}

/// Once the calling task is critical (from the start, or by inheritance
/// while it waited for an earlier one), promotes every request of `rest`,
/// the pieces of one transfer it waits for in order, at once and only
/// once (`promoted`): waiting promotes only the request waited for, and
/// the pieces of a transfer cut into short requests
/// ([`BlockLayer::request_len_max`]) would otherwise go critical one at
/// a time.
fn promote_rest<'a>(promoted: &mut bool, rest: impl Iterator<Item = &'a crate::block::IoHandle>) {
    if !*promoted && context::current_class() == Class::Critical {
        rest.for_each(crate::block::IoHandle::promote);
        *promoted = true;
    }
}

/// A [`PageCache::start_write_around`] in flight: its device writes.
/// Dropped unfinished (a caller's error path), it waits for them: a write
/// left in flight could land after a later write of the same range (a
/// device orders overlapping writes only once one has completed) and put
/// older bytes back.
pub struct WriteAround {
    writes: Vec<crate::block::IoHandle>,
}

impl WriteAround {
    /// Waits for every device write (not for a device flush); returns the
    /// first error.
    pub fn finish(mut self) -> Result<(), CacheError> {
        self.wait_all().map_err(CacheError::from)
    }

    /// Waits for every write, all of them promoted once this task is
    /// critical; the first error.
    fn wait_all(&mut self) -> Result<(), BlockError> {
        let writes = std::mem::take(&mut self.writes);
        let mut promoted = false;
        let mut first = Ok(());
        for k in 0..writes.len() {
            promote_rest(&mut promoted, writes[k..].iter());
            first = first.and(writes[k].wait());
        }
        first
    }
}

impl Drop for WriteAround {
    fn drop(&mut self) {
        let _ = self.wait_all();
    }
}

/// Why a cache operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CacheError {
    /// The I/O below failed.
    #[error("cache: {0}")]
    Block(#[from] BlockError),
    /// The range is outside the file.
    #[error("cache: {len} bytes at offset {offset} are outside file {file} ({size} bytes)")]
    OutOfRange {
        /// The file.
        file: FileId,
        /// The requested offset.
        offset: u64,
        /// The requested length.
        len: u64,
        /// The file's size.
        size: u64,
    },
    /// A write around the cache must cover whole pages.
    #[error(
        "cache: {len} bytes at offset {offset} of file {file} are not whole pages of {page} bytes"
    )]
    Unaligned {
        /// The file.
        file: FileId,
        /// The requested offset.
        offset: u64,
        /// The requested length.
        len: u64,
        /// The page size.
        page: u64,
    },
    /// A file cannot be placed there.
    #[error("cache: cannot add file `{name}`: {why}")]
    BadFile {
        /// The file's name.
        name: String,
        /// Why, in plain words.
        why: String,
    },
}

#[derive(Clone, Debug)]
struct FileInfo {
    name: Arc<str>,
    base: u64,
    len: u64,
}

/// One part (shard) of the cache: its frames, under its own lock.
pub(crate) struct Core {
    frames: Frames,
}

/// The writeback thread's mailbox.
struct WbState {
    shutdown: bool,
    kicked: bool,
}

#[derive(Default)]
struct Counters {
    /// Bytes of frames `prefault.rs` backed.
    prefaulted_bytes: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    throttled: AtomicU64,
    reclaims: AtomicU64,
    read_through_pages: AtomicU64,
    writeback_pages: AtomicU64,
    writeback_errors: AtomicU64,
    discarded: AtomicU64,
    written_around_pages: AtomicU64,
    busy: AtomicU64,
}

pub(crate) struct Inner {
    block: Arc<BlockLayer>,
    cfg: CacheConfig,
    page: usize,
    sync: SyncOptions,
    clock: Clock,
    /// The parts of the cache; a page lives in `shard_of(key)`. critio's
    /// own mutex: a background holder a request waits for inherits.
    shards: Box<[PartLock<Core>]>,
    /// Pages per stripe: a stripe of a file lies in one part.
    stripe: u64,
    /// Dirty pages per class, summed over the parts.
    dirty: Arc<[AtomicUsize; 2]>,
    wb: Mutex<WbState>,
    wb_cv: Condvar,
    files: RwLock<Vec<FileInfo>>,
    throttle: Arc<Throttle>,
    counters: Counters,
    /// Per class: the last failure to write back pages counted against
    /// it, until a later writeback of its pages succeeds. Per class, as
    /// dirty limits are: a writer throttled on pages that keep failing is
    /// told, however well another class's writeback goes.
    wb_error: Mutex<[Option<BlockError>; 2]>,
}

/// A page cache over one block layer. Dropping it stops its writeback
/// thread; call [`PageCache::flush_all`] first to keep dirty data.
pub struct PageCache {
    inner: Arc<Inner>,
    writeback: Option<JoinHandle<()>>,
    /// Backing the frames ahead of use (`cache.prefault`); dropped, so
    /// stopped, before the frames are.
    prefault: Option<Prefault>,
}

/// What [`PageCache::read_cached`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CachedRead {
    /// Every page was cached: the bytes are copied.
    Hit,
    /// A page is not cached, or still loading.
    Miss,
    /// A thread that is not foreground held a page's part.
    Busy,
}

/// A snapshot of the cache's counters.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct CacheStats {
    /// Reads and writes that found their page cached.
    pub hits: u64,
    /// Pages loaded on a miss.
    pub misses: u64,
    /// Writes that waited in dirty throttling.
    pub throttled: u64,
    /// Dirty pages written back by a task that needed a frame.
    pub reclaims: u64,
    /// Pages [`PageCache::read_through`] read from the device (not cached).
    pub read_through_pages: u64,
    /// Pages written back (by the writeback thread and by flushes).
    pub writeback_pages: u64,
    /// Writeback writes that failed (the pages stay dirty).
    pub writeback_errors: u64,
    /// Clean pages dropped by [`PageCache::discard`] (their owner's dead
    /// bytes).
    pub discarded: u64,
    /// Pages written straight to the device by
    /// [`PageCache::start_write_around`].
    pub written_around_pages: u64,
    /// [`PageCache::read_cached`] calls that found a part a background
    /// thread held ([`CachedRead::Busy`]).
    pub busy: u64,
    /// Bytes of frames backed with memory ahead of use so far
    /// (`cache.prefault`; it ends at the cache's size, less a part's
    /// partial pages, a few seconds after start).
    pub prefaulted_bytes: u64,
    /// Dirty pages of critical writers now.
    pub dirty_critical: usize,
    /// Dirty pages of non-critical writers now.
    pub dirty_noncritical: usize,
    /// Frames.
    pub frames: usize,
    /// Frames holding no page now (read under each part's lock in turn).
    pub free_frames: usize,
}

impl PageCache {
    /// A cache of `cfg.capacity_bytes` over `block`, with its writeback
    /// thread. `sync` decides whether waits on pending I/O pass
    /// criticality on (inheritance off gives the "classes without
    /// inheritance" scheme).
    pub fn new(
        block: Arc<BlockLayer>,
        cfg: CacheConfig,
        sync: &SyncConfig,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let page = cfg.page_bytes as usize;
        let dirty: Arc<[AtomicUsize; 2]> = Arc::default();
        let (count, frames) = (cfg.shard_count(), cfg.frames());
        let metrics = block.metrics().clone();
        let sync = sync.options_in("cache", &metrics);
        let part_lock = SyncOptions {
            name: PART_LOCK_POINT,
            ..sync.clone()
        };
        let mut spans = Vec::with_capacity(count);
        let shards = (0..count)
            .map(|s| {
                // The remainder's frames go one each to the first parts.
                let n = frames / count + usize::from(s < frames % count);
                let mut frames = Frames::with_shared(n, page, dirty.clone());
                if cfg.clean_bytes_max > 0 {
                    let clean = cfg.clean_bytes_max / page as u64;
                    frames.set_clean_max((clean as usize).div_ceil(count));
                }
                spans.push(frames.arena_span());
                PartLock::with_options(Core { frames }, part_lock.clone())
            })
            .collect();
        let inner = Arc::new(Inner {
            block,
            cfg,
            page,
            sync,
            clock: Clock::new(),
            shards,
            stripe: u64::from(cfg.writeback_batch_pages),
            dirty,
            wb: Mutex::new(WbState {
                shutdown: false,
                kicked: false,
            }),
            wb_cv: Condvar::new(),
            files: RwLock::new(Vec::new()),
            throttle: Arc::new(Throttle::new(metrics.clone())),
            counters: Counters::default(),
            wb_error: Mutex::new([None, None]),
        });
        let writeback = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("critio-writeback".into())
                .spawn(move || inner.writeback_loop())
                .expect("cannot spawn the writeback thread")
        };
        let prefault = cfg.prefault.then(|| Prefault::start(inner.clone(), spans));
        Ok(Self {
            inner,
            writeback: Some(writeback),
            prefault,
        })
    }

    /// Places a file of `len` bytes at device offset `base` (both multiples
    /// of the page size, inside the device, not overlapping another file).
    pub fn add_file(&self, name: &str, base: u64, len: u64) -> Result<FileId, CacheError> {
        let page = self.inner.page as u64;
        let bad = |why: String| CacheError::BadFile {
            name: name.to_owned(),
            why,
        };
        if base % page != 0 || len % page != 0 || len == 0 {
            return Err(bad(format!(
                "base {base} and length {len} must be positive multiples of {page}"
            )));
        }
        let capacity = self.inner.block.device().info().capacity;
        if base.checked_add(len).is_none_or(|end| end > capacity) {
            return Err(bad(format!(
                "[{base}, {base}+{len}) is past the device end ({capacity})"
            )));
        }
        let mut files = self.inner.files.write();
        if let Some(f) = files
            .iter()
            .find(|f| base < f.base + f.len && f.base < base + len)
        {
            return Err(bad(format!("it overlaps file `{}`", f.name)));
        }
        files.push(FileInfo {
            name: name.into(),
            base,
            len,
        });
        Ok((files.len() - 1) as FileId)
    }

    /// A file's size in bytes.
    pub fn file_len(&self, file: FileId) -> u64 {
        self.inner.file(file).1
    }

    /// Reads `out.len()` bytes at `offset` of `file`.
    pub fn read(&self, file: FileId, offset: u64, out: &mut [u8]) -> Result<(), CacheError> {
        let mut done = 0;
        for (key, in_page, n) in self.inner.pages(file, offset, out.len())? {
            let dst = &mut out[done..done + n];
            self.inner.access(key, false, |core, i, _| {
                dst.copy_from_slice(&core.frames.data(i)[in_page..in_page + n]);
                core.frames.touch(i);
                Some(())
            })?;
            done += n;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `offset` of `file` if every page is
    /// cached and no background thread holds a part it needs:
    /// [`CachedRead::Hit`] with `out` filled, else (`out` unspecified)
    /// [`CachedRead::Miss`] if a page is missing or still loading, or
    /// [`CachedRead::Busy`] if a thread that is not foreground holds the
    /// lock of a page's part past a spin of 30 µs. Never waits for the device
    /// nor long for background work: an event loop tries this first and
    /// hands a miss or a busy part to a thread that may wait
    /// ([`PageCache::prefetch`], which waits for the part as its caller,
    /// making the holder critical meanwhile).
    ///
    /// A background holder keeps a part for as long as its work under the
    /// lock takes, a wait for the CPU included (the part lock's wait point
    /// shows how long requests waited there), and an event loop that
    /// waited would stall every client it serves; but that work is a page
    /// copy or a writeback run's copies, microseconds unless the holder
    /// lost its CPU, so the loop spins that long first: a request handed
    /// to another thread and back costs more than it. A foreground holder's
    /// hold (another request's page copy) is waited for.
    pub fn read_cached(
        &self,
        file: FileId,
        offset: u64,
        out: &mut [u8],
    ) -> Result<CachedRead, CacheError> {
        let pages = self.inner.pages(file, offset, out.len())?;
        let mut done = 0;
        for &(key, in_page, n) in &pages {
            let Some(mut core) = self.inner.lock_unless_background(key) else {
                self.inner.counters.busy.fetch_add(1, Ordering::Relaxed);
                return Ok(CachedRead::Busy);
            };
            if !Inner::copy_from(&mut core, key, in_page, &mut out[done..done + n], true) {
                return Ok(CachedRead::Miss);
            }
            done += n;
        }
        (self.inner.counters.hits).fetch_add(pages.len() as u64, Ordering::Relaxed);
        Ok(CachedRead::Hit)
    }

    /// Loads the pages of `[offset, offset + len)` of `file` into the cache
    /// (in the caller's class), so a [`PageCache::read_cached`] of the
    /// range then finds them, unless they are evicted meanwhile.
    pub fn prefetch(&self, file: FileId, offset: u64, len: usize) -> Result<(), CacheError> {
        for (key, _, _) in self.inner.pages(file, offset, len)? {
            self.inner.access(key, false, |core, i, _| {
                core.frames.touch(i);
                Some(())
            })?;
        }
        Ok(())
    }

    /// Writes `data` at `offset` of `file` (into the cache; durable after a
    /// flush). May wait in dirty throttling.
    pub fn write(&self, file: FileId, offset: u64, data: &[u8]) -> Result<(), CacheError> {
        self.write_pages(file, offset, data, false)
    }

    /// Writes `data` at `offset` of a file written like a log: the caller
    /// promises that no byte of `file` at or after `offset` that this write
    /// does not cover will be read before it is written again. So a page
    /// that starts at or after `offset` and is not cached is not read from
    /// the device first: it starts zeroed. (A page holding bytes before
    /// `offset` is loaded as usual.)
    pub fn write_appending(
        &self,
        file: FileId,
        offset: u64,
        data: &[u8],
    ) -> Result<(), CacheError> {
        self.write_pages(file, offset, data, true)
    }

    /// Prepares `[offset, offset + len)` of a file written like a log for
    /// writes that may come in any order: every page that starts in the
    /// range and is not cached is made present, zeroed and dirty (so it is
    /// never read from the device, and what is written into it is kept
    /// even if it is written back and evicted before the rest arrives).
    /// The caller promises what [`PageCache::write_appending`] does, for
    /// the whole range, and serializes preparations (a log's append lock);
    /// the writes themselves then need no lock of the caller's.
    ///
    /// It never waits in dirty throttling: it runs under that append lock,
    /// which requests wait for, so a writer throttles before it takes the
    /// lock ([`PageCache::balance_dirty`]), and a class's dirty pages may
    /// pass its limit by the pages the preparations in progress make dirty.
    /// Measured with critio-kv on a real file (vda) under a SET load with
    /// BGSAVE and BGREWRITEAOF looping: throttled here on its dirty limit,
    /// the log rewrite held the value log's append lock over 1 ms 7 times
    /// in one 9 s load, up to 6.7 ms, with the worker's appends waiting;
    /// without the throttle here, a SET's longest wait for that lock went
    /// from 1.3-4.9 ms to 0.7-1.1 ms (three alternated pairs).
    pub fn prepare_appending(&self, file: FileId, offset: u64, len: u64) -> Result<(), CacheError> {
        if len == 0 {
            return Ok(());
        }
        let page = self.inner.page as u64;
        let mut at = offset.div_ceil(page) * page;
        while at < offset + len {
            let key = self.inner.pages(file, at, 1)?[0].0;
            self.inner.access(key, true, |core, i, class| {
                self.inner.write_page(core, i, 0, &[], class, Limit::Pass)
            })?;
            at += page;
        }
        Ok(())
    }

    fn write_pages(
        &self,
        file: FileId,
        offset: u64,
        data: &[u8],
        appending: bool,
    ) -> Result<(), CacheError> {
        let mut done = 0;
        for (key, in_page, n) in self.inner.pages(file, offset, data.len())? {
            let src = &data[done..done + n];
            let fresh = n == self.inner.page || (appending && in_page == 0);
            self.inner.access(key, fresh, |core, i, class| {
                self.inner
                    .write_page(core, i, in_page, src, class, Limit::Keep)
            })?;
            done += n;
        }
        Ok(())
    }

    /// Reads `out.len()` bytes at `offset` of `file` without filling the
    /// cache: pages that are cached are copied from it, the others are read
    /// from the device in the caller's class and not kept. For scans of
    /// data nobody writes meanwhile (a snapshot or a cleaner reading old
    /// log records), so they do not evict what requests use.
    pub fn read_through(
        &self,
        file: FileId,
        offset: u64,
        out: &mut [u8],
    ) -> Result<(), CacheError> {
        let pending = self.start_read_through(file, offset, out.len())?;
        out.copy_from_slice(&pending.finish()?);
        Ok(())
    }

    /// [`PageCache::read_through`] that does not wait: cached pages are
    /// copied now, the device reads of the others are submitted (in the
    /// caller's class) and [`ReadThrough::finish`] waits for them. A scan
    /// keeps a few of these in flight ahead of where it reads, so its
    /// device reads overlap each other and its own work.
    pub fn start_read_through(
        &self,
        file: FileId,
        offset: u64,
        len: usize,
    ) -> Result<ReadThrough, CacheError> {
        let pages = self.inner.pages(file, offset, len)?;
        // Built as it goes, not zeroed first: only a missing page's bytes
        // are zeros until its read ends (a scan's chunk is 1 MiB; with
        // it zeroed, memset was 12% of a BGSAVE's samples in `perf`, 4%
        // after).
        let mut out = Vec::with_capacity(len);
        // Its memory backed now, not by a fault in each copy below, which
        // holds a part's lock (`prefault::back_spare`).
        prefault::back_spare(&mut out);
        let mut missing: Vec<(PageKey, usize, usize, usize)> = Vec::new();
        for &(key, in_page, n) in &pages {
            let done = out.len();
            // One page per lock hold: a long scan never holds the cache.
            if !self.inner.append_cached(key, in_page, n, &mut out) {
                out.resize(done + n, 0);
                missing.push((key, in_page, n, done));
            }
        }
        debug_assert_eq!(out.len(), len);
        let counters = &self.inner.counters;
        counters
            .hits
            .fetch_add((pages.len() - missing.len()) as u64, Ordering::Relaxed);
        counters
            .read_through_pages
            .fetch_add(missing.len() as u64, Ordering::Relaxed);
        let page = self.inner.page;
        // One device read per run of contiguous missing pages, each at most
        // the longest request the block layer wants from this thread (a
        // background scan's are short, so a critical command waits less
        // behind one at the device).
        let most = self.request_pages(true);
        let mut reads = Vec::new();
        let mut at = 0;
        while at < missing.len() {
            let mut end = at + 1;
            while end < missing.len()
                && end - at < most
                && missing[end].0.page == missing[end - 1].0.page + 1
            {
                end += 1;
            }
            let first = missing[at].0;
            let io = self.inner.block.submit(
                Op::Read,
                self.inner.device_offset(first),
                AlignedBuf::zeroed((end - at) * page),
                true,
                READ_POINT,
            )?;
            let copies = missing[at..end]
                .iter()
                .enumerate()
                .map(|(k, &(_, in_page, n, dst))| (k * page + in_page, n, dst))
                .collect();
            reads.push((io, copies));
            at = end;
        }
        Ok(ReadThrough { out, reads })
    }

    /// Makes every write to `file` so far durable: writes its dirty pages in
    /// the caller's class, waits for its pages under writeback (promoting
    /// them if the caller is critical), then flushes the device. Other
    /// files' dirty pages are not touched.
    pub fn flush_file(&self, file: FileId) -> Result<(), CacheError> {
        self.inner.flush_file(file)?;
        Ok(self.inner.block.flush()?)
    }

    /// Makes every write to every file so far durable.
    pub fn flush_all(&self) -> Result<(), CacheError> {
        let mut files: Vec<FileId> = (self.inner.shards.iter())
            .flat_map(|s| s.lock().frames.files_with_unflushed())
            .collect();
        files.sort_unstable();
        files.dedup();
        for f in files {
            self.inner.flush_file(f)?;
        }
        Ok(self.inner.block.flush()?)
    }

    /// Writes `data`, whole pages at `offset` of `file`, straight to the
    /// device without keeping them, non-critical as writeback is (a
    /// critical task that waits for them promotes them), and does not
    /// wait: [`WriteAround::finish`] does (then a device flush makes them
    /// durable; dropping the [`WriteAround`] waits too). For data written
    /// once and not read back soon (a snapshot's dump): through the cache,
    /// each of its pages would take a frame from pages in use, count
    /// against its writer's dirty limit and be copied twice. A page of the
    /// range still cached is written back first if dirty
    /// ([`PageCache::flush_file`]'s way, for the whole file) and dropped,
    /// so the cache never holds older bytes than the device; the caller
    /// makes sure no one else reads or writes the range
    /// until the writes end.
    pub fn start_write_around(
        &self,
        file: FileId,
        offset: u64,
        data: &[u8],
    ) -> Result<WriteAround, CacheError> {
        let (base, size) = self.inner.file(file);
        let len = data.len() as u64;
        if offset.checked_add(len).is_none_or(|e| e > size) {
            return Err(CacheError::OutOfRange {
                file,
                offset,
                len,
                size,
            });
        }
        let page = self.inner.page as u64;
        if offset % page != 0 || len % page != 0 {
            return Err(CacheError::Unaligned {
                file,
                offset,
                len,
                page,
            });
        }
        // Cached pages of the range go first; if one was not clean, the
        // file's dirty pages are written back and the range looked at
        // again (a page being loaded is clean once loaded).
        while self.discard_range(file, offset, offset + len).1 > 0 {
            self.inner.flush_file(file)?;
            std::thread::yield_now();
        }
        // Non-critical writes (until someone waits for them), cut as such.
        let most = self.request_pages(false) * self.inner.page;
        // Should a submission fail, the writes already submitted are
        // waited for (the drop) before the error returns.
        let mut pending = WriteAround { writes: Vec::new() };
        for (k, chunk) in data.chunks(most).enumerate() {
            let at = base + offset + (k * most) as u64;
            let io = self
                .inner
                .block
                .write_async(at, AlignedBuf::from_slice(chunk))?;
            pending.writes.push(io);
        }
        (self.inner.counters.written_around_pages).fetch_add(len / page, Ordering::Relaxed);
        Ok(pending)
    }

    /// How many pages one device request of a bulk transfer holds: as
    /// many as fit in the length the block layer gives the calling thread
    /// ([`BlockLayer::request_len_max`]; `sync`, it waits for them), and
    /// at least one (a cut shorter than a page sends whole pages).
    fn request_pages(&self, sync: bool) -> usize {
        (self.inner.block.request_len_max(sync) as usize / self.inner.page).max(1)
    }

    /// Drops the clean cached pages that lie wholly within `[offset,
    /// offset + len)` of `file`, bytes its owner will not read again (a
    /// log's cleaned space): their frames are free at once, so pages
    /// still in use are not evicted in their place. Pages that are dirty,
    /// under writeback or loading stay, as they are (their bytes may still
    /// be needed on the device). Returns how many pages were dropped.
    /// Costs O(pages in the range), taking one part's lock per stripe.
    pub fn discard(&self, file: FileId, offset: u64, len: u64) -> Result<usize, CacheError> {
        let (_, size) = self.inner.file(file);
        let end = offset.checked_add(len).filter(|&e| e <= size);
        let Some(end) = end else {
            return Err(CacheError::OutOfRange {
                file,
                offset,
                len,
                size,
            });
        };
        Ok(self.discard_range(file, offset, end).0)
    }

    /// [`PageCache::discard`] of `[offset, end)` (within the file): the
    /// pages dropped, and the pages of the range still cached (not clean).
    fn discard_range(&self, file: FileId, offset: u64, end: u64) -> (usize, usize) {
        let (page, stripe) = (self.inner.page as u64, self.inner.stripe);
        let (mut at, last) = (offset.div_ceil(page), end / page);
        let (mut dropped, mut kept) = (0, 0);
        while at < last {
            // A stripe's pages are in one part: one lock hold each.
            let upto = ((at / stripe + 1) * stripe).min(last);
            let mut core = self.inner.shard(PageKey { file, page: at }).lock();
            for p in at..upto {
                let key = PageKey { file, page: p };
                match core.frames.discard(key) {
                    Some(true) => dropped += 1,
                    Some(false) => kept += 1,
                    None => {}
                }
            }
            drop(core);
            at = upto;
        }
        (self.inner.counters.discarded).fetch_add(dropped as u64, Ordering::Relaxed);
        (dropped, kept)
    }

    /// Drops every clean page (a cold cache, for tests and experiments).
    pub fn drop_clean(&self) -> usize {
        (self.inner.shards.iter())
            .map(|s| s.lock().frames.drop_clean())
            .sum()
    }

    /// Waits in dirty throttling until the caller's class may dirty a page
    /// (at once if it may). For a writer about to take locks that others
    /// need: throttled here, it holds none of them (Linux's
    /// `balance_dirty_pages`, before the critical section instead of
    /// inside it). A write may still throttle if others dirtied meanwhile.
    pub fn balance_dirty(&self) -> Result<(), CacheError> {
        if self.inner.may_dirty(context::current_class()) {
            return Ok(());
        }
        self.inner
            .counters
            .throttled
            .fetch_add(1, Ordering::Relaxed);
        self.inner.throttle_wait()
    }

    /// The counters, and the frames free now.
    pub fn stats(&self) -> CacheStats {
        let c = &self.inner.counters;
        CacheStats {
            hits: c.hits.load(Ordering::Relaxed),
            misses: c.misses.load(Ordering::Relaxed),
            throttled: c.throttled.load(Ordering::Relaxed),
            reclaims: c.reclaims.load(Ordering::Relaxed),
            read_through_pages: c.read_through_pages.load(Ordering::Relaxed),
            writeback_pages: c.writeback_pages.load(Ordering::Relaxed),
            writeback_errors: c.writeback_errors.load(Ordering::Relaxed),
            discarded: c.discarded.load(Ordering::Relaxed),
            busy: c.busy.load(Ordering::Relaxed),
            prefaulted_bytes: c.prefaulted_bytes.load(Ordering::Relaxed),
            written_around_pages: c.written_around_pages.load(Ordering::Relaxed),
            dirty_critical: self.inner.dirty(Class::Critical),
            dirty_noncritical: self.inner.dirty(Class::NonCritical),
            frames: self.inner.cfg.frames(),
            free_frames: (self.inner.shards.iter())
                .map(|s| s.lock().frames.free_frames())
                .sum(),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &CacheConfig {
        &self.inner.cfg
    }

    /// The block layer below.
    pub fn block(&self) -> &Arc<BlockLayer> {
        &self.inner.block
    }
}

impl Drop for PageCache {
    fn drop(&mut self) {
        drop(self.prefault.take());
        self.inner.wb.lock().shutdown = true;
        self.inner.wb_cv.notify_all();
        if let Some(t) = self.writeback.take() {
            let _ = t.join();
        }
    }
}

/// How long an event loop's cached read spins for a part a background
/// thread holds before it gives up (`Busy`): a background step under a
/// part lock is a page copy or a writeback run's (32 pages, 128 KiB),
/// and a request's trip to a miss reader and back is two thread
/// wake-ups. Under a BGSAVE/BGREWRITEAOF loop (critio-kv, 300k keys,
/// GETs alone; vda) it cut `Busy` from 1700-2000 to 210-310 per 600k
/// GETs.
const BUSY_SPIN: std::time::Duration = std::time::Duration::from_micros(30);

/// Whether a write that would dirty a page keeps to its class's dirty
/// limit (throttled when over it) or may pass it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Limit {
    Keep,
    /// The writer holds a lock others need and throttled before taking it
    /// ([`PageCache::prepare_appending`]).
    Pass,
}

/// What a caller must do before retrying an access.
enum Act {
    Wait(Arc<PendingIo>),
    /// Wait for the writeback of this frame of the page's part.
    WaitWriteback(usize, Arc<PendingIo>),
    Load(usize, Arc<PendingIo>),
    /// Write back this frame of the page's part.
    Reclaim(usize),
    Throttle,
}

impl Inner {
    /// The part of the cache that holds `key`'s page: a hash of its file
    /// and stripe.
    fn shard_index(&self, key: PageKey) -> usize {
        let n = self.shards.len();
        if n == 1 {
            return 0;
        }
        let mut h = self::core::PageHasher::default();
        std::hash::Hasher::write_u32(&mut h, key.file);
        std::hash::Hasher::write_u64(&mut h, key.page / self.stripe);
        // The multiplicative hash's high bits are its best mixed.
        ((std::hash::Hasher::finish(&h) >> 32) as usize) % n
    }

    /// The part of the cache that holds `key`'s page.
    fn shard(&self, key: PageKey) -> &PartLock<Core> {
        &self.shards[self.shard_index(key)]
    }

    /// Locks `key`'s part, unless a thread that is not foreground holds it
    /// past [`BUSY_SPIN`] (None). One that took it just after the check is
    /// waited for: rare, and bounded as any wait for a part is.
    fn lock_unless_background(&self, key: PageKey) -> Option<MutexGuard<'_, Core>> {
        self.shard(key).lock_unless_background(BUSY_SPIN)
    }

    /// Appends `n` bytes at `in_page` of `key`'s page to `out` if the page
    /// is cached and loaded (one lock hold), without marking it used (a
    /// scan leaves the replacement order alone). False: not cached,
    /// nothing appended.
    fn append_cached(&self, key: PageKey, in_page: usize, n: usize, out: &mut Vec<u8>) -> bool {
        let core = self.shard(key).lock();
        let Some(i) = Self::loaded(&core, key) else {
            return false;
        };
        out.extend_from_slice(&core.frames.data(i)[in_page..in_page + n]);
        true
    }

    /// The frame holding page `key`, unless it is only being read in.
    fn loaded(core: &Core, key: PageKey) -> Option<usize> {
        core.frames
            .lookup(key)
            .filter(|&i| !matches!(core.frames.frame(i).state, State::Loading(_)))
    }

    /// Copies `dst.len()` bytes at `in_page` of `key`'s page into `dst` if
    /// the page is cached and loaded, under a part lock the caller holds;
    /// marks it used if `touch`. False: not cached, nothing copied.
    fn copy_from(
        core: &mut Core,
        key: PageKey,
        in_page: usize,
        dst: &mut [u8],
        touch: bool,
    ) -> bool {
        let Some(i) = Self::loaded(core, key) else {
            return false;
        };
        dst.copy_from_slice(&core.frames.data(i)[in_page..in_page + dst.len()]);
        if touch {
            core.frames.touch(i);
        }
        true
    }

    /// Dirty pages (dirty or under writeback) of `class`, over all parts.
    fn dirty(&self, class: Class) -> usize {
        self.dirty[class.index()].load(Ordering::Relaxed)
    }

    /// Wakes the writeback thread.
    fn kick(&self) {
        self.wb.lock().kicked = true;
        self.wb_cv.notify_one();
    }

    /// A file's place on the device: (base, length).
    fn file(&self, file: FileId) -> (u64, u64) {
        self.files
            .read()
            .get(file as usize)
            .map(|f| (f.base, f.len))
            .unwrap_or_else(|| panic!("unknown cache file {file}"))
    }

    /// The pages covering `[offset, offset+len)` of `file`: (page, offset in
    /// page, bytes).
    fn pages(
        &self,
        file: FileId,
        offset: u64,
        len: usize,
    ) -> Result<Vec<(PageKey, usize, usize)>, CacheError> {
        let (_, size) = self.file(file);
        let end = offset.checked_add(len as u64);
        if end.is_none_or(|e| e > size) {
            return Err(CacheError::OutOfRange {
                file,
                offset,
                len: len as u64,
                size,
            });
        }
        let page = self.page as u64;
        let mut v = Vec::new();
        let mut at = offset;
        let end = offset + len as u64;
        while at < end {
            let in_page = (at % page) as usize;
            let n = ((page - at % page).min(end - at)) as usize;
            v.push((
                PageKey {
                    file,
                    page: at / page,
                },
                in_page,
                n,
            ));
            at += n as u64;
        }
        Ok(v)
    }

    fn device_offset(&self, key: PageKey) -> u64 {
        self.file(key.file).0 + key.page * self.page as u64
    }

    /// Runs `f` on the page's frame once it is loaded (or, for a `fresh`
    /// write that needs none of the page's old bytes, just allocated); `f`
    /// returns None to ask for throttling. `f` is given the caller's class
    /// as it was before the part's lock: a background caller a request
    /// waits for there inherits for as long as it holds it, and what it
    /// writes in that moment is still background data (counted against
    /// its own dirty limit, its writeback errors its own).
    fn access<R>(
        &self,
        key: PageKey,
        fresh: bool,
        mut f: impl FnMut(&mut Core, usize, Class) -> Option<R>,
    ) -> Result<R, CacheError> {
        loop {
            let class = context::current_class();
            let act = {
                let mut core = self.shard(key).lock();
                match core.frames.lookup(key) {
                    Some(i) => match &core.frames.frame(i).state {
                        State::Loading(p) => Act::Wait(p.clone()),
                        _ => {
                            self.counters.hits.fetch_add(1, Ordering::Relaxed);
                            match f(&mut core, i, class) {
                                Some(r) => return Ok(r),
                                None => Act::Throttle,
                            }
                        }
                    },
                    None => match core.frames.alloc(key) {
                        Alloc::Frame(i) if fresh => match f(&mut core, i, class) {
                            Some(r) => return Ok(r),
                            None => {
                                core.frames.release(i);
                                Act::Throttle
                            }
                        },
                        Alloc::Frame(i) => {
                            let p = PendingIo::new(PAGE_LOCK_POINT, context::current(), &self.sync);
                            core.frames.begin_load(i, p.clone());
                            Act::Load(i, p)
                        }
                        Alloc::Wait(p) => Act::Wait(p),
                        Alloc::WaitWriteback(i, p) => Act::WaitWriteback(i, p),
                        Alloc::Reclaim(i) => Act::Reclaim(i),
                    },
                }
            };
            match act {
                // A failed I/O shows in the page's state on the retry.
                Act::Wait(p) => drop(p.wait()),
                Act::WaitWriteback(i, p) => drop(self.end_waited(self.shard_index(key), i, &p)),
                Act::Load(i, p) => self.load(key, i, &p)?,
                Act::Reclaim(i) => self.reclaim(key, i)?,
                Act::Throttle => self.throttle_wait()?,
            }
        }
    }

    /// Copies `src` into the page at `in_page`, unless `limit` keeps the
    /// writer's class (`class`, as it was before the part's lock) to its
    /// dirty limit, the class is over it, and the page would become dirty.
    fn write_page(
        &self,
        core: &mut Core,
        i: usize,
        in_page: usize,
        src: &[u8],
        class: Class,
        limit: Limit,
    ) -> Option<()> {
        let would_dirty = matches!(core.frames.frame(i).state, State::Clean | State::Free);
        if would_dirty && limit == Limit::Keep && !self.may_dirty(class) {
            self.counters.throttled.fetch_add(1, Ordering::Relaxed);
            return None;
        }
        let fresh = matches!(core.frames.frame(i).state, State::Free);
        let data = core.frames.data_mut(i);
        if fresh && src.len() < data.len() {
            data.fill(0); // a fresh page: none of its old bytes are wanted
        }
        data[in_page..in_page + src.len()].copy_from_slice(src);
        if core.frames.mark_written(i, class, self.clock.now()) && self.near_limit() {
            self.kick();
        }
        Some(())
    }

    fn limit(&self, pct: f64) -> usize {
        ((self.cfg.frames() as f64 * pct / 100.0) as usize).max(1)
    }

    /// Whether a writer of `class` may dirty one more page.
    fn may_dirty(&self, class: Class) -> bool {
        if !self.cfg.dirty_limits {
            let total = self.dirty(Class::Critical) + self.dirty(Class::NonCritical);
            return total < self.limit(self.cfg.shared_dirty_pct);
        }
        let pct = match class {
            Class::Critical => self.cfg.critical_dirty_pct,
            Class::NonCritical => self.cfg.noncritical_dirty_pct,
        };
        self.dirty(class) < self.limit(pct)
    }

    /// Waits in dirty throttling until the caller's class may dirty a page,
    /// or fails with the device's error if writeback is failing (a dead or
    /// full device would otherwise keep the writer waiting forever).
    fn throttle_wait(&self) -> Result<(), CacheError> {
        let failed = || self.wb_error.lock()[context::current_class().index()].clone();
        let done = || self.may_dirty(context::current_class()) || failed().is_some();
        self.throttle.wait(done, || self.kick());
        if self.may_dirty(context::current_class()) {
            return Ok(());
        }
        match failed() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }

    /// Reads a missing page in the caller's class.
    fn load(&self, key: PageKey, i: usize, p: &Arc<PendingIo>) -> Result<(), CacheError> {
        self.counters.misses.fetch_add(1, Ordering::Relaxed);
        let buf = AlignedBuf::zeroed(self.page);
        let submitted = self
            .block
            .submit(Op::Read, self.device_offset(key), buf, true, READ_POINT);
        let result = submitted.and_then(|h| {
            p.issued(h.clone());
            h.wait_buf()
        });
        let mut core = self.shard(key).lock();
        match result {
            Ok(buf) => {
                core.frames.data_mut(i).copy_from_slice(buf.as_slice());
                core.frames.end_load(i);
                Ok(())
            }
            Err(e) => {
                core.frames.release(i);
                drop(core);
                p.abandoned();
                Err(e.into())
            }
        }
    }

    /// Writes back dirty page `i` in the caller's class, so its frame can be
    /// reused (direct reclaim).
    fn reclaim(&self, key: PageKey, i: usize) -> Result<(), CacheError> {
        self.counters.reclaims.fetch_add(1, Ordering::Relaxed);
        let shard = self.shard_index(key);
        let run = {
            let core = self.shards[shard].lock();
            if !matches!(core.frames.frame(i).state, State::Dirty) {
                return Ok(()); // someone else cleaned it
            }
            self.plan_runs(shard, core, vec![i])
        };
        let submitted = run.into_iter().map(|r| self.submit_run(r, true)).collect();
        self.finish_runs(submitted)
    }

    /// Writes the dirty pages of `file` (those dirty now; some dirtied
    /// meanwhile too) and waits for its pages under writeback, in the
    /// caller's class, a bounded chunk of pages of one part at a time (so
    /// no lock hold grows with the number of dirty pages).
    fn flush_file(&self, file: FileId) -> Result<(), CacheError> {
        let chunk = (self.cfg.writeback_batch_pages * self.cfg.writeback_inflight) as usize;
        for shard in 0..self.shards.len() {
            let Some(end) = self.shards[shard].lock().frames.last_unflushed(file) else {
                continue;
            };
            let mut from = 0;
            while from <= end {
                let targets =
                    self.shards[shard]
                        .lock()
                        .frames
                        .unflushed_of(file, from..=end, chunk);
                let Some(&(last, _)) = targets.last() else {
                    break;
                };
                from = last.page + 1;
                self.flush_pages(shard, &targets)?;
            }
        }
        Ok(())
    }

    /// Makes the writes up to each target's write sequence durable (the
    /// targets are pages of part `shard`).
    fn flush_pages(&self, shard: usize, targets: &[(PageKey, u64)]) -> Result<(), CacheError> {
        loop {
            let (runs, waits) = {
                let core = self.shards[shard].lock();
                let (mut dirty, mut waits) = (Vec::new(), Vec::new());
                for &(key, seq) in targets {
                    let Some(i) = core.frames.lookup(key) else {
                        continue; // written and evicted
                    };
                    let f = core.frames.frame(i);
                    if f.written_seq >= seq {
                        continue;
                    }
                    match &f.state {
                        State::Dirty => dirty.push(i),
                        State::Writeback { io, .. } => waits.push((i, io.clone())),
                        _ => {}
                    }
                }
                (self.plan_runs(shard, core, dirty), waits)
            };
            if runs.is_empty() && waits.is_empty() {
                return Ok(());
            }
            let submitted = runs.into_iter().map(|r| self.submit_run(r, true)).collect();
            self.finish_runs(submitted)?;
            for (i, p) in waits {
                self.end_waited(shard, i, &p)?;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::mpsc::channel;
    use std::time::{Duration, Instant};

    use super::*;
    use crate::block::BlockConfig;
    use crate::device::mem::MemDevice;

    /// A 1 MiB cache over a memory device, with a file whose first page
    /// holds 7s.
    fn cache_with_a_page() -> (Arc<PageCache>, FileId) {
        let dev = Arc::new(MemDevice::new(1 << 20));
        let block = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
        let cfg = CacheConfig {
            capacity_bytes: 1 << 20,
            ..CacheConfig::default()
        };
        let cache = Arc::new(PageCache::new(block, cfg, &SyncConfig::default()).unwrap());
        let f = cache.add_file("f", 0, 1 << 20).unwrap();
        cache.write(f, 0, &[7; 4096]).unwrap();
        cache.flush_file(f).unwrap();
        (cache, f)
    }

    /// With `cache.prefault` (the default) a background thread backs every
    /// part's frames with memory soon after the cache is made, beside a
    /// writer, whose page it leaves as written; with it off, nothing is
    /// backed ahead.
    #[test]
    fn the_frames_are_backed_ahead_of_use_unless_prefault_is_off() {
        let page = rustix::param::page_size();
        let probe = vec![0u8; 4 * page];
        let at = (probe.as_ptr() as usize).next_multiple_of(page);
        if crate::sys::populate_write(at, page).is_err() {
            return; // a kernel before 5.14: the thread stops at once
        }
        let make = |prefault| {
            let dev = Arc::new(MemDevice::new(8 << 20));
            let block = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
            let cfg = CacheConfig {
                capacity_bytes: 8 << 20,
                shards: 4,
                prefault,
                ..CacheConfig::default()
            };
            PageCache::new(block, cfg, &SyncConfig::default()).unwrap()
        };
        let cache = make(true);
        let f = cache.add_file("f", 0, 8 << 20).unwrap();
        cache.write(f, 4096, &[9; 4096]).unwrap();
        // Each part may lose a partial page at either end of its frames.
        let least = (8 << 20) - 2 * 4 * page as u64;
        let deadline = Instant::now() + Duration::from_secs(20);
        while cache.stats().prefaulted_bytes < least && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        let backed = cache.stats().prefaulted_bytes;
        assert!(
            (least..=8 << 20).contains(&backed),
            "{backed} bytes backed of 8 MiB"
        );
        let mut out = [0u8; 4096];
        cache.read(f, 4096, &mut out).unwrap();
        assert_eq!(out, [9; 4096]);
        drop(cache);

        let lazy = make(false);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(lazy.stats().prefaulted_bytes, 0);
    }

    /// The prefault thread asks for huge pages over each part's frames
    /// (their aligned 2 MiB stretches), where the kernel has them.
    #[test]
    fn the_prefaulted_frames_ask_for_huge_pages() {
        if !std::path::Path::new("/sys/kernel/mm/transparent_hugepage").exists() {
            return; // a kernel without transparent huge pages
        }
        let dev = Arc::new(MemDevice::new(32 << 20));
        let block = Arc::new(BlockLayer::new(dev, BlockConfig::default()).unwrap());
        let cfg = CacheConfig {
            capacity_bytes: 32 << 20,
            shards: 2,
            ..CacheConfig::default()
        };
        let cache = PageCache::new(block, cfg, &SyncConfig::default()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(20);
        while cache.stats().prefaulted_bytes < 30 << 20 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        for part in cache.inner.shards.iter() {
            let (addr, len) = part.lock().frames.arena_span();
            let inside = addr.next_multiple_of(prefault::CHUNK);
            assert!(
                inside + prefault::CHUNK <= addr + len,
                "a part holds a huge page"
            );
            let flags = crate::sys::mapping_flags(inside).unwrap().expect("mapped");
            assert!(flags.iter().any(|f| f == "hg"), "frames' flags: {flags:?}");
        }
    }

    /// A background task holding a part's lock (a scan's page copy, a
    /// writeback plan) that a request's hit needs inherits the request's
    /// criticality until it lets go, and the request's wait is accounted
    /// to the part lock's wait point.
    #[test]
    fn a_background_holder_of_a_part_a_request_waits_for_inherits() {
        let (cache, f) = cache_with_a_page();
        let key = PageKey { file: f, page: 0 };
        let (held_tx, held_rx) = channel();
        let holder = std::thread::spawn({
            let cache = cache.clone();
            move || {
                context::set_background();
                let part = cache.inner.shard(key).lock();
                held_tx.send(()).unwrap();
                let deadline = Instant::now() + Duration::from_secs(20);
                while context::current_class() != Class::Critical && Instant::now() < deadline {
                    std::thread::sleep(Duration::from_millis(1));
                }
                let inherited = context::current_class() == Class::Critical;
                drop(part);
                (inherited, context::current_class())
            }
        });
        held_rx.recv().unwrap();
        context::set_foreground();
        let mut page = [0u8; 4096];
        cache.read(f, 0, &mut page).unwrap();
        assert_eq!(page, [7; 4096]);
        let (inherited, after) = holder.join().unwrap();
        assert!(inherited, "the holder never became critical");
        assert_eq!(
            after,
            Class::NonCritical,
            "the inheritance outlived the hold"
        );
        let waits = cache.block().metrics().get().snapshot();
        assert!(
            (waits.wait_points.iter())
                .any(|w| w.point == PART_LOCK_POINT && w.class == Class::Critical),
            "no critical wait at {PART_LOCK_POINT}: {waits:?}"
        );
    }

    /// An event loop's cached read does not wait for a part a background
    /// thread holds past its spin (Busy, counted), and gets its hit once
    /// it is free; a part another foreground thread holds is waited for.
    #[test]
    fn a_cached_read_hands_back_a_part_a_background_thread_holds() {
        let (cache, f) = cache_with_a_page();
        let key = PageKey { file: f, page: 0 };
        context::set_foreground();
        let mut page = [0u8; 4096];
        for holder_foreground in [false, true] {
            let (held_tx, held_rx) = channel();
            let (go_tx, go_rx) = channel::<()>();
            let holder = std::thread::spawn({
                let cache = cache.clone();
                move || {
                    if holder_foreground {
                        context::set_foreground();
                    } else {
                        context::set_background();
                    }
                    let part = cache.inner.shard(key).lock();
                    held_tx.send(()).unwrap();
                    // A background holder lets go once asked; a
                    // foreground one after a while, for its waiter.
                    if holder_foreground {
                        std::thread::sleep(Duration::from_millis(50));
                    } else {
                        go_rx.recv().unwrap();
                    }
                    drop(part);
                }
            });
            held_rx.recv().unwrap();
            let found = cache.read_cached(f, 0, &mut page).unwrap();
            if holder_foreground {
                assert_eq!(found, CachedRead::Hit, "a request's hold is waited for");
            } else {
                assert_eq!(found, CachedRead::Busy);
                go_tx.send(()).unwrap();
            }
            holder.join().unwrap();
            page.fill(0);
            // The writeback thread may hold the part for a moment too.
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut found = cache.read_cached(f, 0, &mut page).unwrap();
            while found == CachedRead::Busy && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(1));
                found = cache.read_cached(f, 0, &mut page).unwrap();
            }
            assert_eq!(found, CachedRead::Hit);
            assert_eq!(page, [7; 4096]);
        }
        assert!(cache.stats().busy >= 1);
    }
}
