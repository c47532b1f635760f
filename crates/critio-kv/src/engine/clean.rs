//! The cleaner: frees value-log space by copying the live records at the
//! tail to the head (FIFO cleaning of a circular log).
//!
//! ```text
//!  clean tail ─> records, gathered in batches (32 records or 32 KiB)
//!  per batch:  room in the cache? (dirty throttling here, holding no lock)
//!              ─> the batch's stripes ─ each record still its key's latest? ─ no ──> dead
//!                 (lock ceiling)        └─ yes ─ expired? ─ yes ──> drop the key
//!                                                         └─ no ──> place its copy at the head
//!              <─ stripes released; the copies' bytes written (one append)
//!              ─> each key's stripe alone: still the original? ─ yes ──> repoint to the copy
//!  the clean tail moves past the batch; its space is reusable after the next checkpoint
//! ```
//!
//! A request for one of the batch's keys waits while the cleaner holds the
//! stripes, so that section holds only what the log's order needs (the
//! liveness check and the placement), at the lock ceiling
//! ([`critio::context::ceiling`]): measured on a real disk under a
//! BGREWRITEAOF loop, the cleaner held a batch's stripes 37 µs at the
//! median, but a preempted hold lasted up to 33 ms, and 0.1% of GETs
//! waited for one.
//!
//! Deletions and FLUSHALL records are dropped: everything older than them
//! is behind the tail already (FIFO), so nothing can come back. The
//! cleaner is background work: it reads past the cache (old records would
//! only evict what requests use), and its copies are non-critical dirty
//! pages, unless a request waits for a stripe it holds, or for space.
//!
//! It runs in the checkpointer when writers' free space falls below
//! `clean_free_pct`, and as BGREWRITEAOF (the whole log as of its start).

use critio::context;

use super::checkpoint::JobProgress;
use super::index::{Index, Loc};
use super::ops::{now_ms, Held};
use super::record;
use super::vlog::{Flow, Who};
use super::{EngineError, Inner};

/// Most rounds of cleaning per checkpointer wake-up (each ends with a
/// checkpoint).
const ROUNDS_MAX: usize = 8;

/// What one cleaning pass did.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Cleaned {
    /// Live records copied to the head.
    pub(crate) copied: u64,
    /// Expired keys dropped.
    pub(crate) expired: u64,
    /// Log bytes gone through.
    pub(crate) bytes: u64,
}

impl Inner {
    /// Whether writers' free space is below `clean_free_pct`.
    pub(crate) fn short_of_space(&self) -> bool {
        self.vlog.free() < self.vlog.region() / 100 * self.cfg.clean_free_pct
    }

    /// Cleans (and checkpoints) until writers have `clean_free_pct` of the
    /// log free, a snapshot holds the space, or [`ROUNDS_MAX`] rounds.
    pub(crate) fn clean_for_space(&self) -> Result<(), EngineError> {
        let batch = (self.vlog.region() / 16).max(1 << 20);
        for _ in 0..ROUNDS_MAX {
            if !self.short_of_space() {
                break;
            }
            if self.vlog.reclaimable() > 0 {
                self.checkpoint()?;
                continue;
            }
            if self.vlog.snapshot_running() {
                break; // the space comes back when it ends
            }
            let (tail, head) = self.vlog.boundary();
            if tail == head {
                break;
            }
            self.clean(tail + batch, None)?;
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Cleans from the clean tail through the records that start below
    /// `upto` (at most the head): every live one is copied to the head, in
    /// batches (one value-log append and one pass over the stripes each).
    /// `progress` follows it (BGREWRITEAOF's).
    pub(crate) fn clean(
        &self,
        upto: u64,
        progress: Option<&JobProgress>,
    ) -> Result<Cleaned, EngineError> {
        let _one = self.cleaner.lock();
        // Under the epoch lock no append is copying: every record below the
        // head is whole.
        // The live records it may copy are of keys there are now.
        let (from, head, keys) = {
            let _epoch = self.epoch.write();
            let (from, head) = self.vlog.boundary();
            (from, head, self.index.keys())
        };
        let mut done = Cleaned::default();
        let mut batch = Batch::default();
        if let Some(p) = progress {
            p.set_total(upto.min(head).saturating_sub(from), keys);
        }
        let reached = self.vlog.scan(from, head, |addr, r, stored| {
            if addr >= upto || self.closing.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Flow::Stop);
            }
            let size = stored.len() as u32;
            if r.is_value() {
                batch.push(addr, r.key, stored);
            }
            done.bytes += u64::from(size);
            if batch.full() {
                self.clean_batch(&mut batch, &mut done)?;
                self.vlog.cleaned_to(addr + u64::from(size))?;
                context::yield_point();
            }
            if let Some(p) = progress {
                p.advance(addr + u64::from(size) - from, done.copied);
            }
            Ok(Flow::Continue)
        })?;
        self.clean_batch(&mut batch, &mut done)?;
        self.vlog.cleaned_to(reached)?;
        let mut bg = self.bg.lock();
        bg.stats.cleaned_records += done.copied;
        bg.stats.cleaned_bytes += done.bytes;
        Ok(done)
    }

    /// Copies the records of `batch` that are still their keys' latest to
    /// the head, drops expired keys, and empties the batch.
    fn clean_batch(&self, batch: &mut Batch, done: &mut Cleaned) -> Result<(), EngineError> {
        if batch.records.is_empty() {
            return Ok(());
        }
        // Throttled here, the cleaner holds no lock a request may need.
        self.cache.balance_dirty()?;
        loop {
            // Under the stripes only what the order of the log needs: which
            // records are still their keys' latest, and their place at the
            // head. A request for one of these keys waits for exactly this
            // (the copy's bytes are gathered and copied after), and at the
            // lock ceiling the kernel does not preempt the cleaner midway.
            let keys: Vec<&[u8]> = batch.records.iter().map(Candidate::key).collect();
            let ceiling = context::ceiling();
            let mut held = Held::lock(&self.index, &keys);
            let now = now_ms();
            // Asked under the stripes, as for every change of a key: a
            // snapshot's end clears each stripe's pre-images after it ends
            // in the value log, so an answer given under a stripe stays
            // true for that stripe until it is let go.
            let snapshot = self.vlog.snapshot_running();
            let (mut live, mut sizes) = (Vec::new(), Vec::new());
            for c in &batch.records {
                let stripe = held.of(c.key());
                let Some(loc) = stripe.get(c.key()).filter(|l| l.addr == c.addr) else {
                    continue; // superseded or deleted: dead
                };
                if loc.expired(now) {
                    // A running BGSAVE still dumps it if it was live then.
                    stripe.set(c.key(), None, snapshot);
                    self.vlog.add_live(-i64::from(loc.size));
                    self.index.count(-1);
                    done.expired += 1;
                    continue;
                }
                live.push(c);
                sizes.push(c.bytes.len());
            }
            if live.is_empty() {
                break;
            }
            let total = sizes.iter().sum::<usize>() as u64;
            let largest = sizes.iter().copied().max().unwrap_or(0) as u64;
            let reserved = self.vlog.try_reserve(total, largest, 0, Who::Cleaner)?;
            let Some(mut res) = reserved else {
                drop(held);
                drop(ceiling);
                self.make_room(batch.records[0].addr, total + largest)?;
                continue;
            };
            // Placed while the stripes are held: a later write of any of
            // these keys lands after its copy in the log, which is the order
            // recovery replays. The copy itself holds no stripe, so a request
            // for one of these keys does not wait for the cleaner's pages:
            // the originals stay where they are until the clean tail passes.
            let epoch = self.epoch.read(); // appends hold it, like writers
            let placed = self.vlog.place(&mut res, &sizes)?;
            drop(held);
            drop(ceiling);
            let mut bytes = Vec::with_capacity(total as usize);
            for c in &live {
                bytes.extend_from_slice(&c.bytes);
            }
            // The head is past the copies' space now: if their bytes are
            // not written (a failed read of the head's page, or dirty
            // throttling on failing writeback), that space holds no records,
            // and a checkpoint would make durable a log recovery cannot
            // scan. The engine fails, as for a writer's failed append (before
            // the epoch lock goes, so no checkpoint's boundary includes it);
            // errors before the placement change nothing and are retried.
            if let Err(e) = self.vlog.fill(&placed, &bytes) {
                self.fail(format!("the cleaner's copies: {e}"));
                return Err(e);
            }
            drop(epoch);
            #[cfg(test)]
            tests::BEFORE_REPOINT.with(|hook| {
                if let Some(f) = hook.borrow().as_ref() {
                    f();
                }
            });
            // Repointed one key at a time: each check-and-set stands alone,
            // and a request waits for one key's, not for the batch's.
            // Whether a snapshot needs the original is asked under each
            // key's stripe: one may have started or ended since the
            // placement, and its end clears the stripes one by one (asked
            // once for the batch, a stripe already cleared got a pre-image
            // no one clears, and the next BGSAVE read the key as of a
            // record cleaned away). One that starts during the loop sees the
            // copies, placed before it began and whole.
            let _ceiling = context::ceiling();
            for (c, &addr) in live.iter().zip(&placed.addrs) {
                let mut stripe = self.index.lock(Index::stripe_of(c.key()));
                let snapshot = self.vlog.snapshot_running();
                // Written or deleted meanwhile: the copy is dead, and what
                // replaced the original comes after it in the log.
                let Some(loc) = stripe.get(c.key()).filter(|l| l.addr == c.addr) else {
                    continue;
                };
                stripe.set(c.key(), Some(Loc { addr, ..loc }), snapshot);
                done.copied += 1;
            }
            break;
        }
        batch.records.clear();
        batch.bytes = 0;
        Ok(())
    }

    /// The log has no room for the cleaner's copies of records from `addr`
    /// on: a checkpoint makes the space cleaned so far reusable; if that
    /// is not enough, wait (a snapshot holds the space), or the store is
    /// full.
    fn make_room(&self, addr: u64, bytes: u64) -> Result<(), EngineError> {
        self.vlog.cleaned_to(addr)?;
        self.checkpoint()?;
        if self.vlog.try_reserve(bytes, 0, 0, Who::Cleaner)?.is_some() {
            return Ok(());
        }
        if self.vlog.snapshot_running() {
            self.vlog.wait_for(bytes, 0, Who::Cleaner, || {});
            return Ok(());
        }
        Err(EngineError::NoSpace)
    }
}

/// Bytes of records the cleaner copies in one batch.
const BATCH_BYTES: usize = 32 << 10;
/// Records in one batch.
const BATCH_RECORDS: usize = 32;

/// A record the cleaner may copy, with its bytes as stored.
struct Candidate {
    addr: u64,
    /// Its key's length: the key is in `bytes`, after the header.
    key_len: usize,
    bytes: Vec<u8>,
}

impl Candidate {
    fn key(&self) -> &[u8] {
        &self.bytes[record::HEADER..record::HEADER + self.key_len]
    }
}

/// Records gathered for one pass.
#[derive(Default)]
struct Batch {
    records: Vec<Candidate>,
    bytes: usize,
}

impl Batch {
    /// A record of `key` at `addr`, whose bytes as stored are `stored`: a
    /// record holds no address, so its copy is those bytes (not encoded
    /// again, which computed its checksum a second time).
    fn push(&mut self, addr: u64, key: &[u8], stored: &[u8]) {
        self.bytes += stored.len();
        let c = Candidate {
            addr,
            key_len: key.len(),
            bytes: stored.to_vec(),
        };
        debug_assert_eq!(c.key(), key, "a record's key follows its header");
        self.records.push(c);
    }

    fn full(&self) -> bool {
        self.bytes >= BATCH_BYTES || self.records.len() >= BATCH_RECORDS
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::cell::RefCell;
    use std::sync::Arc;

    use critio::config::Config;
    use critio::device::mem::MemDevice;
    use critio::device::Device;

    use crate::engine::record;
    use crate::engine::vlog::Flow;
    use crate::engine::{Engine, EngineConfig, EngineError, SetOptions};

    thread_local! {
        /// Runs in the cleaning thread between a batch's copy and its repoint.
        pub(in crate::engine) static BEFORE_REPOINT: RefCell<Option<Box<dyn Fn()>>> = const { RefCell::new(None) };
    }

    /// A small engine over `dev` (1 MiB cache, 4 MiB log, checkpoints only
    /// when asked or the log fills), for the engine's unit tests.
    pub(in crate::engine) fn open(dev: &Arc<MemDevice>) -> Engine {
        open_over(dev.clone()).unwrap()
    }

    /// [`open`] over any device.
    pub(in crate::engine) fn open_over(dev: Arc<dyn Device>) -> Result<Engine, EngineError> {
        open_with(
            dev,
            EngineConfig {
                log_bytes: 4 << 20,
                checkpoint_interval_ms: 0,
                value_bytes_max: 64 << 10,
                ..EngineConfig::default()
            },
        )
    }

    /// An engine with `cfg` over `dev`, on a stack with a 1 MiB cache and
    /// background threads at the foreground's nice level.
    pub(in crate::engine) fn open_with(
        dev: Arc<dyn Device>,
        cfg: EngineConfig,
    ) -> Result<Engine, EngineError> {
        let mut config = Config::default();
        config.cache.capacity_bytes = 1 << 20;
        config.context.background_nice = 0;
        let stack = critio::Stack::over(dev, &config).unwrap();
        Engine::open(&stack, cfg)
    }

    fn key(i: usize) -> Vec<u8> {
        format!("k{i:03}").into_bytes()
    }

    /// The 16 KiB value [`near_a_laps_end`] writes.
    const LAP_FILL: [u8; 16 << 10] = [7u8; 16 << 10];

    /// Writes 16 KiB values (to keys 0..40, in turn) until less than 20
    /// KiB of the value log's lap are left. Returns the head, what is left
    /// of the lap, and a value that makes `key(999)`'s record exactly
    /// that long.
    fn near_a_laps_end(e: &Engine) -> (u64, usize, Vec<u8>) {
        let vlog = &e.inner.vlog;
        let region = vlog.region();
        let mut i = 0;
        while region - vlog.head() % region > 20 << 10 {
            e.set(&key(i % 40), &LAP_FILL, SetOptions::default())
                .unwrap();
            i += 1;
        }
        let last = vlog.head();
        let left = (region - last % region) as usize;
        let fill = vec![9u8; left - record::HEADER - key(999).len()];
        (last, left, fill)
    }

    /// A record can fill its lap of the value log to the last byte, with
    /// no padding after it; a scan (the cleaner's, a snapshot's) goes on
    /// into the next lap. It used to find its read-ahead stopped at the
    /// lap's end and panic, which killed the checkpointer and left every
    /// writer waiting for space.
    #[test]
    fn a_scan_reads_on_past_a_record_that_ends_exactly_at_the_end_of_a_lap() {
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = open(&dev);
        let vlog = &e.inner.vlog;
        let region = vlog.region();
        // One record exactly as long as what is left of the lap.
        let (last, left, fill) = near_a_laps_end(&e);
        let k = key(999);
        assert_eq!(record::size(k.len(), fill.len()), left);
        e.set(&k, &fill, SetOptions::default()).unwrap();
        assert_eq!(vlog.head() % region, 0, "the record ends the lap");
        // A few records into the next lap (the cleaner makes room at its
        // start).
        for j in 0..3 {
            e.set(&key(j), b"next lap", SetOptions::default()).unwrap();
        }
        let head = vlog.head();
        assert!(head > last + left as u64, "the head is in the next lap");
        let mut seen = Vec::new();
        let reached = vlog
            .scan(last, head, |addr, r, _| {
                seen.push((addr, r.key.to_vec()));
                Ok(Flow::Continue)
            })
            .unwrap();
        assert_eq!(reached, head);
        assert_eq!(seen[0], (last, k.clone()), "the lap's last record");
        assert_eq!(seen[1].0, last + left as u64, "the next lap's first");
        assert_eq!(
            seen.iter().filter(|(_, key)| key.as_slice() != k).count(),
            3
        );
        assert_eq!(e.get(&k).unwrap(), Some(fill));
        e.close().unwrap();
    }

    /// Records appended together (MSET, a transaction, a cleaner's batch)
    /// of which one fills its lap of the value log to the last byte: the
    /// next ones start the next lap, at the region's start. They were one
    /// run past the region's end: preparing its pages failed, which failed
    /// the engine (a debug build's assertion panicked, under the write's
    /// locks). Both are there, and after a reopen (the index rebuilt by a
    /// scan across the lap's end).
    #[test]
    fn records_appended_together_go_on_in_the_next_lap_after_one_fills_a_lap_exactly() {
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = open(&dev);
        let vlog = &e.inner.vlog;
        // One record exactly as long as what is left of the lap, and one
        // after it, in one write.
        let (last, left, fill) = near_a_laps_end(&e);
        let (k, k2) = (key(999), key(998));
        assert_eq!(record::size(k.len(), fill.len()), left);
        let next = b"the next lap's first".to_vec();
        e.mset(&[(&k, &fill), (&k2, &next)]).unwrap();
        let head = last + (left + record::size(k2.len(), next.len())) as u64;
        assert_eq!(vlog.head(), head, "no pad between them");
        let check = |e: &Engine| {
            assert_eq!(e.get(&k).unwrap(), Some(fill.clone()));
            assert_eq!(e.get(&k2).unwrap(), Some(next.clone()));
            assert_eq!(e.get(&key(0)).unwrap(), Some(LAP_FILL.to_vec()));
        };
        check(&e);
        e.close().unwrap();
        drop(e);
        let e = open(&dev);
        check(&e);
        e.close().unwrap();
    }

    /// The cleaner copies without holding the stripes; keys written or
    /// deleted between its copy and its repoint keep what was written, in
    /// memory and after reopening (the copies come first in the log).
    #[test]
    fn keys_written_while_the_cleaner_copies_keep_the_new_values() {
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = Arc::new(open(&dev));
        for i in 0..100 {
            e.set(&key(i), b"old", SetOptions::default()).unwrap();
        }
        let e2 = e.clone();
        BEFORE_REPOINT.with(|h| {
            *h.borrow_mut() = Some(Box::new(move || {
                for i in 0..50 {
                    e2.set(&key(i), b"new", SetOptions::default()).unwrap();
                }
                for i in 50..60 {
                    e2.del(&[&key(i)]).unwrap();
                }
            }))
        });
        let head = e.inner.vlog.head();
        let done = e.inner.clean(head, None).unwrap();
        BEFORE_REPOINT.with(|h| h.borrow_mut().take());
        assert_eq!(done.copied, 40, "only the untouched keys are repointed");
        let check = |e: &Engine| {
            assert_eq!(e.dbsize(), 90);
            for i in 0..100 {
                let want = match i {
                    0..50 => Some(b"new".to_vec()),
                    50..60 => None,
                    _ => Some(b"old".to_vec()),
                };
                assert_eq!(e.get(&key(i)).unwrap(), want, "key {i}");
            }
        };
        check(&e);
        // The originals' space is reused: the keys now live in the copies
        // and in what was written after them.
        e.inner.checkpoint().unwrap();
        check(&e);
        let e = Arc::into_inner(e).expect("the hook is gone");
        e.close().unwrap();
        drop(e);
        check(&open(&dev));
    }

    /// With the durable tail in the middle of a page, the cleaner's copies
    /// near the end of the region stop short of the page that physically
    /// holds the tail (the log's end is a region past that page's start):
    /// appends make the pages they start present zeroed, so one reaching
    /// into it would wipe the oldest records recovery needs, and their
    /// writeback before the next checkpoint would leave a superblock
    /// pointing at zeros. A power cut right after the copies are written
    /// back then recovers every key.
    #[test]
    fn copies_near_the_end_never_reach_the_page_holding_the_durable_tail() {
        use std::time::{Duration, Instant};

        use critio::device::faulty::{FaultConfig, FaultyDevice};
        let dev = Arc::new(
            FaultyDevice::new(Arc::new(MemDevice::new(32 << 20)), FaultConfig::default()).unwrap(),
        );
        let open_it = || {
            let mut config = critio::config::Config::default();
            config.cache.capacity_bytes = 1 << 20;
            config.context.background_nice = 0;
            let stack = critio::Stack::over(dev.clone(), &config).unwrap();
            Engine::open(
                &stack,
                EngineConfig {
                    log_bytes: 4 << 20,
                    checkpoint_interval_ms: 0,
                    value_bytes_max: 64 << 10,
                    clean_free_pct: 1,
                    ..EngineConfig::default()
                },
            )
        };
        let e = Arc::new(open_it().unwrap());
        let v = &e.inner.vlog;
        let region = v.region();
        // A durable tail in the middle of the first page: a dead 3992-byte
        // record cleaned away.
        e.set(b"pad", &vec![1u8; 3969], SetOptions::default())
            .unwrap();
        assert_eq!(v.head(), 3992);
        e.del(&[b"pad"]).unwrap();
        e.inner.clean(3992, None).unwrap();
        e.inner.checkpoint().unwrap();
        assert_eq!(v.boundary().0, 3992);
        // Garbage up to about 12% of the region short of the tail's lap
        // end, then live 64-byte records whose copies would end about 1500
        // bytes short of it: inside the page that holds the tail.
        let lap_end = 3992 + region;
        let big = vec![2u8; 60_000];
        while lap_end - v.head() > region / 100 * 12 + 70_000 {
            e.set(b"f", &big, SetOptions::default()).unwrap();
        }
        e.del(&[b"f"]).unwrap();
        let n = ((lap_end - v.head() - 1500) / 128) as usize;
        let keys: Vec<Vec<u8>> = (0..n).map(|i| format!("s{i:06}").into_bytes()).collect();
        let val = [3u8; 37];
        for chunk in keys.chunks(256) {
            let pairs: Vec<(&[u8], &[u8])> = chunk.iter().map(|k| (&k[..], &val[..])).collect();
            e.mset(&pairs).unwrap();
        }
        assert_eq!(v.boundary().0, 3992, "no cleaning yet");
        // No checkpoint moves the tail while the cleaner copies: it stops
        // at the end, waiting for one to make room.
        let ckpt = e.inner.ckpt.lock();
        let cleaner = {
            let (e, upto) = (e.clone(), v.head());
            std::thread::spawn(move || e.inner.clean(upto, None).map(|d| d.copied))
        };
        let start = Instant::now();
        while !cleaner.is_finished() && start.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(10));
        }
        let head = v.head();
        assert!(
            head <= region,
            "the copies reached {} bytes into the page holding the tail",
            head - region
        );
        // The copies written back, then the power goes before a superblock.
        e.inner.cache.flush_file(v.file()).unwrap();
        dev.power_cut().unwrap();
        drop(ckpt);
        let _ = cleaner.join().unwrap(); // fails if it had to checkpoint
        drop(e);
        dev.restart();
        let e = open_it().unwrap_or_else(|err| panic!("recovery after the power cut: {err}"));
        for k in &keys {
            assert_eq!(e.get(k).unwrap(), Some(val.to_vec()), "{k:?}");
        }
    }

    /// Waits until `done`, failing after 30 s ("never: {what}").
    pub(in crate::engine) fn wait_until(what: &str, done: impl Fn() -> bool) {
        let start = std::time::Instant::now();
        while !done() {
            assert!(
                start.elapsed() < std::time::Duration::from_secs(30),
                "never: {what}"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// The first key `{prefix}{i}` whose index stripe passes `ok`.
    fn key_with_stripe(prefix: &str, ok: impl Fn(usize) -> bool) -> Vec<u8> {
        (0..10_000)
            .map(|i| format!("{prefix}{i}").into_bytes())
            .find(|k| ok(crate::engine::index::Index::stripe_of(k)))
            .expect("a key of such a stripe")
    }

    fn dump_keys(e: &Engine) -> Vec<Vec<u8>> {
        let mut k: Vec<Vec<u8>> = e.read_dump().unwrap().into_iter().map(|x| x.key).collect();
        k.sort();
        k
    }

    /// Cleans up to `upto` on a thread of its own that stops before its
    /// first batch's repoint: it says so on the receiver, and goes on when
    /// the sender sends.
    fn cleaner_paused_before_its_first_repoint(
        e: &Arc<Engine>,
        upto: u64,
    ) -> (
        std::thread::JoinHandle<super::Cleaned>,
        std::sync::mpsc::Receiver<()>,
        std::sync::mpsc::Sender<()>,
    ) {
        use std::sync::atomic::{AtomicBool, Ordering};
        let (at_tx, at_rx) = std::sync::mpsc::channel();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        let e = e.clone();
        let cleaner = std::thread::spawn(move || {
            let paused = AtomicBool::new(false);
            BEFORE_REPOINT.with(|h| {
                *h.borrow_mut() = Some(Box::new(move || {
                    if !paused.swap(true, Ordering::SeqCst) {
                        at_tx.send(()).unwrap();
                        go_rx.recv().unwrap();
                    }
                }))
            });
            let done = e.inner.clean(upto, None).unwrap();
            BEFORE_REPOINT.with(|h| h.borrow_mut().take());
            done
        });
        (cleaner, at_rx, go_tx)
    }

    /// The cleaner repoints a key to its copy just as a BGSAVE ends (the
    /// end clears the stripes' pre-images one stripe at a time): it saves
    /// no pre-image under a stripe the end has passed, so the next BGSAVE
    /// dumps every live key.
    #[test]
    fn a_repoint_racing_the_end_of_a_bgsave_leaves_the_next_dump_whole() {
        use std::time::Duration;

        use crate::engine::index::Index;
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = Arc::new(open(&dev));
        let k2 = b"key-two".to_vec();
        let s2 = Index::stripe_of(&k2);
        let k3 = key_with_stripe("key3-", |s| s < s2);
        let s3 = Index::stripe_of(&k3);
        let x = key_with_stripe("x-", |s| ![s2, s3].contains(&s));
        let sx = Index::stripe_of(&x);
        e.set(&k2, b"two", SetOptions::default()).unwrap();
        e.set(&k3, b"three", SetOptions::default()).unwrap();
        let upto = e.inner.vlog.head();
        e.set(&x, b"x", SetOptions::default()).unwrap();
        // A BGSAVE held at x's record, after k2's and k3's.
        let gx = e.inner.index.lock(sx);
        e.bgsave().unwrap();
        wait_until("the dump passed k2 and k3", || {
            e.background_progress()
                .0
                .is_some_and(|p| p.keys_processed == 2)
        });
        let (cleaner, at_rx, go_tx) = cleaner_paused_before_its_first_repoint(&e, upto);
        at_rx.recv().unwrap(); // copies placed and filled, not repointed
        let g2 = e.inner.index.lock(s2);
        go_tx.send(()).unwrap(); // the cleaner waits for k2's stripe
        std::thread::sleep(Duration::from_millis(100));
        drop(gx); // the dump ends and clears the stripes up to s2
        wait_until("the snapshot ended in the value log", || {
            !e.inner.vlog.snapshot_running()
        });
        std::thread::sleep(Duration::from_millis(100));
        drop(g2);
        assert_eq!(cleaner.join().unwrap().copied, 2);
        wait_until("the BGSAVE ends", || {
            e.background_running() == (false, false)
        });
        let mut all = vec![k2.clone(), k3.clone(), x.clone()];
        all.sort();
        assert_eq!(dump_keys(&e), all);
        e.bgsave().unwrap();
        wait_until("the second BGSAVE ends", || {
            e.background_running() == (false, false)
        });
        assert_eq!(dump_keys(&e), all, "the second dump lost a live key");
    }

    /// A key live when BGSAVE was called that expires while the dump runs,
    /// and that the cleaner drops meanwhile, is in the dump (the dump
    /// keeps what was live as it began, as a fork would).
    #[test]
    fn a_key_the_cleaner_drops_as_expired_during_a_bgsave_is_still_dumped() {
        use std::time::Duration;

        use crate::engine::index::Index;
        use crate::engine::ops::now_ms;
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = Arc::new(open(&dev));
        let a = b"a-dead".to_vec();
        let sa = Index::stripe_of(&a);
        let fs: Vec<Vec<u8>> = (0..10_000)
            .map(|i| format!("f{i}").into_bytes())
            .filter(|k| Index::stripe_of(k) != sa)
            .take(31)
            .collect();
        let k = key_with_stripe("k", |s| s != sa);
        e.set(&a, b"dead", SetOptions::default()).unwrap();
        for f in &fs {
            e.set(f, b"f", SetOptions::default()).unwrap();
        }
        let expire = now_ms() + 500;
        let ttl = SetOptions {
            expire_at_ms: Some(expire),
            ..SetOptions::default()
        };
        e.set(&k, b"ttl", ttl).unwrap();
        e.del(&[&a[..]]).unwrap();
        let upto = e.inner.vlog.head();
        let (cleaner, at_rx, go_tx) = cleaner_paused_before_its_first_repoint(&e, upto);
        at_rx.recv().unwrap(); // the first batch placed, not repointed
                               // The BGSAVE is held at a's stripe (its dead record comes first).
        let ga = e.inner.index.lock(sa);
        let called = now_ms();
        e.bgsave().unwrap();
        assert!(called < expire, "k is live when BGSAVE is called");
        while now_ms() <= expire + 50 {
            std::thread::sleep(Duration::from_millis(10));
        }
        go_tx.send(()).unwrap();
        let done = cleaner.join().unwrap();
        assert_eq!(done.expired, 1, "the cleaner dropped k as expired");
        drop(ga);
        wait_until("the BGSAVE ends", || {
            e.background_running() == (false, false)
        });
        assert!(
            dump_keys(&e).contains(&k),
            "k was live when BGSAVE was called, but is not in the dump"
        );
    }

    /// Expired keys count as live data until the cleaner drops them: once
    /// every key of a store at its live-data limit has expired, a write
    /// refused for the limit makes the checkpointer sweep them out, and
    /// writes are taken again.
    #[test]
    fn a_store_full_of_expired_keys_takes_writes_again_after_a_sweep() {
        use std::time::{Duration, Instant};

        use crate::engine::ops::now_ms;
        use crate::engine::EngineError;
        let dev = Arc::new(MemDevice::new(32 << 20));
        let e = open(&dev);
        let value = vec![5u8; 16 << 10];
        // The fill and the sweep its refusal asks for (which finds every key
        // live, and copies them all) must end before the keys expire, or
        // that sweep would drop them and nothing after the expiry would be
        // refused: the writes are a request's (a background writer is
        // throttled to a few dirty pages of this 1 MiB cache, and its fill
        // took seconds), the test waits for that sweep, and the keys live
        // long enough for a busy machine (fill and sweep took up to 4 s here
        // with three other threads spinning on two cores).
        let _fg = critio::context::foreground();
        let expire = now_ms() + 10_000;
        let ttl = SetOptions {
            expire_at_ms: Some(expire),
            ..SetOptions::default()
        };
        let mut n = 0;
        loop {
            match e.set(format!("ttl{n}").as_bytes(), &value, ttl) {
                Ok(_) => n += 1,
                Err(EngineError::NoSpace) => break,
                Err(err) => panic!("{err}"),
            }
        }
        assert!(n > 100, "{n} keys fill the live-data limit");
        wait_until("the sweep the fill asked for ends", || {
            e.background_stats().expiry_sweeps >= 1
        });
        assert!(
            now_ms() < expire,
            "the fill and its sweep took longer than the keys live"
        );
        while now_ms() <= expire {
            std::thread::sleep(Duration::from_millis(20));
        }
        // The write refused last, again: a smaller one (a shorter key) could
        // fit in what the fill left under the limit.
        let refused_key = format!("ttl{n}").into_bytes();
        let start = Instant::now();
        let mut refused = 0;
        loop {
            match e.set(&refused_key, &value, SetOptions::default()) {
                Ok(_) => break,
                Err(EngineError::NoSpace) => refused += 1,
                Err(err) => panic!("{err}"),
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "still refused after 20 s ({refused} tries), live {}",
                e.inner.vlog.live()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(
            refused >= 1,
            "the first write after the expiry was taken before any sweep"
        );
        // (taken as soon as the second sweep, still going, freed enough)
        wait_until("the second sweep ends", || {
            e.background_stats().expiry_sweeps >= 2
        });
        assert_eq!(e.get(&refused_key).unwrap(), Some(value.clone()));
        for i in (0..n).step_by(37) {
            assert_eq!(e.get(format!("ttl{i}").as_bytes()).unwrap(), None);
        }
        e.close().unwrap();
    }

    /// Which commands a [`FailingMem`] fails (by op and offset), and the
    /// error's words.
    type Fault = (
        Box<dyn Fn(critio::device::Op, u64) -> bool + Send + Sync>,
        &'static str,
    );

    /// A 32 MiB memory device that fails the commands its fault picks (a
    /// bad sector, a disk that died), none until one is set.
    pub(crate) struct FailingMem {
        mem: MemDevice,
        fault: parking_lot::Mutex<Option<Fault>>,
    }

    impl FailingMem {
        pub(crate) fn new() -> Arc<Self> {
            Arc::new(Self {
                mem: MemDevice::new(32 << 20),
                fault: parking_lot::Mutex::new(None),
            })
        }

        /// From now on, fails the commands `fails` picks with `why`.
        pub(crate) fn fail(
            &self,
            why: &'static str,
            fails: impl Fn(critio::device::Op, u64) -> bool + Send + Sync + 'static,
        ) {
            *self.fault.lock() = Some((Box::new(fails), why));
        }

        /// Fails nothing any more.
        pub(crate) fn heal(&self) {
            *self.fault.lock() = None;
        }
    }

    impl Device for FailingMem {
        fn info(&self) -> &critio::device::DeviceInfo {
            self.mem.info()
        }

        fn submit(&self, cmd: critio::device::Command, done: critio::device::Completer) {
            let (op, offset) = (cmd.op, cmd.offset);
            let why = match &*self.fault.lock() {
                Some((fails, why)) if fails(op, offset) => *why,
                _ => return self.mem.submit(cmd, done),
            };
            done(critio::device::Completion {
                result: Err(critio::device::DeviceError::Io {
                    device: "failing-mem".into(),
                    op,
                    offset,
                    source: std::io::Error::other(why),
                }),
                buf: cmd.buf,
            })
        }
    }

    /// The cleaner has placed a batch's copies (the head is past them)
    /// when writing their bytes fails: here the read of the head's page,
    /// evicted since the last checkpoint. That space holds no records, so
    /// the engine fails, as for a writer's failed append: no write is
    /// acknowledged after it and no checkpoint makes that log durable. (The
    /// error used to be only recorded: a later write was acknowledged, the
    /// next checkpoint made that log durable, and after a crash the store
    /// did not open, recovery's scan meeting the unwritten copies.) A
    /// restart recovers every acknowledged key.
    #[test]
    fn a_failed_write_of_the_cleaners_placed_copies_fails_the_engine_and_loses_nothing() {
        let dev = FailingMem::new();
        let e = open_over(dev.clone()).unwrap();
        let value = vec![4u8; 3000];
        for i in 0..4 {
            e.set(&key(i), &value, SetOptions::default()).unwrap();
        }
        let (page, v) = (e.inner.layout.page, &e.inner.vlog);
        let head = v.head();
        assert!(
            head / page > 0 && head % page != 0,
            "the head {head} is inside a later page"
        );
        // The head's page written back and evicted; reading it fails.
        e.inner.checkpoint().unwrap();
        e.inner.cache.drop_clean();
        let at = e.inner.layout.data.0 + head % v.region() / page * page;
        dev.fail("bad sector", move |op, offset| {
            op == critio::device::Op::Read && offset == at
        });
        let err = e.inner.clean(head, None).unwrap_err();
        assert!(
            v.head() > head,
            "the copies were placed before the error: {err}"
        );
        dev.heal();
        let after = e.set(b"after", b"acked?", SetOptions::default());
        let _ = e.save();
        drop(e); // a crash: no final checkpoint
        let e = open_over(dev).unwrap_or_else(|err| panic!("reopening: {err}"));
        for i in 0..4 {
            assert_eq!(e.get(&key(i)).unwrap(), Some(value.clone()), "key {i}");
        }
        if after.is_ok() {
            assert_eq!(e.get(b"after").unwrap(), Some(b"acked?".to_vec()));
        }
        assert!(
            matches!(&after, Err(EngineError::Failed(why)) if why.contains("cleaner")),
            "a write after the cleaner's failure: {after:?}"
        );
        e.close().unwrap();
    }
}
