//! Devices: one [`Device`] trait over every backend, real and simulated.
//!
//! ```text
//!   block layer ──Command{op, offset, buf, class}──> Device::submit
//!        ^                                               │
//!        └──────────── Completer(Completion) <───────────┘  (any thread)
//! ```
//!
//! | backend  | what                                          | priority reaches        |
//! |----------|-----------------------------------------------|-------------------------|
//! | `uring`  | io_uring, O_DIRECT, per-request `ioprio`      | kernel scheduler, drive |
//! | `pool`   | pread/pwrite on per-class worker threads      | kernel (`ioprio_set`)   |
//! | `sim`    | HDD/SSD timing model, NCQ + firmware reorder  | simulated firmware      |
//! | `mem`    | memory, completes inline                      | nothing (tests)         |
//! | `faulty` | wraps any device: EIO, spikes, torn writes    | the wrapped device      |
//!
//! A command's buffer moves into the device and comes back in the
//! completion, so an in-flight buffer is never shared. Offsets and lengths
//! must be multiples of the device's block size ([`validate`] says which rule
//! a command broke). Every backend passes the same conformance suite
//! (`tests/device_conformance.rs`).
//!
//! Opening a device by path or [`DeviceSpec`] fails with a typed
//! [`DeviceOpenError`] (io_uring or O_DIRECT unsupported, no such file, a
//! bad option, another I/O error, no thread); a command on an open device
//! fails with a [`DeviceError`].

mod buf;
pub mod config;
pub mod crash;
pub mod faulty;
pub mod mem;
mod open_error;
pub mod pool;
pub mod sim;
pub mod spec;
#[allow(unsafe_code)] // io_uring: SQEs whose buffers the kernel reads and writes
pub mod uring;

use std::fmt;
use std::sync::mpsc;

pub use buf::{AlignedBuf, BUF_ALIGN};
pub use config::{DeviceConfig, PriorityMode};
pub use open_error::DeviceOpenError;
pub use spec::{DeviceSpec, OpenOptions};

/// The largest command critio sends to a device: the block layer refuses
/// longer requests (it also bounds how far back its range lookup scans),
/// and the write cache and the log size their commands by it.
pub const IO_LEN_MAX: u64 = 8 << 20;

use crate::class::Class;

/// What a command does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Op {
    /// Fill the buffer from the device.
    Read,
    /// Write the buffer to the device.
    Write,
    /// Make every completed write durable.
    Flush,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
        })
    }
}

/// One command to a device.
#[derive(Debug)]
pub struct Command {
    /// Read, write or flush.
    pub op: Op,
    /// Byte offset (a multiple of the block size; 0 for flushes).
    pub offset: u64,
    /// The data to write, or the buffer to read into (its length is the
    /// transfer size; empty for flushes).
    pub buf: AlignedBuf,
    /// The request's class, handed to the device's own priority mechanism.
    pub class: Class,
    /// Where the command comes from, for devices that decide by it (the
    /// write cache's admission policies).
    pub hint: IoHint,
}

/// Where a command comes from. The block layer fills it; the default is an
/// anonymous asynchronous command.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IoHint {
    /// Its submitter waits for it.
    pub sync: bool,
    /// Its submitter was foreground (not merely inheriting) when it
    /// submitted it.
    pub foreground: bool,
    /// The block layer's request id (0: none), the handle a promotion at
    /// the device refers to.
    pub tag: u64,
}

impl Command {
    /// A read of `len` bytes at `offset`.
    pub fn read(offset: u64, len: usize, class: Class) -> Self {
        Self {
            op: Op::Read,
            offset,
            buf: AlignedBuf::zeroed(len),
            class,
            hint: IoHint::default(),
        }
    }

    /// A write of `buf` at `offset`.
    pub fn write(offset: u64, buf: AlignedBuf, class: Class) -> Self {
        Self {
            op: Op::Write,
            offset,
            buf,
            class,
            hint: IoHint::default(),
        }
    }

    /// A flush.
    pub fn flush(class: Class) -> Self {
        Self {
            op: Op::Flush,
            offset: 0,
            buf: AlignedBuf::empty(),
            class,
            hint: IoHint::default(),
        }
    }

    /// Bytes transferred.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Whether the command transfers no bytes (a flush).
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
}

/// A command's outcome, with its buffer back.
#[derive(Debug)]
pub struct Completion {
    /// Success, or why not.
    pub result: Result<(), DeviceError>,
    /// The command's buffer (filled, for a successful read).
    pub buf: AlignedBuf,
}

/// Called exactly once with a command's completion, on any thread (possibly
/// inside `submit`, before it returns).
pub type Completer = Box<dyn FnOnce(Completion) + Send>;

/// What a device is.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// A name for tables and errors (`mem`, `sim-hdd`, `uring:/path`).
    pub name: String,
    /// Size in bytes.
    pub capacity: u64,
    /// Offsets and lengths must be multiples of this.
    pub block_size: u32,
    /// How many commands the device takes at once to good effect (its
    /// internal queue depth); the block layer never dispatches more.
    pub queue_depth: u32,
    /// A block's first write allocates it (a regular file on a file
    /// system), or converts it from reserved-but-unwritten (a file whose
    /// blocks were reserved when opened): that write, and the next flush,
    /// cost the file system's metadata (a journal commit). Regions written
    /// over and over (a log) are worth writing once when they are created.
    pub allocates_on_first_write: bool,
}

/// A storage device.
pub trait Device: Send + Sync + 'static {
    /// What the device is.
    fn info(&self) -> &DeviceInfo;

    /// Starts `cmd`; `done` is called exactly once with its outcome. Invalid
    /// commands complete at once with the error from [`validate`].
    fn submit(&self, cmd: Command, done: Completer);

    /// Whether [`Device::flush_here`] flushes (default: no).
    fn flushes_here(&self) -> bool {
        false
    }

    /// A flush ([`Op::Flush`]) done by the calling thread, which blocks
    /// until it ends, where the device can do that more cheaply than
    /// through [`Device::submit`]. The block layer calls it only for a
    /// flush the calling thread itself waits for, and only after it has
    /// stopped dispatching, so no other request waits behind the call.
    /// Devices that cannot return `None` (and then [`Device::flushes_here`]
    /// is false).
    fn flush_here(&self) -> Option<Result<(), DeviceError>> {
        None
    }

    /// Whether [`Device::submit_here`] does reads and writes (default: no).
    fn submits_here(&self) -> bool {
        false
    }

    /// A read or write done by the calling thread, which blocks until it
    /// ends, where the device can do that more cheaply than through
    /// [`Device::submit`] (no completion thread between the kernel and the
    /// caller). The block layer calls it only for a request its caller
    /// waits for, that no one can promote any more (critical already, or
    /// no inheritance), after the caller has stopped dispatching. Devices
    /// that cannot, now or at all, hand the command back (`Err`), and the
    /// caller submits it as usual.
    fn submit_here(&self, cmd: Command) -> Result<Completion, Command> {
        Err(cmd)
    }
}

/// Why a command or a device failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The operating system reported an error.
    #[error("{device}: {op} at offset {offset} failed: {source}")]
    Io {
        /// The device's name.
        device: String,
        /// The operation.
        op: Op,
        /// Its offset.
        offset: u64,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// Offset or length is not a multiple of the block size.
    #[error("{device}: {what} {value} is not a multiple of the block size {block_size}; align it")]
    Unaligned {
        /// The device's name.
        device: String,
        /// `offset` or `length`.
        what: &'static str,
        /// The bad value.
        value: u64,
        /// The required multiple.
        block_size: u32,
    },
    /// The command reaches past the end of the device.
    #[error("{device}: {op} of {len} bytes at offset {offset} is past the end ({capacity} bytes)")]
    OutOfRange {
        /// The device's name.
        device: String,
        /// The operation.
        op: Op,
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u64,
        /// The device's size.
        capacity: u64,
    },
    /// An error injected by the `faulty` device.
    #[error("{device}: injected I/O error on {op} at offset {offset}")]
    Injected {
        /// The device's name.
        device: String,
        /// The operation.
        op: Op,
        /// Its offset.
        offset: u64,
    },
    /// The device has no space left for this write.
    #[error("{device}: no space left for a {len}-byte write at offset {offset}")]
    NoSpace {
        /// The device's name.
        device: String,
        /// Its offset.
        offset: u64,
        /// Its length.
        len: u64,
    },
    /// The device lost power (simulated) and refuses commands until restarted.
    #[error("{device}: device is powered off (simulated power cut)")]
    PoweredOff {
        /// The device's name.
        device: String,
    },
    /// A device could not be opened or set up; `cause` says why and what
    /// to do. Devices that wrap others (`faulty`, the write cache) fail
    /// with this; the devices opened by path or [`DeviceSpec`] fail with a
    /// typed [`DeviceOpenError`] instead.
    #[error("cannot open device {device}: {cause}")]
    Open {
        /// What was being opened.
        device: String,
        /// Why it failed, in plain words.
        cause: String,
    },
}

/// Checks a command against the device's rules: alignment, range, and an
/// empty buffer for flushes.
pub fn validate(info: &DeviceInfo, cmd: &Command) -> Result<(), DeviceError> {
    validate_parts(info, cmd.op, cmd.offset, cmd.len() as u64)
}

/// [`validate`] for a command not built yet: its operation, offset and
/// length.
#[inline]
pub fn validate_parts(info: &DeviceInfo, op: Op, offset: u64, len: u64) -> Result<(), DeviceError> {
    let block = u64::from(info.block_size);
    let unaligned = |what, value| DeviceError::Unaligned {
        device: info.name.clone(),
        what,
        value,
        block_size: info.block_size,
    };
    if op == Op::Flush {
        assert!(len == 0, "a flush carries no data");
        return Ok(());
    }
    // Block sizes are powers of two but for odd test devices: a mask, not
    // two divisions, on every request's path.
    let misaligned = |v: u64| {
        if block.is_power_of_two() {
            v & (block - 1) != 0
        } else {
            v % block != 0
        }
    };
    if misaligned(offset) {
        return Err(unaligned("offset", offset));
    }
    if len == 0 || misaligned(len) {
        return Err(unaligned("length", len));
    }
    if offset
        .checked_add(len)
        .is_none_or(|end| end > info.capacity)
    {
        return Err(DeviceError::OutOfRange {
            device: info.name.clone(),
            op,
            offset,
            len,
            capacity: info.capacity,
        });
    }
    Ok(())
}

/// Submits `cmd` and blocks the calling thread until it completes. For tests
/// and simple tools; the block layer never blocks a device thread.
pub fn submit_and_wait(device: &dyn Device, cmd: Command) -> Completion {
    let (tx, rx) = mpsc::sync_channel(1);
    device.submit(
        cmd,
        Box::new(move |c| {
            // The receiver only goes away if the caller panicked.
            let _ = tx.send(c);
        }),
    );
    rx.recv()
        .expect("a device dropped a completer without calling it")
}
