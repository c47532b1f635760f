//! [`LogConfig`]: where the log lives and how much it may buffer, every
//! default written down, validated with an error that names the field.
//!
//! Checks that need the device (alignment to its block size, fitting its
//! capacity) are made by [`Log::open`](super::Log::open), with the same kind
//! of error.

use serde::{Deserialize, Serialize};

use super::record::encoded_len;
use super::{BATCH_BYTES_LIMIT, LOG_BLOCK_MIN, RECORD_BYTES_LIMIT};
use crate::error::ConfigError;

/// The `log` section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LogConfig {
    /// Where the log's region starts on the device, in bytes. A multiple of
    /// 4096 (and of the device's block size). Default: 0.
    pub region_offset_bytes: u64,
    /// The region's size in bytes: one header block, the rest a ring of
    /// records. A multiple of 4096, at least 64 KiB. Default: 64 MiB.
    pub region_bytes: u64,
    /// The largest group-commit batch: one write of whole blocks. A multiple
    /// of 4096, at most 8 MiB and at most half the ring (so a batch always
    /// fits once the log is truncated). Default: 1 MiB.
    pub batch_bytes_max: u64,
    /// The largest payload of one record; a larger one is refused at once.
    /// At most 4 MiB, and a whole record must fit a batch. Default: 256 KiB.
    pub record_bytes_max: u64,
    /// Appended bytes not yet taken by the writer; appenders wait ("log:
    /// space wait") beyond it. At least one whole record. Default: 4 MiB.
    pub pending_bytes_max: u64,
    /// What `open` does when a bad record is followed by valid ones (media
    /// corruption, not a torn tail): `false` refuses with
    /// [`LogError::Corrupt`](super::LogError::Corrupt) and changes nothing;
    /// `true` recovers up to the bad record, drops the rest and reports
    /// [`Tail::Corrupt`](super::Tail::Corrupt). Default: false.
    pub allow_corrupt_truncate: bool,
    /// Who writes a batch a foreground task waits for: `true`, that task,
    /// in its own thread, when no batch is in flight (leader group commit,
    /// as PostgreSQL's backends flush the WAL themselves): its records and
    /// every record pending before them go in one write and one flush,
    /// with no hand-off to the log writer and back, and a record a
    /// foreground task appends does not wake the writer (its commit will
    /// write it; without one, the next batch anyone else causes, a wait
    /// for log space, or closing, does). `false`: the log writer writes
    /// every batch. Either
    /// way a foreground commit waiting for a batch the writer has in
    /// flight makes it inherit. Default: true.
    pub committer_writes: bool,
}

/// The smallest region: a header block and 15 ring blocks.
pub const REGION_BYTES_MIN: u64 = 16 * LOG_BLOCK_MIN;

impl Default for LogConfig {
    fn default() -> Self {
        Self {
            region_offset_bytes: 0,
            region_bytes: 64 << 20,
            batch_bytes_max: 1 << 20,
            record_bytes_max: 256 << 10,
            pending_bytes_max: 4 << 20,
            allow_corrupt_truncate: false,
            committer_writes: true,
        }
    }
}

fn invalid(field: &'static str, value: u64, allowed: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.to_string(),
        allowed: allowed.into(),
    }
}

impl LogConfig {
    /// Checks every field (with 4096-byte blocks); the error names the first
    /// bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_for_block(LOG_BLOCK_MIN)
    }

    /// Checks every field for a log of `block`-byte blocks.
    pub(crate) fn validate_for_block(&self, block: u64) -> Result<(), ConfigError> {
        assert!(block >= LOG_BLOCK_MIN && block.is_power_of_two());
        let multiple = format!("must be a multiple of the log block ({block} bytes)");
        if self.region_offset_bytes % block != 0 {
            return Err(invalid(
                "log.region_offset_bytes",
                self.region_offset_bytes,
                multiple,
            ));
        }
        let region = self.region_bytes;
        if region % block != 0 || region < REGION_BYTES_MIN.max(16 * block) {
            let min = REGION_BYTES_MIN.max(16 * block);
            return Err(invalid(
                "log.region_bytes",
                region,
                format!("{multiple}, at least {min}"),
            ));
        }
        let half_ring = (region - block) / 2;
        let batch = self.batch_bytes_max;
        if batch % block != 0 || batch < block || batch > BATCH_BYTES_LIMIT || batch > half_ring {
            return Err(invalid(
                "log.batch_bytes_max",
                batch,
                format!(
                    "{multiple}, at most {BATCH_BYTES_LIMIT} and at most half the ring \
                     ({half_ring} bytes with this log.region_bytes)"
                ),
            ));
        }
        let record = self.record_bytes_max;
        if record == 0 || record > RECORD_BYTES_LIMIT || encoded_len(record) > batch {
            return Err(invalid(
                "log.record_bytes_max",
                record,
                format!(
                    "must be within 1..={RECORD_BYTES_LIMIT}, and a whole record \
                     ({} bytes more) must fit log.batch_bytes_max",
                    encoded_len(0)
                ),
            ));
        }
        if self.pending_bytes_max < encoded_len(record) {
            return Err(invalid(
                "log.pending_bytes_max",
                self.pending_bytes_max,
                format!(
                    "must hold at least one whole record ({} bytes)",
                    encoded_len(record)
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_validate_and_bad_fields_are_named() {
        LogConfig::default().validate().unwrap();
        let cases = [
            (
                LogConfig {
                    region_offset_bytes: 100,
                    ..LogConfig::default()
                },
                "log.region_offset_bytes",
            ),
            (
                LogConfig {
                    region_bytes: 4096,
                    ..LogConfig::default()
                },
                "log.region_bytes",
            ),
            (
                LogConfig {
                    region_bytes: 1 << 20,
                    ..LogConfig::default()
                },
                "log.batch_bytes_max",
            ),
            (
                LogConfig {
                    record_bytes_max: 1 << 20,
                    ..LogConfig::default()
                },
                "log.record_bytes_max",
            ),
            (
                LogConfig {
                    pending_bytes_max: 1000,
                    ..LogConfig::default()
                },
                "log.pending_bytes_max",
            ),
        ];
        for (cfg, field) in cases {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(field), "{field}: {e}");
        }
    }

    #[test]
    fn larger_device_blocks_tighten_alignment() {
        let cfg = LogConfig {
            region_offset_bytes: 4096,
            ..LogConfig::default()
        };
        cfg.validate().unwrap();
        let e = cfg.validate_for_block(8192).unwrap_err().to_string();
        assert!(e.contains("8192"), "{e}");
    }
}
