//! [`LogError`]: why a log operation failed, and what to do about it.

use super::Lsn;
use crate::block::BlockError;
use crate::error::ConfigError;

/// Why a log operation failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LogError {
    /// An earlier write or flush of the log failed. Nothing after it is
    /// acknowledged, and the log accepts nothing more: its state on the
    /// device is unknown until it is recovered.
    #[error(
        "log: poisoned: the {failed} failed, so records from LSN {first_unacked} on are not \
         acknowledged and no new record is accepted; restart and recover the log (Log::open) \
         to continue"
    )]
    Poisoned {
        /// What failed: the operation and the records or offset.
        failed: String,
        /// The first LSN whose commit was not acknowledged.
        first_unacked: Lsn,
        /// The block layer's error.
        #[source]
        cause: BlockError,
    },
    /// A record larger than `log.record_bytes_max`.
    #[error(
        "log: a {len}-byte record exceeds the {max}-byte limit (log.record_bytes_max); \
         split it or raise the limit"
    )]
    RecordTooLarge {
        /// The payload's length.
        len: u64,
        /// The limit.
        max: u64,
    },
    /// The log is closing or closed: the writer has stopped (or is
    /// stopping), so nothing more is appended or made durable.
    #[error(
        "log: closed: the log writer has stopped, so no record is appended or made durable; \
         open the log again to continue"
    )]
    Closed,
    /// Its owner told the log to take no more records
    /// ([`Log::refuse_appends`](super::Log::refuse_appends)); the records
    /// appended before still become durable.
    #[error("log: appends refused: {why}")]
    Refused {
        /// Why, as the owner gave it.
        why: String,
    },
    /// Reading or writing the log failed while opening it or writing its
    /// header (on truncation that also poisons the log).
    #[error("log: {what} failed; check the device, then open the log again")]
    Io {
        /// What was being done.
        what: String,
        /// The block layer's error.
        #[source]
        source: BlockError,
    },
    /// The header block is neither blank nor a critio log header.
    #[error(
        "log: the block at offset {offset} is not a critio log header ({reason}); check \
         log.region_offset_bytes, or zero the region to format a new log there"
    )]
    BadHeader {
        /// The header's device offset.
        offset: u64,
        /// Why it is not one.
        reason: String,
    },
    /// The log on the device was formatted with another geometry.
    #[error(
        "log: the log at offset {offset} was formatted with {what} = {on_disk}, but {configured} \
         is configured; configure {on_disk}, or zero the region to format a new log"
    )]
    Mismatch {
        /// The header's device offset.
        offset: u64,
        /// Which setting differs.
        what: &'static str,
        /// What the header says.
        on_disk: u64,
        /// What the configuration says.
        configured: u64,
    },
    /// Recovery found a bad record followed by valid ones: acknowledged
    /// records would be lost by resuming. The log was not changed.
    #[error(
        "log: record {lsn} at offset {offset} is corrupt and {later_records} valid records \
         follow it ({recovered} records before it are intact); resuming would drop them. Keep \
         a copy of the device, then set log.allow_corrupt_truncate = true to recover up to \
         the corrupt record and drop the rest"
    )]
    Corrupt {
        /// The bad record's device offset.
        offset: u64,
        /// The LSN expected there.
        lsn: Lsn,
        /// Valid records found after it.
        later_records: u64,
        /// Valid live records before it.
        recovered: u64,
    },
    /// The log writer thread could not be started.
    #[error("log: cannot start the log writer thread; check the process's thread limit")]
    Spawn {
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The configuration is invalid or does not fit the device.
    #[error(transparent)]
    Config(#[from] ConfigError),
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;
    use std::sync::Arc;

    use super::*;
    use crate::device::{DeviceError, Op};

    #[test]
    fn poisoned_says_what_failed_and_what_to_do_and_chains_the_cause() {
        let cause = BlockError::Device(Arc::new(DeviceError::Injected {
            device: "faulty(mem)".into(),
            op: Op::Flush,
            offset: 0,
        }));
        let e = LogError::Poisoned {
            failed: "flush after records 3..=5".into(),
            first_unacked: 3,
            cause,
        };
        let msg = e.to_string();
        assert!(msg.contains("flush after records 3..=5"), "{msg}");
        assert!(msg.contains("restart and recover"), "{msg}");
        let source = e.source().expect("the cause is chained").to_string();
        assert!(source.contains("injected"), "{source}");
    }
}
