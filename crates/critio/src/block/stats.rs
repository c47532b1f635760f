//! Per-class metrics of the block layer: completions, bytes, and where the
//! time went (admission wait, queue wait, device time).
//!
//! Recorded under the core lock at every completion, so kept cheap: most
//! requests are admitted and dispatched the moment they arrive, and their
//! zero waits are counted apart (an increment instead of a histogram
//! record) and folded into the histograms when the stats are read, which
//! gives the same figures as recording each one.
//!
//! Every request is counted, but not every device time is measured: a
//! request of the layer's fast path on a device that answers within 2 µs
//! on average (memory) is timed one in 16 (two clock reads would be a
//! tenth of it), so there the device-time histogram holds a sample of the
//! completions, not all of them.
//!
//! [`BlockLayer::stats`](super::BlockLayer::stats) gives each histogram's
//! summary; [`BlockLayer::latency_buckets`](super::BlockLayer::latency_buckets)
//! its counts at given bucket bounds (for a Prometheus exporter), read under
//! the same lock so as not to copy the histograms.

use std::time::Duration;

use serde::Serialize;

use super::sched::{Completed, SchedCounters};
use crate::class::Class;
use crate::metrics::{BucketCounts, LatencyHistogram, LatencySummary};
use crate::time::Nanos;

/// A histogram of waits whose zero samples are counted apart until read.
#[derive(Clone, Debug, Default)]
struct Waits {
    hist: LatencyHistogram,
    zeros: u64,
}

impl Waits {
    fn record(&mut self, waited: Nanos) {
        if waited == 0 {
            self.zeros += 1;
        } else {
            self.hist.record_nanos(waited);
        }
    }

    /// The histogram with the zeros counted apart folded in.
    fn hist(&mut self) -> &LatencyHistogram {
        if self.zeros > 0 {
            self.hist.record_nanos_n(0, self.zeros);
            self.zeros = 0;
        }
        &self.hist
    }

    fn summary(&mut self) -> LatencySummary {
        self.hist().summary()
    }

    fn buckets(&mut self, bounds: &[Duration]) -> BucketCounts {
        self.hist().buckets(bounds)
    }
}

/// Accumulated metrics of one class.
#[derive(Clone, Debug, Default)]
struct ClassAcc {
    completions: u64,
    bytes: u64,
    admission_wait: Waits,
    queue_wait: Waits,
    device_time: LatencyHistogram,
}

/// Accumulated metrics of both classes.
#[derive(Clone, Debug, Default)]
pub(crate) struct StatsAcc {
    classes: [ClassAcc; 2],
}

impl StatsAcc {
    pub(crate) fn record<P>(&mut self, done: &Completed<P>, bytes: u64) {
        let c = &mut self.classes[done.class.index()];
        c.completions += 1;
        c.bytes += bytes;
        c.admission_wait.record(done.admission_wait);
        c.queue_wait.record(done.queue_wait);
        if done.timed {
            c.device_time.record_nanos(done.device_time);
        }
    }

    /// A critical request the fast path sent and completed (no waits; its
    /// device time if it was timed).
    pub(crate) fn record_fast(&mut self, bytes: u64, device_time: Option<Nanos>) {
        let c = &mut self.classes[Class::Critical.index()];
        c.completions += 1;
        c.bytes += bytes;
        c.admission_wait.zeros += 1;
        c.queue_wait.zeros += 1;
        if let Some(t) = device_time {
            c.device_time.record_nanos(t);
        }
    }

    /// [`StatsAcc::record_fast`] for `n` untimed requests of `bytes` in all.
    pub(crate) fn record_fast_untimed(&mut self, n: u64, bytes: u64) {
        let c = &mut self.classes[Class::Critical.index()];
        c.completions += n;
        c.bytes += bytes;
        c.admission_wait.zeros += n;
        c.queue_wait.zeros += n;
    }

    pub(crate) fn snapshot(
        &mut self,
        counters: SchedCounters,
        noncritical_cap: u32,
        cap_view: (Option<f64>, Option<f64>),
        pacing: Option<f64>,
        own: Option<f64>,
    ) -> BlockStats {
        let mut class = |cl: Class| {
            let c = &mut self.classes[cl.index()];
            ClassStats {
                class: cl,
                completions: c.completions,
                bytes: c.bytes,
                admission_wait: c.admission_wait.summary(),
                queue_wait: c.queue_wait.summary(),
                device_time: c.device_time.summary(),
            }
        };
        BlockStats {
            classes: Class::ALL.map(&mut class).to_vec(),
            counters,
            noncritical_cap,
            auto_clean_us: cap_view.0.map(|ns| ns / 1000.0),
            auto_mixed_us: cap_view.1.map(|ns| ns / 1000.0),
            pacing_mib_s: pacing.map(|b| b / f64::from(1 << 20)),
            background_own_mib_s: own.map(|b| b / f64::from(1 << 20)),
            shared_dispatch_turns: 0,
        }
    }

    pub(crate) fn buckets(&mut self, bounds: &[Duration]) -> Vec<ClassBuckets> {
        Vec::from(Class::ALL.map(|cl| {
            let c = &mut self.classes[cl.index()];
            ClassBuckets {
                class: cl,
                admission_wait: c.admission_wait.buckets(bounds),
                queue_wait: c.queue_wait.buckets(bounds),
                device_time: c.device_time.buckets(bounds),
            }
        }))
    }
}

/// One class's latency histograms at fixed bucket bounds
/// ([`BlockLayer::latency_buckets`](super::BlockLayer::latency_buckets)).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassBuckets {
    /// The class.
    pub class: Class,
    /// Submission to admission.
    pub admission_wait: BucketCounts,
    /// Admission to dispatch.
    pub queue_wait: BucketCounts,
    /// Dispatch to completion.
    pub device_time: BucketCounts,
}

/// What one class got.
#[derive(Clone, Debug, Serialize)]
pub struct ClassStats {
    /// The class.
    pub class: Class,
    /// Requests completed.
    pub completions: u64,
    /// Bytes transferred.
    pub bytes: u64,
    /// Submission to admission.
    pub admission_wait: LatencySummary,
    /// Admission to dispatch.
    pub queue_wait: LatencySummary,
    /// Dispatch to completion.
    pub device_time: LatencySummary,
}

/// A snapshot of the block layer's metrics.
#[derive(Clone, Debug, Serialize)]
pub struct BlockStats {
    /// Critical, then non-critical.
    pub classes: Vec<ClassStats>,
    /// Promotions by location, starvation dispatches, anticipation holds.
    pub counters: SchedCounters,
    /// The non-critical cap now (u32::MAX: unlimited).
    pub noncritical_cap: u32,
    /// The adaptive cap's clean baseline of critical device latency, µs.
    pub auto_clean_us: Option<f64>,
    /// The adaptive cap's last windowed mean of critical device latency
    /// with background at the device, µs.
    pub auto_mixed_us: Option<f64>,
    /// The background rate the adaptive cap's pacing allows now, MiB/s
    /// (None: unpaced).
    pub pacing_mib_s: Option<f64>,
    /// The background's own write throughput as the adaptive cap last
    /// estimated it (what it writes per second pacing does not hold it),
    /// MiB/s; pacing keeps `min_share` of it.
    pub background_own_mib_s: Option<f64>,
    /// Dispatcher turns a critical thread took alongside another thread's
    /// turn rather than wait for it to come back from the device.
    pub shared_dispatch_turns: u64,
}

impl BlockStats {
    /// The stats of one class.
    pub fn class(&self, class: Class) -> &ClassStats {
        &self.classes[class.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_waits_counted_apart_read_as_if_recorded() {
        let mut apart = Waits::default();
        let mut direct = LatencyHistogram::new();
        for w in [0, 0, 5_000, 0, 120_000, 0] {
            apart.record(w);
            direct.record_nanos(w);
        }
        assert_eq!(apart.summary(), direct.summary());
        apart.record(0);
        direct.record_nanos(0);
        assert_eq!(apart.summary(), direct.summary(), "read twice");
        let bounds = [Duration::from_micros(10), Duration::from_millis(1)];
        apart.record(0);
        direct.record_nanos(0);
        assert_eq!(apart.buckets(&bounds), direct.buckets(&bounds));
        assert_eq!(
            apart.buckets(&bounds).cumulative,
            vec![7, 8],
            "6 zeros, 5 µs"
        );
    }
}
