//! The block layer's driver: runs the scheduler core on the caller's threads
//! and the device's completion threads, against a real clock.
//!
//! ```text
//!  submit (caller) ──lock core──> Scheduler::submit ──no slot──> park ("block: admission")
//!        │                                                            ^ woken by a completion
//!        v                                                            │ or a promotion
//!  kick: while Scheduler::dispatch -> Device::submit (outside the lock)
//!                                                │
//!  device completion thread <────────────────────┘
//!        └─> Scheduler::complete, wake admitted submitters, finish the handle, kick
//!  timer thread: kicks when an anticipation window or a cap probe ends
//! ```
//!
//! One thread dispatches at a time (a dispatcher's turn); a kick that finds
//! another dispatcher leaves the work to it, which re-checks the core after
//! each batch, so a device that completes inline cannot recurse. A
//! critical thread is the exception: it does not wait behind another
//! thread's turn but takes one of its own alongside (a dispatcher is
//! outside the core lock while it hands its batch to the device, and one
//! that is background work, preempted there by the CPU scheduler, held
//! queued foreground requests for milliseconds: a priority inversion
//! through the dispatcher's turn). A thread never takes a second turn
//! while it is in one.
//!
//! A request that its submitter waits for, dispatched by that submitter, is
//! done by it where the device can ([`Device::flush_here`]: `fdatasync` on
//! a file, with no io_uring worker thread and no reaper wake-up between
//! the kernel and the caller; [`Device::submit_here`]: a read or write on
//! the caller's own ring, the kernel waking the caller itself), after it
//! has ended its turn as dispatcher, so no other request waits behind it.
//! A read or write goes this way only once no one can promote it (it is
//! critical, or the scheme has no inheritance).
//!
//! Per request the driver reads the clock twice (at submission and at
//! completion: the device time needs both), takes the core lock once to
//! submit and dispatch, once to complete, and once more to end the
//! dispatcher's turn unless the turn was its own request alone, done in its
//! thread (the turn then ends under the submission's lock). A request done
//! in its submitter's thread that the core would dispatch at once anyway
//! (nothing queued, a slot and room at the device) takes no turn and no
//! entry in the core's table ([`Scheduler::submit_direct`]): the common
//! case of a foreground read on an idle device. While the core has nothing
//! queued, such a request takes no core lock either: it goes through the
//! fast path's gate (`fast.rs`, [`Inner::lock_core`]), two
//! compare-and-swaps and a record (or, untimed, an atomic add to a tally)
//! the next lock holder folds in. A request
//! allocates its shared state (what waiters wait on) only if someone other
//! than its submitter may complete it, and the device's completion closure
//! only for a request sent through [`Device::submit`]; a one-request batch
//! is kept inline. The two clock reads cost about 20 ns on this project's
//! virtual machine, a tenth of a 4 KiB read from memory (`critio bench
//! block-overhead` measures both), so on such a device the fast path times
//! one request in 16.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use parking_lot::{Condvar, Mutex, MutexGuard};

use super::fast::{FastPath, Record, Ticket};
use super::request::{IoHandle, IoState};
use super::sched::{Direct, Promotion, ReqInfo, Scheduler};
use super::stats::StatsAcc;
use super::{BlockConfig, BlockStats, ClassBuckets, ReqId, IO_LEN_MAX};
use crate::class::Class;
use crate::context::{self, Blocker, BlockingStatus, InheritKind, TaskRef, WaitScope};
use crate::device::{
    validate_parts, AlignedBuf, Command, Completion, Device, DeviceError, IoHint, Op,
};
use crate::error::ConfigError;
use crate::metrics::MetricsHandle;
use crate::shim::thread;
use crate::time::{Clock, Nanos};

/// The wait point of admission waits.
pub const ADMISSION_POINT: &str = "block: admission";
/// The wait point of queue waits (admission to dispatch), per class.
pub const QUEUE_POINT: &str = "block: queue";
/// The default wait point of waits for a request's completion.
pub const IO_POINT: &str = "block: io";

/// Why a request failed.
#[derive(Clone, Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BlockError {
    /// The device refused or failed the command.
    #[error(transparent)]
    Device(Arc<DeviceError>),
    /// The request is larger than the block layer accepts.
    #[error("block layer: a {len}-byte request exceeds the {max}-byte limit; split it")]
    TooLarge {
        /// The request's length.
        len: u64,
        /// The limit ([`IO_LEN_MAX`]).
        max: u64,
    },
}

impl From<DeviceError> for BlockError {
    fn from(e: DeviceError) -> Self {
        BlockError::Device(Arc::new(e))
    }
}

/// What the core keeps per request.
struct Payload {
    cmd: Option<Command>,
    /// What its waiters wait on; none while only its submitter, which
    /// does it in its own thread, may complete it ([`Inner::start`]).
    state: Option<Arc<IoState>>,
    /// The submitter, while it waits for admission.
    admission_waiter: Option<TaskRef>,
}

struct Core {
    sched: Scheduler<Payload>,
    stats: StatsAcc,
    /// Dispatchers' turns in progress: at most one, and besides it the
    /// turns critical threads took alongside ([`Inner::take_batch`]).
    turns: u32,
    /// Turns critical threads took while another was in progress.
    shared_turns: u64,
    timer_at: Option<Nanos>,
    shutdown: bool,
}

/// The core lock, taken through [`Inner::lock_core`].
struct CoreGuard<'a> {
    inner: &'a Inner,
    /// Always some until dropped.
    core: Option<MutexGuard<'a, Core>>,
    /// Fast-path requests folded in while held: their (zero) queue waits
    /// go to the wait-point table once the lock is released.
    folded: u64,
}

impl std::ops::Deref for CoreGuard<'_> {
    type Target = Core;
    fn deref(&self) -> &Core {
        self.core.as_ref().expect("held until dropped")
    }
}

impl std::ops::DerefMut for CoreGuard<'_> {
    fn deref_mut(&mut self) -> &mut Core {
        self.core.as_mut().expect("held until dropped")
    }
}

impl Drop for CoreGuard<'_> {
    fn drop(&mut self) {
        if let Some(core) = self.core.take() {
            // Only a critical thread reopens the gate: it is the one that
            // uses it, and a background thread's request takes the lock a
            // few times, each of which would otherwise close and reopen
            // it. After background work the next critical request goes
            // the locked way once, and reopens it.
            if self.inner.fast_on() && context::current_class() == Class::Critical {
                if let Some(room) = core.sched.fast_room() {
                    self.inner.fast.open(&room);
                }
            }
            drop(core);
        }
        self.inner.metrics.get().record_waits(
            QUEUE_POINT,
            Class::Critical,
            Duration::ZERO,
            self.folded,
        );
    }
}

/// What one dispatcher turn sends to the device. Most turns send one
/// request, which is kept inline, so a turn allocates nothing.
#[derive(Default)]
struct Batch {
    first: Option<(ReqId, Command)>,
    rest: Vec<(ReqId, Command)>,
}

impl Batch {
    fn push(&mut self, id: ReqId, cmd: Command) {
        if self.first.is_none() {
            debug_assert!(self.rest.is_empty());
            self.first = Some((id, cmd));
        } else {
            self.rest.push((id, cmd));
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }

    /// Request `id`'s command, if it is in the batch.
    fn get(&self, id: ReqId) -> Option<&Command> {
        self.first
            .iter()
            .chain(&self.rest)
            .find(|(i, _)| *i == id)
            .map(|(_, cmd)| cmd)
    }

    /// Takes every request out, in dispatch order.
    fn drain(&mut self) -> impl Iterator<Item = (ReqId, Command)> + '_ {
        self.first.take().into_iter().chain(self.rest.drain(..))
    }
}

/// A request that left the device: one with a place in the core's table,
/// or one sent without ([`Scheduler::submit_direct`]), with the state its
/// waiters wait on if it got one.
enum Sent {
    Tracked(ReqId),
    Direct(Direct, Option<Arc<IoState>>),
}

/// How a submission left its submitter.
enum Started {
    /// Done by the submitter in its own thread before [`Inner::start`] (or,
    /// through the fast path, [`Inner::do_fast`]) returned, with no state:
    /// the outcome and the buffer.
    Done(Result<(), BlockError>, AlignedBuf),
    /// Outstanding, or finished through its state: wait on that.
    Pending(Arc<IoState>),
}

impl Started {
    /// A synchronous request's outcome and buffer, waited for if it is
    /// still outstanding.
    #[inline]
    fn outcome(self) -> Result<AlignedBuf, BlockError> {
        match self {
            Started::Done(result, buf) => result.map(|()| buf),
            Started::Pending(state) => IoHandle { state }.wait_buf(),
        }
    }
}

std::thread_local! {
    /// Whether this thread is in a dispatcher's turn (between taking a
    /// batch and ending the turn under the core lock). One flag for every
    /// layer: no device below a block layer submits to another block layer
    /// from inside its `submit` (`end_turn` asserts the flag in debug
    /// builds, so a device that did would be caught by the tests).
    static IN_TURN: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Ends the calling thread's dispatcher turn (under the core lock).
fn end_turn(core: &mut Core) {
    debug_assert!(core.turns > 0 && IN_TURN.get());
    core.turns -= 1;
    IN_TURN.set(false);
}

/// Refuses a request longer than [`IO_LEN_MAX`].
fn within_limit(len: usize) -> Result<(), BlockError> {
    let len = len as u64;
    if len > IO_LEN_MAX {
        return Err(BlockError::TooLarge {
            len,
            max: IO_LEN_MAX,
        });
    }
    Ok(())
}

/// Called with the id of a request promoted while at the device.
pub type AtDeviceHook = Arc<dyn Fn(ReqId) + Send + Sync>;

pub(crate) struct Inner {
    device: Arc<dyn Device>,
    cfg: BlockConfig,
    clock: Clock,
    /// Taken through [`Inner::lock_core`], except by the timer thread
    /// (which changes only the timer and waits on `timer_cv`) and at
    /// shutdown.
    core: Mutex<Core>,
    /// Critical requests sent while nothing is queued, past the core lock
    /// (see `fast.rs`); used only on a device that does requests in its
    /// caller's thread.
    fast: FastPath,
    /// The device's [`Device::submits_here`] and [`Device::flushes_here`],
    /// asked once.
    submits_here: bool,
    flushes_here: bool,
    timer_cv: Condvar,
    next_id: AtomicU64,
    at_device_hook: Mutex<Option<AtDeviceHook>>,
    /// The registry this layer's waits (and the layers' above it) go to.
    pub(crate) metrics: MetricsHandle,
}

/// A block layer in front of one device. Share it with `Arc`; dropping it
/// stops its timer thread (outstanding requests still complete).
pub struct BlockLayer {
    inner: Arc<Inner>,
    timer: Option<JoinHandle<()>>,
}

impl BlockLayer {
    /// A block layer over `device` with `cfg`, recording its waits in the
    /// process-wide metrics registry.
    pub fn new(device: Arc<dyn Device>, cfg: BlockConfig) -> Result<Self, ConfigError> {
        Self::with_metrics(device, cfg, MetricsHandle::GLOBAL)
    }

    /// A block layer recording its waits in `metrics` (a stack's registry).
    /// The page cache and the log over it record theirs there too.
    pub fn with_metrics(
        device: Arc<dyn Device>,
        cfg: BlockConfig,
        metrics: MetricsHandle,
    ) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let depth = device.info().queue_depth.max(1);
        let (submits_here, flushes_here) = (device.submits_here(), device.flushes_here());
        let inner = Arc::new(Inner {
            device,
            cfg,
            fast: FastPath::new(),
            submits_here,
            flushes_here,
            clock: Clock::new(),
            core: Mutex::new(Core {
                sched: Scheduler::new(cfg.sched(depth)),
                stats: StatsAcc::default(),
                turns: 0,
                shared_turns: 0,
                timer_at: None,
                shutdown: false,
            }),
            timer_cv: Condvar::new(),
            next_id: AtomicU64::new(1),
            at_device_hook: Mutex::new(None),
            metrics,
        });
        let timer = {
            let inner = inner.clone();
            std::thread::Builder::new()
                .name("critio-block-timer".into())
                .spawn(move || inner.timer_loop())
                .expect("cannot spawn the block timer thread")
        };
        Ok(Self {
            inner,
            timer: Some(timer),
        })
    }

    /// The device below.
    pub fn device(&self) -> &Arc<dyn Device> {
        &self.inner.device
    }

    /// The registry this layer, and the layers built over it, record
    /// their waits in.
    pub fn metrics(&self) -> &MetricsHandle {
        &self.inner.metrics
    }

    /// The configuration.
    pub fn config(&self) -> &BlockConfig {
        &self.inner.cfg
    }

    /// Submits a request. `sync`: the caller will wait for it, so it takes
    /// the caller's class (per the scheme); otherwise it is non-critical
    /// (writeback, read-ahead) until someone critical waits for it. Blocks
    /// while no admission slot is free. `point` names the wait point of waits
    /// on the returned handle.
    pub fn submit(
        &self,
        op: Op,
        offset: u64,
        buf: AlignedBuf,
        sync: bool,
        point: &'static str,
    ) -> Result<IoHandle, BlockError> {
        self.inner.submit(op, offset, buf, sync, point)
    }

    /// Reads `len` bytes at `offset` synchronously, in the caller's class.
    pub fn read(&self, offset: u64, len: usize) -> Result<AlignedBuf, BlockError> {
        // Refused before its buffer is allocated: a length no request may
        // have is an error, not an allocation of that size.
        within_limit(len)?;
        let buf = AlignedBuf::zeroed(len);
        self.inner.run(Op::Read, offset, buf)
    }

    /// Writes `buf` at `offset` synchronously, in the caller's class.
    pub fn write(&self, offset: u64, buf: AlignedBuf) -> Result<(), BlockError> {
        self.inner.run(Op::Write, offset, buf).map(drop)
    }

    /// Writes zeros over `len` bytes at `offset` synchronously, in the
    /// caller's class, in writes of up to 4 MiB; does not flush. For a
    /// region a device allocates on its first write
    /// ([`DeviceInfo::allocates_on_first_write`](crate::device::DeviceInfo)),
    /// written once when it is created so that no later write of it pays
    /// for the allocation. Stops at the first error.
    pub fn write_zeros(&self, offset: u64, len: u64) -> Result<(), BlockError> {
        const CHUNK: u64 = 4 << 20;
        let chunk = CHUNK.min(IO_LEN_MAX);
        let mut at = offset;
        while at < offset + len {
            let n = chunk.min(offset + len - at);
            self.write(at, AlignedBuf::zeroed(n as usize))?;
            at += n;
        }
        Ok(())
    }

    /// The longest request the calling thread should submit for a bulk
    /// transfer it cuts into requests: `sync`, it will wait for them (so
    /// they take its class), or not (non-critical). See
    /// [`BlockConfig::noncritical_request_max_bytes`].
    pub fn request_len_max(&self, sync: bool) -> u64 {
        let class = self
            .inner
            .cfg
            .scheme
            .classify(sync, context::current_class());
        self.inner.cfg.request_len_max(class)
    }

    /// Writes asynchronously (non-critical until awaited by a critical task).
    pub fn write_async(&self, offset: u64, buf: AlignedBuf) -> Result<IoHandle, BlockError> {
        self.submit(Op::Write, offset, buf, false, IO_POINT)
    }

    /// Flushes the device's write cache synchronously, in the caller's class.
    pub fn flush(&self) -> Result<(), BlockError> {
        self.inner.run(Op::Flush, 0, AlignedBuf::empty()).map(drop)
    }

    /// Promotes a request wherever it is (no-op without I/O inheritance).
    pub fn promote(&self, id: ReqId) -> Promotion {
        self.inner.promote(id, InheritKind::Io)
    }

    /// Promotes every outstanding non-critical request overlapping a byte
    /// range (for a critical task that waits for "whatever I/O covers this").
    /// Returns how many were promoted or found at the device.
    pub fn promote_range(&self, offset: u64, len: u64) -> usize {
        let ids = self
            .inner
            .lock_core()
            .sched
            .noncritical_overlapping(offset, len);
        ids.into_iter()
            .filter(|&id| self.inner.promote(id, InheritKind::Io) != Promotion::NotFound)
            .count()
    }

    /// Installs the hook called when a request is promoted at the device (the
    /// write cache reissues it).
    pub fn set_at_device_hook(&self, hook: AtDeviceHook) {
        *self.inner.at_device_hook.lock() = Some(hook);
    }

    /// A snapshot of the per-class metrics.
    pub fn stats(&self) -> BlockStats {
        let mut core = self.inner.lock_core();
        let Core {
            sched,
            stats,
            shared_turns,
            ..
        } = &mut *core;
        let mut out = stats.snapshot(
            sched.counters(),
            sched.noncritical_cap(),
            sched.cap_view(),
            sched.pacing_rate(),
            sched.background_own_rate(),
        );
        out.shared_dispatch_turns = *shared_turns;
        out
    }

    /// Zeroes the per-class counts and latency histograms of
    /// [`BlockLayer::stats`] and the shared dispatch turns (a server's
    /// CONFIG RESETSTAT); the scheduler's own counters and the adaptive
    /// cap's state are kept.
    pub fn reset_stats(&self) {
        let mut core = self.inner.lock_core();
        core.stats = StatsAcc::default();
        core.shared_turns = 0;
    }

    /// Each class's admission wait, queue wait and device time histograms
    /// read at `bounds` (cumulative counts, count, sum), critical first:
    /// what a Prometheus exporter exposes. Computed under the core lock (a
    /// pass over each histogram), so meant for a scrape every few seconds,
    /// not for every request.
    pub fn latency_buckets(&self, bounds: &[Duration]) -> Vec<ClassBuckets> {
        self.inner.lock_core().stats.buckets(bounds)
    }

    /// Where an outstanding request is.
    pub fn location(&self, id: ReqId) -> Option<super::Location> {
        self.inner.lock_core().sched.location(id)
    }

    /// The clock the layer measures with.
    pub fn clock(&self) -> &Clock {
        &self.inner.clock
    }
}

impl Drop for BlockLayer {
    fn drop(&mut self) {
        self.inner.core.lock().shutdown = true;
        self.inner.timer_cv.notify_all();
        if let Some(t) = self.timer.take() {
            let _ = t.join();
        }
    }
}

impl Inner {
    /// Submits a request and returns a handle to wait on.
    fn submit(
        self: &Arc<Self>,
        op: Op,
        offset: u64,
        buf: AlignedBuf,
        sync: bool,
        point: &'static str,
    ) -> Result<IoHandle, BlockError> {
        let (class, hint) = self.check(op, offset, buf.len(), sync)?;
        let cmd = Command {
            op,
            offset,
            buf,
            class,
            hint,
        };
        match self.start(cmd, point, true) {
            Started::Pending(state) => Ok(IoHandle { state }),
            Started::Done(..) => unreachable!("a request with a handle is finished through it"),
        }
    }

    /// A synchronous request in the caller's class, waited for: its
    /// outcome, and the buffer (the data, for a read).
    ///
    /// One the core would send at once goes past the core altogether
    /// while the fast path's gate is open. It takes no id (its tag stays
    /// 0: nothing can promote it), so no shared counter either. Its
    /// command is built only once it has its place, as the device's
    /// argument: on a device answering from memory, each move of it
    /// through another frame showed in the layer's cost.
    fn run(
        self: &Arc<Self>,
        op: Op,
        offset: u64,
        buf: AlignedBuf,
    ) -> Result<AlignedBuf, BlockError> {
        let (class, hint) = self.check(op, offset, buf.len(), true)?;
        let command = |buf| Command {
            op,
            offset,
            buf,
            class,
            hint,
        };
        // Done here, no one can promote it, and one the core would send at
        // once (critical, or classes off).
        let fast = self.does_here(op)
            && self.goes_here(op, class)
            && (class == Class::Critical || !self.cfg.scheme.classes());
        if let Some(ticket) = fast.then(|| self.fast.enter()).flatten() {
            return self.do_fast(ticket, IO_POINT, command(buf)).outcome();
        }
        self.start(command(buf), IO_POINT, false).outcome()
    }

    /// A request's class (per the scheme: `sync`, the caller will wait for
    /// it, so it takes the caller's class) and where it comes from, once
    /// its size and its place on the device are checked.
    #[inline(always)]
    fn check(
        &self,
        op: Op,
        offset: u64,
        len: usize,
        sync: bool,
    ) -> Result<(Class, IoHint), BlockError> {
        within_limit(len)?;
        let len = len as u64;
        validate_parts(self.device.info(), op, offset, len)?;
        let (class, foreground) = context::current_class_and_foreground();
        let hint = IoHint {
            sync,
            foreground,
            tag: 0,
        };
        Ok((self.cfg.scheme.classify(sync, class), hint))
    }

    /// Whether the fast path is used: the device does some requests in
    /// their caller's thread.
    fn fast_on(&self) -> bool {
        self.submits_here || self.flushes_here
    }

    /// Whether the device does `op` in its caller's thread.
    fn does_here(&self, op: Op) -> bool {
        match op {
            Op::Flush => self.flushes_here,
            Op::Read | Op::Write => self.submits_here,
        }
    }

    /// Submits a request. With `handle`, it gets its shared state (what
    /// its waiters wait on) at once; without, only if someone other than
    /// the submitter may complete it: a request its submitter dispatches
    /// itself and does in its own thread needs none, and its outcome comes
    /// back as [`Started::Done`].
    fn start(self: &Arc<Self>, mut cmd: Command, point: &'static str, handle: bool) -> Started {
        let (op, offset, len, class, sync) = (
            cmd.op,
            cmd.offset,
            cmd.buf.len() as u64,
            cmd.class,
            cmd.hint.sync,
        );
        // A request its submitter waits for may be done by that thread.
        let here = sync && self.does_here(op);
        let mine_here = here && self.goes_here(op, class);
        let id = self.next_id();
        cmd.hint.tag = id;
        let new_state = || IoState::new(id, point, Arc::downgrade(self));
        let info = ReqInfo {
            class,
            level: context::current_background_level(),
            op,
            offset,
            len,
        };
        // One that cannot be gets its state now, outside the core lock.
        let state = (handle || !mine_here).then(new_state);
        let now = self.clock.now();
        let mut batch = Batch::default();
        let (admitted, alone, state) = {
            let mut core = self.lock_core();
            // One done here that the core would dispatch at once goes with
            // no table entry, no state and no dispatcher's turn.
            if mine_here && !handle {
                if let Some(d) = core.sched.submit_direct(&info, now) {
                    drop(core);
                    return self.do_direct(d, id, point, cmd);
                }
            }
            let payload = Payload {
                state,
                cmd: Some(cmd),
                admission_waiter: None,
            };
            let admitted = core.sched.submit(id, info, payload, now);
            let mut mine = false;
            if admitted {
                self.take_batch(&mut core, now, &mut batch);
                mine = here
                    && batch
                        .get(id)
                        .is_some_and(|cmd| self.goes_here(cmd.op, cmd.class));
            }
            // The submitter's own request, alone in its turn and done in
            // its thread: the turn ends here (nothing else was dispatchable
            // under this same lock), with no second pass over the core.
            let alone = mine && batch.len() == 1;
            if alone {
                end_turn(&mut core);
            }
            let p = core.sched.payload_mut(id).expect("just submitted");
            if !admitted {
                p.admission_waiter = Some(context::current());
            }
            // Whoever else may complete the request finishes its state.
            if !mine && p.state.is_none() {
                p.state = Some(new_state());
            }
            (admitted, alone, p.state.clone())
        };
        if !admitted {
            self.wait_admission(id);
            self.kick();
        } else if alone {
            let (_, cmd) = batch.drain().next().expect("a batch of one");
            return self.do_here(id, point, cmd);
        } else if let Some(started) = self.run_dispatch_own(batch, now, here.then_some((id, point)))
        {
            return started;
        }
        Started::Pending(state.expect("a request someone else completes has its state"))
    }

    /// A new request's id.
    fn next_id(&self) -> ReqId {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Whether the submitter's own request, dispatched by itself, is done
    /// in its thread: a flush, or a read or write no one can promote any
    /// more (critical already, or no inheritance), since a thread blocked
    /// inside the device is not in a wait a critical task's chain walk can
    /// find.
    fn goes_here(&self, op: Op, class: Class) -> bool {
        op == Op::Flush || class == Class::Critical || !self.cfg.scheme.inheritance()
    }

    /// Does request `id`, which its submitter dispatched and waits for, in
    /// the calling thread ([`Device::flush_here`], [`Device::submit_here`]).
    /// A device that hands it back gets it as usual; the request then gets
    /// its state (if it had none) before it goes.
    fn do_here(self: &Arc<Self>, id: ReqId, point: &'static str, cmd: Command) -> Started {
        match self.try_here(cmd) {
            Ok(c) => self.on_complete(Sent::Tracked(id), c),
            Err(cmd) => {
                let state = {
                    let mut core = self.lock_core();
                    let p = core.sched.payload_mut(id).expect("not sent yet");
                    p.state
                        .get_or_insert_with(|| IoState::new(id, point, Arc::downgrade(self)))
                        .clone()
                };
                self.send(id, cmd);
                Started::Pending(state)
            }
        }
    }

    /// [`Inner::do_here`] for a request sent by
    /// [`Scheduler::submit_direct`]: one the device hands back gets a
    /// state, which its completion finishes.
    fn do_direct(
        self: &Arc<Self>,
        d: Direct,
        id: ReqId,
        point: &'static str,
        cmd: Command,
    ) -> Started {
        match self.try_here(cmd) {
            Ok(c) => self.on_complete(Sent::Direct(d, None), c),
            Err(cmd) => self.send_direct(d, id, point, cmd),
        }
    }

    /// Sends a request with no place in the core's table through the
    /// device's completion (the device handed it back): it gets a state,
    /// which its completion finishes.
    fn send_direct(
        self: &Arc<Self>,
        d: Direct,
        id: ReqId,
        point: &'static str,
        cmd: Command,
    ) -> Started {
        let state = IoState::new(id, point, Arc::downgrade(self));
        let (inner, waited) = (self.clone(), state.clone());
        self.device.submit(
            cmd,
            Box::new(move |c| {
                inner.on_complete(Sent::Direct(d, Some(waited)), c);
            }),
        );
        Started::Pending(state)
    }

    /// Does a request that went through the fast path's gate in the
    /// calling thread. If it completes in the gate's epoch, the core gets
    /// a record of it (folded in by the next lock holder); if the epoch
    /// ended meanwhile, the core adopted it and it completes through the
    /// core; if the device hands it back, it goes through the device's
    /// completion as an adopted request.
    #[inline]
    fn do_fast(self: &Arc<Self>, ticket: Ticket, point: &'static str, cmd: Command) -> Started {
        let (op, len) = (cmd.op, cmd.buf.len() as u64);
        let t0 = self.fast.timed().then(|| self.clock.now());
        match self.try_here(cmd) {
            Ok(c) => {
                let times = t0.map(|t0| (t0, self.clock.now()));
                if !self.fast.leave(&ticket) {
                    let d = Direct::adopted(op, len, t0, &ticket.room);
                    return self.on_complete(Sent::Direct(d, None), c);
                }
                if times.is_none() && op != Op::Write {
                    if self.fast.add_untimed(len) {
                        // The tally is due: taking the lock folds it in.
                        drop(self.lock_core());
                    }
                    return Started::Done(c.result.map_err(BlockError::from), c.buf);
                }
                let record = Record {
                    op,
                    len,
                    times,
                    nc_inflight: ticket.room.nc_inflight,
                };
                if let Err(record) = self.fast.push(record) {
                    // The ring is full: fold it in now, this one with it.
                    let mut core = self.lock_core();
                    self.fold(&mut core, record, &mut None);
                    core.folded += 1;
                }
                Started::Done(c.result.map_err(BlockError::from), c.buf)
            }
            Err(cmd) => {
                // Taking the lock ends the gate's epoch (if it had not
                // ended already): the core has adopted the request.
                drop(self.lock_core());
                let d = Direct::adopted(op, len, Some(self.clock.now()), &ticket.room);
                self.send_direct(d, self.next_id(), point, cmd)
            }
        }
    }

    /// Takes the core lock as every holder but the timer does: ends the
    /// fast path's epoch, adopts what it still has at the device and folds
    /// in what it completed, so the core decides on everything sent; the
    /// guard reopens the gate on release by a critical thread if nothing is
    /// queued.
    fn lock_core(&self) -> CoreGuard<'_> {
        let mut core = self.core.lock();
        let mut folded = 0;
        if self.fast_on() {
            let adopted = self.fast.close();
            core.sched.adopt_fast(adopted);
            let mut now = None;
            while let Some(record) = self.fast.pop() {
                self.fold(&mut core, record, &mut now);
                folded += 1;
            }
            let (n, bytes) = self.fast.take_untimed();
            if n > 0 {
                let now = *now.get_or_insert_with(|| self.clock.now());
                core.sched.complete_fast_untimed(n, now);
                core.stats.record_fast_untimed(n, bytes);
                folded += n;
            }
        }
        CoreGuard {
            inner: self,
            core: Some(core),
            folded,
        }
    }

    /// Folds a fast-path request's record into the core and the stats.
    /// `now`: the fold's time, read once for the untimed records (the
    /// adaptive cap counts them as critical traffic until then).
    fn fold(&self, core: &mut Core, r: Record, now: &mut Option<Nanos>) {
        let now = match (r.times, *now) {
            (Some((_, done)), _) => done,
            (None, Some(now)) => now,
            (None, None) => *now.insert(self.clock.now()),
        };
        let device_time = core
            .sched
            .complete_fast(r.op, r.len, r.times, r.nc_inflight, now);
        if let Some(t) = device_time {
            self.fast.note_device_time(t);
        }
        let bytes = if r.op == Op::Flush { 0 } else { r.len };
        core.stats.record_fast(bytes, device_time);
    }

    /// Does `cmd` in the calling thread ([`Device::flush_here`],
    /// [`Device::submit_here`]), or hands it back if the device cannot.
    fn try_here(&self, cmd: Command) -> Result<Completion, Command> {
        if cmd.op == Op::Flush {
            match self.device.flush_here() {
                Some(result) => Ok(Completion {
                    result,
                    buf: cmd.buf,
                }),
                None => Err(cmd),
            }
        } else {
            self.device.submit_here(cmd)
        }
    }

    fn wait_admission(self: &Arc<Self>, id: ReqId) {
        let blocker = Arc::new(AdmissionWait {
            layer: Arc::downgrade(self),
            id,
        });
        let status = BlockingStatus::Admission {
            stage: ADMISSION_POINT,
        };
        let scope = WaitScope::enter(status, blocker);
        loop {
            {
                let mut core = self.lock_core();
                if core.sched.location(id) != Some(super::Location::AwaitingAdmission) {
                    if let Some(p) = core.sched.payload_mut(id) {
                        p.admission_waiter = None;
                    }
                    break;
                }
            }
            thread::park();
        }
        drop(scope);
    }

    /// Dispatches everything the core allows, one dispatcher at a time.
    fn kick(self: &Arc<Self>) {
        let now = self.clock.now();
        let mut batch = Batch::default();
        self.take_batch(&mut self.lock_core(), now, &mut batch);
        self.run_dispatch(batch, now);
    }

    /// Under the core lock: if no other thread is dispatching, takes what
    /// the core allows now into the empty `batch` and makes the caller a
    /// dispatcher (it must then call [`Inner::run_dispatch`]). Leaves it
    /// empty if there is nothing to do or another dispatcher will do it (it
    /// re-checks after each batch), unless the caller is critical and not
    /// in a turn itself: it takes one alongside rather than wait for a
    /// dispatcher that may be background work the CPU scheduler holds.
    fn take_batch(&self, core: &mut Core, now: Nanos, batch: &mut Batch) {
        debug_assert!(batch.is_empty());
        let shared = core.turns > 0;
        if shared
            && (IN_TURN.get()
                || !self.cfg.scheme.classes()
                || context::current_class() != Class::Critical)
        {
            return;
        }
        let classes = self.cfg.scheme.classes();
        while let Some((id, class, p)) = core.sched.dispatch_payload(now) {
            let promoted = classes && class == Class::Critical;
            let mut cmd = p.cmd.take().expect("a request is dispatched once");
            if promoted {
                cmd.class = Class::Critical; // promoted: critical at the device too
            }
            batch.push(id, cmd);
        }
        if batch.is_empty() {
            let next = core.sched.next_timer(now);
            if next.is_some_and(|t| core.timer_at.is_none_or(|cur| t < cur)) {
                core.timer_at = next;
                self.timer_cv.notify_one();
            }
        } else {
            core.turns += 1;
            core.shared_turns += u64::from(shared);
            IN_TURN.set(true);
        }
        #[cfg(debug_assertions)]
        core.sched.check_invariants();
    }

    /// Sends `batch` to the device, then keeps dispatching until the core
    /// allows nothing more; ends the dispatcher's turn. `now` is the time the
    /// batch was taken; later batches take a fresh one.
    fn run_dispatch(self: &Arc<Self>, batch: Batch, now: Nanos) {
        self.run_dispatch_own(batch, now, None);
    }

    /// [`Inner::run_dispatch`], where `own` is a request the calling
    /// thread submitted and will wait for (and its wait point): if it is
    /// dispatched here and [`Inner::goes_here`], it is done in this thread
    /// ([`Inner::do_here`]) once this thread has stopped dispatching (a
    /// dispatcher blocked in its own I/O would hold back every other
    /// request), and its outcome returned.
    fn run_dispatch_own(
        self: &Arc<Self>,
        mut batch: Batch,
        mut now: Nanos,
        own: Option<(ReqId, &'static str)>,
    ) -> Option<Started> {
        let mut mine = None;
        while !batch.is_empty() {
            for (id, cmd) in batch.drain() {
                if own.is_some_and(|(own, _)| own == id) && self.goes_here(cmd.op, cmd.class) {
                    mine = Some(cmd);
                } else {
                    self.send(id, cmd);
                }
            }
            let mut core = self.lock_core();
            end_turn(&mut core);
            if core.sched.dispatchable() {
                now = self.clock.now();
            }
            self.take_batch(&mut core, now, &mut batch);
        }
        let ((id, point), cmd) = own.zip(mine)?;
        Some(self.do_here(id, point, cmd))
    }

    /// Hands request `id` to the device; its completion finishes the
    /// request's state, which it has by then.
    fn send(self: &Arc<Self>, id: ReqId, cmd: Command) {
        let inner = self.clone();
        self.device.submit(
            cmd,
            Box::new(move |c| {
                inner.on_complete(Sent::Tracked(id), c);
            }),
        );
    }

    /// Completes a request: finishes its state and returns it, or, for a
    /// request with none (done by its submitter), returns the outcome.
    fn on_complete(self: &Arc<Self>, sent: Sent, c: Completion) -> Started {
        let now = self.clock.now();
        let bytes = c.buf.len() as u64;
        let mut batch = Batch::default();
        let (done, wake) = {
            let mut core = self.lock_core();
            let mut done = match sent {
                Sent::Tracked(id) => core.sched.complete(id, now),
                Sent::Direct(d, state) => {
                    let payload = Payload {
                        cmd: None,
                        state,
                        admission_waiter: None,
                    };
                    core.sched.complete_direct(d, payload, now)
                }
            };
            core.stats.record(&done, bytes);
            let wake: Vec<TaskRef> = if done.admitted.is_empty() {
                Vec::new()
            } else {
                done.admitted
                    .drain(..)
                    .filter_map(|a| core.sched.payload_mut(a)?.admission_waiter.take())
                    .collect()
            };
            self.take_batch(&mut core, now, &mut batch);
            (done, wake)
        };
        if done.class == Class::Critical {
            // The wait-point tables are of critical tasks' waits; both classes
            // are in the layer's own per-class stats.
            let waited = std::time::Duration::from_nanos(done.queue_wait);
            self.metrics
                .get()
                .record_wait(QUEUE_POINT, Class::Critical, waited);
        }
        for t in wake {
            t.unpark();
        }
        let result = c.result.map_err(BlockError::from);
        let started = match done.payload.state {
            Some(state) => {
                state.finish(result, c.buf);
                Started::Pending(state)
            }
            None => Started::Done(result, c.buf),
        };
        self.run_dispatch(batch, now);
        started
    }

    /// Promotes a request; `kind` says whether a waiter on the I/O or an
    /// admission waiter that turned critical asked (for the counters).
    pub(crate) fn promote(self: &Arc<Self>, id: ReqId, kind: InheritKind) -> Promotion {
        if !self.cfg.scheme.inheritance() {
            return Promotion::Disabled;
        }
        let (outcome, wake) = {
            let mut core = self.lock_core();
            let now = self.clock.now();
            let outcome = core.sched.promote(id, now);
            let wake = match outcome {
                Promotion::Admitted => core
                    .sched
                    .payload_mut(id)
                    .and_then(|p| p.admission_waiter.take()),
                _ => None,
            };
            (outcome, wake)
        };
        if !matches!(outcome, Promotion::NotFound | Promotion::AlreadyCritical) {
            self.metrics.get().count_resolution(kind);
        }
        if let Some(t) = wake {
            t.unpark();
        }
        match outcome {
            Promotion::Admitted | Promotion::Requeued => self.kick(),
            Promotion::AtDevice => {
                let hook = self.at_device_hook.lock().clone();
                if let Some(hook) = hook {
                    hook(id);
                }
            }
            _ => {}
        }
        outcome
    }

    fn timer_loop(self: Arc<Self>) {
        let mut core = self.core.lock();
        loop {
            if core.shutdown {
                return;
            }
            let now = self.clock.now();
            match core.timer_at {
                Some(at) if at <= now => {
                    core.timer_at = None;
                    drop(core);
                    self.kick();
                    core = self.core.lock();
                }
                Some(at) => {
                    let deadline = self.clock.instant(at);
                    self.timer_cv.wait_until(&mut core, deadline);
                }
                None => self.timer_cv.wait(&mut core),
            }
        }
    }
}

impl Inner {
    /// Records a wait on one of `layer`'s blockers (an admission slot, a
    /// request) in the layer's registry, or the process-wide one if the
    /// layer is gone.
    pub(crate) fn record_wait_in(
        layer: &Weak<Inner>,
        point: &'static str,
        class: Class,
        waited: std::time::Duration,
    ) {
        match layer.upgrade() {
            Some(layer) => layer.metrics.get().record_wait(point, class, waited),
            None => crate::metrics::global().record_wait(point, class, waited),
        }
    }
}

/// The blocker of a submitter waiting for an admission slot: if it turns
/// critical, its request retries in the critical pool.
struct AdmissionWait {
    layer: Weak<Inner>,
    id: ReqId,
}

impl Blocker for AdmissionWait {
    fn record_wait(
        &self,
        point: &'static str,
        class: crate::class::Class,
        waited: std::time::Duration,
    ) {
        Inner::record_wait_in(&self.layer, point, class, waited);
    }
    fn resolve(&self, waiter: &TaskRef, _flipped: &mut Vec<TaskRef>) {
        if !waiter.is_critical() {
            return;
        }
        if let Some(layer) = self.layer.upgrade() {
            layer.promote(self.id, InheritKind::Admission);
        }
    }
}

const _: () = {
    const fn is_send_sync<T: Send + Sync>() {}
    is_send_sync::<BlockLayer>();
};
