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
//! background_nice = 10     # nice levels a background thread runs below its own while non-critical
//! lock_ceiling = true      # background sections holding request locks run real-time
//! background_idle = false  # background threads also SCHED_IDLE while non-critical
//! background_cpu_min_share = 0.5  # CPU floor: background keeps this share of the CPU it wants
//! background_yield_us = 500  # background CPU loops yield at most this often (waking requests go first)
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
//! anticipation_us = 0      # paper 004: hold lower lanes after a lane's last completion
//! anticipation_think_time = true   # only for a lane whose mean think time fits the window
//! tokens = []              # paper 004 batch budgets: [critical, level 0, level 1, ...]
//! noncritical_request_max_bytes = 0  # cut background bulk requests to this (0: off; serve on a file: 131072)
//!
//! [cache]
//! capacity_bytes = 67108864
//! dirty_limits = true      # separate limits per class (off: one shared limit)
//! critical_dirty_pct = 20.0
//! noncritical_dirty_pct = 1.0
//! clean_bytes_max = 0      # 0: clean pages may use the whole cache
//! prefault = true          # back the cache's memory at start, in a background thread
//!
//! [log]
//! region_offset_bytes = 0        # where the write-ahead log lives on the device
//! region_bytes = 67108864        # 64 MiB: a header block and a ring of records
//! batch_bytes_max = 1048576      # one group-commit write
//! record_bytes_max = 262144
//! pending_bytes_max = 4194304    # appenders wait beyond this
//! allow_corrupt_truncate = false # open refuses a corrupt (not torn) tail
//! committer_writes = true        # a foreground commit writes its own batch (no writer hand-off)
//!
//! [device]                       # what crate::stack::Stack::open opens
//! spec = "mem"                   # mem | sim[:ssd|:hdd][:PATH] | file:PATH | pool:PATH
//! capacity_bytes = 268435456     # size of mem/sim, or of a file created for it
//! priorities = "levels"          # off | levels | classes | idle: each class's kernel ioprio
//! queue_depth = 128              # file: commands in flight; 0 = the disk's nr_requests
//!
//! # [nvwc]                       # optional: a write cache in front of the device
//! # device = "sim:ssd"
//! # policy = "cp-pi-ioi"
//! # cache_bytes = 67108864
//! ```
//!
//! Each section's type lives with its layer (`block::BlockConfig`,
//! `sync::SyncConfig`, ...) and validates itself with the leaf
//! [`crate::error::ConfigError`]; this module only gathers them, so no
//! layer depends on it.

use serde::{Deserialize, Serialize};

use crate::block::BlockConfig;
use crate::cache::CacheConfig;
use crate::device::DeviceConfig;
pub use crate::error::ConfigError;
use crate::log::LogConfig;
use crate::nvwc::WriteCacheConfig;
pub use crate::sync::{SyncConfig, HELPER_WINDOW_MS_RANGE};

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
    /// The device a [`crate::stack::Stack`] opens.
    pub device: DeviceConfig,
    /// A write cache in front of the device (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvwc: Option<WriteCacheConfig>,
}

/// The `context` section.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ContextConfig {
    /// Mirror each thread's effective class into the kernel with
    /// `ioprio_set`, with the device's priorities (`device.priorities`;
    /// with `off`, critical best-effort 0 and non-critical best-effort 7),
    /// so the kernel's own I/O for the thread is prioritized too. The
    /// mirror is process-wide: a [`crate::Stack`] that turns it on turns it
    /// off when it closes. Default: false.
    pub kernel_mirror: bool,
    /// How many nice levels threads marked background
    /// ([`crate::context::set_background`]) run below their own (the
    /// process's nice, which request threads keep: 10 at nice 0, 15 under
    /// `nice -n 5`, at most 19) while they are non-critical; they run at
    /// their own while they inherit criticality (so a lock holder a
    /// request waits for is never slowed). 0 turns it off. Default 10:
    /// a background thread gets about a tenth of a CPU a request thread
    /// wants, and all of an idle one. Range 0..=19.
    pub background_nice: i32,
    /// Run a background thread's short sections that hold locks requests
    /// take (the cleaner's batch of key stripes) real-time, so the kernel
    /// never preempts it there while a request waits
    /// ([`crate::context::ceiling`]). Needs `CAP_SYS_NICE` or
    /// `RLIMIT_RTPRIO >= 1`; without, it stays off with a note. Default:
    /// true.
    pub lock_ceiling: bool,
    /// Put background threads, while non-critical, in `SCHED_IDLE` as
    /// well (they still run at their own nice, `SCHED_OTHER`, while they
    /// inherit).
    /// The kernel then counts a CPU running only them as idle when it
    /// places a waking request thread, and preempts them at once; they also
    /// get less of a busy CPU than at nice 19. Needs `background_nice`
    /// above 0. Process-wide: on from the first stack that asks for it.
    /// Default: false.
    pub background_idle: bool,
    /// The CPU floor: a background thread gets at least this share of the
    /// CPU time it wants (its run time over its run plus run-queue wait,
    /// each 50 ms), however busy request threads keep its CPU: below it,
    /// its non-critical nice is lowered a level at a time toward 0 (and it
    /// leaves `SCHED_IDLE`); well above it, raised back. The CPU's
    /// counterpart of `block.noncritical_cap.auto.min_share`. 0 turns it
    /// off. Needs `background_nice` above 0. Process-wide, like
    /// `background_nice`. Default 0.5. Range 0..=1.
    pub background_cpu_min_share: f64,
    /// How long, in microseconds, a non-critical background thread runs
    /// at most between two yields of the CPU in its CPU-bound loops
    /// ([`crate::context::yield_point`]: the snapshot's compression, the
    /// value log's scans and copies). The kernel's fair scheduler may
    /// leave a waking request thread waiting until the next tick (up to
    /// 4 ms at 250 Hz) behind a lower-priority thread on its CPU; a yield
    /// lets it have the CPU if it is owed it. Needs `background_nice`
    /// above 0. 0 turns it off. Process-wide, like `background_nice`.
    /// Default 500.
    pub background_yield_us: u32,
}

impl Default for ContextConfig {
    fn default() -> Self {
        Self {
            kernel_mirror: false,
            background_nice: 10,
            lock_ceiling: true,
            background_idle: false,
            background_cpu_min_share: 0.5,
            background_yield_us: 500,
        }
    }
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
        let share = self.context.background_cpu_min_share;
        if !(0.0..=1.0).contains(&share) {
            return Err(ConfigError::Invalid {
                field: "context.background_cpu_min_share",
                value: share.to_string(),
                allowed: "must be within 0..=1 (0: off)".into(),
            });
        }
        self.sync.validate()?;
        self.block.validate()?;
        self.log.validate()?;
        self.cache.validate()?;
        self.device.validate()?;
        match &self.nvwc {
            Some(wc) => wc.cache.validate(),
            None => Ok(()),
        }
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
        let err = Config::from_toml_str("[context]\nbackground_cpu_min_share = 1.5").unwrap_err();
        assert!(
            err.to_string().contains("context.background_cpu_min_share"),
            "{err}"
        );
        let ok = Config::from_toml_str("[context]\nbackground_cpu_min_share = 0.25").unwrap();
        assert_eq!(ok.context.background_cpu_min_share, 0.25);
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
    fn device_and_nvwc_sections_parse() {
        let text = "[device]\nspec = \"sim:ssd\"\ncapacity_bytes = 16777216\n\
                    [nvwc]\ndevice = \"mem\"\ncache_bytes = 1048576\n";
        let c = Config::from_toml_str(text).unwrap();
        assert_eq!(c.device.spec.to_string(), "sim:ssd");
        assert_eq!(c.nvwc.as_ref().map(|w| w.cache.cache_bytes), Some(1 << 20));
        assert!(Config::default().nvwc.is_none());
        let err = Config::from_toml_str("[nvwc]\ncache_bytes = 0").unwrap_err();
        assert!(err.to_string().contains("nvwc.cache_bytes"), "{err}");
        let again = Config::from_toml_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(again, c);
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
