//! A latency histogram (hdrhistogram, nanoseconds, 3 significant digits)
//! with the summary every critio table prints, and its counts at fixed
//! bucket bounds (what a Prometheus histogram exposes).

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

    /// The samples at or below each of `bounds` (cumulative), the count and
    /// the sum: the figures of a Prometheus histogram with these bucket
    /// bounds (its `+Inf` bucket is `count`). A sample counts at a bound
    /// when its recorded value (to the histogram's 3 significant digits,
    /// the lowest value of its HDR bucket) is at most the bound, so a
    /// count may include samples up to 0.1% above its bound. `bounds` must
    /// increase strictly. One pass over the histogram's counts.
    pub fn buckets(&self, bounds: &[Duration]) -> BucketCounts {
        assert!(
            bounds.windows(2).all(|w| w[0] < w[1]),
            "bucket bounds must increase: {bounds:?}"
        );
        let bounds_ns: Vec<u64> = bounds
            .iter()
            .map(|b| b.as_nanos().min(u128::from(u64::MAX)) as u64)
            .collect();
        // Samples whose value lies in (bounds[i-1], bounds[i]], then summed.
        let mut per_bucket = vec![0u64; bounds.len()];
        let mut i = 0;
        for v in self.hist.iter_recorded() {
            let value = self.hist.lowest_equivalent(v.value_iterated_to());
            while i < bounds_ns.len() && value > bounds_ns[i] {
                i += 1;
            }
            if i == bounds_ns.len() {
                break; // above every bound: only in the count
            }
            per_bucket[i] += v.count_at_value();
        }
        let mut cumulative = per_bucket;
        for j in 1..cumulative.len() {
            cumulative[j] += cumulative[j - 1];
        }
        BucketCounts {
            cumulative,
            count: self.count(),
            sum: self.total(),
        }
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

/// A histogram's counts at fixed bucket bounds
/// ([`LatencyHistogram::buckets`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BucketCounts {
    /// Samples at or below each bound, in the bounds' order: cumulative,
    /// so never decreasing, and at most `count`.
    pub cumulative: Vec<u64>,
    /// Every sample (what a `+Inf` bucket holds).
    pub count: u64,
    /// The sum of the samples (approximated bucket by bucket, as
    /// [`LatencyHistogram::total`]).
    pub sum: Duration,
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
    fn buckets_are_cumulative_counts_at_each_bound() {
        let mut h = LatencyHistogram::new();
        // 10 µs, 3x 25 µs (on the bound), 100 µs, 2 ms, 20 s (above all).
        for us in [10u64, 25, 25, 25, 100, 2_000, 20_000_000] {
            h.record(Duration::from_micros(us));
        }
        let bounds = [
            Duration::from_micros(5),
            Duration::from_micros(25),
            Duration::from_micros(50),
            Duration::from_millis(1),
            Duration::from_secs(10),
        ];
        let b = h.buckets(&bounds);
        assert_eq!(b.cumulative, vec![0, 4, 4, 5, 6]);
        assert_eq!(b.count, 7);
        let exact = Duration::from_micros(10 + 75 + 100 + 2_000 + 20_000_000);
        let err = (b.sum.as_secs_f64() - exact.as_secs_f64()).abs() / exact.as_secs_f64();
        assert!(err < 0.001, "sum {:?} vs {exact:?}", b.sum);
        // Zero-length waits (recorded as 1 ns) are under every bound.
        h.record_nanos_n(0, 3);
        assert_eq!(h.buckets(&bounds).cumulative, vec![3, 7, 7, 8, 9]);
        let empty = LatencyHistogram::new().buckets(&bounds);
        assert_eq!(empty.cumulative, vec![0; 5]);
        assert_eq!((empty.count, empty.sum), (0, Duration::ZERO));
    }

    #[test]
    #[should_panic(expected = "must increase")]
    fn bucket_bounds_must_increase() {
        let d = Duration::from_micros(1);
        LatencyHistogram::new().buckets(&[d, d]);
    }

    #[test]
    fn empty_histogram_reports_zeros() {
        let h = LatencyHistogram::new();
        assert_eq!(h.summary(), LatencySummary::default());
        assert!(h.ccdf().is_empty());
    }
}
