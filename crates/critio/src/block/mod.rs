//! The block layer: criticality-aware admission and dispatch in front of a
//! device, the user-space equivalent of the kernel block layer that paper 000
//! enlightened.
//!
//! ```text
//!  read/write/flush (sync: caller's class; async: non-critical)
//!        │
//!        v
//!  admission: critical pool (128) | non-critical pool (128)   "block: admission"
//!        │          (a waiter that turns critical retries in the critical pool)
//!        v
//!  dispatch: critical lane ─────first──────┐
//!            background levels 0..7 ───────┴─ in level order, if the cap allows,
//!            (a FIFO lane each)                no anticipation window holds them,
//!                                              token budget left; >= 1 per 10 ms
//!                                              regardless
//!        │
//!        v
//!  device (class travels on as the command's priority)
//! ```
//!
//! Every non-critical request stays findable by its byte range (the `ncio`
//! index) until it completes, and a critical task that waits for one promotes
//! it where it is (`promote`): a critical slot, the critical queue, or, at the
//! device, a count (the write cache of issue 7 reissues it).
//!
//! Schemes ([`BlockScheme`]) switch the same layer between the comparisons of
//! the experiments: `none` (one FIFO), `static` (classes by task, no
//! inheritance), `sync-first` (classes by sync/async), `rcp` (classes by task
//! plus inheritance).

mod cap;
mod fast;
mod layer;
mod ncio;
mod request;
mod sched;
#[cfg(test)]
mod sched_tests;
mod stats;

use serde::{Deserialize, Serialize};

pub use cap::{AutoCapConfig, NoncriticalCap};
pub use layer::{BlockError, BlockLayer};
pub use ncio::IO_LEN_MAX;
pub use request::IoHandle;
pub use sched::{
    Completed, FastRoom, LaneTokens, Location, Promotion, ReqInfo, SchedConfig, SchedCounters,
    Scheduler, BACKGROUND_LEVELS, LANES,
};
pub use stats::{BlockStats, ClassBuckets, ClassStats};

use crate::class::Class;
use crate::error::ConfigError;
use crate::time::{Nanos, MS, US};

/// A request's id, unique within one block layer.
pub type ReqId = u64;

/// Which comparison scheme the block layer runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum BlockScheme {
    /// One pool, one FIFO, no classes, no cap (Linux's default behaviour).
    None,
    /// Classes by the submitting task (foreground first), no inheritance.
    Static,
    /// Classes by kind: synchronous I/O critical, asynchronous not.
    SyncFirst,
    /// Classes by task, and I/O inheritance: promotion of awaited requests,
    /// admission waiters retried as critical when they inherit.
    #[default]
    Rcp,
}

impl BlockScheme {
    /// Whether requests are split into two classes.
    pub fn classes(self) -> bool {
        self != BlockScheme::None
    }

    /// Whether waiting on a request promotes it, and admission waiters that
    /// inherit criticality retry as critical.
    pub fn inheritance(self) -> bool {
        self == BlockScheme::Rcp
    }

    /// The class of a new request: `sync` requests are waited for by their
    /// submitter, whose class is `task`.
    ///
    /// With `none` the class still travels to the device (so a device that
    /// passes priority to the kernel gives the "kernel priority only"
    /// comparison), but the layer itself schedules everything as one class.
    pub fn classify(self, sync: bool, task: Class) -> Class {
        match self {
            BlockScheme::SyncFirst if sync => Class::Critical,
            BlockScheme::SyncFirst => Class::NonCritical,
            _ if sync => task,
            _ => Class::NonCritical,
        }
    }
}

/// The block layer's configuration; defaults are paper 000's.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct BlockConfig {
    /// The scheme. Default `rcp`.
    pub scheme: BlockScheme,
    /// Admission slots for critical requests. Default 128. Range 1..=65536.
    pub critical_slots: u32,
    /// Admission slots for non-critical requests. Default 128. Range 1..=65536.
    pub noncritical_slots: u32,
    /// At least one non-critical dispatch per this period, in ms. Default 10.
    /// Range 1..=10000.
    pub starvation_period_ms: u64,
    /// Non-critical requests allowed at the device: `{ fixed = N }` (0 =
    /// unlimited) or `{ auto = { ... } }`. Default `{ fixed = 1 }`.
    pub noncritical_cap: NoncriticalCap,
    /// Anticipation window after a critical completion, in µs (paper 004).
    /// Default 0 (off). Range 0..=100000.
    pub anticipation_us: u64,
    /// Open the anticipation window only for a lane whose measured mean
    /// think time (its last completion to its next arrival) fits in it, as
    /// the anticipatory scheduler does; false opens it after every lane's
    /// last completion. Default true.
    pub anticipation_think_time: bool,
    /// Per-lane batch budgets (paper 004's tokens): `[critical, level 0,
    /// level 1, ...]`, 0 = unlimited. A lane that has used its budget
    /// yields until every other lane with work has had its own. Default
    /// `[]` (off: strict priority, the starvation timer guarantees
    /// progress).
    pub tokens: LaneTokens,
    /// The longest request a bulk transfer (the page cache's read-through
    /// and write-around: a snapshot's scan, its dump) submits while it is
    /// non-critical, in bytes; 0 = up to the device's largest command
    /// ([`IO_LEN_MAX`]). A device works on a command it has begun and
    /// cannot preempt it, so a critical command sent behind a background
    /// one of a megabyte waits for all of it (`critio serve` sets 128 KiB
    /// on a real device, and says why). With a cap of N background
    /// requests at the device, a critical one waits behind at most N of
    /// these. The cost: more, shorter background requests, and the
    /// starvation timer's one forced background dispatch per period moves
    /// this much at most. A transfer's requests are whole cache pages, at
    /// least one. Used only with classes (not `none`). Default 0 (the
    /// simulated drives of the papers). Range 0, or a multiple of 4096
    /// within 4096..=[`IO_LEN_MAX`].
    pub noncritical_request_max_bytes: u64,
}

impl Default for BlockConfig {
    fn default() -> Self {
        Self {
            scheme: BlockScheme::Rcp,
            critical_slots: 128,
            noncritical_slots: 128,
            starvation_period_ms: 10,
            noncritical_cap: NoncriticalCap::Fixed(1),
            anticipation_us: 0,
            anticipation_think_time: true,
            tokens: LaneTokens::default(),
            noncritical_request_max_bytes: 0,
        }
    }
}

fn invalid(field: &'static str, value: impl ToString, allowed: &str) -> ConfigError {
    ConfigError::Invalid {
        field,
        value: value.to_string(),
        allowed: allowed.to_owned(),
    }
}

impl BlockConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (field, v) in [
            ("block.critical_slots", self.critical_slots),
            ("block.noncritical_slots", self.noncritical_slots),
        ] {
            if !(1..=65536).contains(&v) {
                return Err(invalid(field, v, "must be within 1..=65536"));
            }
        }
        if !(1..=10_000).contains(&self.starvation_period_ms) {
            return Err(invalid(
                "block.starvation_period_ms",
                self.starvation_period_ms,
                "must be within 1..=10000 ms",
            ));
        }
        if self.anticipation_us > 100_000 {
            return Err(invalid(
                "block.anticipation_us",
                self.anticipation_us,
                "must be within 0..=100000 µs",
            ));
        }
        let cut = self.noncritical_request_max_bytes;
        if cut != 0 && (!(4096..=IO_LEN_MAX).contains(&cut) || cut % 4096 != 0) {
            return Err(invalid(
                "block.noncritical_request_max_bytes",
                cut,
                &format!(
                    "must be 0 (no limit) or a multiple of 4096 within 4096..={IO_LEN_MAX} bytes"
                ),
            ));
        }
        if let NoncriticalCap::Auto(a) = self.noncritical_cap {
            if a.max == 0
                || a.window == 0
                || a.target_ratio.is_nan()
                || a.target_ratio < 1.0
                || !(0.0..=1.0).contains(&a.min_share)
            {
                return Err(invalid(
                    "block.noncritical_cap.auto",
                    format!("{a:?}"),
                    "needs max >= 1, window >= 1, target_ratio >= 1.0 and min_share within 0..=1",
                ));
            }
        }
        Ok(())
    }

    /// The scheduler core's configuration for a device of `device_depth`.
    pub fn sched(&self, device_depth: u32) -> SchedConfig {
        let classes = self.scheme.classes();
        SchedConfig {
            classes,
            critical_slots: self.critical_slots,
            noncritical_slots: self.noncritical_slots,
            starvation_period: self.starvation_period_ms * MS,
            noncritical_cap: if classes {
                self.noncritical_cap
            } else {
                NoncriticalCap::Fixed(0)
            },
            anticipation: if classes {
                self.anticipation_us * US
            } else {
                0
            },
            think_time: self.anticipation_think_time,
            tokens: if classes {
                self.tokens
            } else {
                LaneTokens::default()
            },
            device_depth,
        }
    }

    /// The longest request a bulk transfer of class `class` submits (see
    /// [`BlockConfig::noncritical_request_max_bytes`]).
    pub fn request_len_max(&self, class: Class) -> u64 {
        let cut = self.noncritical_request_max_bytes;
        if class == Class::Critical || !self.scheme.classes() || cut == 0 {
            IO_LEN_MAX
        } else {
            cut.min(IO_LEN_MAX)
        }
    }

    /// The starvation period in [`Nanos`].
    pub fn starvation_period(&self) -> Nanos {
        self.starvation_period_ms * MS
    }
}

/// Parses a cap as given on a command line: a count (0 = unlimited) or
/// `auto`.
pub fn parse_cap(text: &str) -> Result<NoncriticalCap, String> {
    if text == "auto" {
        return Ok(NoncriticalCap::Auto(AutoCapConfig::default()));
    }
    text.parse::<u32>()
        .map(NoncriticalCap::Fixed)
        .map_err(|_| format!("`{text}` is not a cap: give a count (0 = unlimited) or `auto`"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schemes_classify_as_documented() {
        use BlockScheme::*;
        use Class::*;
        assert_eq!(
            None.classify(false, Critical),
            NonCritical,
            "the device still sees classes"
        );
        assert_eq!(Static.classify(true, NonCritical), NonCritical);
        assert_eq!(Static.classify(true, Critical), Critical);
        assert_eq!(
            Rcp.classify(false, Critical),
            NonCritical,
            "async is non-critical"
        );
        assert_eq!(SyncFirst.classify(true, NonCritical), Critical);
        assert_eq!(SyncFirst.classify(false, Critical), NonCritical);
        assert!(Rcp.inheritance() && !Static.inheritance() && !None.classes());
    }

    #[test]
    fn config_defaults_validate_and_errors_name_the_field() {
        BlockConfig::default().validate().unwrap();
        let bad = BlockConfig {
            critical_slots: 0,
            ..BlockConfig::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("block.critical_slots"), "{e}");
        assert_eq!(parse_cap("3"), Ok(NoncriticalCap::Fixed(3)));
        assert!(matches!(parse_cap("auto"), Ok(NoncriticalCap::Auto(_))));
        assert!(parse_cap("x").unwrap_err().contains("auto"));
        for cut in [1, 4095, 5000, IO_LEN_MAX + 4096] {
            let bad = BlockConfig {
                noncritical_request_max_bytes: cut,
                ..BlockConfig::default()
            };
            let e = bad.validate().unwrap_err().to_string();
            assert!(e.contains("block.noncritical_request_max_bytes"), "{e}");
        }
    }

    #[test]
    fn only_non_critical_requests_are_cut_and_only_with_classes() {
        let cut = BlockConfig {
            noncritical_request_max_bytes: 128 << 10,
            ..BlockConfig::default()
        };
        cut.validate().unwrap();
        assert_eq!(cut.request_len_max(Class::NonCritical), 128 << 10);
        assert_eq!(cut.request_len_max(Class::Critical), IO_LEN_MAX);
        let none = BlockConfig {
            scheme: BlockScheme::None,
            ..cut
        };
        assert_eq!(none.request_len_max(Class::NonCritical), IO_LEN_MAX);
        assert_eq!(
            BlockConfig::default().request_len_max(Class::NonCritical),
            IO_LEN_MAX,
            "off by default"
        );
    }
}
