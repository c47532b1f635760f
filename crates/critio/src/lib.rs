//! critio: request-centric I/O prioritization (RCP) as an embeddable I/O
//! stack.
//!
//! An application marks the threads that serve requests as foreground
//! ([`context::set_foreground`]). critio then finds every I/O a request
//! waits for, directly or through any chain of locks, condition variables,
//! queued I/Os and admission stages, and makes it critical at every layer of
//! the path (page cache, log, write cache, block layer, device), while
//! background work keeps progressing.
//!
//! # Quick start
//!
//! One [`Config`] opens a whole [`Stack`]; the stack lays out the device
//! (here: a write-ahead log, then a page-cache file) and checks that no two
//! regions overlap.
//!
//! ```
//! use critio::{Config, Stack};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = Config::default(); // [device] spec = "mem"; "file:PATH" for io_uring + O_DIRECT
//! config.device.capacity_bytes = 64 << 20;
//! config.log.region_bytes = 8 << 20;
//! let stack = Stack::open(&config)?;
//! let (log, _recovered) = stack.open_log()?;
//! let table = stack.add_file("table", 16 << 20)?;
//!
//! // A request thread: its commit and its reads are critical at every layer,
//! // and whatever it waits on (a lock a background thread holds, the log
//! // writer) inherits that until the wait ends.
//! critio::context::set_foreground();
//! log.append_commit(b"put k1 = v1")?;
//! stack.cache().write(table, 0, b"v1")?;
//! let mut back = [0u8; 2];
//! stack.cache().read(table, 0, &mut back)?;
//! assert_eq!(&back, b"v1");
//! critio::context::clear_foreground();
//!
//! // A background checkpoint: non-critical unless a request waits for it.
//! stack.cache().flush_all()?;
//! log.truncate(log.durable_lsn())?;
//!
//! // Where requests waited, per wait point and class ("log: commit wait"
//! // when a commit found its record not yet durable).
//! for w in stack.metrics().snapshot().wait_points {
//!     println!("{} ({:?}): {} waits", w.point, w.class, w.latency.count);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! `cargo run --example embedded_store` runs a fuller store (recovery, a
//! checkpoint thread, an epoch lock the requests share with it).
//!
//! # Modules, from the top
//!
//! ```text
//!  stack     the front door: one Config -> device, write cache, block layer, page cache, log; the layout
//!  config    the whole stack's configuration (TOML), each section its layer's own type
//!  cache     page cache with per-class dirty limits and throttling (paper 001's cache layer)
//!  log       write-ahead log with group commit; committers' waits pass criticality to the writer
//!  block     admission, dispatch, promotion, the non-critical cap (papers 000, 004)
//!  nvwc      non-volatile write cache admitting what requests wait for (paper 002)
//!  device    io_uring (file:), worker pool (pool:), simulated SSD/HDD (sim:), memory (mem)
//!  sync      Mutex / RwLock / Condvar / Event that pass criticality on
//!  context   who is critical now: foreground + inherited; what each task waits on
//!  metrics   wait points per stack, inheritance counters per process
//!  sys       the ioprio system calls and priority types (context and device use them)
//!  class     the two classes, critical and non-critical (a leaf every layer names)
//!  error     the configuration error every layer validates with (a leaf)
//! ```
//!
//! `docs/ARCHITECTURE.md` maps each layer to the paper it implements.

#![deny(missing_docs)]
#![deny(unsafe_code)]

pub mod block;
pub mod cache;
pub mod class;
pub mod config;
pub mod context;
pub mod device;
pub mod error;
pub mod log;
pub mod metrics;
pub mod nvwc;
mod shim;
#[cfg(not(loom))]
pub mod stack;
pub mod sync;
pub mod sys;
pub mod time;

pub use class::Class;
pub use config::{Config, ConfigError};
pub use context::current_class;
#[cfg(not(loom))]
pub use stack::{Stack, StackError};
