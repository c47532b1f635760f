//! critio-kv: a Redis-protocol (RESP2, and RESP3 after `HELLO 3`) key-value server, with
//! transactions (MULTI/EXEC, one log record each), built only on
//! critio's layers. Its request workers (event loops, one per two cores) are
//! marked foreground; its checkpoint, snapshot and log-rewrite threads are
//! not.
//!
//! ```text
//!  clients ── RESP2/3 ─> request workers (foreground; rounds, one commit each)
//!                            │
//!                            v
//!  engine: value log + in-memory index, write-ahead log, checkpoints
//!                            │
//!  critio: sync ── cache ── log ── block ── device
//! ```

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod engine;
pub mod glob;
pub mod server;
pub mod stack;

pub use stack::{Scheme, Stack, StackConfig};

/// The crate's version, for `critio --version` and `INFO`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
