//! The cap on non-critical requests at the device, fixed or adaptive.
//!
//! A device reorders what it holds (NCQ, firmware, the kernel's own
//! scheduler), so every non-critical request at the device can delay a
//! critical one. Paper 000 caps them at one, which protects critical latency
//! but costs background throughput (its Figure 11). The `auto` cap finds the
//! largest cap the critical requests do not notice:
//!
//! ```text
//!   critical device latency, background at the device  ─┐  (mean of a window)
//!                                                        ├─ ratio <= target: cap += 1   (additive increase)
//!   clean baseline (no background at the device)       ─┘  ratio >  target: cap /= 2   (multiplicative decrease)
//!   every probe_every (and at once with no baseline): hold background until
//!       it drains and re-measure the baseline
//!   no critical traffic for idle_grace: cap grows to max (nobody to protect);
//!       when critical traffic returns, the cap restarts at 1
//! ```
//!
//! Decisions use a window's trimmed mean (its slowest sample dropped), not
//! single samples: a device's own tail (host caches, firmware) produces rare
//! slow critical requests with or without background, and cutting on each of
//! them would pin the cap at 1.
//!
//! ```text
//! ```
//!
//! Sans-I/O: it sees latencies and times, never a clock.

use serde::{Deserialize, Serialize};

use crate::time::{Nanos, MS};

/// How many non-critical requests may be outstanding at the device.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoncriticalCap {
    /// At most this many (0 means unlimited). Paper 000's default is 1.
    Fixed(u32),
    /// Adapted to the critical requests' measured device latency.
    Auto(AutoCapConfig),
}

impl Default for NoncriticalCap {
    fn default() -> Self {
        NoncriticalCap::Fixed(1)
    }
}

/// Settings of the adaptive cap.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AutoCapConfig {
    /// The largest cap. Default 32.
    pub max: u32,
    /// Critical device latency with background at the device may be this
    /// many times the clean baseline. Default 1.5.
    pub target_ratio: f64,
    /// Critical completions per decision. Default 16.
    pub window: u32,
    /// How often the clean baseline is re-measured, in ms. Default 1000.
    pub probe_every_ms: u64,
    /// How long a probe may hold background dispatch, in ms. Default 50.
    pub probe_max_ms: u64,
    /// No critical completion for this long lets the cap grow freely, in ms.
    /// Default 100.
    pub idle_grace_ms: u64,
}

impl Default for AutoCapConfig {
    fn default() -> Self {
        Self {
            max: 32,
            target_ratio: 1.5,
            window: 16,
            probe_every_ms: 1000,
            probe_max_ms: 50,
            idle_grace_ms: 100,
        }
    }
}

/// Clean samples a probe collects before it ends.
const PROBE_SAMPLES: u32 = 4;
/// Weight of a new clean sample in the baseline.
const CLEAN_ALPHA: f64 = 0.2;

/// The live state of a cap.
#[derive(Clone, Debug)]
pub(crate) enum CapState {
    Fixed(u32),
    Auto(AutoCap),
}

impl CapState {
    pub(crate) fn new(cap: NoncriticalCap) -> Self {
        match cap {
            NoncriticalCap::Fixed(n) => CapState::Fixed(n),
            NoncriticalCap::Auto(cfg) => CapState::Auto(AutoCap::new(cfg)),
        }
    }

    /// How many non-critical requests may be at the device now (None =
    /// unlimited).
    pub(crate) fn limit(&self, now: Nanos) -> Option<u32> {
        match self {
            CapState::Fixed(0) => None,
            CapState::Fixed(n) => Some(*n),
            CapState::Auto(a) => Some(a.limit(now)),
        }
    }

    /// The current cap, for reporting (u32::MAX = unlimited).
    pub(crate) fn current(&self) -> u32 {
        match self {
            CapState::Fixed(0) => u32::MAX,
            CapState::Fixed(n) => *n,
            CapState::Auto(a) => a.cap,
        }
    }

    pub(crate) fn on_critical_complete(&mut self, latency: Nanos, nc_at_dispatch: u32, now: Nanos) {
        if let CapState::Auto(a) = self {
            a.on_critical_complete(latency, nc_at_dispatch, now);
        }
    }

    pub(crate) fn on_noncritical_complete(&mut self, now: Nanos) {
        if let CapState::Auto(a) = self {
            a.on_noncritical_complete(now);
        }
    }

    /// The adaptive cap's view: (clean baseline, mean of the last decided
    /// window with background at the device), in ns.
    pub(crate) fn view(&self) -> (Option<f64>, Option<f64>) {
        match self {
            CapState::Auto(a) => (a.clean, a.last_mixed),
            CapState::Fixed(_) => (None, None),
        }
    }

    /// When a probe ends by timeout, if one is running.
    pub(crate) fn probe_deadline(&self) -> Option<Nanos> {
        match self {
            CapState::Auto(a) => a.probe_until,
            CapState::Fixed(_) => None,
        }
    }
}

#[derive(Clone, Debug)]
pub(crate) struct AutoCap {
    cfg: AutoCapConfig,
    cap: u32,
    clean: Option<f64>,
    mixed_sum: f64,
    mixed_n: u32,
    mixed_max: f64,
    last_mixed: Option<f64>,
    seen: u32,
    probe_until: Option<Nanos>,
    probe_clean: u32,
    last_probe: Nanos,
    last_critical: Option<Nanos>,
}

impl AutoCap {
    fn new(cfg: AutoCapConfig) -> Self {
        assert!(cfg.max >= 1 && cfg.window >= 1 && cfg.target_ratio >= 1.0);
        Self {
            cfg,
            cap: 1,
            clean: None,
            mixed_sum: 0.0,
            mixed_n: 0,
            mixed_max: 0.0,
            last_mixed: None,
            seen: 0,
            probe_until: None,
            probe_clean: 0,
            last_probe: 0,
            last_critical: None,
        }
    }

    fn limit(&self, now: Nanos) -> u32 {
        match self.probe_until {
            Some(until) if now < until => 0,
            _ => self.cap,
        }
    }

    fn target(&self) -> Option<f64> {
        self.clean.map(|c| c * self.cfg.target_ratio)
    }

    fn on_critical_complete(&mut self, latency: Nanos, nc_at_dispatch: u32, now: Nanos) {
        if self.idle(now) {
            self.cap = 1; // critical traffic is back: start low again
            self.reset_window();
        }
        self.last_critical = Some(now);
        let lat = latency as f64;
        if nc_at_dispatch == 0 {
            self.clean = Some(match self.clean {
                None => lat,
                Some(c) => c + CLEAN_ALPHA * (lat - c),
            });
            if self.probe_until.is_some() {
                self.probe_clean += 1;
                if self.probe_clean >= PROBE_SAMPLES {
                    self.probe_until = None;
                }
            }
        } else {
            self.mixed_sum += lat;
            self.mixed_n += 1;
            self.mixed_max = self.mixed_max.max(lat);
        }
        self.seen += 1;
        if self.seen >= self.cfg.window {
            self.decide();
        }
        self.maybe_probe(now);
    }

    fn decide(&mut self) {
        if let (Some(target), true) = (self.target(), self.mixed_n >= 2) {
            let mean = (self.mixed_sum - self.mixed_max) / f64::from(self.mixed_n - 1);
            self.last_mixed = Some(mean);
            if mean <= target {
                self.cap = (self.cap + 1).min(self.cfg.max);
            } else {
                self.cut();
            }
        }
        self.reset_window();
    }

    fn reset_window(&mut self) {
        self.seen = 0;
        self.mixed_sum = 0.0;
        self.mixed_n = 0;
        self.mixed_max = 0.0;
    }

    fn cut(&mut self) {
        self.cap = (self.cap / 2).max(1);
    }

    /// No critical completion for `idle_grace` (or ever).
    fn idle(&self, now: Nanos) -> bool {
        self.last_critical
            .is_none_or(|t| now.saturating_sub(t) >= self.cfg.idle_grace_ms * MS)
    }

    /// Starts a probe when one is due, or at once while there is no
    /// baseline yet.
    fn maybe_probe(&mut self, now: Nanos) {
        if let Some(until) = self.probe_until {
            if now >= until {
                self.probe_until = None; // timed out: keep the old baseline
            }
            return;
        }
        let due = now.saturating_sub(self.last_probe) >= self.cfg.probe_every_ms * MS;
        if due || self.clean.is_none() {
            self.last_probe = now;
            self.probe_clean = 0;
            self.probe_until = Some(now + self.cfg.probe_max_ms * MS);
        }
    }

    fn on_noncritical_complete(&mut self, now: Nanos) {
        if self.idle(now) {
            self.cap = (self.cap + 1).min(self.cfg.max);
            self.probe_until = None;
        }
        if self.probe_until.is_some_and(|until| now >= until) {
            self.probe_until = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn auto() -> CapState {
        CapState::new(NoncriticalCap::Auto(AutoCapConfig::default()))
    }

    #[test]
    fn fixed_caps_and_unlimited() {
        assert_eq!(CapState::new(NoncriticalCap::Fixed(1)).limit(0), Some(1));
        assert_eq!(CapState::new(NoncriticalCap::Fixed(0)).limit(0), None);
    }

    #[test]
    fn grows_while_critical_latency_stays_near_the_baseline() {
        let mut c = auto();
        let mut now = 0;
        for _ in 0..4 {
            now += MS;
            c.on_critical_complete(MS, 0, now); // clean baseline 1 ms
        }
        for _ in 0..(16 * 10) {
            now += MS;
            c.on_critical_complete(MS + MS / 5, 1, now); // 1.2x: fine
        }
        assert!(c.current() >= 8, "cap grew to {}", c.current());
    }

    #[test]
    fn halves_when_the_window_mean_rises_but_ignores_a_lone_outlier() {
        let mut c = auto();
        let mut now = 0;
        for _ in 0..4 {
            now += MS;
            c.on_critical_complete(MS, 0, now);
        }
        for _ in 0..(16 * 6) {
            now += MS;
            c.on_critical_complete(MS, 1, now);
        }
        let grown = c.current();
        assert!(grown >= 4);
        for _ in 0..16 {
            now += MS;
            c.on_critical_complete(2 * MS, 3, now); // 2x > 1.5x target
        }
        assert!(c.current() <= grown / 2, "{} -> {}", grown, c.current());
        let before = c.current();
        now += MS;
        c.on_critical_complete(20 * MS, 3, now); // one slow request
        for _ in 0..15 {
            now += MS;
            c.on_critical_complete(MS, 3, now);
        }
        assert!(
            c.current() > before,
            "a lone outlier in a good window does not cut"
        );
    }

    #[test]
    fn restarts_at_one_when_critical_traffic_returns_after_idle() {
        let mut c = auto();
        for i in 0..100 {
            c.on_noncritical_complete(i * MS);
        }
        assert_eq!(c.current(), 32);
        c.on_critical_complete(MS, 32, 1000 * MS);
        assert_eq!(c.current(), 1);
    }

    #[test]
    fn grows_freely_without_critical_traffic() {
        let mut c = auto();
        for i in 0..100 {
            c.on_noncritical_complete(i * MS);
        }
        assert_eq!(c.current(), 32);
    }

    #[test]
    fn probes_hold_background_until_clean_samples_arrive_or_time_out() {
        let mut c = auto();
        c.on_critical_complete(MS, 1, 2000 * MS); // triggers a probe
        assert_eq!(c.limit(2000 * MS + 1), Some(0), "held during the probe");
        for i in 1..=4 {
            c.on_critical_complete(MS, 0, 2000 * MS + i);
        }
        assert_eq!(c.limit(2000 * MS + 10), Some(c.current()), "probe over");
        c.on_critical_complete(MS, 1, 3100 * MS); // next probe
        assert_eq!(c.limit(3100 * MS + 1), Some(0));
        assert_eq!(c.limit(3100 * MS + 51 * MS), Some(c.current()), "timed out");
    }
}
