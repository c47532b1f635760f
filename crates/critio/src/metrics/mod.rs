//! Observability: where critical tasks wait, and how often criticality was
//! inherited.
//!
//! Every blocking wait in critio ends at a *wait point*: the name of the lock,
//! condition variable or stage (`"inode"`, `"log: commit wait"`,
//! `"admission: block"`). Each wait is recorded per wait point and per class
//! in a latency histogram, which is what the experiments print as the papers'
//! Tables 2-3 (max and mean wait of critical tasks per wait point, per
//! scheme). Counters tally inheritance by kind and the chain walk's steps.
//!
//! Each stack has its own registry ([`crate::stack::Stack::metrics`]):
//! the block layer holds its [`MetricsHandle`], the page cache, the log and
//! the write cache take it from there, and the locks made with the stack's
//! sync options carry it, so two stacks in one process (two stores, or
//! schemes compared side by side) keep their wait tables apart. A wait
//! ends at its blocker, which knows its registry ([`crate::context::Blocker::record_wait`]);
//! layers and locks built without a stack record into the process-wide
//! [`global`] one. The inheritance counters are the process's (a thread
//! inherits through whatever it waits on, whichever stack that is), so
//! every registry reports the same counters. Experiments take a
//! [`snapshot`](Metrics::snapshot) after each scheme and
//! [`reset`](Metrics::reset) before the next.
//!
//! Recording is on every wait's path, so it takes no lock shared by the
//! whole process: the histograms are sharded by thread (`waits.rs`: a few
//! tens of ns per wait, a shard's own lock) and merged when read; the
//! counters are relaxed atomics.
//!
//! ```text
//!  WaitScope drop ──blocker.record_wait──> its stack's registry: shard of this thread ─┐
//!  Task::inherit / revoke ──count_*──> the process's atomic counters                  ├─> snapshot (merge) / reset
//!  block, cache, nvwc ──record_wait / count_resolution─────────────────────────────────┘
//! ```

mod latency;
mod waits;

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use serde::Serialize;

pub use latency::{BucketCounts, LatencyHistogram, LatencySummary, LATENCY_MAX};
use waits::WaitTables;

use crate::class::Class;
use crate::context::InheritKind;

/// Where a layer or a primitive records its waits: the registry of the
/// stack it belongs to, or the process-wide one ([`global`]). Cloning it is
/// an `Arc` clone; it compares equal to another handle of the same
/// registry.
#[derive(Clone, Default)]
pub struct MetricsHandle(Option<Arc<Metrics>>);

impl MetricsHandle {
    /// The process-wide registry.
    pub const GLOBAL: MetricsHandle = MetricsHandle(None);

    /// A handle of `metrics` (a stack's own registry).
    pub fn of(metrics: Arc<Metrics>) -> Self {
        Self(Some(metrics))
    }

    /// A new registry of its own.
    pub fn new_registry() -> Self {
        Self::of(Arc::new(Metrics::default()))
    }

    /// The registry.
    pub fn get(&self) -> &Metrics {
        match &self.0 {
            Some(m) => m,
            None => global(),
        }
    }

    /// Whether this is the process-wide registry.
    pub fn is_global(&self) -> bool {
        self.0.is_none()
    }
}

impl PartialEq for MetricsHandle {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self.get(), other.get())
    }
}

impl Eq for MetricsHandle {}

impl std::fmt::Debug for MetricsHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("MetricsHandle(global)"),
            Some(m) => write!(f, "MetricsHandle({:p})", Arc::as_ptr(m)),
        }
    }
}

/// The process-wide metrics registry.
pub fn global() -> &'static Metrics {
    static GLOBAL: LazyLock<Metrics> = LazyLock::new(Metrics::default);
    &GLOBAL
}

const KINDS: usize = InheritKind::ALL.len();

/// The inheritance counters. They are the process's, not a stack's: a task
/// (a thread) inherits through whatever it waits on, whichever stack that
/// belongs to, so every registry reports these same counters.
struct Counters {
    boosts: [AtomicU64; KINDS],
    revocations: [AtomicU64; KINDS],
    resolutions: [AtomicU64; KINDS],
    helpers_dropped: AtomicU64,
    chain_steps: AtomicU64,
    chain_truncated: AtomicU64,
    chain_cycles: AtomicU64,
}

static COUNTERS: Counters = Counters {
    boosts: [const { AtomicU64::new(0) }; KINDS],
    revocations: [const { AtomicU64::new(0) }; KINDS],
    resolutions: [const { AtomicU64::new(0) }; KINDS],
    helpers_dropped: AtomicU64::new(0),
    chain_steps: AtomicU64::new(0),
    chain_truncated: AtomicU64::new(0),
    chain_cycles: AtomicU64::new(0),
};

/// A registry of wait-point histograms (a stack's, or the process-wide
/// [`global`] one), and a view of the process's inheritance counters.
#[derive(Default)]
pub struct Metrics {
    waits: WaitTables,
}

impl Metrics {
    /// Records one wait of `class` at wait point `point` (into the calling
    /// thread's shard: no process-wide lock).
    pub fn record_wait(&self, point: &'static str, class: Class, waited: Duration) {
        self.waits.record(point, class, waited);
    }

    /// Records `n` waits of the same length at once (the block layer's
    /// fast-path requests' zero queue waits, folded in a batch).
    pub fn record_waits(&self, point: &'static str, class: Class, waited: Duration, n: u64) {
        if n > 0 {
            self.waits.record_n(point, class, waited, n);
        }
    }

    pub(crate) fn count_boost(&self, kind: InheritKind) {
        COUNTERS.boosts[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_revoke(&self, kind: InheritKind) {
        COUNTERS.revocations[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a dependency resolved without a task inheriting: an I/O
    /// promoted, an admission waiter retried as critical.
    pub fn count_resolution(&self, kind: InheritKind) {
        COUNTERS.resolutions[kind.index()].fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_helper_dropped(&self) {
        COUNTERS.helpers_dropped.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_chain_step(&self) {
        COUNTERS.chain_steps.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_chain_truncated(&self) {
        COUNTERS.chain_truncated.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn count_chain_cycle(&self) {
        COUNTERS.chain_cycles.fetch_add(1, Ordering::Relaxed);
    }

    /// The histogram of one wait point and class (empty if never recorded).
    pub fn wait_histogram(&self, point: &str, class: Class) -> LatencyHistogram {
        self.waits.histogram(point, class)
    }

    /// A copy of everything recorded so far (every wait recorded before the
    /// call is in it), wait points in name order.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let wait_points = self
            .waits
            .merged()
            .iter()
            .map(|(&(point, class), h)| WaitPointStats {
                point: point.to_owned(),
                class,
                latency: h.summary(),
            })
            .collect();
        let inheritance = InheritKind::ALL
            .iter()
            .map(|&kind| InheritCount {
                kind,
                boosts: COUNTERS.boosts[kind.index()].load(Ordering::Relaxed),
                revocations: COUNTERS.revocations[kind.index()].load(Ordering::Relaxed),
                resolutions: COUNTERS.resolutions[kind.index()].load(Ordering::Relaxed),
            })
            .collect();
        MetricsSnapshot {
            wait_points,
            inheritance,
            helpers_dropped: COUNTERS.helpers_dropped.load(Ordering::Relaxed),
            chain_steps: COUNTERS.chain_steps.load(Ordering::Relaxed),
            chain_truncated: COUNTERS.chain_truncated.load(Ordering::Relaxed),
            chain_cycles: COUNTERS.chain_cycles.load(Ordering::Relaxed),
        }
    }

    /// Every wait point's histogram of each class read at `bounds`
    /// (cumulative counts, count, sum; see [`LatencyHistogram::buckets`]),
    /// in name order: what a Prometheus exporter exposes.
    pub fn wait_buckets(&self, bounds: &[Duration]) -> Vec<WaitPointBuckets> {
        self.waits
            .merged()
            .iter()
            .map(|(&(point, class), h)| WaitPointBuckets {
                point: point.to_owned(),
                class,
                buckets: h.buckets(bounds),
            })
            .collect()
    }

    /// Forgets every wait recorded in this registry so far, and zeroes the
    /// process's inheritance counters.
    pub fn reset(&self) {
        self.waits.clear();
        let counters = COUNTERS
            .boosts
            .iter()
            .chain(&COUNTERS.revocations)
            .chain(&COUNTERS.resolutions)
            .chain([
                &COUNTERS.helpers_dropped,
                &COUNTERS.chain_steps,
                &COUNTERS.chain_truncated,
                &COUNTERS.chain_cycles,
            ]);
        for c in counters {
            c.store(0, Ordering::Relaxed);
        }
    }
}

/// Waits at one wait point by one class.
#[derive(Clone, Debug, Serialize)]
pub struct WaitPointStats {
    /// The wait point's name.
    pub point: String,
    /// The class of the waiting tasks.
    pub class: Class,
    /// Wait time distribution.
    pub latency: LatencySummary,
}

/// Waits at one wait point by one class, at fixed bucket bounds
/// ([`Metrics::wait_buckets`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitPointBuckets {
    /// The wait point's name.
    pub point: String,
    /// The class of the waiting tasks.
    pub class: Class,
    /// Wait times at the bounds asked for.
    pub buckets: BucketCounts,
}

/// Inheritance events of one kind.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct InheritCount {
    /// What criticality was inherited through.
    pub kind: InheritKind,
    /// Times a task inherited criticality this way.
    pub boosts: u64,
    /// Times that inheritance was revoked.
    pub revocations: u64,
    /// Dependencies resolved without a task inheriting (I/O promotions,
    /// admission waiters retried as critical).
    pub resolutions: u64,
}

/// A copy of the metrics at one moment.
#[derive(Clone, Debug, Serialize)]
pub struct MetricsSnapshot {
    /// Per wait point and class.
    pub wait_points: Vec<WaitPointStats>,
    /// Per inheritance kind.
    pub inheritance: Vec<InheritCount>,
    /// Inferred condvar helpers dropped for not signalling within the window.
    pub helpers_dropped: u64,
    /// Transitive steps taken by chain walks (beyond the first object).
    pub chain_steps: u64,
    /// Chain walks cut at the depth bound.
    pub chain_truncated: u64,
    /// Tasks met twice in one walk (a dependency cycle).
    pub chain_cycles: u64,
}

impl MetricsSnapshot {
    /// The wait-point table for critical tasks, in the shape of paper 000
    /// Tables 2-3: one row per wait point, max and mean wait.
    pub fn critical_wait_table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "{:<32} {:>10} {:>12} {:>12}",
            "wait point (critical)", "waits", "mean ms", "max ms"
        );
        for w in self
            .wait_points
            .iter()
            .filter(|w| w.class == Class::Critical)
        {
            let _ = writeln!(
                out,
                "{:<32} {:>10} {:>12.3} {:>12.3}",
                w.point,
                w.latency.count,
                w.latency.mean_us / 1000.0,
                w.latency.max_us / 1000.0
            );
        }
        out
    }

    /// Boosts of one kind.
    pub fn boosts(&self, kind: InheritKind) -> u64 {
        self.inheritance
            .iter()
            .find(|c| c.kind == kind)
            .map_or(0, |c| c.boosts)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn wait_buckets_match_each_wait_points_histogram() {
        let m = Metrics::default();
        for us in [5u64, 40, 300] {
            m.record_wait("t: b", Class::Critical, Duration::from_micros(us));
        }
        m.record_wait("t: a", Class::NonCritical, Duration::from_millis(20));
        let bounds = [Duration::from_micros(10), Duration::from_millis(1)];
        let rows = m.wait_buckets(&bounds);
        let names: Vec<_> = rows.iter().map(|r| (r.point.as_str(), r.class)).collect();
        assert_eq!(
            names,
            [("t: a", Class::NonCritical), ("t: b", Class::Critical)],
            "in name order"
        );
        assert_eq!(rows[0].buckets.cumulative, vec![0, 0]);
        assert_eq!(rows[0].buckets.count, 1);
        assert_eq!(rows[1].buckets.cumulative, vec![1, 3]);
        assert_eq!(
            rows[1].buckets,
            m.wait_histogram("t: b", Class::Critical).buckets(&bounds)
        );
        m.reset();
        assert!(m.wait_buckets(&bounds).is_empty());
    }
}
