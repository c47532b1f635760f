//! `pool`: pread/pwrite on per-class worker threads. The backend that works
//! everywhere (tmpfs, filesystems without O_DIRECT, kernels without
//! io_uring), with the class handed to the kernel per thread instead of per
//! request: each worker sets its own I/O priority with `ioprio_set`
//! ([`set_thread_ioprio`](crate::sys::set_thread_ioprio)), so everything
//! it reads, writes and syncs goes to the block layer at its class's
//! priority.
//!
//! ```text
//!  submit(cmd, done) ── validate ──bad──> done(Err) at once
//!        │ class
//!        ├── critical FIFO ────> critical workers (default 2, RT 0)
//!        │                         pread / pwrite / fdatasync ─> done(..)
//!        └── non-critical FIFO ─> non-critical workers (default 2, IDLE)
//! ```
//!
//! What a class gets: its own workers, so a backlog of non-critical work
//! never delays the start of a critical command in user space, and its own
//! kernel priority below that. Workers serve only their own class (a
//! critical worker never runs non-critical work at critical priority).
//! Where RT is refused for lack of privilege, critical workers run at
//! `BestEffort(0)`; [`PoolDevice::effective_priorities`] says which.
//!
//! Without O_DIRECT (the default) I/O goes through the page cache: block
//! size 512, reads may be served from memory, and writes are durable only
//! after a flush (`fdatasync`). Dirty pages the kernel writes back on its own
//! do not carry the worker's priority; reads that miss, and the writeback a
//! flush forces, do. With `direct`: block size 4096, the same alignment
//! rules as `uring`, and every I/O carries its worker's priority.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::panic::{self, AssertUnwindSafe};
use std::path::Path;
use std::sync::{mpsc, Arc};
use std::thread::{self, JoinHandle};

use parking_lot::{Condvar, Mutex};

use super::uring::FileSpec;
use super::{
    validate, Command, Completer, Completion, Device, DeviceError, DeviceInfo, DeviceOpenError, Op,
};
use crate::class::Class;
use crate::sys::{set_thread_ioprio_or_fallback, ClassPriorities, IoPriority};

/// Default workers per class.
pub const WORKERS_DEFAULT: usize = 2;
/// Most workers per class.
pub const WORKERS_MAX: usize = 64;
/// Most commands queued per class. The block layer never dispatches more
/// than the queue depth; more than this is a bug, and panics.
pub const QUEUED_MAX: usize = 4096;

const _: () = assert!(WORKERS_DEFAULT >= 1 && WORKERS_DEFAULT <= WORKERS_MAX);
const _: () = assert!(QUEUED_MAX >= 2 * WORKERS_MAX);

/// How to open a [`PoolDevice`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolOptions {
    /// Threads serving critical commands, 1 to [`WORKERS_MAX`]. Default 2.
    pub critical_workers: usize,
    /// Threads serving non-critical commands, 1 to [`WORKERS_MAX`]. Default 2.
    pub non_critical_workers: usize,
    /// Whether each worker sets its kernel I/O priority. Default: true. Off,
    /// workers keep the opening thread's priority (the "none" baseline).
    pub set_worker_ioprio: bool,
    /// The workers' priorities. Default: critical `Realtime(0)`,
    /// non-critical `Idle`.
    pub priorities: ClassPriorities,
    /// Open with O_DIRECT (block size 4096). Default: false (block size 512;
    /// works on every filesystem, tmpfs included).
    pub direct: bool,
    /// If the file does not exist, create it with this many bytes (a
    /// multiple of the block size). Default: `None`, a missing file is an
    /// error.
    pub create_size: Option<u64>,
}

impl Default for PoolOptions {
    fn default() -> Self {
        Self {
            critical_workers: WORKERS_DEFAULT,
            non_critical_workers: WORKERS_DEFAULT,
            set_worker_ioprio: true,
            priorities: ClassPriorities::default(),
            direct: false,
            create_size: None,
        }
    }
}

impl PoolOptions {
    fn workers(&self, class: Class) -> usize {
        match class {
            Class::Critical => self.critical_workers,
            Class::NonCritical => self.non_critical_workers,
        }
    }

    fn check(&self, device: &str) -> Result<(), DeviceOpenError> {
        let invalid = |field, why| DeviceOpenError::InvalidOption {
            device: device.to_owned(),
            field,
            why,
        };
        for class in Class::ALL {
            let n = self.workers(class);
            if !(1..=WORKERS_MAX).contains(&n) {
                let field = match class {
                    Class::Critical => "critical_workers",
                    Class::NonCritical => "non_critical_workers",
                };
                return Err(invalid(
                    field,
                    format!("{n} {} workers: give 1 to {WORKERS_MAX}", class.as_str()),
                ));
            }
        }
        self.priorities
            .check()
            .map_err(|e| invalid("priorities", e.to_string()))?;
        Ok(())
    }
}

/// A file served by per-class pread/pwrite worker threads.
pub struct PoolDevice {
    shared: Arc<Shared>,
    workers: Vec<Worker>,
    priorities: Option<ClassPriorities>,
}

struct Worker {
    class: Class,
    tid: i32,
    handle: JoinHandle<()>,
}

/// What the device and its workers share.
struct Shared {
    info: DeviceInfo,
    file: File,
    queues: Mutex<Queues>,
    /// Signalled when a class's queue gains a command, or on close.
    ready: [Condvar; 2],
}

struct Queues {
    jobs: [VecDeque<(Command, Completer)>; 2],
    /// Set by `Drop`: workers exit once their queue is empty.
    closing: bool,
}

/// A started worker's report: its thread id and the priority it set, or
/// the kernel's refusal of that priority.
type Started = Result<(i32, Option<IoPriority>), DeviceOpenError>;

impl PoolDevice {
    /// Opens `path` read-write (with O_DIRECT if `options.direct`) and
    /// starts the workers, each with its class's kernel I/O priority.
    ///
    /// Errors say why and what to do: no such file
    /// ([`DeviceOpenError::NotFound`]), no O_DIRECT on the filesystem or a
    /// priority the kernel refused for another reason than RT privilege
    /// (`Unsupported`), a bad option (`InvalidOption`), another error
    /// opening the file (`Io`), no thread (`Resource`).
    pub fn open(path: impl AsRef<Path>, options: PoolOptions) -> Result<Self, DeviceOpenError> {
        let path = path.as_ref();
        let device = format!("pool:{}", path.display());
        options.check(&device)?;
        let opened = FileSpec {
            path,
            device: &device,
            direct: options.direct,
            create_size: options.create_size,
            no_direct_hint: "open the pool without O_DIRECT (PoolOptions::direct = false)",
        }
        .open()?;
        let workers = options.critical_workers + options.non_critical_workers;
        let shared = Arc::new(Shared {
            info: DeviceInfo {
                name: device.clone(),
                capacity: opened.capacity,
                block_size: opened.block_size,
                queue_depth: u32::try_from(workers).expect("at most 128 workers"),
                allocates_on_first_write: opened.regular_file,
            },
            file: opened.file,
            queues: Mutex::new(Queues {
                jobs: [VecDeque::new(), VecDeque::new()],
                closing: false,
            }),
            ready: [Condvar::new(), Condvar::new()],
        });
        let mut dev = Self {
            shared,
            workers: Vec::with_capacity(workers),
            priorities: options.set_worker_ioprio.then_some(options.priorities),
        };
        dev.start_workers(&options)?;
        Ok(dev)
    }

    /// Starts every worker and waits until each has set its priority.
    /// On an error, the workers already started stop when `self` drops.
    fn start_workers(&mut self, options: &PoolOptions) -> Result<(), DeviceOpenError> {
        let (tx, rx) = mpsc::channel::<Started>();
        for class in Class::ALL {
            let priority = self.priorities.map(|p| p.of(class));
            for index in 0..options.workers(class) {
                let (shared, tx) = (self.shared.clone(), tx.clone());
                let handle = thread::Builder::new()
                    .name(format!("critio-pool-{}-{index}", class.as_str()))
                    .spawn(move || worker(&shared, class, priority, &tx))
                    .map_err(|source| DeviceOpenError::Resource {
                        device: self.shared.info.name.clone(),
                        what: "cannot start a worker thread",
                        source,
                    })?;
                let started = rx.recv().expect("a starting worker always reports");
                let (tid, set) = started?;
                self.workers.push(Worker { class, tid, handle });
                if let (Some(p), Some(set)) = (self.priorities.as_mut(), set) {
                    match class {
                        Class::Critical => p.critical = set,
                        Class::NonCritical => p.non_critical = set,
                    }
                }
            }
        }
        Ok(())
    }

    /// The kernel I/O priority the workers of each class run at: the
    /// configured one, or where RT was refused, `BestEffort(0)`.
    /// [`ClassPriorities::NONE`] when `set_worker_ioprio` is off.
    pub fn effective_priorities(&self) -> ClassPriorities {
        self.priorities.unwrap_or(ClassPriorities::NONE)
    }

    /// Each worker's class and Linux thread id (to check its priority with
    /// [`thread_ioprio`](crate::sys::thread_ioprio), or find it in
    /// `/proc`).
    pub fn worker_tids(&self) -> Vec<(Class, i32)> {
        self.workers.iter().map(|w| (w.class, w.tid)).collect()
    }
}

/// A worker thread's body: set the priority, report, serve its class.
fn worker(
    shared: &Shared,
    class: Class,
    priority: Option<IoPriority>,
    started: &mpsc::Sender<Started>,
) {
    let tid = rustix::thread::gettid().as_raw_nonzero().get();
    let set = priority
        .map(|p| set_thread_ioprio_or_fallback(0, p))
        .transpose()
        .map_err(|e| DeviceOpenError::Unsupported {
            device: shared.info.name.clone(),
            what: format!(
                "a {} worker cannot set its I/O priority to {priority:?}: {e}; \
                 choose another priority or set set_worker_ioprio = false",
                class.as_str()
            ),
            source: Some(e),
        });
    let ok = set.is_ok();
    // `open` waits for this report before starting the next worker.
    let _ = started.send(set.map(|set| (tid, set)));
    if ok {
        serve(shared, class);
    }
}

/// Runs `class`'s commands in FIFO order until closing and drained.
fn serve(shared: &Shared, class: Class) {
    loop {
        let (cmd, done) = {
            let mut queues = shared.queues.lock();
            loop {
                if let Some(job) = queues.jobs[class.index()].pop_front() {
                    break job;
                }
                if queues.closing {
                    return;
                }
                shared.ready[class.index()].wait(&mut queues);
            }
        };
        let completion = shared.execute(cmd);
        // The panic hook has already printed the message; keep serving.
        let _ = panic::catch_unwind(AssertUnwindSafe(|| done(completion)));
    }
}

impl Shared {
    fn execute(&self, mut cmd: Command) -> Completion {
        let result = match cmd.op {
            Op::Read => self.file.read_exact_at(cmd.buf.as_mut_slice(), cmd.offset),
            Op::Write => self.file.write_all_at(cmd.buf.as_slice(), cmd.offset),
            Op::Flush => self.file.sync_data(),
        };
        Completion {
            result: result.map_err(|source| DeviceError::Io {
                device: self.info.name.clone(),
                op: cmd.op,
                offset: cmd.offset,
                source,
            }),
            buf: cmd.buf,
        }
    }
}

impl Device for PoolDevice {
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
        let class = cmd.class;
        let mut queues = self.shared.queues.lock();
        assert!(!queues.closing, "submit on a device being dropped");
        let queue = &mut queues.jobs[class.index()];
        assert!(
            queue.len() < QUEUED_MAX,
            "more than {QUEUED_MAX} {} commands queued",
            class.as_str()
        );
        queue.push_back((cmd, done));
        drop(queues);
        self.shared.ready[class.index()].notify_one();
    }
}

impl Drop for PoolDevice {
    /// Lets the workers finish every queued command, then joins them. A
    /// worker dropping the device from a completer is not joined (it cannot
    /// wait for itself); it drains its queue and exits on its own.
    fn drop(&mut self) {
        self.shared.queues.lock().closing = true;
        for ready in &self.shared.ready {
            ready.notify_all();
        }
        let me = thread::current().id();
        for w in self.workers.drain(..) {
            if w.handle.thread().id() == me {
                continue;
            }
            if let Err(panic) = w.handle.join() {
                if !thread::panicking() {
                    panic::resume_unwind(panic);
                }
            }
        }
    }
}
