//! Per-class metrics of the block layer: completions, bytes, and where the
//! time went (admission wait, queue wait, device time).
//!
//! Recorded under the core lock at every completion, so kept cheap: most
//! requests are admitted and dispatched the moment they arrive, and their
//! zero waits are counted apart (an increment instead of a histogram
//! record) and folded into the histograms when the stats are read, which
//! gives the same figures as recording each one.

use serde::Serialize;

use super::sched::{Completed, SchedCounters};
use crate::class::Class;
use crate::metrics::{LatencyHistogram, LatencySummary};
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

    fn summary(&mut self) -> LatencySummary {
        if self.zeros > 0 {
            self.hist.record_nanos_n(0, self.zeros);
            self.zeros = 0;
        }
        self.hist.summary()
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
        c.device_time.record_nanos(done.device_time);
    }

    pub(crate) fn snapshot(
        &mut self,
        counters: SchedCounters,
        noncritical_cap: u32,
        cap_view: (Option<f64>, Option<f64>),
        pacing: Option<f64>,
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
        }
    }
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
    }
}
