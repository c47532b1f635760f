//! `nvwc`: a request-oriented non-volatile write cache (paper 002): a fast
//! durable device in front of a slow backing device that admits only the
//! writes requests wait for, so the scarce cache is not filled and
//! congested by background writes.
//!
//! [`WriteCache`] is itself a [`Device`], so it sits under the block layer
//! like any other: the block layer's command hints (`sync`, `foreground`,
//! the class) are what the admission [`Policy`] decides by, and its
//! promotion of a request already at the device is what reissues an
//! in-flight write to the cache ([`WriteCache::reissue_hook`], which the
//! stack wires into the block layer).
//!
//! # The write path
//!
//! ```text
//!  submit(write) ── per block: cached already? ──yes──> cache (a newer copy never goes behind a cached one)
//!        │                    admitted by the policy? ──yes──> cache ──no free slot──> stall (FIFO, "nvwc: cache full")
//!        │                                            ──no───> backing             or bypass (full = "bypass")
//!        v
//!  cache blocks:   data -> new slots (copy-on-write, never in place)  ┐ in parallel; complete when both
//!                  map records -> metadata log (group commit)         ┘ are written (durable after a flush)
//!  backing blocks: write -> backing device, then a grouped backing flush, so a bypassed write is
//!                  durable when it completes and a flush of the write cache never waits for the
//!                  slow device
//!  flush:          flush the cache device (data and metadata of every completed write)
//!  read:           per block the newest copy: cache slot if mapped, else backing (served piecewise)
//! ```
//!
//! A write completes, like a write to a drive with a volatile cache, when
//! its data and map records are written; it is durable once a flush
//! submitted after its completion completes. After a crash,
//! [`WriteCache::new`] recovers every such write from the cache or the
//! backing device, and no stale copy wins (`tests/nvwc.rs` cuts the power
//! of both devices at random points to check it).
//!
//! # The reissue path (CP+PI+IOI; paper 002, Section 4.2.2)
//!
//! ```text
//!  critical task waits on request 42 ── block layer: promote(42) = at the device ── hook ──> reissue(42)
//!  bypassed write 42 (its data kept) ───────────────> backing device ... still in flight
//!  reissue(42): same data -> new cache slots + map records + cache flush ──> completes write 42 (once)
//!  the backing write lands later: its completion is discarded (counted); the map already points to
//!  the cache copy, and writeback of those blocks waits until no backing write to them is in flight,
//!  so the late write never overwrites newer data
//! ```
//!
//! Once reissued, the cache copy decides: if the backing write completes
//! first, its completion is held until the copy is durable (and used only
//! if the reissue fails), because a write issued after write 42 completes
//! must find the copy mapped, not go behind it.
//!
//! # Failures
//!
//! A failed write or flush of the cache device (data, metadata, reissue,
//! compaction) *poisons* the write cache: which completed writes are
//! durable is unknown, so writes and flushes are refused with
//! [`NvwcError::Poisoned`] (reads still work) until it is dropped and
//! opened again, which recovers. A failed backing write fails only its
//! command; a failed writeback round changes nothing and is retried.
//!
//! # The metadata log (`record.rs`, `mdlog.rs`, `recovery.rs`)
//!
//! ```text
//!  records:  map(slot, block, seq, data crc)    a version of a block is in a slot
//!            free(block, seq)                   written back: map records of block <= seq are dead
//!  appended in batches to fresh sectors of the half of the current epoch (never rewriting a
//!  sector that holds records); when the half is full, compaction:
//!    1. snapshot: a map record per slot being written or mapped (not one being freed: its
//!       free record may be among those dropped) -> the other half, epoch + 1
//!    2. flush  3. header(epoch + 1) -> header slot (epoch + 1) % 2  4. flush
//!  (records wait meanwhile; a crash before 4 leaves the old epoch's half and header intact)
//!  recovery: newest valid header -> every valid record of its epoch in its half ->
//!    per block, the newest map record not killed by a free record whose data matches its crc wins
//!    (a slot is reused only after what superseded its version is durable, so an older record
//!    never points at another block's data) -> written as the next epoch (a compaction)
//! ```
//!
//! # Writeback
//!
//! A background thread writes the oldest cached blocks back when the cache
//! is `writeback_start_pct` full (until `writeback_stop_pct`), or at once
//! when writes stall: read the slots, write contiguous runs to the backing
//! device as non-critical I/O, flush the backing device, append free
//! records, flush the cache device; the slots are then free.

mod config;
mod core;
mod error;
mod flush;
mod io;
mod joint;
mod layout;
mod mdlog;
mod policy;
mod read;
mod record;
mod recovery;
mod reissue;
mod stats;
mod write;
mod writeback;

#[cfg(test)]
mod core_tests;

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex};

pub use config::{
    FullPolicy, NvwcConfig, WriteCacheConfig, BATCH_BYTES_MAX, BLOCK_BYTES_RANGE,
    COMMAND_BYTES_MAX, HEADER_BYTES, ROUND_BLOCKS_MAX, SECTOR_BYTES_MAX, SLOTS_MAX,
};
pub use error::NvwcError;
pub use policy::{ParsePolicyError, Policy};
pub use recovery::RecoveryReport;
pub use reissue::Reissue;
pub use stats::NvwcStats;

use self::core::Core;
use crate::device::{Command, Completer, Completion, Device, DeviceError, DeviceInfo, Op};
use crate::time::{Clock, Nanos};
use flush::GroupFlush;
use layout::Layout;
use mdlog::MdState;
use stats::Counters;
use write::WriteOp;

/// The wait point of writes stalled for a free cache slot.
pub const STALL_POINT: &str = "nvwc: cache full";

/// A write waiting for free slots.
struct Stalled {
    cmd: Command,
    done: Completer,
    since: Nanos,
}

/// What the driver keeps under one lock.
struct State {
    core: Core,
    /// Writes waiting for free slots, first come first served.
    stalled: VecDeque<Stalled>,
    /// Bypassed writes in flight by tag, kept for reissue (CP+PI+IOI).
    inflight: HashMap<u64, Arc<WriteOp>>,
    /// Writeback is on (between the start and stop thresholds).
    writeback_active: bool,
    shutdown: bool,
}

/// Everything the write cache's threads and completions share.
struct Shared {
    /// Where stalls are recorded: the stack's registry once it is set.
    metrics: std::sync::OnceLock<crate::metrics::MetricsHandle>,
    cache: Arc<dyn Device>,
    backing: Arc<dyn Device>,
    cfg: NvwcConfig,
    layout: Layout,
    info: DeviceInfo,
    state: Mutex<State>,
    /// Wakes the writeback thread (paired with `state`).
    wake: Condvar,
    md: Mutex<MdState>,
    /// Why the cache is poisoned, if it is (a leaf lock).
    poison: Mutex<Option<String>>,
    bypass_flush: Mutex<GroupFlush>,
    /// One writeback round at a time.
    round_lock: Mutex<()>,
    counters: Counters,
    clock: Clock,
    recovery: RecoveryReport,
}

/// A non-volatile write cache: a [`Device`] over a cache device and a
/// backing device. Share it with `Arc`; dropping it stops its writeback
/// thread, waiting for a round in progress (so drop the last handle on a
/// thread that is not one of the devices' completion threads, once I/O has
/// quiesced), and fails writes still waiting for a slot. Cached blocks stay
/// cached: they are recovered when it is opened again.
pub struct WriteCache {
    shared: Arc<Shared>,
    writeback: Option<JoinHandle<()>>,
}

impl WriteCache {
    /// Opens a write cache of `cache` in front of `backing`, recovering
    /// what the cache device holds (or formatting it if its header area is
    /// blank), and starts the writeback thread. The error says what does
    /// not fit or what failed.
    pub fn new(
        cache: Arc<dyn Device>,
        backing: Arc<dyn Device>,
        cfg: NvwcConfig,
    ) -> Result<WriteCache, DeviceError> {
        let mut wc = Self::without_writeback_thread(cache, backing, cfg)?;
        let shared = wc.shared.clone();
        let thread = std::thread::Builder::new()
            .name("critio-nvwc-writeback".into())
            .spawn(move || shared.writeback_loop())
            .map_err(|e| DeviceError::Open {
                device: wc.shared.info.name.clone(),
                cause: format!("cannot start the writeback thread: {e}"),
            })?;
        wc.writeback = Some(thread);
        Ok(wc)
    }

    /// Like [`WriteCache::new`], without a writeback thread: blocks are
    /// written back only by [`WriteCache::writeback_now`] and
    /// [`WriteCache::writeback_all`], on the caller's thread, so a test
    /// over devices that complete inline runs deterministically from its
    /// seed. A write stalled for a slot waits until one of them is called.
    pub fn without_writeback_thread(
        cache: Arc<dyn Device>,
        backing: Arc<dyn Device>,
        cfg: NvwcConfig,
    ) -> Result<WriteCache, DeviceError> {
        let name = format!("nvwc({} -> {})", cache.info().name, backing.info().name);
        let layout =
            Layout::new(&cfg, cache.info(), backing.info()).map_err(|e| e.into_open(&name))?;
        let opened = recovery::open(&*cache, &layout).map_err(|e| e.into_open(&name))?;
        let info = DeviceInfo {
            name,
            capacity: layout.capacity(),
            block_size: cfg.block_bytes,
            // Commands go on to two devices, each with its own queue: a
            // bypassed write holds its slot until the slow device (and a
            // grouped flush) completes it, which must not take the slots
            // of the writes the cache would finish at once.
            queue_depth: cache
                .info()
                .queue_depth
                .saturating_add(backing.info().queue_depth),
            // Writes the cache admits land on the cache device first.
            allocates_on_first_write: cache.info().allocates_on_first_write
                || backing.info().allocates_on_first_write,
        };
        let core = Core::new(layout.slots, &opened.placed, opened.next_seq);
        let shared = Arc::new(Shared {
            metrics: std::sync::OnceLock::new(),
            cache,
            backing,
            cfg,
            layout,
            info,
            state: Mutex::new(State {
                core,
                stalled: VecDeque::new(),
                inflight: HashMap::new(),
                writeback_active: false,
                shutdown: false,
            }),
            wake: Condvar::new(),
            md: Mutex::new(MdState::new(opened.epoch, opened.next_sector)),
            poison: Mutex::new(None),
            bypass_flush: Mutex::new(GroupFlush::default()),
            round_lock: Mutex::new(()),
            counters: Counters::default(),
            clock: Clock::new(),
            recovery: opened.report,
        });
        Ok(WriteCache {
            shared,
            writeback: None,
        })
    }

    /// The hook a block layer over this write cache calls with the tag of
    /// each request it promotes while the request is at the device: it
    /// runs [`WriteCache::reissue`]. Whoever assembles the stack wires it
    /// (`block.set_at_device_hook(wc.reissue_hook())`, as
    /// [`crate::stack::Stack`] does), so the write cache needs nothing from
    /// the block layer above it. The hook holds the cache weakly: once the
    /// cache is dropped it does nothing.
    pub fn reissue_hook(&self) -> Arc<dyn Fn(u64) + Send + Sync> {
        let weak = Arc::downgrade(&self.shared);
        Arc::new(move |tag| {
            if let Some(shared) = weak.upgrade() {
                shared.reissue(tag);
            }
        })
    }

    /// Records the write cache's stalls in `metrics` (a stack's registry)
    /// instead of the process-wide one. Only the first call counts.
    pub fn record_waits_in(&self, metrics: crate::metrics::MetricsHandle) {
        let _ = self.shared.metrics.set(metrics);
    }

    /// I/O criticality inheritance at the device: if the bypassed write
    /// with block-layer tag `tag` is still in flight at the backing device,
    /// writes its data to the cache and completes it when that is durable,
    /// discarding the backing device's later completion. Only with
    /// `cp+pi+ioi`; never blocks.
    pub fn reissue(&self, tag: u64) -> Reissue {
        self.shared.reissue(tag)
    }

    /// What the write cache did so far, and how full it is.
    pub fn stats(&self) -> NvwcStats {
        let sh = &self.shared;
        let (used, dirty) = {
            let st = sh.state.lock();
            (st.core.used() as u64, st.core.dirty_count() as u64)
        };
        sh.counters
            .snapshot(sh.cfg.policy, u64::from(sh.layout.slots), used, dirty)
    }

    /// The configuration.
    pub fn config(&self) -> &NvwcConfig {
        &self.shared.cfg
    }

    /// What opening found on the cache device.
    pub fn recovery(&self) -> &RecoveryReport {
        &self.shared.recovery
    }

    /// The cache device.
    pub fn cache_device(&self) -> &Arc<dyn Device> {
        &self.shared.cache
    }

    /// The backing device.
    pub fn backing_device(&self) -> &Arc<dyn Device> {
        &self.shared.backing
    }

    /// Writes waiting for a free slot now.
    pub fn stalled(&self) -> usize {
        self.shared.state.lock().stalled.len()
    }

    /// One writeback round of the oldest blocks, at most `max_blocks`
    /// (taken within 1..=2048), on the caller's thread; then a cache flush
    /// releases the freed slots and admits stalled writes. Returns the
    /// blocks written back.
    pub fn writeback_now(&self, max_blocks: usize) -> Result<usize, DeviceError> {
        self.shared
            .writeback_round(max_blocks.clamp(1, ROUND_BLOCKS_MAX as usize))
    }

    /// Writes back every cached block (those cached when called and those
    /// completing meanwhile), on the caller's thread; returns when the
    /// cache holds no dirty block. A block with a backing write in flight
    /// waits for it.
    pub fn writeback_all(&self) -> Result<(), DeviceError> {
        self.shared.writeback_all()
    }
}

impl Device for WriteCache {
    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn submit(&self, cmd: Command, done: Completer) {
        let sh = &self.shared;
        if let Err(e) = sh.refuse(&cmd) {
            return done(Completion {
                result: Err(e),
                buf: cmd.buf,
            });
        }
        match cmd.op {
            Op::Read => sh.read(cmd, done),
            Op::Write => sh.write(cmd, done),
            Op::Flush => sh.flush(cmd, done),
        }
    }
}

impl Drop for WriteCache {
    fn drop(&mut self) {
        let stalled: Vec<Stalled> = {
            let mut st = self.shared.state.lock();
            st.shutdown = true;
            st.stalled.drain(..).collect()
        };
        self.shared.wake.notify_all();
        // Joined so that no writeback I/O follows the drop (a device may be
        // cut and restarted next); not from the thread itself.
        if let Some(t) = self.writeback.take() {
            if t.thread().id() != std::thread::current().id()
                && t.join().is_err()
                && !std::thread::panicking()
            {
                panic!("the write cache's writeback thread panicked");
            }
        }
        for s in stalled {
            let e = NvwcError::Closed.into_device(&self.shared.info.name, Op::Write, s.cmd.offset);
            (s.done)(Completion {
                result: Err(e),
                buf: s.cmd.buf,
            });
        }
    }
}

impl Shared {
    /// Why `cmd` is refused before it starts, if it is.
    fn refuse(&self, cmd: &Command) -> Result<(), DeviceError> {
        crate::device::validate(&self.info, cmd)?;
        let len = cmd.len() as u64;
        if len > COMMAND_BYTES_MAX {
            let e = NvwcError::TooLarge {
                len,
                max: COMMAND_BYTES_MAX,
            };
            return Err(e.into_device(&self.info.name, cmd.op, cmd.offset));
        }
        if cmd.op == Op::Read {
            return Ok(());
        }
        if let Some(what) = self.poison.lock().clone() {
            let e = NvwcError::Poisoned { what };
            return Err(e.into_device(&self.info.name, cmd.op, cmd.offset));
        }
        Ok(())
    }

    /// Marks the cache poisoned by the failure of `what` (the first wins)
    /// and fails the writes waiting for a slot: none will be admitted.
    /// Called with no lock held.
    fn poison(&self, what: &str) {
        let what = self
            .poison
            .lock()
            .get_or_insert_with(|| what.to_owned())
            .clone();
        let stalled: Vec<Stalled> = self.state.lock().stalled.drain(..).collect();
        for s in stalled {
            let e = NvwcError::Poisoned { what: what.clone() };
            let e = e.into_device(&self.info.name, Op::Write, s.cmd.offset);
            (s.done)(Completion {
                result: Err(e),
                buf: s.cmd.buf,
            });
        }
    }

    fn is_poisoned(&self) -> bool {
        self.poison.lock().is_some()
    }
}

const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<WriteCache>();
};
