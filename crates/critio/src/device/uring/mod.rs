//! `uring`: the real device. io_uring with O_DIRECT, each request carrying
//! its class to the kernel's block layer and the drive in the SQE's
//! `ioprio` (an [`IoPriority`] from [`crate::sys`], which also holds the
//! per-thread `ioprio_set` the `pool` backend and the context layer use;
//! its items are re-exported here, where they used to live).
//!
//! One of the two places in critio with `unsafe` (the other is the
//! `ioprio` system calls in [`crate::sys`]): pushing SQEs whose buffers the
//! kernel reads and writes (`state.rs`).
//!
//! ```text
//!  submitting threads (any number)                  reaper thread (one)
//!  ───────────────────────────────                  ───────────────────
//!  submit(cmd, done)
//!    validate ──bad──> done(Err) at once
//!    lock ─> slot = table.insert(buf, done)         poll(eventfd)  <─┐
//!         ─> SQE{op, fd, buf ptr, offset,           read(eventfd)    │
//!                ioprio(class), user_data=slot}     lock ─> CQEs ─>  │
//!         ─> io_uring_enter ─> unlock                 table.remove   │
//!                   │                               unlock           │
//!                   v                               done(Completion) │
//!     kernel ─> block layer (mq-deadline sees        ────────────────┘
//!               ioprio) ─> drive ─> CQE ─> eventfd
//!
//!  flush_here (a flush its caller waits for): fdatasync in the caller
//!  submit_here (a read or write its caller waits for, no longer promotable):
//!    read: the caller's own small ring: push SQE{.., ioprio(class)},
//!    io_uring_enter waiting for its CQE (the kernel wakes the caller; no
//!    reaper in between); write: pwrite under ioprio(class) (`here.rs`)
//! ```
//!
//! | module    | what                                                       |
//! |-----------|------------------------------------------------------------|
//! | `file`    | opening and probing the file (shared with `pool`)          |
//! | `ring`    | setting up the ring, with errors that say what to do       |
//! | `table`   | in-flight commands by `user_data`, owning their buffers    |
//! | `state`   | submission, resubmission, completion, behind one lock      |
//! | `reaper`  | the completion thread                                      |
//! | `here`    | reads and writes done by their caller, on a ring of its own |
//!
//! What each class gets: critical requests go as `Realtime(0)` and
//! non-critical ones as `Idle` by default ([`ClassPriorities`]). Where the
//! kernel refuses RT (no `CAP_SYS_NICE`), the first refused request and
//! every later one go as `BestEffort(0)` instead;
//! [`UringDevice::effective_priorities`] says which is in use. With
//! `per_request_ioprio` off, every request carries 0 and the kernel uses the
//! submitting thread's priority: the "none" baseline of the experiments.
//!
//! Block size 4096: O_DIRECT needs offsets, lengths and buffer addresses
//! aligned to the logical block size, which is 512 or 4096 on the disks and
//! filesystems critio targets, so 4096 is always safe (a block device with
//! a larger logical block size gets that instead).

pub(crate) mod file;
mod here;
mod reaper;
mod ring;
mod state;
mod table;

use std::path::Path;
use std::sync::Arc;
use std::thread::{self, JoinHandle};

use parking_lot::Mutex;
use rustix::event::{eventfd, EventfdFlags};

/// The kernel I/O priority interface, which lives in [`crate::sys`] (the
/// context layer uses it too); re-exported here, where it used to live.
pub use crate::sys::{
    set_thread_ioprio, set_thread_ioprio_or_fallback, thread_ioprio, ClassPriorities, InvalidLevel,
    IoPriority,
};
pub(crate) use file::FileSpec;
pub use file::{BUFFERED_BLOCK_SIZE, DIRECT_BLOCK_SIZE};

use self::reaper::Shared;
use self::state::State;
use super::{
    validate, Command, Completer, Completion, Device, DeviceError, DeviceInfo, DeviceOpenError,
};

/// The default ring size, which is also the queue depth.
pub const ENTRIES_DEFAULT: u32 = 128;
/// The largest ring critio sets up (the in-flight table is this big).
pub const ENTRIES_MAX: u32 = 4096;

const _: () = assert!(ENTRIES_DEFAULT.is_power_of_two());
const _: () = assert!(ENTRIES_DEFAULT <= ENTRIES_MAX);

/// The kernel's queue depth for the disk holding `path` (its
/// `nr_requests`), rounded up to a power of two and at most
/// [`ENTRIES_MAX`]: the ring size of a device that is to be as deep as the
/// kernel's own queue. `None` where there is no disk behind the path
/// (tmpfs) or `/sys` does not say.
pub fn kernel_queue_depth(path: &Path) -> Option<u32> {
    let n = crate::sys::disk_of(path)?.nr_requests?;
    Some(n.max(1).next_power_of_two().min(ENTRIES_MAX))
}

/// How to open a [`UringDevice`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UringOptions {
    /// SQ entries: the queue depth, and the most commands in flight (more
    /// wait in a FIFO). A power of two, 1 to [`ENTRIES_MAX`].
    /// Default: [`ENTRIES_DEFAULT`] (128).
    pub entries: u32,
    /// If the file does not exist, create it with this many bytes (a
    /// multiple of 4096). Default: `None`, a missing file is an error.
    pub create_size: Option<u64>,
    /// Whether each request carries its class's `ioprio`. Default: true.
    /// Off, every SQE carries 0 (the "none" baseline).
    pub per_request_ioprio: bool,
    /// The `ioprio` of each class. Default: critical `Realtime(0)`,
    /// non-critical `Idle`.
    pub priorities: ClassPriorities,
}

impl Default for UringOptions {
    fn default() -> Self {
        Self {
            entries: ENTRIES_DEFAULT,
            create_size: None,
            per_request_ioprio: true,
            priorities: ClassPriorities::default(),
        }
    }
}

/// A file or block device driven through io_uring with O_DIRECT.
pub struct UringDevice {
    shared: Arc<Shared>,
    reaper: Option<JoinHandle<()>>,
}

impl UringDevice {
    /// Opens `path` (a regular file or a block device) read-write with
    /// O_DIRECT, probes io_uring and O_DIRECT, and starts the reaper.
    ///
    /// Errors say why and what to do: io_uring missing or disabled, or no
    /// O_DIRECT on the filesystem ([`DeviceOpenError::Unsupported`]), no
    /// such file (`NotFound`), a bad option (`InvalidOption`), another
    /// error opening the file (`Io`), no thread or eventfd (`Resource`).
    pub fn open(path: impl AsRef<Path>, options: UringOptions) -> Result<Self, DeviceOpenError> {
        let path = path.as_ref();
        let device = format!("uring:{}", path.display());
        let resource = |what, source| DeviceOpenError::Resource {
            device: device.clone(),
            what,
            source,
        };
        check_options(&device, &options)?;
        let opened = FileSpec {
            path,
            device: &device,
            direct: true,
            create_size: options.create_size,
            no_direct_hint: "the pool backend",
        }
        .open()?;
        let eventfd = eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)
            .map_err(|e| resource("cannot create an eventfd", e.into()))?;
        let ring = ring::build(&device, options.entries, &eventfd)?;
        let priorities = options.per_request_ioprio.then_some(options.priorities);
        let caller_file = opened
            .file
            .try_clone()
            .map_err(|e| resource("cannot duplicate the file descriptor", e))?;
        let state = State::new(ring, opened.file, priorities);
        let shared = Arc::new(Shared {
            info: DeviceInfo {
                name: device.clone(),
                capacity: opened.capacity,
                block_size: opened.block_size,
                queue_depth: options.entries,
                allocates_on_first_write: opened.regular_file,
            },
            state: Mutex::new(state),
            eventfd,
            caller_file,
            id: here::next_device_id(),
        });
        let for_reaper = shared.clone();
        let reaper = thread::Builder::new()
            .name("critio-uring-reaper".into())
            .spawn(move || reaper::run(for_reaper))
            .map_err(|e| resource("cannot start the reaper thread", e))?;
        Ok(Self {
            shared,
            reaper: Some(reaper),
        })
    }

    /// The `ioprio` each class is sent with now: the configured one, or
    /// after the kernel refused RT, its fallback ([`IoPriority::fallback`]).
    /// [`ClassPriorities::NONE`] when per-request ioprio is off.
    pub fn effective_priorities(&self) -> ClassPriorities {
        self.shared
            .state
            .lock()
            .priorities()
            .unwrap_or(ClassPriorities::NONE)
    }
}

fn check_options(device: &str, options: &UringOptions) -> Result<(), DeviceOpenError> {
    let invalid = |field, why| DeviceOpenError::InvalidOption {
        device: device.to_owned(),
        field,
        why,
    };
    let entries = options.entries;
    if !entries.is_power_of_two() || entries > ENTRIES_MAX {
        return Err(invalid(
            "entries",
            format!("{entries} must be a power of two from 1 to {ENTRIES_MAX}"),
        ));
    }
    options
        .priorities
        .check()
        .map_err(|e| invalid("priorities", e.to_string()))?;
    Ok(())
}

impl Device for UringDevice {
    fn info(&self) -> &DeviceInfo {
        &self.shared.info
    }

    fn submit(&self, cmd: Command, done: Completer) {
        if let Err(e) = validate(&self.shared.info, &cmd) {
            done(Completion {
                result: Err(e),
                buf: cmd.buf,
            });
            return;
        }
        let mut state = self.shared.state.lock();
        assert!(!state.closing, "submit on a device being dropped");
        state.admit(cmd, done);
        if state.needs_retry() {
            drop(state);
            self.shared.wake();
        }
    }

    fn flushes_here(&self) -> bool {
        true
    }

    /// `fdatasync` in the calling thread. Through the ring, a flush costs
    /// more: the kernel cannot start an fsync without blocking, so it hands
    /// every IORING_OP_FSYNC to an io-wq worker thread, whose completion
    /// then wakes the reaper, which wakes the waiter: three thread wake-ups
    /// where the system call has one (the caller's own, when it ends). On this project's test machine (a
    /// virtual machine with 2 vCPUs), critio-kv under a SET load made
    /// 35-40k context switches a second through the ring, Redis 17k under
    /// the same load, and critio-kv 24-28k with this. A flush carries no
    /// per-request I/O priority to lose (the kernel's flush machinery does
    /// not schedule by it).
    fn flush_here(&self) -> Option<Result<(), DeviceError>> {
        Some(
            self.shared
                .caller_file
                .sync_data()
                .map_err(|source| DeviceError::Io {
                    device: self.shared.info.name.clone(),
                    op: super::Op::Flush,
                    offset: 0,
                    source,
                }),
        )
    }

    fn submits_here(&self) -> bool {
        true
    }

    /// The read on a ring of the calling thread's own, with the same
    /// per-request `ioprio` as through the shared ring, waited for in the
    /// same `io_uring_enter` that submits it: the kernel wakes the caller
    /// when it is done. Through the shared ring the completion wakes the
    /// reaper, which wakes the caller: two wake-ups where this has one. The
    /// write with `pwrite` under the request's `ioprio` (`here.rs` says
    /// why). A thread that cannot set up a ring hands a read back.
    fn submit_here(&self, cmd: Command) -> Result<Completion, Command> {
        if let Err(e) = validate(&self.shared.info, &cmd) {
            return Ok(Completion {
                result: Err(e),
                buf: cmd.buf,
            });
        }
        here::submit(&self.shared, cmd)
    }
}

impl Drop for UringDevice {
    /// Stops taking commands (there is no one left to submit), waits until
    /// every command in flight has completed and its completer returned,
    /// and joins the reaper. Dropped by a completer on the reaper itself,
    /// it returns at once; the reaper finishes the rest and exits.
    fn drop(&mut self) {
        self.shared.state.lock().closing = true;
        self.shared.wake();
        let Some(reaper) = self.reaper.take() else {
            return;
        };
        if reaper.thread().id() == thread::current().id() {
            return;
        }
        if let Err(panic) = reaper.join() {
            if !thread::panicking() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}
