//! One `Config` for the whole stack: every limit in one place, with the
//! paper's value as the default, validated with an error that names the
//! field and says what is allowed.
//!
//! Units are last in field names (`helper_window_ms`). A config file is TOML
//! with the same sections and names; unknown keys are rejected so a typo is
//! an error, not a silently ignored setting.
//!
//! ```toml
//! [context]
//! kernel_mirror = false    # mirror each thread's class into ioprio_set
//! background_nice = 10     # CPU nice of background threads while non-critical
//!
//! [sync]
//! inheritance = true       # owners/helpers inherit from critical waiters
//! helper_window_ms = 1000  # inferred condvar helper dropped after this
//!
//! [block]
//! scheme = "rcp"           # none | static | sync-first | rcp
//! critical_slots = 128
//! noncritical_slots = 128
//! starvation_period_ms = 10
//! noncritical_cap = { fixed = 1 }   # or { auto = {} }; fixed = 0: unlimited
//! anticipation_us = 0
//!
//! [cache]
//! capacity_bytes = 67108864
//! dirty_limits = true      # separate limits per class (off: one shared limit)
//! critical_dirty_pct = 20.0
//! noncritical_dirty_pct = 1.0
//!
//! [log]
//! region_offset_bytes = 0        # where the write-ahead log lives on the device
//! region_bytes = 67108864        # 64 MiB: a header block and a ring of records
//! batch_bytes_max = 1048576      # one group-commit write
//! record_bytes_max = 262144
//! pending_bytes_max = 4194304    # appenders wait beyond this
//! allow_corrupt_truncate = false # open refuses a corrupt (not torn) tail
//! ```

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::block::BlockConfig;
use crate::cache::CacheConfig;
use crate::log::LogConfig;
use crate::sync::{SyncOptions, HELPER_WINDOW_DEFAULT};

/// The whole stack's configuration.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// The enlightenment API.
    pub context: ContextConfig,
    /// Priority inheritance through locks and condition variables.
    pub sync: SyncConfig,
    /// Admission, dispatch and the non-critical cap.
    pub block: BlockConfig,
    /// The write-ahead log's region, batches and bounds.
    pub log: LogConfig,
    /// The page cache: size, dirty limits per class, writeback.
    pub cache: CacheConfig,
}

/// The `context` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextConfig {
    /// Mirror each thread's effective class into the kernel with
    /// `ioprio_set` (critical: best-effort 0, non-critical: best-effort 7),
    /// so the kernel's own I/O for the thread is prioritized too. Default:
    /// false.
    pub kernel_mirror: bool,
    /// The CPU nice value of threads marked background
    /// ([`crate::context::set_background`]) while they are non-critical;
    /// they run at nice 0 while they inherit criticality (so a lock holder
    /// a request waits for is never slowed). 0 turns it off. Default 10:
    /// a background thread gets about a tenth of a CPU a request thread
    /// wants, and all of an idle one. Range 0..=19.
    pub background_nice: i32,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            kernel_mirror: false,
            background_nice: 10,
        }
    }
}

/// The `sync` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SyncConfig {
    /// Whether lock owners and condvar helpers inherit criticality from
    /// critical waiters. Default: true.
    pub inheritance: bool,
    /// How long an inferred condvar helper may go without signalling before
    /// it is dropped, in milliseconds. Default: 1000 (1 s). Range 1..=60000.
    pub helper_window_ms: u64,
}

/// The allowed range of `sync.helper_window_ms`.
pub const HELPER_WINDOW_MS_RANGE: std::ops::RangeInclusive<u64> = 1..=60_000;

const _: () = assert!(HELPER_WINDOW_DEFAULT.as_millis() as u64 >= *HELPER_WINDOW_MS_RANGE.start());
const _: () = assert!(HELPER_WINDOW_DEFAULT.as_millis() as u64 <= *HELPER_WINDOW_MS_RANGE.end());

impl Default for SyncConfig {
    fn default() -> Self {
        Self {
            inheritance: true,
            helper_window_ms: HELPER_WINDOW_DEFAULT.as_millis() as u64,
        }
    }
}

impl SyncConfig {
    /// Options for a primitive named `name` under this configuration.
    pub fn options(&self, name: &'static str) -> SyncOptions {
        SyncOptions::named(name)
            .inherit(self.inheritance)
            .helper_window(Duration::from_millis(self.helper_window_ms))
    }
}

/// A configuration that cannot be used, and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A field is out of its allowed range.
    #[error("config: `{field}` = {value} is invalid: {allowed}")]
    Invalid {
        /// The dotted field name, as in the config file.
        field: &'static str,
        /// The rejected value.
        value: String,
        /// What is allowed instead.
        allowed: String,
    },
    /// The config file is not valid TOML for this schema.
    #[error("config: cannot parse: {0}")]
    Parse(#[from] toml::de::Error),
}

impl Config {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let nice = self.context.background_nice;
        if !(0..=19).contains(&nice) {
            return Err(ConfigError::Invalid {
                field: "context.background_nice",
                value: nice.to_string(),
                allowed: "must be within 0..=19 (0: off)".into(),
            });
        }
        let window = self.sync.helper_window_ms;
        if !HELPER_WINDOW_MS_RANGE.contains(&window) {
            return Err(ConfigError::Invalid {
                field: "sync.helper_window_ms",
                value: window.to_string(),
                allowed: format!(
                    "must be within {}..={} milliseconds",
                    HELPER_WINDOW_MS_RANGE.start(),
                    HELPER_WINDOW_MS_RANGE.end()
                ),
            });
        }
        self.block.validate()?;
        self.log.validate()?;
        self.cache.validate()
    }

    /// Parses and validates a TOML config.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text)?;
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_the_papers_and_valid() {
        let c = Config::default();
        c.validate().unwrap();
        assert!(c.sync.inheritance);
        assert_eq!(c.sync.helper_window_ms, 1000);
        assert_eq!(Config::from_toml_str("").unwrap(), c);
    }

    #[test]
    fn bad_values_and_unknown_keys_are_named() {
        let err = Config::from_toml_str("[sync]\nhelper_window_ms = 0").unwrap_err();
        assert!(err.to_string().contains("sync.helper_window_ms"), "{err}");
        let err = Config::from_toml_str("[sync]\nhelper_windw_ms = 5").unwrap_err();
        assert!(err.to_string().contains("helper_windw_ms"), "{err}");
        let err = Config::from_toml_str("[block]\nstarvation_period_ms = 0").unwrap_err();
        assert!(
            err.to_string().contains("block.starvation_period_ms"),
            "{err}"
        );
    }

    #[test]
    fn the_log_section_parses_and_is_validated() {
        let text = "[log]\nregion_bytes = 2097152\nbatch_bytes_max = 524288\n";
        let c = Config::from_toml_str(text).unwrap();
        assert_eq!(
            (c.log.region_bytes, c.log.batch_bytes_max),
            (2 << 20, 512 << 10)
        );
        assert_eq!(
            c.log.pending_bytes_max,
            LogConfig::default().pending_bytes_max
        );
        assert!(!c.log.allow_corrupt_truncate);
        let err = Config::from_toml_str("[log]\nregion_bytes = 1048576").unwrap_err();
        assert!(err.to_string().contains("log.batch_bytes_max"), "{err}");
        let err = Config::from_toml_str("[log]\nregion_byte = 1").unwrap_err();
        assert!(err.to_string().contains("region_byte"), "{err}");
    }

    #[test]
    fn a_full_config_file_parses() {
        let text = "[context]\nkernel_mirror = true\n[block]\nscheme = \"static\"\n\
                    noncritical_cap = { auto = { max = 8 } }\nanticipation_us = 500\n";
        let c = Config::from_toml_str(text).unwrap();
        assert!(c.context.kernel_mirror);
        assert_eq!(c.block.scheme, crate::block::BlockScheme::Static);
        assert!(
            matches!(c.block.noncritical_cap, crate::block::NoncriticalCap::Auto(a) if a.max == 8)
        );
    }
}
