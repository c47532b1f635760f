//! `critio bench cache-entanglement`: foreground write-plus-commit latency
//! while a background task writes a large file through the cache (paper 000,
//! Section 2: dirty throttling caused by background writes, a commit that
//! waits for a log writer busy behind background I/O).
//!
//! Foreground threads each write a 4 KiB page of a table file through the
//! cache and commit a log record; a background thread writes a large file
//! sequentially through the cache and flushes it every 64 MiB (a
//! checkpoint's pattern). Four runs on the same stack, side by side:
//!
//! | run                      | cache dirty limits  | condvar/lock inheritance (log writer) |
//! |--------------------------|---------------------|---------------------------------------|
//! | both off                 | one shared 20%      | off                                   |
//! | dirty limits only        | 1% / 20% per class  | off                                   |
//! | log inheritance only     | one shared 20%      | on                                    |
//! | both on (rcp)            | 1% / 20% per class  | on                                    |
//!
//! The block layer runs `rcp` in all four, so the comparison isolates the
//! two mechanisms of issue 4; it runs with the adaptive cap and the
//! drive's priority firmware, as `critio serve` does on a real device:
//! the simulated SSD acknowledges writes from its DRAM buffer, so a fixed
//! cap of one request lets the background stream ~195 MiB/s into the
//! buffer and every commit's flush waits for it to drain (with a fixed cap
//! the four runs measured alike: rcp's p99 1.9x both-off's).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::block::{AutoCapConfig, BlockConfig, BlockLayer, NoncriticalCap};
use critio::cache::{CacheConfig, FileId, PageCache};
use critio::config::SyncConfig;
use critio::context;
use critio::device::{DeviceSpec, OpenOptions};
use critio::log::{Log, LogConfig};
use critio::metrics::{self, LatencyHistogram};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

const MIB: u64 = 1 << 20;
const CAPACITY: u64 = 2048 * MIB;
const LOG_BYTES: u64 = 64 * MIB;
const TABLE_BYTES: u64 = 64 * MIB;
const BIG_BYTES: u64 = 1536 * MIB;
const FOREGROUND_THREADS: usize = 2;
const BG_CHUNK: usize = 256 << 10;
const BG_FLUSH_EVERY: u64 = 64 * MIB;

#[derive(Clone, Copy)]
struct Run {
    name: &'static str,
    dirty_limits: bool,
    inheritance: bool,
}

const RUNS: [Run; 4] = [
    Run {
        name: "both off",
        dirty_limits: false,
        inheritance: false,
    },
    Run {
        name: "dirty limits only",
        dirty_limits: true,
        inheritance: false,
    },
    Run {
        name: "log inheritance only",
        dirty_limits: false,
        inheritance: true,
    },
    Run {
        name: "both on (rcp)",
        dirty_limits: true,
        inheritance: true,
    },
];

struct Measured {
    fg: LatencyHistogram,
    fg_ops_s: f64,
    bg_mib_s: f64,
    waits: critio::metrics::MetricsSnapshot,
}

struct Setup {
    cache: Arc<PageCache>,
    log: Log,
    table: FileId,
    big: FileId,
    /// The newest LSN a foreground thread committed.
    committed: AtomicU64,
}

fn setup(spec: &DeviceSpec, run: Run) -> Result<Setup, String> {
    let opts = OpenOptions {
        capacity: CAPACITY,
        drive_priority: true,
        ..OpenOptions::default()
    };
    let dev = spec.open(opts).map_err(|e| e.to_string())?;
    let sync = SyncConfig {
        inheritance: run.inheritance,
        ..SyncConfig::default()
    };
    let block_cfg = BlockConfig {
        noncritical_cap: NoncriticalCap::Auto(AutoCapConfig::default()),
        ..BlockConfig::default()
    };
    let block = Arc::new(BlockLayer::new(dev, block_cfg).map_err(|e| e.to_string())?);
    let cache_cfg = CacheConfig {
        dirty_limits: run.dirty_limits,
        ..CacheConfig::default()
    };
    let cache =
        Arc::new(PageCache::new(block.clone(), cache_cfg, &sync).map_err(|e| e.to_string())?);
    let log_cfg = LogConfig {
        region_offset_bytes: 0,
        region_bytes: LOG_BYTES,
        // Paper 000's journaling daemon: every commit goes through the log
        // writer, the dependency this experiment is about (by default a
        // foreground commit writes its own batch, with no writer to wait
        // for).
        committer_writes: false,
        ..LogConfig::default()
    };
    let (log, _) = Log::open(block, &log_cfg, &sync).map_err(|e| e.to_string())?;
    let table = cache
        .add_file("table", LOG_BYTES, TABLE_BYTES)
        .map_err(|e| e.to_string())?;
    let big = cache
        .add_file("big", LOG_BYTES + TABLE_BYTES, BIG_BYTES)
        .map_err(|e| e.to_string())?;
    Ok(Setup {
        cache,
        log,
        table,
        big,
        committed: AtomicU64::new(0),
    })
}

fn foreground(s: &Setup, seed: u64, stop: &AtomicBool) -> (LatencyHistogram, u64) {
    context::set_foreground();
    let mut rng = SmallRng::seed_from_u64(seed);
    let (mut hist, mut n) = (LatencyHistogram::new(), 0);
    let page = vec![0xab; 4096];
    let record = vec![0xcd; 100];
    while !stop.load(Ordering::Relaxed) {
        let offset = rng.gen_range(0..TABLE_BYTES / 4096) * 4096;
        let t = Instant::now();
        s.cache
            .write(s.table, offset, &page)
            .expect("foreground write");
        let lsn = s.log.append_commit(&record).expect("foreground commit");
        hist.record(t.elapsed());
        s.committed.fetch_max(lsn, Ordering::Relaxed);
        n += 1;
    }
    (hist, n)
}

/// What an application's checkpointer does for the log: the records are
/// the benchmark's own, so once committed they may go; every 20 ms the log
/// is truncated to the newest commit when it is a quarter full. Without it
/// the log fills on a fast device and every commit waits for space forever.
/// It is the log's space helper, as a checkpointer is.
fn truncator(s: &Setup, stop: &AtomicBool) {
    s.log.register_space_helper(context::current());
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(20));
        let upto = s.committed.load(Ordering::Relaxed);
        if upto > 0 && s.log.used_pct() > 25.0 {
            s.log.truncate(upto).expect("truncate the log");
        }
    }
}

fn background(s: &Setup, stop: &AtomicBool, written: &AtomicU64) {
    let chunk = vec![0x5a; BG_CHUNK];
    let mut offset = 0;
    while !stop.load(Ordering::Relaxed) {
        s.cache
            .write(s.big, offset, &chunk)
            .expect("background write");
        offset += BG_CHUNK as u64;
        written.fetch_add(BG_CHUNK as u64, Ordering::Relaxed);
        if offset % BG_FLUSH_EVERY == 0 {
            s.cache.flush_file(s.big).expect("background flush");
        }
        if offset + BG_CHUNK as u64 > BIG_BYTES {
            offset = 0;
        }
    }
}

fn measure(spec: &DeviceSpec, run: Run, secs: f64) -> Result<Measured, String> {
    let s = Arc::new(setup(spec, run)?);
    metrics::global().reset();
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let bg = {
        let (s, stop, written) = (s.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || background(&s, &stop, &written))
    };
    let trunc = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || truncator(&s, &stop))
    };
    std::thread::sleep(Duration::from_millis(300)); // the background fills the cache first
    let fgs: Vec<_> = (0..FOREGROUND_THREADS as u64)
        .map(|i| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || foreground(&s, i, &stop))
        })
        .collect();
    let start = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(secs));
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let mut fg = LatencyHistogram::new();
    let mut ops = 0;
    for h in fgs {
        let (hist, n) = h.join().map_err(|_| "foreground thread panicked")?;
        fg.merge(&hist);
        ops += n;
    }
    bg.join().map_err(|_| "background thread panicked")?;
    trunc.join().map_err(|_| "log truncator panicked")?;
    Ok(Measured {
        fg,
        fg_ops_s: ops as f64 / elapsed,
        bg_mib_s: written.load(Ordering::Relaxed) as f64 / (elapsed + 0.3) / MIB as f64,
        waits: metrics::global().snapshot(),
    })
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let spec: DeviceSpec = args.device.as_deref().unwrap_or("sim:ssd").parse()?;
    let secs = if args.quick { 2.0 } else { 10.0 };
    let mut results = Vec::new();
    for run in RUNS {
        eprintln!("cache-entanglement: {} ({secs} s on {spec})", run.name);
        results.push((run, measure(&spec, run, secs)?));
    }
    let mut t = Table::new(
        &format!(
            "{spec}: {FOREGROUND_THREADS} foreground threads write 4 KiB + commit, one background \
             thread writes a file through the cache (flush every 64 MiB), {secs} s each"
        ),
        &["run", "fg ops/s", "p50 ms", "p99 ms", "max ms", "bg MiB/s"],
    );
    let ms = |h: &LatencyHistogram, q: f64| h.quantile(q).as_secs_f64() * 1e3;
    for (run, m) in &results {
        t.row(vec![
            json!(run.name),
            json!(m.fg_ops_s),
            json!(ms(&m.fg, 0.5)),
            json!(ms(&m.fg, 0.99)),
            json!(m.fg.max().as_secs_f64() * 1e3),
            json!(m.bg_mib_s),
        ]);
    }
    let mut tables = vec![t];
    for (run, m) in &results {
        tables.push(Table::wait_points(
            &format!("wait points of critical tasks: {}", run.name),
            &m.waits,
        ));
    }
    let (off, on) = (&results[0].1, &results[3].1);
    let targets = vec![
        Target::new(
            "rcp-p99-vs-both-off",
            ms(&on.fg, 0.99) / ms(&off.fg, 0.99),
            Goal::AtMost(0.5),
            "x",
        ),
        Target::new(
            "rcp-max-vs-both-off",
            on.fg.max().as_secs_f64() / off.fg.max().as_secs_f64(),
            Goal::AtMost(0.5),
            "x",
        ),
        Target::new(
            "rcp-background-progress-vs-both-off",
            on.bg_mib_s / off.bg_mib_s,
            Goal::AtLeast(0.5),
            "x",
        ),
    ];
    Ok(Report {
        experiment: "cache-entanglement".into(),
        description: "foreground write+commit latency under a background file writer, with the \
                      cache's per-class dirty limits and the log writer's inheritance on and off"
            .into(),
        tables,
        targets,
    })
}
