//! The stack's figures in the Prometheus text exposition format (0.0.4),
//! served at `http://ADDR/metrics` when `[server] metrics = "ADDR"` (or
//! `critio serve --metrics ADDR`) is set; `prom_http` is the listener.
//!
//! Why: INFO shows these figures to a person at a `redis-cli` prompt;
//! operators graph and alert on what Prometheus scrapes. The latencies are
//! real Prometheus histograms (`_bucket{le=...}`, `_sum`, `_count`), so
//! `histogram_quantile()` and `rate()` work over any window and across
//! servers, which INFO's since-start percentiles cannot do.
//!
//! Everything is read at scrape time from the sources INFO reads
//! (`BlockLayer::stats`, the metrics registry of [`Backend::metrics`], the
//! page cache's, log's and write cache's stats, the engine's background
//! stats), through a prometheus-client [`Collector`]; nothing is recorded
//! twice and requests pay nothing for the endpoint. The latency histograms
//! are critio's HDR histograms read at [`LATENCY_BUCKETS`] (a pass over
//! each per scrape; the block layer's under its core lock).
//!
//! | metric (prefix `critio_`)                              | type      | labels            |
//! |--------------------------------------------------------|-----------|-------------------|
//! | `block_completions_total`, `block_bytes_total`          | counter   | `class`           |
//! | `block_admission_wait_seconds`, `block_queue_wait_seconds`, `block_device_time_seconds` | histogram | `class` |
//! | `block_promotions_total`                                | counter   | `location` (`admission`, `queue`, `device`) |
//! | `block_starvation_dispatches_total`, `block_anticipation_holds_total`, `block_shared_dispatch_turns_total`, `block_fast_sent_total`, `block_fast_adopted_total`, `block_cap_stalls_total` | counter | |
//! | `block_noncritical_cap` (`+Inf`: unlimited), `block_noncritical_pacing_bytes_per_second` (when paced) | gauge | |
//! | `wait_seconds`: every wait point's waits                | histogram | `point`, `class`  |
//! | `inherit_boosts_total`, `inherit_revocations_total`, `inherit_resolutions_total` | counter | `kind` |
//! | `inherit_helpers_dropped_total`, `inherit_chain_steps_total`, `inherit_chain_truncated_total`, `inherit_chain_cycles_total` | counter | |
//! | `cache_hits_total`, `cache_misses_total`, `cache_throttled_total`, `cache_reclaims_total`, `cache_read_through_pages_total`, `cache_writeback_pages_total`, `cache_writeback_errors_total`, `cache_discarded_total`, `cache_written_around_pages_total`, `cache_busy_total` | counter | |
//! | `cache_capacity_bytes`, `cache_frames`, `cache_free_frames`, `cache_prefaulted_bytes` | gauge |               |
//! | `cache_dirty_pages`                                     | gauge     | `class`           |
//! | `log_batches_total`, `log_committer_batches_total`, `log_records_total`, `log_written_bytes_total`, `log_truncations_total` | counter | |
//! | `log_used_bytes`, `log_capacity_bytes`, `log_poisoned`, `vlog_live_bytes`, `vlog_used_bytes`, `vlog_capacity_bytes` | gauge | |
//! | `kv_checkpoints_total`, `kv_checkpoint_errors_total`, `kv_checkpoint_seconds_total`, `kv_snapshots_total`, `kv_rewrites_total`, `kv_cleaned_bytes_total` | counter | |
//! | `kv_job_progress_ratio`: how far a running job is (only while it runs) | gauge | `job` (`bgsave`, `bgrewriteaof`) |
//! | `background_cpu_floor_raises_total` (counter), `background_cpu_relieved_threads` (gauge): the CPU floor | counter, gauge | |
//! | `kv_connections_received_total`, `kv_commands_processed_total`, `kv_keyspace_hits_total`, `kv_keyspace_misses_total` | counter | |
//! | `kv_connected_clients`, `kv_keys`                       | gauge     |                   |
//! | `kv_round_seconds`: the workers' rounds, by part        | histogram | `part` (`run`, `commit`, `send`) |
//! | `kv_info` (1)                                           | gauge     | `version`, `scheme`, `device` |
//! | `write_cache_*` (with a write cache only): writes, cached/hit/bypassed writes, reissues, stalls, writeback, reads; slots, used slots, dirty blocks | counter, gauge | |
//!
//! `class` is `critical` or `noncritical`; `point` is the wait point's name
//! as critio spells it (`block: admission`, `log: commit wait`); `kind` is
//! an inheritance kind (`lock`, `condvar`, `io`, ...).

use std::fmt;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use critio::block::{ClassBuckets, ClassStats};
use critio::context::{Class, InheritKind};
use critio::metrics::BucketCounts;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{
    DescriptorEncoder, EncodeGaugeValue, EncodeLabelSet, EncodeMetric, MetricEncoder, NoLabelSet,
};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::info::Info;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};

use super::{Backend, Shared};

/// The `Content-Type` of the exposition.
pub(crate) const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// The upper bounds of every latency histogram's buckets: 10 µs to 10 s in
/// 1-2.5-5 steps (x2 or x2.5), the usual Prometheus spacing. Waits and
/// device times of a healthy store sit in the lower half; the upper half
/// shows stalls (a write throttled behind a checkpoint, a slow device).
/// Longer samples are only in the `+Inf` bucket.
pub const LATENCY_BUCKETS: [Duration; 19] = [
    Duration::from_micros(10),
    Duration::from_micros(25),
    Duration::from_micros(50),
    Duration::from_micros(100),
    Duration::from_micros(250),
    Duration::from_micros(500),
    Duration::from_millis(1),
    Duration::from_micros(2_500),
    Duration::from_millis(5),
    Duration::from_millis(10),
    Duration::from_millis(25),
    Duration::from_millis(50),
    Duration::from_millis(100),
    Duration::from_millis(250),
    Duration::from_millis(500),
    Duration::from_secs(1),
    Duration::from_millis(2_500),
    Duration::from_secs(5),
    Duration::from_secs(10),
];

/// A registry whose one collector reads the server's figures at each
/// scrape.
pub(crate) fn registry(shared: Arc<Shared>) -> Registry {
    let mut r = Registry::with_prefix("critio");
    r.register_collector(Box::new(Exporter { shared }));
    r
}

/// The exposition text of `registry` now.
pub(crate) fn render(registry: &Registry) -> Result<String, fmt::Error> {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, registry)?;
    Ok(out)
}

/// A latency histogram read at [`LATENCY_BUCKETS`], as a Prometheus
/// histogram in seconds.
struct Hist<'a>(&'a BucketCounts);

impl EncodeMetric for Hist<'_> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), fmt::Error> {
        let b = self.0;
        debug_assert_eq!(b.cumulative.len(), LATENCY_BUCKETS.len());
        // The encoder takes each bucket's own count and sums them; its
        // `+Inf` bucket is `count`.
        let mut below = 0;
        let buckets: Vec<(f64, u64)> = LATENCY_BUCKETS
            .iter()
            .zip(&b.cumulative)
            .map(|(bound, &at_or_below)| {
                let own = at_or_below - below;
                below = at_or_below;
                (bound.as_secs_f64(), own)
            })
            .collect();
        encoder.encode_histogram::<NoLabelSet>(b.sum.as_secs_f64(), b.count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        MetricType::Histogram
    }
}

/// Writes metric families into one scrape.
struct Out<'a, 'b> {
    enc: &'a mut DescriptorEncoder<'b>,
}

impl Out<'_, '_> {
    fn counter(&mut self, name: &str, help: &str, unit: Option<&Unit>, v: u64) -> fmt::Result {
        let m = self
            .enc
            .encode_descriptor(name, help, unit, MetricType::Counter)?;
        ConstCounter::new(v).encode(m)
    }

    fn gauge(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<&Unit>,
        v: impl EncodeGaugeValue,
    ) -> fmt::Result {
        let m = self
            .enc
            .encode_descriptor(name, help, unit, MetricType::Gauge)?;
        ConstGauge::new(v).encode(m)
    }

    /// One counter family, a value per label set.
    fn counters<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        unit: Option<&Unit>,
        rows: &[(L, u64)],
    ) -> fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, unit, MetricType::Counter)?;
        for (labels, v) in rows {
            ConstCounter::new(*v).encode(m.encode_family(labels)?)?;
        }
        Ok(())
    }

    fn gauges<L: EncodeLabelSet, V: EncodeGaugeValue + Copy>(
        &mut self,
        name: &str,
        help: &str,
        rows: &[(L, V)],
    ) -> fmt::Result {
        let mut m = self
            .enc
            .encode_descriptor(name, help, None, MetricType::Gauge)?;
        for (labels, v) in rows {
            ConstGauge::new(*v).encode(m.encode_family(labels)?)?;
        }
        Ok(())
    }

    /// One histogram family in seconds, a histogram per label set.
    fn histograms<L: EncodeLabelSet>(
        &mut self,
        name: &str,
        help: &str,
        rows: &[(L, &BucketCounts)],
    ) -> fmt::Result {
        let mut m =
            self.enc
                .encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
        for (labels, b) in rows {
            Hist(b).encode(m.encode_family(labels)?)?;
        }
        Ok(())
    }
}

/// Reads the figures at each scrape.
struct Exporter {
    shared: Arc<Shared>,
}

impl fmt::Debug for Exporter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Exporter").finish_non_exhaustive()
    }
}

impl Collector for Exporter {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
        let mut out = Out { enc: &mut enc };
        let b = &self.shared.backend;
        block(&mut out, b)?;
        waits(&mut out, b)?;
        cache(&mut out, b)?;
        log(&mut out, b)?;
        write_cache(&mut out, b)?;
        server(&mut out, &self.shared)
    }
}

/// A class as a label value: `critical` or `noncritical` (one word, as
/// label values are usually spelled).
fn class_name(class: Class) -> &'static str {
    match class {
        Class::Critical => "critical",
        Class::NonCritical => "noncritical",
    }
}

fn class_label(class: Class) -> [(&'static str, &'static str); 1] {
    [("class", class_name(class))]
}

fn block(out: &mut Out, b: &Backend) -> fmt::Result {
    let st = b.block.stats();
    let per_class = |f: fn(&ClassStats) -> u64| {
        st.classes
            .iter()
            .map(|c| (class_label(c.class), f(c)))
            .collect::<Vec<_>>()
    };
    out.counters(
        "block_completions",
        "Block-layer requests completed, by class.",
        None,
        &per_class(|c| c.completions),
    )?;
    out.counters(
        "block",
        "Bytes transferred by completed block-layer requests, by class.",
        Some(&Unit::Bytes),
        &per_class(|c| c.bytes),
    )?;
    let buckets = b.block.latency_buckets(&LATENCY_BUCKETS);
    let rows = |pick: fn(&ClassBuckets) -> &BucketCounts| {
        buckets
            .iter()
            .map(|c| (class_label(c.class), pick(c)))
            .collect::<Vec<_>>()
    };
    out.histograms(
        "block_admission_wait",
        "Block-layer requests' time from submission to admission (waiting for a slot), by class.",
        &rows(|c| &c.admission_wait),
    )?;
    out.histograms(
        "block_queue_wait",
        "Block-layer requests' time from admission to dispatch to the device, by class.",
        &rows(|c| &c.queue_wait),
    )?;
    out.histograms(
        "block_device_time",
        "Block-layer requests' time at the device (dispatch to completion), by class.",
        &rows(|c| &c.device_time),
    )?;
    let k = st.counters;
    out.counters(
        "block_promotions",
        "Requests promoted to critical, by where the promotion found them.",
        None,
        &[
            ([("location", "admission")], k.promoted_awaiting_admission),
            ([("location", "queue")], k.promoted_queued),
            ([("location", "device")], k.promoted_at_device),
        ],
    )?;
    out.counter(
        "block_starvation_dispatches",
        "Non-critical dispatches forced by the starvation timer.",
        None,
        k.starvation_dispatches,
    )?;
    out.counter(
        "block_anticipation_holds",
        "Dispatch decisions that held non-critical work back for anticipation.",
        None,
        k.anticipation_holds,
    )?;
    out.counter(
        "block_shared_dispatch_turns",
        "Dispatch turns a critical thread took alongside another thread's turn.",
        None,
        st.shared_dispatch_turns,
    )?;
    out.counter(
        "block_fast_sent",
        "Critical requests sent past the block layer's core while nothing was queued.",
        None,
        k.fast_sent,
    )?;
    out.counter(
        "block_fast_adopted",
        "Fast-path requests still at the device when the core next changed, completed through it.",
        None,
        k.fast_adopted,
    )?;
    out.counter(
        "block_cap_stalls",
        "Single critical requests far slower than the adaptive cap's baseline, with \
         background about (each cut the cap to one and halved the pacing rate).",
        None,
        k.cap_stalls,
    )?;
    let cap = match st.noncritical_cap {
        u32::MAX => f64::INFINITY,
        n => f64::from(n),
    };
    out.gauge(
        "block_noncritical_cap",
        "Non-critical requests allowed at the device now (+Inf: unlimited).",
        None,
        cap,
    )?;
    if let Some(mib_s) = st.pacing_mib_s {
        out.gauge(
            "block_noncritical_pacing_bytes_per_second",
            "The background rate the adaptive cap's pacing allows now.",
            None,
            mib_s * f64::from(1u32 << 20),
        )?;
    }
    if let Some(mib_s) = st.background_own_mib_s {
        out.gauge(
            "block_background_own_bytes_per_second",
            "The background's own write throughput (per second pacing does not hold it); \
             pacing keeps min_share of it.",
            None,
            mib_s * f64::from(1u32 << 20),
        )?;
    }
    for (name, help, us) in [
        (
            "block_critical_clean_device_seconds",
            "The adaptive cap's baseline: critical device latency with no background about.",
            st.auto_clean_us,
        ),
        (
            "block_critical_mixed_device_seconds",
            "Critical device latency with background at the device (the adaptive cap's \
             last window, its slowest sample dropped).",
            st.auto_mixed_us,
        ),
    ] {
        if let Some(us) = us {
            out.gauge(name, help, None, us / 1e6)?;
        }
    }
    Ok(())
}

fn waits(out: &mut Out, b: &Backend) -> fmt::Result {
    let m = b.metrics();
    let rows = m.wait_buckets(&LATENCY_BUCKETS);
    let rows: Vec<_> = rows
        .iter()
        .map(|w| {
            (
                [("point", w.point.as_str()), ("class", class_name(w.class))],
                &w.buckets,
            )
        })
        .collect();
    out.histograms(
        "wait",
        "Blocking waits by wait point (lock, condition variable or stage) and class of the waiter.",
        &rows,
    )?;
    let snap = m.snapshot();
    let kinds = |f: fn(&critio::metrics::InheritCount) -> u64| {
        InheritKind::ALL
            .iter()
            .map(|&kind| {
                let n = snap
                    .inheritance
                    .iter()
                    .find(|c| c.kind == kind)
                    .map_or(0, f);
                ([("kind", kind.as_str())], n)
            })
            .collect::<Vec<_>>()
    };
    out.counters(
        "inherit_boosts",
        "Times a task inherited criticality, by what it was inherited through.",
        None,
        &kinds(|c| c.boosts),
    )?;
    out.counters(
        "inherit_revocations",
        "Times inherited criticality was revoked, by kind.",
        None,
        &kinds(|c| c.revocations),
    )?;
    out.counters(
        "inherit_resolutions",
        "Dependencies resolved without a task inheriting (I/O promotions, admission waiters retried as critical), by kind.",
        None,
        &kinds(|c| c.resolutions),
    )?;
    out.counter(
        "inherit_helpers_dropped",
        "Inferred condition-variable helpers dropped for not signalling in time.",
        None,
        snap.helpers_dropped,
    )?;
    out.counter(
        "inherit_chain_steps",
        "Transitive steps taken by dependency chain walks.",
        None,
        snap.chain_steps,
    )?;
    out.counter(
        "inherit_chain_truncated",
        "Dependency chain walks cut at the depth bound.",
        None,
        snap.chain_truncated,
    )?;
    out.counter(
        "inherit_chain_cycles",
        "Dependency cycles met by chain walks.",
        None,
        snap.chain_cycles,
    )
}

fn cache(out: &mut Out, b: &Backend) -> fmt::Result {
    let c = b.cache.stats();
    out.gauge(
        "cache_capacity",
        "The page cache's capacity.",
        Some(&Unit::Bytes),
        b.cache.config().capacity_bytes,
    )?;
    out.gauge("cache_frames", "Page cache frames.", None, c.frames)?;
    out.gauge(
        "cache_free_frames",
        "Page cache frames holding no page now.",
        None,
        c.free_frames,
    )?;
    out.gauge(
        "cache_prefaulted",
        "Page cache memory backed ahead of its first use so far (cache.prefault).",
        Some(&Unit::Bytes),
        c.prefaulted_bytes,
    )?;
    for (name, help, v) in [
        (
            "cache_hits",
            "Reads and writes that found their page cached.",
            c.hits,
        ),
        ("cache_misses", "Pages loaded on a miss.", c.misses),
        (
            "cache_throttled",
            "Writes that waited in dirty throttling.",
            c.throttled,
        ),
        (
            "cache_reclaims",
            "Dirty pages written back by a task that needed a frame.",
            c.reclaims,
        ),
        (
            "cache_read_through_pages",
            "Pages read from the device without caching them.",
            c.read_through_pages,
        ),
        (
            "cache_writeback_pages",
            "Pages written back.",
            c.writeback_pages,
        ),
        (
            "cache_writeback_errors",
            "Writeback writes that failed (the pages stay dirty).",
            c.writeback_errors,
        ),
        (
            "cache_discarded",
            "Clean pages dropped because their owner no longer needs them (cleaned log space).",
            c.discarded,
        ),
        (
            "cache_written_around_pages",
            "Pages written straight to the device, not kept (a dump).",
            c.written_around_pages,
        ),
        (
            "cache_busy",
            "Cached reads of an event loop handed to a miss reader: a background thread held the page's cache part.",
            c.busy,
        ),
    ] {
        out.counter(name, help, None, v)?;
    }
    out.gauges(
        "cache_dirty_pages",
        "Dirty pages now, by the class of their writer.",
        &[
            (class_label(Class::Critical), c.dirty_critical as u64),
            (class_label(Class::NonCritical), c.dirty_noncritical as u64),
        ],
    )
}

fn log(out: &mut Out, b: &Backend) -> fmt::Result {
    let engine = &b.engine;
    let l = engine.log().stats();
    out.counter(
        "log_batches",
        "Log batches written and flushed.",
        None,
        l.batches,
    )?;
    out.counter(
        "log_committer_batches",
        "Log batches their foreground committer wrote itself (log.committer_writes); \
         the log writer wrote the rest.",
        None,
        l.committer_batches,
    )?;
    out.counter("log_records", "Log records made durable.", None, l.records)?;
    out.counter(
        "log_written",
        "Bytes written by log batches (whole blocks, padding included).",
        Some(&Unit::Bytes),
        l.bytes_written,
    )?;
    out.counter(
        "log_truncations",
        "Log truncations that moved its head.",
        None,
        l.truncations,
    )?;
    out.gauge(
        "log_used",
        "Log ring bytes in use.",
        Some(&Unit::Bytes),
        l.used_bytes,
    )?;
    out.gauge(
        "log_capacity",
        "Log ring bytes in all.",
        Some(&Unit::Bytes),
        l.capacity_bytes,
    )?;
    out.gauge(
        "log_poisoned",
        "1 if a log write failed and the log refuses commits.",
        None,
        u64::from(engine.log().is_poisoned()),
    )?;
    let (live, span, size) = engine.space();
    out.gauge(
        "vlog_live",
        "Value-log bytes of live records.",
        Some(&Unit::Bytes),
        live,
    )?;
    out.gauge(
        "vlog_used",
        "Value-log bytes in use (live and dead).",
        Some(&Unit::Bytes),
        span,
    )?;
    out.gauge(
        "vlog_capacity",
        "The value log's region.",
        Some(&Unit::Bytes),
        size,
    )?;
    let bg = engine.background_stats();
    out.counter(
        "kv_checkpoints",
        "Checkpoints completed.",
        None,
        bg.checkpoints,
    )?;
    out.counter(
        "kv_checkpoint_errors",
        "Checkpoints that failed.",
        None,
        bg.checkpoint_errors,
    )?;
    let ckpt_secs = ConstCounter::new(bg.checkpoint_ms_total / 1000.0);
    ckpt_secs.encode(out.enc.encode_descriptor(
        "kv_checkpoint",
        "Time spent in completed checkpoints.",
        Some(&Unit::Seconds),
        MetricType::Counter,
    )?)?;
    out.counter(
        "kv_snapshots",
        "Snapshots (BGSAVE) completed.",
        None,
        bg.snapshots,
    )?;
    out.counter(
        "kv_rewrites",
        "Value-log rewrites (BGREWRITEAOF) completed.",
        None,
        bg.rewrites,
    )?;
    out.counter(
        "kv_cleaned",
        "Value-log bytes the cleaner went through.",
        Some(&Unit::Bytes),
        bg.cleaned_bytes,
    )?;
    let (snapshot, rewrite) = engine.background_progress();
    let running: Vec<_> = [("bgsave", snapshot), ("bgrewriteaof", rewrite)]
        .into_iter()
        .filter_map(|(job, p)| Some(([("job", job)], p?.fraction)))
        .collect();
    out.gauges(
        "kv_job_progress_ratio",
        "How far the running BGSAVE or BGREWRITEAOF is through its part of the value log, 0 to 1 (only while it runs).",
        &running,
    )?;
    let floor = critio::context::cpu_floor_stats();
    out.counter(
        "background_cpu_floor_raises",
        "Times the CPU floor lowered a background thread's nice by a level more (it got less than context.background_cpu_min_share of the CPU it wanted).",
        None,
        floor.raises,
    )?;
    out.gauge(
        "background_cpu_relieved_threads",
        "Background threads the CPU floor runs below the background nice now.",
        None,
        u64::from(floor.relieved),
    )
}

fn write_cache(out: &mut Out, b: &Backend) -> fmt::Result {
    let Some(wc) = &b.write_cache else {
        return Ok(());
    };
    let s = wc.stats();
    for (name, help, v) in [
        (
            "write_cache_writes",
            "Write commands the write cache received.",
            s.writes,
        ),
        (
            "write_cache_cached_writes",
            "Writes the admission policy admitted to the cache.",
            s.cached_writes,
        ),
        (
            "write_cache_hit_writes",
            "Writes not admitted that overwrote cached blocks.",
            s.hit_writes,
        ),
        (
            "write_cache_bypassed_writes",
            "Writes sent (at least partly) to the backing device.",
            s.bypassed_writes,
        ),
        (
            "write_cache_full_bypasses",
            "Admitted writes sent to the backing device because the cache was full.",
            s.full_bypasses,
        ),
        (
            "write_cache_reissues",
            "In-flight writes reissued to the cache because a critical task waited for them.",
            s.reissues,
        ),
        (
            "write_cache_reissue_misses",
            "Reissue requests that found nothing to reissue or no free slot.",
            s.reissue_misses,
        ),
        (
            "write_cache_stalls",
            "Writes that waited for a free slot.",
            s.stalls,
        ),
        (
            "write_cache_writeback_blocks",
            "Blocks written back to the backing device.",
            s.writeback_blocks,
        ),
        (
            "write_cache_writeback_errors",
            "Writeback rounds that failed.",
            s.writeback_errors,
        ),
        ("write_cache_reads", "Read commands.", s.reads),
        (
            "write_cache_read_hit_blocks",
            "Blocks read from the cache.",
            s.read_hit_blocks,
        ),
        (
            "write_cache_read_miss_blocks",
            "Blocks read from the backing device.",
            s.read_miss_blocks,
        ),
    ] {
        out.counter(name, help, None, v)?;
    }
    let stall = ConstCounter::new(Duration::from_nanos(s.stall_ns).as_secs_f64());
    stall.encode(out.enc.encode_descriptor(
        "write_cache_stall",
        "Time writes waited for a free slot.",
        Some(&Unit::Seconds),
        MetricType::Counter,
    )?)?;
    out.gauge("write_cache_slots", "Write cache slots.", None, s.slots)?;
    out.gauge(
        "write_cache_used_slots",
        "Write cache slots in use now.",
        None,
        s.used_slots,
    )?;
    out.gauge(
        "write_cache_dirty_blocks",
        "Blocks waiting for writeback now.",
        None,
        s.dirty_blocks,
    )
}

fn server(out: &mut Out, s: &Shared) -> fmt::Result {
    let st = &s.stats;
    let rounds = {
        let t = st.rounds.lock();
        [&t.run, &t.commit, &t.send].map(|h| h.buckets(&LATENCY_BUCKETS))
    };
    let rows: Vec<_> = ["run", "commit", "send"]
        .iter()
        .zip(&rounds)
        .map(|(part, b)| ([("part", *part)], b))
        .collect();
    out.histograms(
        "kv_round",
        "The request workers' rounds: running the ready connections' requests (run), the round's one commit wait (commit), sending the replies (send).",
        &rows,
    )?;
    let get = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    for (name, help, v) in [
        (
            "kv_connections_received",
            "Client connections accepted.",
            get(&st.connections_received),
        ),
        (
            "kv_commands_processed",
            "Commands run.",
            get(&st.commands_processed),
        ),
        (
            "kv_keyspace_hits",
            "Key lookups that found the key.",
            get(&st.keyspace_hits),
        ),
        (
            "kv_keyspace_misses",
            "Key lookups that did not.",
            get(&st.keyspace_misses),
        ),
    ] {
        out.counter(name, help, None, v)?;
    }
    out.gauge(
        "kv_connected_clients",
        "Clients connected now.",
        None,
        s.connected() as u64,
    )?;
    out.gauge(
        "kv_keys",
        "Keys in the store.",
        None,
        s.backend.engine.dbsize(),
    )?;
    let info = Info::new(vec![
        ("version", crate::VERSION.to_owned()),
        ("scheme", s.backend.scheme.name().to_owned()),
        ("device", s.backend.device.clone()),
    ]);
    info.encode(out.enc.encode_descriptor(
        "kv",
        "The server's version, scheme and device.",
        None,
        MetricType::Info,
    )?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A collector of one histogram family, to check the encoding alone.
    #[derive(Debug)]
    struct OneHistogram(BucketCounts);

    impl Collector for OneHistogram {
        fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
            Out { enc: &mut enc }.histograms(
                "t_wait",
                "A test histogram.",
                &[([("point", "t: one")], &self.0)],
            )
        }
    }

    /// A collector of one gauge family with fractional values.
    #[derive(Debug)]
    struct Fractions;

    impl Collector for Fractions {
        fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), fmt::Error> {
            Out { enc: &mut enc }.gauges(
                "t_progress_ratio",
                "A test gauge.",
                &[([("job", "bgsave")], 0.25), ([("job", "other")], 1.0)],
            )
        }
    }

    #[test]
    fn fractional_gauges_keep_their_fraction() {
        let mut r = Registry::with_prefix("critio");
        r.register_collector(Box::new(Fractions));
        let text = render(&r).unwrap();
        assert!(
            text.contains("critio_t_progress_ratio{job=\"bgsave\"} 0.25\n"),
            "{text}"
        );
    }

    #[test]
    fn latency_buckets_increase() {
        assert!(LATENCY_BUCKETS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(LATENCY_BUCKETS[0], Duration::from_micros(10));
        assert_eq!(LATENCY_BUCKETS[18], Duration::from_secs(10));
    }

    #[test]
    fn a_histogram_is_cumulative_and_ends_with_inf_equal_to_count() {
        let mut h = critio::metrics::LatencyHistogram::new();
        for us in [5u64, 30, 30, 700, 40_000, 20_000_000] {
            h.record(Duration::from_micros(us));
        }
        let mut r = Registry::with_prefix("critio");
        r.register_collector(Box::new(OneHistogram(h.buckets(&LATENCY_BUCKETS))));
        let text = render(&r).unwrap();
        assert!(
            text.contains("# TYPE critio_t_wait_seconds histogram\n"),
            "{text}"
        );
        let buckets: Vec<(String, u64)> = text
            .lines()
            .filter(|l| l.starts_with("critio_t_wait_seconds_bucket{"))
            .map(|l| {
                let le = l.split("le=\"").nth(1).unwrap().split('"').next().unwrap();
                let n = l.rsplit(' ').next().unwrap().parse().unwrap();
                (le.to_owned(), n)
            })
            .collect();
        assert_eq!(buckets.len(), LATENCY_BUCKETS.len() + 1, "{text}");
        assert!(
            buckets.windows(2).all(|w| w[0].1 <= w[1].1),
            "cumulative: {buckets:?}"
        );
        let at = |le: &str| buckets.iter().find(|b| b.0 == le).unwrap().1;
        assert_eq!(at("1e-05"), 1, "5 µs");
        assert_eq!(at("5e-05"), 3, "and twice 30 µs");
        assert_eq!(at("0.001"), 4);
        assert_eq!(at("0.05"), 5);
        assert_eq!(at("10"), 5, "20 s is above every bound");
        assert_eq!(
            buckets.last().unwrap(),
            &("+Inf".to_owned(), 6),
            "+Inf = count"
        );
        assert!(
            text.contains("critio_t_wait_seconds_count{point=\"t: one\"} 6\n"),
            "{text}"
        );
        let sum: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("critio_t_wait_seconds_sum{point=\"t: one\"} "))
            .unwrap()
            .parse()
            .unwrap();
        assert!((sum - 20.04076).abs() < 0.03, "sum {sum}");
    }
}
