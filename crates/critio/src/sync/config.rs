//! The `[sync]` section of the config: inheritance on or off, and the
//! helper window, turned into each primitive's [`SyncOptions`].

use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::{SyncOptions, HELPER_WINDOW_DEFAULT};
use crate::error::ConfigError;
use crate::metrics::MetricsHandle;

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
    /// Options for a primitive named `name` under this configuration,
    /// recording its waits in the process-wide registry.
    pub fn options(&self, name: &'static str) -> SyncOptions {
        SyncOptions::named(name)
            .inherit(self.inheritance)
            .helper_window(Duration::from_millis(self.helper_window_ms))
    }

    /// Options for a primitive named `name` under this configuration,
    /// recording its waits in `metrics` (a stack's registry).
    pub fn options_in(&self, name: &'static str, metrics: &MetricsHandle) -> SyncOptions {
        self.options(name).metrics(metrics.clone())
    }

    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let window = self.helper_window_ms;
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
        Ok(())
    }
}
