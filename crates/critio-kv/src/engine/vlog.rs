//! The value log: the data region as a circular log of records, written
//! through critio's page cache.
//!
//! ```text
//!  logical addresses only grow; a record at addr lives at addr % region
//!
//!   reuse tail          clean tail                         head
//!      |  dead space,     |  live and dead records           |  free ...  | reuse tail + region
//!      |  reusable once a |  (the cleaner copies the live    |
//!      |  checkpoint says |   ones at the tail to the head)  |
//!      |  so              |                                  |
//! ```
//!
//! - **Append**: under one lock, records are copied into the cache at the
//!   head (sequential dirty pages, written back in long runs); a page that
//!   starts at or after the head is never read first.
//! - **Space**: the head may not pass the reuse tail plus the region: the
//!   reuse tail is the clean tail of the last durable checkpoint (recovery
//!   scans from there), held back while a snapshot reads older records.
//!   Writers stop [`CLEANER_RESERVE_PCT`] short of that, so the cleaner
//!   always has room to relocate; and writes that would make the live data
//!   exceed `live_max_pct` of the region fail (the store is full).
//! - **Order**: every change of the index appends a record: placed under
//!   the log's lock (which also makes the pages it starts present), copied
//!   after it, under the key's stripe lock and the engine's epoch lock
//!   (shared). So the log order of a key's records is the order of its
//!   changes, a snapshot knows whether a change came before it started (its
//!   record is below the snapshot's end) or after, and whoever takes the
//!   epoch lock exclusively (a checkpoint, a snapshot or cleaning starting)
//!   sees every record below the head whole.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use critio::cache::{CachedRead, FileId, PageCache, ReadThrough};
use critio::sync::{Condvar, Mutex, SyncOptions};

use super::record::{self, Decoded, Record, PAD_BYTES};
use super::EngineError;

/// Percent of the region writers leave to the cleaner.
pub(crate) const CLEANER_RESERVE_PCT: u64 = 5;
/// How long a writer waiting for space re-checks on its own.
const SPACE_RECHECK: Duration = Duration::from_millis(100);
/// Bytes a scan reads at once (in unit tests 16 KiB, so that their
/// records run across chunks, and some over several).
const SCAN_CHUNK: usize = if cfg!(test) { 16 << 10 } else { 1 << 20 };

/// Chunks a scan keeps read ahead of where it decodes: its device reads
/// overlap each other and the scan's own work (a snapshot's index
/// lookups and dump writes, the cleaner's copies). At most this many
/// [`SCAN_CHUNK`]s are buffered.
const SCAN_AHEAD: usize = 2;

/// A scan's reads in flight: consecutive chunks from where it reads up to
/// the end of the lap it is in, aligned to [`SCAN_CHUNK`] after the first.
struct Ahead<'a> {
    vlog: &'a Vlog,
    /// Where the next chunk starts (logical address).
    next: u64,
    /// Where this lap's reads stop.
    end: u64,
    reads: VecDeque<(u64, ReadThrough)>,
}

impl Ahead<'_> {
    /// Drops the reads in flight and reads on from `at` up to `end`.
    fn restart(&mut self, at: u64, end: u64) {
        self.reads.clear();
        self.next = at;
        self.end = end;
    }

    /// Starts reads until [`SCAN_AHEAD`] are in flight or the lap is read.
    fn fill(&mut self) -> Result<(), EngineError> {
        while self.reads.len() < SCAN_AHEAD && self.next < self.end {
            let stop = ((self.next / SCAN_CHUNK as u64 + 1) * SCAN_CHUNK as u64).min(self.end);
            let read = self.vlog.cache.start_read_through(
                self.vlog.file,
                self.next % self.vlog.region,
                (stop - self.next) as usize,
            )?;
            self.reads.push_back((self.next, read));
            self.next = stop;
        }
        Ok(())
    }

    /// The chunk that starts at `at` (the next one): waits for its read,
    /// with the following ones started first.
    fn take(&mut self, at: u64) -> Result<Vec<u8>, EngineError> {
        self.fill()?;
        let (start, read) = self
            .reads
            .pop_front()
            .expect("a scan reads only below the lap's end");
        debug_assert_eq!(start, at, "a scan's chunks are consecutive");
        self.fill()?;
        let chunk = read.finish()?;
        // A scan is a background job's loop (BGSAVE, the cleaner): a
        // waiting request thread gets the CPU between its chunks.
        critio::context::yield_point();
        Ok(chunk)
    }
}

/// Who asks for space: writers stop short of the cleaner's reserve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Who {
    Writer,
    Cleaner,
}

/// What changes rarely (checkpoints, cleaning, snapshots), under the
/// value log's lock; the head and the reservations are atomics.
struct State {
    clean_tail: u64,
    durable_tail: u64,
    /// A snapshot's (start, end): it reads records in that range.
    snapshot: Option<(u64, u64)>,
}

impl State {
    fn reuse_tail(&self) -> u64 {
        match self.snapshot {
            Some((from, _)) => self.durable_tail.min(from),
            None => self.durable_tail,
        }
    }
}

/// Space promised to a writer (or the cleaner) that holds locks and is
/// about to append; what is not used is given back when it drops.
pub(crate) struct Reservation<'a> {
    vlog: &'a Vlog,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if self.bytes > 0 {
            self.vlog.reserved.fetch_sub(self.bytes, Ordering::SeqCst);
        }
    }
}

/// Records [`Vlog::place`] placed, their bytes not yet copied.
pub(crate) struct Placed {
    /// Each record's address.
    pub(crate) addrs: Vec<u64>,
    /// Where each contiguous run of them goes: (address, range of the bytes).
    spans: Vec<(u64, std::ops::Range<usize>)>,
    /// Whether a snapshot that started before them is running.
    pub(crate) snapshot: bool,
}

/// The value log of one store.
pub(crate) struct Vlog {
    cache: Arc<PageCache>,
    file: FileId,
    region: u64,
    /// The cache's page size: the log never writes into the page that holds
    /// its reuse tail (see [`Vlog::set_end`]).
    page: u64,
    live_max: u64,
    record_max: usize,
    state: Mutex<State>,
    space: Condvar,
    live: AtomicU64,
    /// Where the next record goes; advanced only under `state`'s lock,
    /// by appends.
    head: AtomicU64,
    /// Space promised to reservations not yet appended.
    reserved: AtomicU64,
    /// The reuse tail plus the region: the head may not pass it. It only
    /// grows (checkpoints), so a reservation made against it stays good.
    end: AtomicU64,
    /// Set when the engine failed: no more reservations, and why.
    refused: OnceLock<String>,
}

/// What a scan's callback wants next.
pub(crate) enum Flow {
    /// The record is done with: on to the next.
    Continue,
    /// Stop before this record (the scan returns its address).
    Stop,
}

impl Vlog {
    /// The log over cache file `file` of `region` bytes, its records
    /// between `tail` and `head` (a checkpoint's).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        cache: Arc<PageCache>,
        file: FileId,
        region: u64,
        live_max_pct: u64,
        record_max: usize,
        (tail, head): (u64, u64),
        sync: impl Fn(&'static str) -> SyncOptions,
    ) -> Self {
        let page = cache.config().page_bytes as u64;
        assert!(region % page == 0 && region > 0);
        assert!(tail <= head && head - tail <= region);
        Self {
            cache,
            file,
            region,
            page,
            live_max: region / 100 * live_max_pct,
            record_max,
            state: Mutex::with_options(
                State {
                    clean_tail: tail,
                    durable_tail: tail,
                    snapshot: None,
                },
                sync("kv: value log"),
            ),
            space: Condvar::with_options(sync("kv: space")),
            live: AtomicU64::new(0),
            head: AtomicU64::new(head),
            reserved: AtomicU64::new(0),
            end: AtomicU64::new(tail / page * page + region),
            refused: OnceLock::new(),
        }
    }

    /// Takes no more reservations (the engine failed, for `why`): every
    /// `try_reserve` fails with it, and waiters for space return at once.
    pub(crate) fn refuse(&self, why: String) {
        let _ = self.refused.set(why);
        let _st = self.state.lock();
        self.space.notify_all();
    }

    /// The region's size.
    pub(crate) fn region(&self) -> u64 {
        self.region
    }

    /// The cache file the log is in.
    pub(crate) fn file(&self) -> FileId {
        self.file
    }

    /// Makes `task` (the cleaner) inherit while a critical writer waits for
    /// space.
    pub(crate) fn register_space_helper(&self, task: critio::context::TaskRef) {
        self.space.register_helper(task);
    }

    /// Whether a snapshot holds records in place.
    pub(crate) fn snapshot_running(&self) -> bool {
        self.state.lock().snapshot.is_some()
    }

    fn limit(&self, who: Who) -> u64 {
        let end = self.end.load(Ordering::SeqCst);
        match who {
            Who::Cleaner => end,
            Who::Writer => end - self.region / 100 * CLEANER_RESERVE_PCT,
        }
    }

    /// The head plus what is reserved: at least the true sum (the
    /// reservations are read first, and an append moves bytes from them to
    /// the head).
    fn used_end(&self) -> u64 {
        let r = self.reserved.load(Ordering::SeqCst);
        self.head.load(Ordering::SeqCst) + r
    }

    /// Recomputes the end after the reuse tail moved (under the lock): a
    /// region past the start of the page that holds the reuse tail, not
    /// past the tail itself. Appends make the pages they start present
    /// zeroed, never read ([`PageCache::prepare_appending`]): one that
    /// reached into that page would zero the oldest records recovery still
    /// needs, and its writeback would put the zeros on the device before
    /// the next checkpoint moves the tail.
    fn set_end(&self, st: &State) {
        let end = st.reuse_tail() / self.page * self.page + self.region;
        let old = self.end.swap(end, Ordering::SeqCst);
        debug_assert!(end >= old, "the log's end moved back");
    }

    /// Bytes writers may still append before they wait for the cleaner.
    pub(crate) fn free(&self) -> u64 {
        self.limit(Who::Writer).saturating_sub(self.used_end())
    }

    /// Reserves room for records of `bytes` in all (the largest
    /// `largest`), or None if there is none now. Fails if the live data
    /// would grow past its limit by `live_growth`.
    pub(crate) fn try_reserve(
        &self,
        bytes: u64,
        largest: u64,
        live_growth: i64,
        who: Who,
    ) -> Result<Option<Reservation<'_>>, EngineError> {
        if let Some(why) = self.refused.get() {
            return Err(EngineError::Failed(why.clone()));
        }
        let live = self.live.load(Ordering::Relaxed);
        if who == Who::Writer && live_growth > 0 && live + live_growth as u64 > self.live_max {
            return Err(EngineError::NoSpace);
        }
        // A record that would cross the end of the region follows a pad
        // (less than the record): room for the worst case.
        let need = bytes + largest;
        loop {
            let r = self.reserved.load(Ordering::SeqCst);
            let head = self.head.load(Ordering::SeqCst);
            if head + r + need > self.limit(who) {
                return Ok(None);
            }
            if self
                .reserved
                .compare_exchange(r, r + need, Ordering::SeqCst, Ordering::SeqCst)
                .is_ok()
            {
                return Ok(Some(Reservation {
                    vlog: self,
                    bytes: need,
                }));
            }
        }
    }

    /// Waits until `bytes` (and `largest`) could be reserved by a writer,
    /// calling `kick` (to wake the cleaner) on each round.
    pub(crate) fn wait_for_space(&self, bytes: u64, largest: u64, kick: impl Fn()) {
        self.wait_for(bytes, largest, Who::Writer, kick)
    }

    /// Waits until `bytes` (and `largest`) could be reserved by `who`, or
    /// reservations are refused. `kick` runs without the log's lock: it
    /// takes the checkpointer's, which a checkpoint holds while it takes
    /// the log's (for its boundary, and to free the space).
    pub(crate) fn wait_for(&self, bytes: u64, largest: u64, who: Who, kick: impl Fn()) {
        let short =
            || self.used_end() + bytes + largest > self.limit(who) && self.refused.get().is_none();
        while short() {
            kick();
            // Asked again under the lock: the end moves, and reservations
            // are refused, under it, and the space is signalled after, so
            // a change after this look wakes the wait.
            let st = self.state.lock();
            if !short() {
                break;
            }
            drop(self.space.wait_timeout(st, SPACE_RECHECK));
        }
    }

    /// Appends `records` (`sizes` bytes each, in order, contiguous in
    /// `bytes`) with space from `res`; returns each one's address, and
    /// whether a snapshot that started before them is running.
    pub(crate) fn append(
        &self,
        res: &mut Reservation<'_>,
        bytes: &[u8],
        sizes: &[usize],
    ) -> Result<(Vec<u64>, bool), EngineError> {
        let placed = self.place(res, sizes)?;
        self.fill(&placed, bytes)?;
        Ok((placed.addrs, placed.snapshot))
    }

    /// The first half of [`Self::append`]: under the lock, places the
    /// records (`sizes` bytes each, in order) with space from `res`, makes
    /// the pages they start present (zeroed, never read) and moves the
    /// head. Their bytes are copied by [`Self::fill`], without the lock:
    /// appenders on other keys copy at once. Until it returns, the records
    /// are not whole, so the caller holds the epoch lock across both.
    pub(crate) fn place(
        &self,
        res: &mut Reservation<'_>,
        sizes: &[usize],
    ) -> Result<Placed, EngineError> {
        let st = self.state.lock();
        let start = self.head.load(Ordering::SeqCst);
        let mut head = start;
        let mut addrs = Vec::with_capacity(sizes.len());
        let mut spans = Vec::with_capacity(2);
        let (mut span_from, mut at) = (0, 0);
        for &size in sizes {
            let phys = head % self.region;
            if phys + size as u64 > self.region {
                spans.push((head - (at - span_from) as u64, span_from..at));
                self.prepare(head, PAD_BYTES as u64)?;
                self.write(head, &record::pad())?;
                head += self.region - phys;
                span_from = at;
            } else if phys == 0 && at > span_from {
                // The records before filled their lap to the last byte
                // (no pad): this one starts a run in the next lap, at the
                // region's start, not past its end.
                spans.push((head - (at - span_from) as u64, span_from..at));
                span_from = at;
            }
            addrs.push(head);
            head += size as u64;
            at += size;
        }
        spans.push((head - (at - span_from) as u64, span_from..at));
        for (addr, range) in &spans {
            self.prepare(*addr, range.len() as u64)?;
        }
        let used = head - start;
        assert!(used <= res.bytes, "appended past the reservation");
        assert!(head <= self.limit(Who::Cleaner), "the log overran its tail");
        // Head first, then the reservation: a reader of both never sees
        // less than the true sum.
        self.head.store(head, Ordering::SeqCst);
        self.reserved.fetch_sub(used, Ordering::SeqCst);
        res.bytes -= used;
        Ok(Placed {
            addrs,
            spans,
            snapshot: st.snapshot.is_some(),
        })
    }

    /// The second half of [`Self::append`]: copies the bytes of the records
    /// `placed` placed (contiguous in `bytes`) to their addresses.
    pub(crate) fn fill(&self, placed: &Placed, bytes: &[u8]) -> Result<(), EngineError> {
        let placed_bytes = placed.spans.last().map_or(0, |(_, range)| range.end);
        assert_eq!(placed_bytes, bytes.len(), "the bytes of other records");
        for (addr, range) in &placed.spans {
            self.write(*addr, &bytes[range.clone()])?;
        }
        Ok(())
    }

    fn prepare(&self, addr: u64, len: u64) -> Result<(), EngineError> {
        debug_assert!(addr % self.region + len <= self.region);
        Ok(self
            .cache
            .prepare_appending(self.file, addr % self.region, len)?)
    }

    fn write(&self, addr: u64, bytes: &[u8]) -> Result<(), EngineError> {
        if bytes.is_empty() {
            return Ok(());
        }
        debug_assert!(addr % self.region + bytes.len() as u64 <= self.region);
        Ok(self.cache.write(self.file, addr % self.region, bytes)?)
    }

    /// Reads the record at `addr` of `size` bytes through the cache.
    pub(crate) fn read(&self, addr: u64, size: u32) -> Result<Vec<u8>, EngineError> {
        let mut buf = vec![0u8; size as usize];
        self.cache.read(self.file, addr % self.region, &mut buf)?;
        Ok(buf)
    }

    /// The record of `size` bytes at `addr`, if the cache has every page
    /// of it and no background thread holds their parts (never waits for
    /// the device or for background work; see [`PageCache::read_cached`]).
    pub(crate) fn read_cached(
        &self,
        addr: u64,
        size: u32,
    ) -> Result<(CachedRead, Vec<u8>), EngineError> {
        let mut buf = vec![0u8; size as usize];
        let found = self
            .cache
            .read_cached(self.file, addr % self.region, &mut buf)?;
        Ok((found, buf))
    }

    /// Loads the pages of the record at `addr` into the cache.
    pub(crate) fn prefetch(&self, addr: u64, size: u32) -> Result<(), EngineError> {
        Ok(self
            .cache
            .prefetch(self.file, addr % self.region, size as usize)?)
    }

    /// Decodes a record read with [`Vlog::read`].
    pub(crate) fn decode<'a>(&self, addr: u64, buf: &'a [u8]) -> Result<Record<'a>, EngineError> {
        match record::decode(buf, self.record_max) {
            Decoded::Record(r, _) => Ok(r),
            other => Err(EngineError::Corrupt(format!(
                "value log record at {addr}: {other:?}"
            ))),
        }
    }

    /// Calls `f` on every record in `[from, to)` (both record boundaries),
    /// with its bytes as stored (padding included), read past the cache
    /// (pages the cache holds are copied from it), with up to
    /// [`SCAN_AHEAD`] chunks read ahead. Returns where it stopped: `to`, or
    /// the address of the record `f` stopped at.
    ///
    /// Records are decoded in the chunk they were read into; only one that
    /// runs from one chunk into the next is gathered, alone, into a buffer
    /// of its own. Appending each chunk to what was left of the one before
    /// copied every byte a scan went through once more (in `perf`, a
    /// BGSAVE's copies were 15% of its samples and the zeroing of its
    /// chunks most of another 12%).
    pub(crate) fn scan(
        &self,
        from: u64,
        to: u64,
        mut f: impl FnMut(u64, Record<'_>, &[u8]) -> Result<Flow, EngineError>,
    ) -> Result<u64, EngineError> {
        let lap_end = |pos: u64| (pos / self.region + 1) * self.region;
        let mut ahead = Ahead {
            vlog: self,
            next: from,
            end: to.min(lap_end(from)),
            reads: VecDeque::new(),
        };
        // `buf` holds the bytes at [buf_at, buf_at + len): a chunk, or a
        // record gathered across two; `next` is the chunk read after it
        // (it may overlap a gathered record's end).
        let mut buf: Vec<u8> = Vec::new();
        let mut buf_at = from;
        let mut next: Option<(u64, Vec<u8>)> = None;
        let mut pos = from;
        while pos < to {
            let end = to.min(lap_end(pos));
            let off = (pos - buf_at) as usize;
            let decoded = if off + PAD_BYTES <= buf.len() {
                record::decode(&buf[off..], self.record_max)
            } else {
                Decoded::Short(PAD_BYTES)
            };
            match decoded {
                Decoded::Pad => {
                    // The rest of the lap is padding; what was read ahead
                    // of it is dropped.
                    pos = lap_end(pos);
                    buf.clear();
                    buf_at = pos;
                    next = None;
                    ahead.restart(pos, to.min(lap_end(pos)));
                }
                Decoded::Short(n) => {
                    if ((end - pos) as usize) < n {
                        return Err(self.corrupt(pos, "a record runs past the log's end"));
                    }
                    let buf_end = buf_at + buf.len() as u64;
                    let (mut c_at, mut c) = match next.take() {
                        Some(chunk) => chunk,
                        None => (buf_end, ahead.take(buf_end)?),
                    };
                    debug_assert!(c_at <= buf_end, "a scan's chunks leave no gap");
                    if pos >= c_at {
                        // The record starts in the chunk: decode there.
                        buf = c;
                        buf_at = c_at;
                        continue;
                    }
                    // It starts before the chunk: its first n bytes, from
                    // `buf` and then from the chunks after.
                    let want_end = pos + n as u64;
                    let mut gathered = Vec::with_capacity(n);
                    gathered.extend_from_slice(&buf[off..]);
                    let mut got_end = buf_end;
                    loop {
                        let from_c = (got_end - c_at) as usize;
                        let take = ((want_end - got_end) as usize).min(c.len() - from_c);
                        gathered.extend_from_slice(&c[from_c..from_c + take]);
                        got_end += take as u64;
                        if got_end == want_end {
                            next = Some((c_at, c));
                            break;
                        }
                        c_at += c.len() as u64;
                        c = ahead.take(c_at)?;
                    }
                    buf = gathered;
                    buf_at = pos;
                }
                Decoded::Bad(why) => return Err(self.corrupt(pos, why)),
                Decoded::Record(r, size) => {
                    if pos + size as u64 > end {
                        return Err(self.corrupt(pos, "a record runs past the log's end"));
                    }
                    if let Flow::Stop = f(pos, r, &buf[off..off + size])? {
                        return Ok(pos);
                    }
                    pos += size as u64;
                    if pos % self.region == 0 && pos < to {
                        // The record filled its lap to the last byte (no
                        // padding after it): the reads go on in the next.
                        buf.clear();
                        buf_at = pos;
                        next = None;
                        ahead.restart(pos, to.min(lap_end(pos)));
                    }
                }
            }
        }
        Ok(to)
    }

    fn corrupt(&self, addr: u64, why: &str) -> EngineError {
        EngineError::Corrupt(format!("value log at {addr}: {why}"))
    }

    /// Live bytes (records the index points to).
    pub(crate) fn live(&self) -> u64 {
        self.live.load(Ordering::Relaxed)
    }

    /// Changes the live byte count.
    pub(crate) fn add_live(&self, delta: i64) {
        if delta >= 0 {
            self.live.fetch_add(delta as u64, Ordering::Relaxed);
        } else {
            self.live.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
        }
    }

    /// (clean tail, head) now: a checkpoint's boundary.
    pub(crate) fn boundary(&self) -> (u64, u64) {
        let st = self.state.lock();
        (st.clean_tail, self.head.load(Ordering::SeqCst))
    }

    /// The head now.
    pub(crate) fn head(&self) -> u64 {
        self.head.load(Ordering::SeqCst)
    }

    /// The cleaner copied every live record below `to` to the head. The
    /// pages the clean tail passed hold only dead records: the cache drops
    /// the clean ones now ([`PageCache::discard`]), so they, not the pages
    /// of live records, make room for what comes next (the cleaner writes
    /// its copies through the cache, and on a cache that holds the data, a
    /// BGREWRITEAOF would otherwise push a live page out for each page it
    /// copies). Their bytes stay on the device until the space is reused,
    /// as recovery may read them until a checkpoint moves the reuse tail.
    pub(crate) fn cleaned_to(&self, to: u64) -> Result<(), EngineError> {
        // Only the cleaner moves the clean tail.
        let tail = self.state.lock().clean_tail;
        assert!(to >= tail && to <= self.head.load(Ordering::SeqCst));
        // Dropped before the tail moves: until it has, no checkpoint can
        // make this space reusable, so no writer fills these pages anew
        // meanwhile (their next lap's bytes would be dropped, if written
        // back already, and missed later). From the start of the page
        // holding the old tail (its bytes before the tail were dead
        // already); the page holding `to` is kept.
        let mut at = tail / self.page * self.page;
        while at < to {
            let phys = at % self.region;
            let n = (to - at).min(self.region - phys);
            self.cache.discard(self.file, phys, n)?;
            at += n;
        }
        let mut st = self.state.lock();
        assert_eq!(
            st.clean_tail, tail,
            "the clean tail moved under the cleaner"
        );
        st.clean_tail = to;
        Ok(())
    }

    /// A checkpoint whose boundary had clean tail `tail` is durable: the
    /// space below it may be reused.
    pub(crate) fn checkpoint_durable(&self, tail: u64) {
        let mut st = self.state.lock();
        st.durable_tail = st.durable_tail.max(tail);
        self.set_end(&st);
        drop(st);
        self.space.notify_all();
    }

    /// Space that a checkpoint now would let writers reuse.
    pub(crate) fn reclaimable(&self) -> u64 {
        let st = self.state.lock();
        st.clean_tail - st.durable_tail
    }

    /// A snapshot starts: records in the returned range stay where they
    /// are until [`Vlog::end_snapshot`].
    pub(crate) fn begin_snapshot(&self) -> (u64, u64) {
        let mut st = self.state.lock();
        assert!(st.snapshot.is_none(), "one snapshot at a time");
        let range = (st.clean_tail, self.head.load(Ordering::SeqCst));
        st.snapshot = Some(range);
        self.set_end(&st);
        range
    }

    /// The snapshot ended.
    pub(crate) fn end_snapshot(&self) {
        let mut st = self.state.lock();
        st.snapshot = None;
        self.set_end(&st);
        drop(st);
        self.space.notify_all();
    }

    /// How much of the region the log spans (head - clean tail).
    pub(crate) fn span(&self) -> u64 {
        let st = self.state.lock();
        self.head.load(Ordering::SeqCst) - st.clean_tail
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use critio::device::mem::MemDevice;

    use super::{Flow, SCAN_CHUNK};
    use crate::engine::clean::tests::open;
    use crate::engine::record::{self, Decoded};
    use crate::engine::SetOptions;

    /// A scan hands over every record whole, in order and with its bytes
    /// as stored, wherever its chunks cut the log: records cut at a
    /// chunk's end, records longer than a chunk (over three of them), and
    /// records in pages the cache holds and in pages it does not.
    #[test]
    fn a_scan_hands_over_records_cut_by_its_chunks_whole_and_as_stored() {
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = open(&dev);
        let vlog = &e.inner.vlog;
        let (from, _) = vlog.boundary();
        let sizes = [0, 1, 100, 3000, 16_000, 16 << 10, 40_000, 60 << 10, 7];
        let mut written = Vec::new();
        for i in 0..120 {
            let key = format!("scan{i:03}").into_bytes();
            let value: Vec<u8> = (0..sizes[i % sizes.len()])
                .map(|j| (i * 31 + j) as u8)
                .collect();
            e.set(&key, &value, SetOptions::default()).unwrap();
            written.push((key, value));
        }
        let head = vlog.head();
        assert!(head - from > (1 << 20), "more than the 1 MiB cache holds");
        assert!(
            sizes.iter().any(|&s| s > 2 * SCAN_CHUNK),
            "some span three chunks"
        );
        let mut seen = Vec::new();
        let mut next = from;
        let reached = vlog
            .scan(from, head, |addr, r, stored| {
                assert_eq!(addr, next, "records follow each other");
                assert_eq!(stored.len(), record::size(r.key.len(), r.value.len()));
                match record::decode(stored, usize::MAX) {
                    Decoded::Record(again, len) => {
                        assert_eq!((again, len), (r, stored.len()));
                    }
                    other => panic!("the stored bytes at {addr} decode as {other:?}"),
                }
                next = addr + stored.len() as u64;
                seen.push((r.key.to_vec(), r.value.to_vec()));
                Ok(Flow::Continue)
            })
            .unwrap();
        assert_eq!(reached, head);
        assert_eq!(seen, written);
    }
}
