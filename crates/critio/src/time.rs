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
///
/// Read from the CPU's time-stamp counter where it is invariant (the
/// `quanta` crate calibrates it against the kernel's monotonic clock once
/// per process, and falls back to that clock where the counter cannot be
/// trusted): the block layer reads it twice per request, and on this
/// project's virtual machine a read costs 10 ns against `Instant::now`'s
/// 23 (`critio bench block-overhead` prints what it costs where it runs).
#[derive(Clone, Debug)]
pub struct Clock {
    counter: quanta::Clock,
    /// The counter's raw value at the epoch.
    epoch: u64,
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock {
    /// A clock whose epoch is now.
    pub fn new() -> Self {
        let counter = quanta::Clock::new();
        let epoch = counter.raw();
        Self { counter, epoch }
    }

    /// Nanoseconds since the epoch.
    pub fn now(&self) -> Nanos {
        self.counter.delta_as_nanos(self.epoch, self.counter.raw())
    }

    /// The instant `at` nanoseconds after the epoch (now, if that has
    /// passed). Taken relative to now, so the counter's calibration error
    /// (a few parts per million) cannot add up over a long run.
    pub fn instant(&self, at: Nanos) -> Instant {
        let ahead = at.saturating_sub(self.now());
        Instant::now() + Duration::from_nanos(ahead)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clock_moves_forward_with_real_time() {
        let clock = Clock::new();
        let (a, b) = (clock.now(), clock.now());
        assert!(a <= b);
        let wall = Instant::now();
        std::thread::sleep(Duration::from_millis(10));
        let slept = clock.now() - b;
        // The sleep lasts at least 10 ms; the counter is calibrated to a
        // few parts per million, so it cannot read less than 9.
        assert!(slept >= 9 * MS, "{slept} ns");
        assert!(slept <= nanos(wall.elapsed()) + MS, "{slept} ns");
    }

    #[test]
    fn a_deadline_maps_to_an_instant_from_now() {
        let clock = Clock::new();
        let before = Instant::now();
        let past = clock.instant(0);
        assert!(past >= before && past <= Instant::now());
        // 50 ms after a moment between t0 and t1, give or take the
        // counter's calibration and the time between the two reads.
        let t0 = Instant::now();
        let soon = clock.instant(clock.now() + 50 * MS);
        let t1 = Instant::now();
        let ms = Duration::from_millis;
        assert!(soon + (t1 - t0) + ms(1) >= t0 + ms(50), "{:?}", soon - t0);
        assert!(soon <= t1 + ms(51), "{:?}", soon - t0);
    }
}
