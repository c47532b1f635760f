//! [`SimDevice`]: runs a drive model in real time (or `speedup` times
//! faster) behind the [`Device`] trait.
//!
//! ```text
//!  submit ─validate─> lock ─> model.submit(req, now) ─notify─┐
//!                                                           v
//!  driver thread: sleep until model.next_event() or a notify; pop the
//!                 completions due; apply each to the store in completion
//!                 order (pre-image into the crash log for writes); unlock;
//!                 call the completers
//! ```
//!
//! Data moves at completion, under the lock, in completion order: that is
//! what a read after a completed write sees, and the order the crash log
//! records. A completed flush makes durable the writes it covers. On the
//! HDD (a SATA FLUSH CACHE, a barrier) that is every write completed
//! before it completes: every write submitted before it, and any later one
//! the firmware finished first (more than the rule requires, never less).
//! On the SSD (an NVMe Flush over a volatile DRAM buffer) it is exactly the
//! writes completed before the flush was submitted: later ones may still
//! sit in the buffer when it completes. A power cut fails every outstanding command with
//! `PoweredOff`, undoes the unflushed writes that the seeded draw drops
//! ([`crate::device::crash`]) and refuses commands until
//! [`SimDevice::restart`]. Dropping the device finishes the outstanding
//! commands at once (no waiting) and syncs a file store: a clean shutdown.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use parking_lot::{Condvar, Mutex, MutexGuard};
use rand::rngs::SmallRng;
use rand::SeedableRng;

use super::config::{Profile, SimConfig, SIM_BLOCK_SIZE};
use super::hdd::HddModel;
use super::model::{Completed, DriveModel, Request};
use super::ssd::SsdModel;
use super::store::Store;
use crate::class::Class;
use crate::device::crash::{CrashLog, CutReport};
use crate::device::{
    validate, Command, Completer, Completion, Device, DeviceError, DeviceInfo, DeviceOpenError, Op,
};
use crate::time::{Clock, Nanos};

/// A simulated HDD or SSD with its data in memory or a file.
pub struct SimDevice {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    info: DeviceInfo,
    config: SimConfig,
    clock: Clock,
    state: Mutex<State>,
    wake: Condvar,
}

struct State {
    model: Box<dyn DriveModel>,
    store: Store,
    /// Unflushed writes; `None` when the write cache is off.
    log: Option<CrashLog>,
    pending: BTreeMap<u64, Pending>,
    next_id: u64,
    /// The latest model time used (times handed to the model never
    /// decrease, whichever thread reads the clock first).
    last_now: Nanos,
    powered: bool,
    shutdown: bool,
    cuts: u64,
}

struct Pending {
    cmd: Command,
    done: Completer,
    /// For a flush that covers only the writes completed before its
    /// submission (the SSD's): the crash log's position then.
    covers: Option<u64>,
}

type Delivery = (Completer, Completion);

fn make_model(config: &SimConfig, cuts: u64) -> Box<dyn DriveModel> {
    let seed = mix(config.seed, cuts);
    let fw = config.firmware();
    match config.profile {
        Profile::Hdd => Box::new(HddModel::new(config.capacity, config.hdd, fw, seed)),
        Profile::Ssd => Box::new(SsdModel::new(config.capacity, config.ssd, fw, seed)),
    }
}

/// A distinct seed for each life of the device (after `n` power cuts).
fn mix(seed: u64, n: u64) -> u64 {
    seed ^ n.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

impl SimDevice {
    /// A device as `config` says; the error names a bad field or why the
    /// file store cannot be opened.
    pub fn new(config: SimConfig) -> Result<SimDevice, DeviceOpenError> {
        config.validate()?;
        let name = config.name();
        let store = Store::open(&config.store, config.capacity, &name)?;
        let model = make_model(&config, 0);
        let info = DeviceInfo {
            name,
            capacity: config.capacity,
            block_size: SIM_BLOCK_SIZE,
            queue_depth: model.queue_depth(),
            allocates_on_first_write: false,
        };
        let state = State {
            model,
            store,
            log: config
                .write_cache
                .then(|| CrashLog::new(config.write_cache_bytes, SIM_BLOCK_SIZE)),
            pending: BTreeMap::new(),
            next_id: 0,
            last_now: 0,
            powered: true,
            shutdown: false,
            cuts: 0,
        };
        let shared = Arc::new(Shared {
            info,
            config,
            clock: Clock::new(),
            state: Mutex::new(state),
            wake: Condvar::new(),
        });
        let runner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("critio-sim".into())
            .spawn(move || runner.run())
            .map_err(|source| DeviceOpenError::Resource {
                device: shared.info.name.clone(),
                what: "cannot start the driver thread",
                source,
            })?;
        Ok(SimDevice {
            shared,
            thread: Some(thread),
        })
    }

    /// A 7200 rpm HDD of `capacity` bytes in memory, defaults otherwise.
    pub fn hdd(capacity: u64, seed: u64) -> Result<SimDevice, DeviceOpenError> {
        Self::new(SimConfig::hdd(capacity, seed))
    }

    /// An 8-channel SSD of `capacity` bytes in memory, defaults otherwise.
    pub fn ssd(capacity: u64, seed: u64) -> Result<SimDevice, DeviceOpenError> {
        Self::new(SimConfig::ssd(capacity, seed))
    }

    /// The configuration the device runs.
    pub fn config(&self) -> &SimConfig {
        &self.shared.config
    }

    /// Completed writes not yet made durable by a flush.
    pub fn unflushed(&self) -> usize {
        self.shared
            .state
            .lock()
            .log
            .as_ref()
            .map_or(0, CrashLog::unflushed)
    }

    /// Whether the device is powered (not cut, or restarted).
    pub fn is_powered(&self) -> bool {
        self.shared.state.lock().powered
    }

    /// Cuts the power: outstanding commands fail with `PoweredOff`, each
    /// unflushed write survives, is dropped or (with `torn_writes`) is torn,
    /// drawn from the seed, and later commands fail until [`restart`].
    /// Cutting a device that is already off does nothing.
    ///
    /// [`restart`]: SimDevice::restart
    pub fn power_cut(&self) -> Result<CutReport, DeviceError> {
        let mut guard = self.shared.state.lock();
        if !guard.powered {
            return Ok(CutReport::default());
        }
        let st = &mut *guard;
        st.powered = false;
        st.cuts += 1;
        st.model = make_model(&self.shared.config, st.cuts);
        let failed = std::mem::take(&mut st.pending);
        let result = match st.log.as_mut() {
            None => Ok(CutReport::default()),
            Some(log) => {
                // Not the model's seed: which writes survive is its own draw.
                let mut rng = SmallRng::seed_from_u64(mix(!self.shared.config.seed, st.cuts));
                let (patches, report) = log.power_cut(&mut rng, self.shared.config.torn_writes);
                patches
                    .iter()
                    .try_for_each(|p| st.store.write(p.offset, &p.data))
                    .and_then(|()| st.store.sync())
                    .map(|()| report)
                    .map_err(|source| self.shared.io_error(Op::Write, 0, source))
            }
        };
        drop(guard);
        self.shared.wake.notify_one();
        for (_, p) in failed {
            let result = Err(self.shared.powered_off());
            (p.done)(Completion {
                result,
                buf: p.cmd.buf,
            });
        }
        result
    }

    /// Powers the device back on with what survived the cut.
    pub fn restart(&self) {
        let mut st = self.shared.state.lock();
        assert!(
            st.pending.is_empty(),
            "commands outstanding on a powered-off device"
        );
        st.powered = true;
    }
}

impl Device for SimDevice {
    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn submit(&self, cmd: Command, done: Completer) {
        if let Err(e) = validate(&self.shared.info, &cmd) {
            return done(Completion {
                result: Err(e),
                buf: cmd.buf,
            });
        }
        let mut st = self.shared.state.lock();
        if !st.powered {
            drop(st);
            let result = Err(self.shared.powered_off());
            return done(Completion {
                result,
                buf: cmd.buf,
            });
        }
        let now = self.shared.now(&mut st, None);
        let id = st.next_id;
        st.next_id += 1;
        let req = Request {
            id,
            op: cmd.op,
            offset: cmd.offset,
            len: cmd.len() as u64,
            high_priority: cmd.class == Class::Critical,
        };
        let covers = match (cmd.op, self.shared.config.profile) {
            (Op::Flush, Profile::Ssd) => st.log.as_ref().map(CrashLog::mark),
            _ => None,
        };
        st.pending.insert(id, Pending { cmd, done, covers });
        st.model.submit(req, now);
        drop(st);
        self.shared.wake.notify_one();
    }
}

impl Drop for SimDevice {
    fn drop(&mut self) {
        self.shared.state.lock().shutdown = true;
        self.shared.wake.notify_all();
        let Some(thread) = self.thread.take() else {
            return;
        };
        // Dropped from a completer on the driver thread: it exits by itself.
        if thread.thread().id() != std::thread::current().id()
            && thread.join().is_err()
            && !std::thread::panicking()
        {
            panic!("the simulated device's driver thread panicked");
        }
    }
}

impl Shared {
    /// The driver thread: sleep until the next event, deliver completions.
    fn run(&self) {
        let mut st = self.state.lock();
        loop {
            let next = st.model.next_event();
            let now = self.now(&mut st, next);
            let batch = self.collect(&mut st, now);
            if !batch.is_empty() {
                MutexGuard::unlocked(&mut st, || deliver(batch));
                continue;
            }
            if st.shutdown {
                break;
            }
            match next {
                Some(t) => {
                    let at = self.clock.instant(self.real_ns(t));
                    self.wake.wait_until(&mut st, at);
                }
                None => self.wake.wait(&mut st),
            }
        }
        self.finish_all(st);
    }

    /// On shutdown: completes everything outstanding without waiting.
    fn finish_all(&self, mut st: MutexGuard<'_, State>) {
        while let Some(t) = st.model.next_event() {
            let now = t.max(st.last_now);
            st.last_now = now;
            let batch = self.collect(&mut st, now);
            MutexGuard::unlocked(&mut st, || deliver(batch));
        }
        assert!(st.pending.is_empty(), "a command the model never completed");
        if let Err(e) = st.store.sync() {
            eprintln!(
                "{}: cannot sync the backing file at shutdown: {e}",
                self.info.name
            );
        }
    }

    /// The model's time now: the clock scaled by `speedup`, never behind
    /// the last time used, and at least `due` once `due`'s real instant
    /// has passed (float rounding must not make the thread spin).
    fn now(&self, st: &mut State, due: Option<Nanos>) -> Nanos {
        let real = self.clock.now();
        let mut now = (real as f64 * self.config.speedup) as Nanos;
        if let Some(t) = due.filter(|&t| self.real_ns(t) <= real) {
            now = now.max(t);
        }
        now = now.max(st.last_now);
        st.last_now = now;
        now
    }

    /// The real time (clock nanoseconds) at which model time `t` comes.
    fn real_ns(&self, t: Nanos) -> Nanos {
        (t as f64 / self.config.speedup).ceil() as Nanos
    }

    /// Pops the completions due at `now` and applies their data.
    fn collect(&self, st: &mut State, now: Nanos) -> Vec<Delivery> {
        let mut done: Vec<Completed> = Vec::new();
        st.model.pop_completed(now, &mut done);
        done.into_iter()
            .map(|c| {
                let p = st
                    .pending
                    .remove(&c.id)
                    .expect("a completion for a pending command");
                self.execute(st, p)
            })
            .collect()
    }

    /// Applies a completed command to the store.
    fn execute(&self, st: &mut State, p: Pending) -> Delivery {
        let Pending {
            mut cmd,
            done,
            covers,
        } = p;
        let offset = cmd.offset;
        let result = match cmd.op {
            Op::Read => st.store.read(offset, cmd.buf.as_mut_slice()),
            Op::Write => write(st, offset, cmd.buf.as_slice()),
            // A barrier covers every write completed so far: those the host
            // saw complete before it submitted the flush, at least.
            Op::Flush => st.store.sync().map(|()| {
                if let Some(log) = st.log.as_mut() {
                    log.flushed(covers.unwrap_or_else(|| log.mark()));
                }
            }),
        };
        let result = result.map_err(|source| self.io_error(cmd.op, offset, source));
        (
            done,
            Completion {
                result,
                buf: cmd.buf,
            },
        )
    }

    fn io_error(&self, op: Op, offset: u64, source: std::io::Error) -> DeviceError {
        DeviceError::Io {
            device: self.info.name.clone(),
            op,
            offset,
            source,
        }
    }

    fn powered_off(&self) -> DeviceError {
        DeviceError::PoweredOff {
            device: self.info.name.clone(),
        }
    }
}

/// Writes `data`, keeping its pre-image while the write cache holds it.
fn write(st: &mut State, offset: u64, data: &[u8]) -> std::io::Result<()> {
    let Some(log) = st.log.as_mut() else {
        return st.store.write(offset, data);
    };
    let mut pre = vec![0u8; data.len()];
    st.store.read(offset, &mut pre)?;
    st.store.write(offset, data)?;
    log.record(offset, pre, data.to_vec());
    Ok(())
}

fn deliver(batch: Vec<Delivery>) {
    for (done, completion) in batch {
        done(completion);
    }
}
