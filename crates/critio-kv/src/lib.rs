//! critio-kv: a Redis-protocol (RESP2) key-value server built only on
//! critio's layers. Its connection threads are marked foreground; its
//! checkpoint, snapshot and log-rewrite threads are not.
//!
//! The engine and server arrive with issue 5; this crate exists now so the
//! workspace has its final shape.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

/// The crate's version, for `critio --version` and `INFO`.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
