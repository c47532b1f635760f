//! A latency histogram (hdrhistogram, nanoseconds, 3 significant digits)
//! with the summary every critio table prints.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The longest latency a histogram tracks exactly; longer ones saturate.
pub const LATENCY_MAX: Duration = Duration::from_secs(3600);

/// Nanosecond latencies from 1 ns to [`LATENCY_MAX`], 3 significant digits.
#[derive(Clone, Debug)]
pub struct LatencyHistogram {
    hist: Histogram<u64>,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        Self::new()
    }
}

impl LatencyHistogram {
    /// An empty histogram.
    pub fn new() -> Self {
        let hist = Histogram::new_with_bounds(1, LATENCY_MAX.as_nanos() as u64, 3)
            .expect("static histogram bounds are valid");
        Self { hist }
    }

    /// Records one latency (saturating at [`LATENCY_MAX`], at least 1 ns).
    pub fn record(&mut self, latency: Duration) {
        self.record_nanos(latency.as_nanos().min(u128::from(u64::MAX)) as u64);
    }

    /// Records one latency given in nanoseconds.
    pub fn record_nanos(&mut self, nanos: u64) {
        self.hist.saturating_record(nanos.max(1));
    }

    /// Records `count` samples of one latency given in nanoseconds.
    pub fn record_nanos_n(&mut self, nanos: u64, count: u64) {
        self.hist.saturating_record_n(nanos.max(1), count);
    }

    /// Adds every sample of `other`.
    pub fn merge(&mut self, other: &LatencyHistogram) {
        self.hist
            .add(&other.hist)
            .expect("histograms share bounds by construction");
    }

    /// Number of samples.
    pub fn count(&self) -> u64 {
        self.hist.len()
    }

    /// The latency at quantile `q` in `[0, 1]` (zero when empty).
    pub fn quantile(&self, q: f64) -> Duration {
        assert!((0.0..=1.0).contains(&q), "quantile {q} outside [0, 1]");
        if self.hist.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.hist.value_at_quantile(q))
    }

    /// The largest sample (zero when empty).
    pub fn max(&self) -> Duration {
        if self.hist.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.hist.max())
    }

    /// The mean (zero when empty).
    pub fn mean(&self) -> Duration {
        if self.hist.is_empty() {
            return Duration::ZERO;
        }
        Duration::from_nanos(self.hist.mean() as u64)
    }

    /// The sum of all samples, approximated bucket by bucket.
    pub fn total(&self) -> Duration {
        Duration::from_nanos((self.hist.mean() * self.hist.len() as f64) as u64)
    }

    /// The fraction of samples at or above each recorded value, for a CCDF
    /// plot: `(latency, fraction)` pairs in increasing latency order.
    pub fn ccdf(&self) -> Vec<(Duration, f64)> {
        let n = self.hist.len();
        if n == 0 {
            return Vec::new();
        }
        let mut below = 0u64;
        let mut points = Vec::new();
        for v in self.hist.iter_recorded() {
            let at_or_above = n - below;
            points.push((
                Duration::from_nanos(v.value_iterated_to()),
                at_or_above as f64 / n as f64,
            ));
            below += v.count_at_value();
        }
        points
    }

    /// The usual summary: count, mean, p50, p99, p99.9, p99.99, max.
    pub fn summary(&self) -> LatencySummary {
        LatencySummary {
            count: self.count(),
            mean_us: micros(self.mean()),
            p50_us: micros(self.quantile(0.50)),
            p99_us: micros(self.quantile(0.99)),
            p999_us: micros(self.quantile(0.999)),
            p9999_us: micros(self.quantile(0.9999)),
            max_us: micros(self.max()),
        }
    }
}

fn micros(d: Duration) -> f64 {
    d.as_nanos() as f64 / 1000.0
}

/// A latency summary in microseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Number of samples.
    pub count: u64,
    /// Mean, µs.
    pub mean_us: f64,
    /// Median, µs.
    pub p50_us: f64,
    /// 99th percentile, µs.
    pub p99_us: f64,
    /// 99.9th percentile, µs.
    pub p999_us: f64,
    /// 99.99th percentile, µs.
    pub p9999_us: f64,
    /// Maximum, µs.
    pub max_us: f64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantiles_match_a_sorted_vector_within_precision() {
        let mut h = LatencyHistogram::new();
        let mut v: Vec<u64> = (1..=10_000u64).map(|i| i * 997 % 100_003 + 1).collect();
        for &x in &v {
            h.record_nanos(x);
        }
        v.sort_unstable();
        for q in [0.5, 0.9, 0.99, 0.999] {
            let exact = v[((q * v.len() as f64).ceil() as usize).saturating_sub(1)];
            let got = h.quantile(q).as_nanos() as u64;
            let err = (got as f64 - exact as f64).abs() / exact as f64;
            assert!(err < 0.002, "q={q} exact={exact} got={got}");
        }
        assert_eq!(h.count(), 10_000);
    }

    #[test]
    fn ccdf_starts_at_one_and_decreases() {
        let mut h = LatencyHistogram::new();
        for x in [10u64, 20, 20, 40] {
            h.record_nanos(x * 1000);
        }
        let c = h.ccdf();
        assert_eq!(c.first().unwrap().1, 1.0);
        assert!(c.windows(2).all(|w| w[0].1 > w[1].1 && w[0].0 < w[1].0));
        assert_eq!(c.last().unwrap().1, 0.25);
    }

    #[test]
    fn empty_histogram_reports_zeros() {
        let h = LatencyHistogram::new();
        assert_eq!(h.summary(), LatencySummary::default());
        assert!(h.ccdf().is_empty());
    }
}
