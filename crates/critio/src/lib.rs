//! critio: request-centric I/O prioritization (RCP) as an embeddable I/O
//! stack.
//!
//! An application marks the threads that serve requests as foreground
//! ([`context::set_foreground`]). critio then finds every I/O a request
//! waits for, directly or through any chain of locks, condition variables,
//! queued I/Os and admission stages, and makes it critical at every layer of
//! the path, while background work keeps progressing.
//!
//! ```text
//!  class     the two classes, critical and non-critical (a leaf every layer names)
//!  context   who is critical now: foreground + inherited; what each task waits on
//!  sync      Mutex / RwLock / Condvar / Event that pass criticality on
//!  metrics   wait points and inheritance counters
//!  sys       the ioprio system calls and priority types (context and device use them)
//! ```
//!
//! Lower layers (cache, log, write cache, block, device) arrive with later
//! issues; `docs/ARCHITECTURE.md` maps each layer to the paper it implements.

#![warn(missing_docs)]
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
