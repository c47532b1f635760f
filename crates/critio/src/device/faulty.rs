//! `faulty`: wraps any device and injects the faults a storage stack must
//! survive. Every fault is off by default and every decision is drawn from
//! one seed, in submission order.
//!
//! | fault          | config                                | the caller sees                          | the inner device sees |
//! |----------------|---------------------------------------|------------------------------------------|-----------------------|
//! | read error     | `read_error_rate`                     | `Injected`, buffer untouched             | nothing               |
//! | write error    | `write_error_rate`                    | `Injected`; nothing is written           | nothing               |
//! | flush error    | `flush_error_rate`                    | `Injected`; nothing becomes durable      | nothing               |
//! | latency spike  | `latency_spike_rate`, `latency_spike` | the completion, `latency_spike` late     | the command, at once  |
//! | no space       | `no_space_after_bytes`                | `NoSpace` once that many bytes were written | nothing            |
//! | power cut      | [`FaultyDevice::power_cut`], `torn_writes` | in-flight and later commands: `PoweredOff` | unflushed writes undone, kept, or torn |
//!
//! Power cuts follow the same rule as `sim` (see `device::crash`): the
//! device ends in "last flushed state + the surviving unflushed writes, in
//! order". To undo a write it needs the write's pre-image, so every write
//! is preceded by a read of the same range from the inner device:
//!
//! ```text
//!   submit(write) ──> inner.read(range) ──> inner.write(data) ──> log (pre, data) ──> done
//!   submit(flush) ──> inner.flush ──> writes completed before the submit are durable
//!   power_cut()   ──> refuse new commands, wait for in-flight ones, undo + redo on inner, inner.flush
//! ```
//!
//! Latency spikes are delivered by a timer thread (started only when the
//! spike rate is positive), so a submitter is never blocked. Overlapping
//! writes in flight at once have no defined order, here as on any device.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex, MutexGuard};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::crash::{CrashLog, CutReport};
use super::{
    submit_and_wait, validate, AlignedBuf, Command, Completer, Completion, Device, DeviceError,
    DeviceInfo, Op,
};
use crate::class::Class;

/// Which faults to inject. Every fault is off by default.
#[derive(Clone, Debug, PartialEq)]
pub struct FaultConfig {
    /// Every decision derives from this. Default: 0.
    pub seed: u64,
    /// Probability that a read fails with `Injected`. Default: 0.
    pub read_error_rate: f64,
    /// Probability that a write fails with `Injected` (and is not written).
    /// Default: 0.
    pub write_error_rate: f64,
    /// Probability that a flush fails with `Injected` (and makes nothing
    /// durable). Default: 0.
    pub flush_error_rate: f64,
    /// Probability that a completion is delayed by `latency_spike`.
    /// Default: 0.
    pub latency_spike_rate: f64,
    /// How long a spike delays a completion. Default: 100 ms.
    pub latency_spike: Duration,
    /// A power cut may tear an unflushed write: keep only a prefix of its
    /// blocks. Default: false.
    pub torn_writes: bool,
    /// Writes fail with `NoSpace` once this many bytes have been written.
    /// Default: none (never).
    pub no_space_after_bytes: Option<u64>,
    /// The simulated volatile cache: past this many unflushed bytes the
    /// oldest writes count as durable (bounds the pre-images kept).
    /// Default: 64 MiB.
    pub write_cache_bytes: u64,
}

impl Default for FaultConfig {
    fn default() -> Self {
        Self {
            seed: 0,
            read_error_rate: 0.0,
            write_error_rate: 0.0,
            flush_error_rate: 0.0,
            latency_spike_rate: 0.0,
            latency_spike: Duration::from_millis(100),
            torn_writes: false,
            no_space_after_bytes: None,
            write_cache_bytes: 64 << 20,
        }
    }
}

/// The longest latency spike allowed.
pub const LATENCY_SPIKE_MAX: Duration = Duration::from_secs(60);

impl FaultConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), String> {
        for (field, rate) in [
            ("read_error_rate", self.read_error_rate),
            ("write_error_rate", self.write_error_rate),
            ("flush_error_rate", self.flush_error_rate),
            ("latency_spike_rate", self.latency_spike_rate),
        ] {
            if !(0.0..=1.0).contains(&rate) {
                return Err(format!(
                    "{field} = {rate} must be a probability in 0.0..=1.0"
                ));
            }
        }
        if self.latency_spike > LATENCY_SPIKE_MAX {
            return Err(format!(
                "latency_spike = {:?} must be at most {LATENCY_SPIKE_MAX:?}",
                self.latency_spike
            ));
        }
        if self.write_cache_bytes == 0 {
            return Err("write_cache_bytes must be positive".into());
        }
        Ok(())
    }
}

/// What the device injected so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct FaultStats {
    /// Reads failed with `Injected`.
    pub read_errors: u64,
    /// Writes failed with `Injected`.
    pub write_errors: u64,
    /// Flushes failed with `Injected`.
    pub flush_errors: u64,
    /// Completions delayed.
    pub latency_spikes: u64,
    /// Writes failed with `NoSpace`.
    pub no_space: u64,
    /// Power cuts.
    pub power_cuts: u64,
}

/// A device that injects faults into another.
pub struct FaultyDevice {
    shared: Arc<Shared>,
}

struct Shared {
    inner: Arc<dyn Device>,
    info: DeviceInfo,
    config: FaultConfig,
    state: Mutex<State>,
    /// Signalled when the last in-flight command finishes.
    drained: Condvar,
    /// Serializes power cuts and restarts.
    cut_lock: Mutex<()>,
    timer: Option<Timer>,
}

struct State {
    rng: SmallRng,
    powered: bool,
    /// Incremented by each power cut; a command from an older epoch failed.
    epoch: u64,
    inflight: usize,
    written_bytes: u64,
    log: CrashLog,
    stats: FaultStats,
}

/// What submit decided for a command that goes to the inner device.
#[derive(Clone, Copy, Debug)]
struct Ticket {
    epoch: u64,
    spike: bool,
    /// For a flush: the crash-log position it covers.
    mark: u64,
}

enum Plan {
    Fail(DeviceError, bool),
    Forward(Ticket),
}

/// What a forwarded command did to the inner device, recorded at its
/// completion under the same lock that decides whether it was cut.
enum Effect {
    None,
    Wrote { offset: u64, pre: AlignedBuf },
    Flushed,
}

impl FaultyDevice {
    /// Wraps `inner`; the error names a bad config field.
    pub fn new(inner: Arc<dyn Device>, config: FaultConfig) -> Result<FaultyDevice, DeviceError> {
        let name = format!("faulty({})", inner.info().name);
        config.validate().map_err(|cause| DeviceError::Open {
            device: name.clone(),
            cause: format!("invalid fault config: {cause}"),
        })?;
        let info = DeviceInfo {
            name,
            ..inner.info().clone()
        };
        let timer = match config.latency_spike_rate > 0.0 {
            false => None,
            true => Some(Timer::start().map_err(|e| DeviceError::Open {
                device: info.name.clone(),
                cause: format!("cannot start the latency-spike timer thread: {e}"),
            })?),
        };
        let state = State {
            rng: SmallRng::seed_from_u64(config.seed),
            powered: true,
            epoch: 0,
            inflight: 0,
            written_bytes: 0,
            log: CrashLog::new(config.write_cache_bytes, info.block_size),
            stats: FaultStats::default(),
        };
        Ok(FaultyDevice {
            shared: Arc::new(Shared {
                inner,
                info,
                config,
                state: Mutex::new(state),
                drained: Condvar::new(),
                cut_lock: Mutex::new(()),
                timer,
            }),
        })
    }

    /// The wrapped device.
    pub fn inner(&self) -> &Arc<dyn Device> {
        &self.shared.inner
    }

    /// What was injected so far.
    pub fn stats(&self) -> FaultStats {
        self.shared.state.lock().stats
    }

    /// Completed writes not yet made durable by a flush.
    pub fn unflushed(&self) -> usize {
        self.shared.state.lock().log.unflushed()
    }

    /// Cuts the power: new commands fail with `PoweredOff` at once; waits
    /// for the commands in flight (they fail with `PoweredOff` too); then
    /// each unflushed write survives, is dropped or (with `torn_writes`) is
    /// torn, drawn from the seed, and the inner device is rewritten and
    /// flushed accordingly. Must not be called from a completer (it waits
    /// for completions). Cutting a device that is off does nothing.
    pub fn power_cut(&self) -> Result<CutReport, DeviceError> {
        let sh = &self.shared;
        let _cut = sh.cut_lock.lock();
        let mut st = sh.state.lock();
        if !st.powered {
            return Ok(CutReport::default());
        }
        st.powered = false;
        st.epoch += 1;
        st.stats.power_cuts += 1;
        while st.inflight > 0 {
            sh.drained.wait(&mut st);
        }
        let mut rng =
            SmallRng::seed_from_u64(sh.config.seed ^ st.epoch.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let (patches, report) = st.log.power_cut(&mut rng, sh.config.torn_writes);
        drop(st);
        for p in patches {
            let cmd = Command::write(p.offset, AlignedBuf::from_slice(&p.data), Class::Critical);
            submit_and_wait(&*sh.inner, cmd).result?;
        }
        submit_and_wait(&*sh.inner, Command::flush(Class::Critical)).result?;
        Ok(report)
    }

    /// Powers the device back on with what survived the cut.
    pub fn restart(&self) {
        let _cut = self.shared.cut_lock.lock();
        self.shared.state.lock().powered = true;
    }
}

impl Device for FaultyDevice {
    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn submit(&self, cmd: Command, done: Completer) {
        let sh = &self.shared;
        if let Err(e) = validate(&sh.info, &cmd) {
            return done(Completion {
                result: Err(e),
                buf: cmd.buf,
            });
        }
        let plan = sh.plan(&cmd);
        match plan {
            Plan::Fail(e, spike) => sh.deliver(
                spike,
                done,
                Completion {
                    result: Err(e),
                    buf: cmd.buf,
                },
            ),
            Plan::Forward(t) => match cmd.op {
                Op::Read => {
                    let me = sh.clone();
                    let finish = move |c| me.finish(t, done, c, Effect::None);
                    sh.inner.submit(cmd, Box::new(finish));
                }
                Op::Write => sh.clone().write(cmd, t, done),
                Op::Flush => {
                    let me = sh.clone();
                    let finish = move |c| me.finish(t, done, c, Effect::Flushed);
                    sh.inner.submit(cmd, Box::new(finish));
                }
            },
        }
    }
}

impl Shared {
    /// Draws the command's fate (always the same draws per command, so one
    /// fault's rate does not shift the others').
    fn plan(&self, cmd: &Command) -> Plan {
        let c = &self.config;
        let mut st = self.state.lock();
        if !st.powered {
            return Plan::Fail(self.powered_off(), false);
        }
        let rate = match cmd.op {
            Op::Read => c.read_error_rate,
            Op::Write => c.write_error_rate,
            Op::Flush => c.flush_error_rate,
        };
        let error = st.rng.gen_bool(rate);
        let spike = st.rng.gen_bool(c.latency_spike_rate);
        st.stats.latency_spikes += u64::from(spike);
        if error {
            let counter = match cmd.op {
                Op::Read => &mut st.stats.read_errors,
                Op::Write => &mut st.stats.write_errors,
                Op::Flush => &mut st.stats.flush_errors,
            };
            *counter += 1;
            let e = DeviceError::Injected {
                device: self.info.name.clone(),
                op: cmd.op,
                offset: cmd.offset,
            };
            return Plan::Fail(e, spike);
        }
        if cmd.op == Op::Write {
            let len = cmd.len() as u64;
            if c.no_space_after_bytes
                .is_some_and(|limit| st.written_bytes + len > limit)
            {
                st.stats.no_space += 1;
                let e = DeviceError::NoSpace {
                    device: self.info.name.clone(),
                    offset: cmd.offset,
                    len,
                };
                return Plan::Fail(e, spike);
            }
            st.written_bytes += len;
        }
        st.inflight += 1;
        Plan::Forward(Ticket {
            epoch: st.epoch,
            spike,
            mark: st.log.mark(),
        })
    }

    /// A write: read the pre-image, write, log both.
    fn write(self: Arc<Self>, cmd: Command, t: Ticket, done: Completer) {
        let pre = Command::read(cmd.offset, cmd.len(), cmd.class);
        let me = self.clone();
        self.inner.submit(
            pre,
            Box::new(move |pre| {
                if let Err(e) = pre.result {
                    let c = Completion {
                        result: Err(e),
                        buf: cmd.buf,
                    };
                    return me.finish(t, done, c, Effect::None);
                }
                if me.state.lock().epoch != t.epoch {
                    // Cut before it reached the media: fails, writes nothing.
                    let c = Completion {
                        result: Ok(()),
                        buf: cmd.buf,
                    };
                    return me.finish(t, done, c, Effect::None);
                }
                let effect = Effect::Wrote {
                    offset: cmd.offset,
                    pre: pre.buf,
                };
                let me2 = me.clone();
                let finish = move |c| me2.finish(t, done, c, effect);
                me.inner.submit(cmd, Box::new(finish));
            }),
        );
    }

    /// The inner device finished a forwarded command: record its effect
    /// and decide, atomically, whether the power went first (then it fails
    /// with `PoweredOff` and a write it made is undone by the cut).
    fn finish(&self, t: Ticket, done: Completer, mut c: Completion, effect: Effect) {
        let mut st = self.state.lock();
        assert!(st.inflight > 0, "a completion for nothing in flight");
        st.inflight -= 1;
        let cut = st.epoch != t.epoch;
        match effect {
            _ if c.result.is_err() => {}
            Effect::None => {}
            Effect::Wrote { offset, pre } => {
                let (pre, post) = (pre.as_slice().to_vec(), c.buf.as_slice().to_vec());
                if cut {
                    st.log.record_doomed(offset, pre, post);
                } else {
                    st.log.record(offset, pre, post);
                }
            }
            Effect::Flushed if cut => {}
            Effect::Flushed => st.log.flushed(t.mark),
        }
        if cut {
            c.result = Err(self.powered_off());
        }
        if st.inflight == 0 {
            self.drained.notify_all();
        }
        drop(st);
        self.deliver(t.spike, done, c);
    }

    fn deliver(&self, spike: bool, done: Completer, c: Completion) {
        match (&self.timer, spike) {
            (Some(timer), true) => {
                timer.after(self.config.latency_spike, Box::new(move || done(c)))
            }
            _ => done(c),
        }
    }

    fn powered_off(&self) -> DeviceError {
        DeviceError::PoweredOff {
            device: self.info.name.clone(),
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// Runs jobs after a delay on its own thread; on drop, runs the rest at
/// once (a completion is never lost).
struct Timer {
    shared: Arc<TimerShared>,
    thread: Option<JoinHandle<()>>,
}

struct TimerShared {
    queue: Mutex<TimerQueue>,
    wake: Condvar,
}

#[derive(Default)]
struct TimerQueue {
    heap: BinaryHeap<Delayed>,
    seq: u64,
    shutdown: bool,
}

struct Delayed {
    at: Instant,
    seq: u64,
    job: Job,
}

impl Ord for Delayed {
    fn cmp(&self, other: &Self) -> Ordering {
        // A max-heap of the reverse: the earliest (then first-scheduled) on top.
        (other.at, other.seq).cmp(&(self.at, self.seq))
    }
}

impl PartialOrd for Delayed {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Delayed {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}

impl Eq for Delayed {}

impl Timer {
    fn start() -> std::io::Result<Timer> {
        let shared = Arc::new(TimerShared {
            queue: Mutex::new(TimerQueue::default()),
            wake: Condvar::new(),
        });
        let runner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("critio-faulty-timer".into())
            .spawn(move || runner.run())?;
        Ok(Timer {
            shared,
            thread: Some(thread),
        })
    }

    fn after(&self, delay: Duration, job: Job) {
        let mut q = self.shared.queue.lock();
        let seq = q.seq;
        q.seq += 1;
        q.heap.push(Delayed {
            at: Instant::now() + delay,
            seq,
            job,
        });
        drop(q);
        self.shared.wake.notify_one();
    }
}

impl TimerShared {
    fn run(&self) {
        let mut q = self.queue.lock();
        loop {
            let due = q.heap.peek().map(|d| d.at);
            match due {
                Some(at) if q.shutdown || at <= Instant::now() => {
                    let d = q.heap.pop().expect("peeked");
                    MutexGuard::unlocked(&mut q, d.job);
                }
                Some(at) => {
                    self.wake.wait_until(&mut q, at);
                }
                None if q.shutdown => return,
                None => self.wake.wait(&mut q),
            }
        }
    }
}

impl Drop for Timer {
    fn drop(&mut self) {
        self.shared.queue.lock().shutdown = true;
        self.shared.wake.notify_all();
        let Some(thread) = self.thread.take() else {
            return;
        };
        if thread.thread().id() != std::thread::current().id()
            && thread.join().is_err()
            && !std::thread::panicking()
        {
            panic!("the fault injector's timer thread panicked");
        }
    }
}
