//! Time for the sans-I/O cores: nanoseconds since an arbitrary epoch.
//!
//! Cores (the block scheduler, the device models) take `now: Nanos` as an
//! argument and never read a clock, so tests and the discrete-event
//! experiments can drive them in virtual time. Drivers read a [`Clock`].

use std::time::{Duration, Instant};

/// Nanoseconds since the clock's epoch.
pub type Nanos = u64;

/// One millisecond in [`Nanos`].
pub const MS: Nanos = 1_000_000;
/// One microsecond in [`Nanos`].
pub const US: Nanos = 1_000;

/// Converts a duration to [`Nanos`] (saturating).
pub fn nanos(d: Duration) -> Nanos {
    d.as_nanos().min(u128::from(u64::MAX)) as Nanos
}

/// A monotonic real-time clock with its own epoch.
#[derive(Clone, Copy, Debug)]
pub struct Clock {
    epoch: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        Self {
            epoch: Instant::now(),
        }
    }

    /// Nanoseconds since the epoch.
    pub fn now(&self) -> Nanos {
        nanos(self.epoch.elapsed())
    }

    /// The instant `at` nanoseconds after the epoch.
    pub fn instant(&self, at: Nanos) -> Instant {
        self.epoch + Duration::from_nanos(at)
    }
}
