//! `critio bench real-device-mix --device file:PATH`: a critical 4 KiB
//! random reader at QD 1 next to a non-critical 128 KiB sequential writer at
//! QD 32, on a real file through io_uring with O_DIRECT (the disk's own
//! scheduler left as it is), in six configurations measured in one run:
//!
//! | run                         | critio layers            | per-request ioprio |
//! |-----------------------------|--------------------------|--------------------|
//! | reader alone                | off (one FIFO)           | off                |
//! | writer alone                | off                      | off                |
//! | no priority                 | off                      | off                |
//! | kernel ioprio only          | off                      | RT / IDLE          |
//! | critio, cap 1               | rcp, 1 writer at device  | BE 0 / BE 7        |
//! | critio, auto                | rcp, adaptive cap        | BE 0 / BE 7        |
//! | critio, auto, strict kernel | rcp, adaptive cap        | RT / IDLE          |
//!
//! Under critio's layers the kernel gets priority *levels*
//! ([`ClassPriorities::LEVELS`]): critio orders the classes itself; strict
//! RT/IDLE classes let mq-deadline hold every background write while any
//! critical read is in flight, which the last row shows.
//!
//! Then the frontier of static rate limits, in the same run: the writer
//! paced at 1/16, 1/8, 1/4 and 1/2 of its alone throughput at QD 1 and
//! QD 4, no priority (what a static rate limiter such as RocksDB's gives).
//! On a host-cached virtio disk no static rate keeps the reader's tail near
//! alone while the writer runs at half speed, so the frontier is the fair
//! bar: critio `auto` is compared with the best static rate at its own
//! writer throughput (interpolated, each curve starting at the reader
//! alone).
//!
//! Targets: `auto`'s reader p99 and p99.9 no worse than the frontier at
//! its writer throughput; its reader p99 within 3x of alone with the writer
//! at half its alone throughput or more.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use critio::block::{AutoCapConfig, BlockConfig, BlockLayer, BlockScheme, NoncriticalCap};
use critio::context;
use critio::device::uring::{ClassPriorities, UringDevice, UringOptions};
use critio::device::{AlignedBuf, Device};
use critio::metrics::LatencyHistogram;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;

/// The reader's region and the writer's region, each (the file is twice
/// this): 1 GiB, or 128 MiB with `--quick`.
const REGION: u64 = 1 << 30;
const QUICK_REGION: u64 = 128 << 20;
const READ_LEN: usize = 4096;
const WRITE_LEN: usize = 128 << 10;
const WRITER_QD: usize = 32;
/// The static rate limits of the frontier: fractions of the writer's alone
/// throughput, at each of these queue depths.
const FRONTIER_FRACTIONS: [f64; 4] = [1.0 / 16.0, 1.0 / 8.0, 1.0 / 4.0, 1.0 / 2.0];
const FRONTIER_QDS: [usize; 2] = [1, 4];
const FILLED_MAGIC: &[u8] = b"critio real-device-mix prefilled v1";

/// The default file, on a disk-backed filesystem.
pub fn default_path() -> PathBuf {
    PathBuf::from("/var/tmp/critio-real-device-mix.img")
}

#[derive(Clone, Copy)]
struct RunCfg {
    name: &'static str,
    reader: bool,
    writer: bool,
    scheme: BlockScheme,
    cap: NoncriticalCap,
    ioprio: Option<ClassPriorities>,
    /// The writer's queue depth.
    writer_qd: usize,
    /// The writer paced to this many bytes a second (a static rate
    /// limiter); `None`: as fast as it can.
    pace: Option<f64>,
}

struct RunResult {
    reads: LatencyHistogram,
    read_iops: f64,
    write_mib_s: f64,
    final_cap: u32,
}

/// Fills the file with data once, so reads hit allocated blocks and writes
/// overwrite (a hole would read as zeros without touching the disk).
fn prefill(path: &Path, region: u64) -> Result<(), String> {
    let file_size = 2 * region;
    let opts = UringOptions {
        create_size: Some(file_size),
        ..UringOptions::default()
    };
    let dev = Arc::new(UringDevice::open(path, opts).map_err(|e| e.to_string())?);
    if dev.info().capacity < file_size {
        return Err(format!(
            "{} is smaller than {} MiB; remove it or pass another path",
            path.display(),
            file_size >> 20
        ));
    }
    let layer = BlockLayer::new(dev, BlockConfig::default()).map_err(|e| e.to_string())?;
    let head = layer
        .read(file_size - 4096, 4096)
        .map_err(|e| e.to_string())?;
    if head.as_slice().starts_with(FILLED_MAGIC) {
        return Ok(());
    }
    eprintln!(
        "real-device-mix: filling {} ({} MiB) once",
        path.display(),
        file_size >> 20
    );
    let mut rng = SmallRng::seed_from_u64(1);
    let mut chunk = AlignedBuf::zeroed(1 << 20);
    let mut pending = VecDeque::new();
    for off in (0..file_size).step_by(1 << 20) {
        rng.fill(chunk.as_mut_slice());
        if off + (1 << 20) == file_size {
            let tail = chunk.as_mut_slice().len() - 4096;
            chunk.as_mut_slice()[tail..tail + FILLED_MAGIC.len()].copy_from_slice(FILLED_MAGIC);
        }
        pending.push_back(
            layer
                .write_async(off, chunk.clone())
                .map_err(|e| e.to_string())?,
        );
        if pending.len() >= 16 {
            pending
                .pop_front()
                .expect("non-empty")
                .wait()
                .map_err(|e| e.to_string())?;
        }
    }
    for h in pending {
        h.wait().map_err(|e| e.to_string())?;
    }
    layer.flush().map_err(|e| e.to_string())
}

fn block_config(run: &RunCfg) -> BlockConfig {
    BlockConfig {
        scheme: run.scheme,
        noncritical_cap: run.cap,
        noncritical_slots: 128,
        ..BlockConfig::default()
    }
}

fn reader(layer: &BlockLayer, stop: &AtomicBool, hist: &mut LatencyHistogram, region: u64) -> u64 {
    context::set_foreground();
    let mut rng = SmallRng::seed_from_u64(42);
    let mut n = 0;
    while !stop.load(Ordering::Relaxed) {
        let offset = rng.gen_range(0..region / READ_LEN as u64) * READ_LEN as u64;
        let t = Instant::now();
        layer.read(offset, READ_LEN).expect("reader: read failed");
        hist.record(t.elapsed());
        n += 1;
    }
    n
}

/// The writer: `qd` writes in flight; with `pace`, a write is submitted
/// only once the bytes submitted so far are within the rate (what a static
/// rate limiter such as RocksDB's does).
fn writer(
    layer: &BlockLayer,
    stop: &AtomicBool,
    bytes: &AtomicU64,
    region: u64,
    qd: usize,
    pace: Option<f64>,
) {
    let file_size = 2 * region;
    let buf = AlignedBuf::from_slice(&[0x5a; WRITE_LEN]);
    let mut offset = region;
    let mut inflight = VecDeque::with_capacity(qd);
    let start = Instant::now();
    let mut submitted = 0u64;
    while !stop.load(Ordering::Relaxed) {
        if let Some(rate) = pace {
            let due = Duration::from_secs_f64(submitted as f64 / rate);
            let now = start.elapsed();
            if due > now {
                std::thread::sleep((due - now).min(Duration::from_millis(5)));
                continue;
            }
        }
        if inflight.len() == qd {
            let h: critio::block::IoHandle = inflight.pop_front().expect("full");
            h.wait().expect("writer: write failed");
            bytes.fetch_add(WRITE_LEN as u64, Ordering::Relaxed);
        }
        inflight.push_back(
            layer
                .write_async(offset, buf.clone())
                .expect("writer: submit"),
        );
        submitted += WRITE_LEN as u64;
        offset += WRITE_LEN as u64;
        if offset + WRITE_LEN as u64 > file_size {
            offset = region;
        }
    }
    for h in inflight {
        h.wait().expect("writer: write failed");
    }
}

fn run_one(path: &Path, run: RunCfg, secs: f64, region: u64) -> Result<RunResult, String> {
    let opts = UringOptions {
        per_request_ioprio: run.ioprio.is_some(),
        priorities: run.ioprio.unwrap_or_default(),
        ..UringOptions::default()
    };
    let dev = Arc::new(UringDevice::open(path, opts).map_err(|e| e.to_string())?);
    let layer = Arc::new(BlockLayer::new(dev, block_config(&run)).map_err(|e| e.to_string())?);
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicU64::new(0));
    let w = run.writer.then(|| {
        let (layer, stop, written) = (layer.clone(), stop.clone(), written.clone());
        std::thread::spawn(move || writer(&layer, &stop, &written, region, run.writer_qd, run.pace))
    });
    let r = run.reader.then(|| {
        let (layer, stop) = (layer.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut hist = LatencyHistogram::new();
            let n = reader(&layer, &stop, &mut hist, region);
            (n, hist)
        })
    });
    let start = Instant::now();
    if std::env::var_os("CRITIO_DEBUG_MIX").is_some() {
        while start.elapsed().as_secs_f64() < secs {
            std::thread::sleep(Duration::from_millis(200));
            let st = layer.stats();
            eprintln!(
                "  t={:.1} cap={} crit={} nc={} nc_dev_p50={:.0}us crit_dev_p50={:.0}us",
                start.elapsed().as_secs_f64(),
                st.noncritical_cap,
                st.classes[0].completions,
                st.classes[1].completions,
                st.classes[1].device_time.p50_us,
                st.classes[0].device_time.p50_us
            );
        }
    } else {
        std::thread::sleep(Duration::from_secs_f64(secs));
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    let (n, reads) = match r {
        Some(h) => h.join().map_err(|_| "reader panicked")?,
        None => (0, LatencyHistogram::new()),
    };
    if let Some(h) = w {
        h.join().map_err(|_| "writer panicked")?;
    }
    Ok(RunResult {
        reads,
        read_iops: n as f64 / elapsed,
        write_mib_s: written.load(Ordering::Relaxed) as f64 / elapsed / (1 << 20) as f64,
        final_cap: layer.stats().noncritical_cap,
    })
}

fn runs() -> [RunCfg; 7] {
    let base = RunCfg {
        name: "",
        reader: true,
        writer: true,
        scheme: BlockScheme::None,
        cap: NoncriticalCap::Fixed(0),
        ioprio: None,
        writer_qd: WRITER_QD,
        pace: None,
    };
    let strict = Some(ClassPriorities::default());
    let critio = RunCfg {
        scheme: BlockScheme::Rcp,
        cap: NoncriticalCap::Auto(AutoCapConfig::default()),
        ioprio: Some(ClassPriorities::LEVELS),
        ..base
    };
    [
        RunCfg {
            name: "reader alone",
            writer: false,
            ..base
        },
        RunCfg {
            name: "writer alone",
            reader: false,
            ..base
        },
        RunCfg {
            name: "both, no priority",
            ..base
        },
        RunCfg {
            name: "both, kernel ioprio only",
            ioprio: strict,
            ..base
        },
        RunCfg {
            name: "both, critio cap 1",
            cap: NoncriticalCap::Fixed(1),
            ..critio
        },
        RunCfg {
            name: "both, critio auto",
            ..critio
        },
        RunCfg {
            name: "both, critio auto, strict kernel",
            ioprio: strict,
            ..critio
        },
    ]
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let path = match args.device.as_deref() {
        None => default_path(),
        Some(spec) => match spec.strip_prefix("file:") {
            Some(p) => PathBuf::from(p),
            None => {
                return Err(format!(
                    "real-device-mix needs --device file:PATH, not `{spec}`"
                ))
            }
        },
    };
    let region = if args.quick { QUICK_REGION } else { REGION };
    prefill(&path, region)?;
    let secs = if args.quick { 1.0 } else { 8.0 };
    let mut results: Vec<(String, RunCfg, RunResult)> = Vec::new();
    for run in runs() {
        eprintln!("real-device-mix: {} ({secs} s)", run.name);
        results.push((run.name.to_owned(), run, run_one(&path, run, secs, region)?));
    }
    let alone_mib = results[1].2.write_mib_s;
    // The frontier of static rate limits: the writer paced at fixed
    // fractions of its alone throughput, at QD 1 and QD 4, no priority.
    let mut frontier: Vec<(usize, f64, f64, f64)> = Vec::new(); // (qd, MiB/s, p99 s, p99.9 s)
    for qd in FRONTIER_QDS {
        for frac in FRONTIER_FRACTIONS {
            let rate = alone_mib * frac;
            let run = RunCfg {
                writer_qd: qd,
                pace: Some(rate * (1 << 20) as f64),
                ..runs()[2]
            };
            let name = format!("static rate {rate:.0} MiB/s, writer QD {qd}");
            eprintln!("real-device-mix: {name} ({secs} s)");
            let r = run_one(&path, run, secs, region)?;
            frontier.push((
                qd,
                r.write_mib_s,
                r.reads.quantile(0.99).as_secs_f64(),
                r.reads.quantile(0.999).as_secs_f64(),
            ));
            results.push((name, run, r));
        }
    }
    let alone = &results[0].2;
    let alone_p99 = alone.reads.quantile(0.99).as_secs_f64();
    let alone_p999 = alone.reads.quantile(0.999).as_secs_f64();
    let mut t = Table::new(
        &format!(
            "{}: reader 4 KiB random QD 1 (critical), writer 128 KiB sequential (non-critical), {secs} s each; {}",
            path.display(),
            super::host::describe(&path)
        ),
        &["run", "read IOPS", "p50 us", "p99 us", "p99.9 us", "p99.9 / alone", "write MiB/s", "write / alone", "nc cap"],
    );
    for (name, run, r) in &results {
        let q = |x: f64| r.reads.quantile(x).as_secs_f64() * 1e6;
        let p999 = r.reads.quantile(0.999).as_secs_f64();
        t.row(vec![
            json!(name),
            json!(r.read_iops),
            json!(q(0.5)),
            json!(q(0.99)),
            json!(q(0.999)),
            if run.reader {
                json!(p999 / alone_p999)
            } else {
                json!("-")
            },
            json!(r.write_mib_s),
            if run.writer {
                json!(r.write_mib_s / alone_mib)
            } else {
                json!("-")
            },
            if r.final_cap == u32::MAX {
                json!("none")
            } else {
                json!(r.final_cap)
            },
        ]);
    }
    let auto = &results[5].2;
    let (auto_p99, auto_p999) = (
        auto.reads.quantile(0.99).as_secs_f64(),
        auto.reads.quantile(0.999).as_secs_f64(),
    );
    // Each static curve starts at the reader alone (a writer at 0 MiB/s).
    let curve = |pick: fn(&(usize, f64, f64, f64)) -> f64, at_zero: f64| {
        FRONTIER_QDS
            .iter()
            .filter_map(|&qd| {
                let mut pts = vec![(0.0, at_zero)];
                pts.extend(
                    frontier
                        .iter()
                        .filter(|p| p.0 == qd)
                        .map(|p| (p.1, pick(p))),
                );
                interpolate(&pts, auto.write_mib_s)
            })
            .fold(f64::INFINITY, f64::min)
    };
    let frontier_p99 = curve(|p| p.2, alone_p99);
    let frontier_p999 = curve(|p| p.3, alone_p999);
    let mut targets = vec![
        Target::new(
            "auto-reader-p99-vs-alone",
            auto_p99 / alone_p99,
            Goal::AtMost(3.0),
            "x",
        ),
        Target::new(
            "auto-writer-throughput-vs-alone",
            auto.write_mib_s / alone_mib,
            Goal::AtLeast(0.5),
            "x",
        ),
    ];
    if frontier_p99.is_finite() {
        targets.push(Target::new(
            "auto-reader-p99-vs-static-frontier",
            auto_p99 / frontier_p99,
            Goal::AtMost(1.0),
            "x",
        ));
        targets.push(Target::new(
            "auto-reader-p99.9-vs-static-frontier",
            auto_p999 / frontier_p999,
            Goal::AtMost(1.0),
            "x",
        ));
    } else {
        // No static rate reached critio's writer throughput: critio is
        // beyond the frontier by throughput alone.
        let fastest = frontier.iter().map(|p| p.1).fold(0.0, f64::max);
        targets.push(Target::new(
            "auto-writer-throughput-vs-fastest-static-rate",
            auto.write_mib_s / fastest.max(f64::MIN_POSITIVE),
            Goal::AtLeast(1.0),
            "x",
        ));
    }
    Ok(Report {
        experiment: "real-device-mix".into(),
        description: format!(
            "a critical QD 1 reader next to a non-critical writer on a real file (io_uring, O_DIRECT, the \
             disk's scheduler as it is): alone, together under the kernel and under critio, and the \
             frontier of static rate limits (the writer paced at {} of its alone throughput, QD {}), \
             against which critio auto's reader tail is compared at its own writer throughput \
             (interpolated; each static curve starts at the reader alone)",
            FRONTIER_FRACTIONS
                .iter()
                .map(|f| format!("1/{:.0}", 1.0 / f))
                .collect::<Vec<_>>()
                .join(", "),
            FRONTIER_QDS
                .iter()
                .map(|q| q.to_string())
                .collect::<Vec<_>>()
                .join(" and ")
        ),
        tables: vec![t],
        targets,
    })
}

/// The value at `x` on the piecewise-linear curve through `pts` (sorted by
/// x as measured: paced rates are close to asked, not exact); `None` past
/// the curve's last point (no static rate reached `x`).
fn interpolate(pts: &[(f64, f64)], x: f64) -> Option<f64> {
    let mut pts = pts.to_vec();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    let last = pts.last()?;
    if x > last.0 {
        return None;
    }
    let i = pts.iter().position(|p| p.0 >= x)?;
    if i == 0 {
        return Some(pts[0].1);
    }
    let (a, b) = (pts[i - 1], pts[i]);
    let t = if b.0 > a.0 {
        (x - a.0) / (b.0 - a.0)
    } else {
        1.0
    };
    Some(a.1 + t * (b.1 - a.1))
}

#[cfg(test)]
mod tests {
    use super::interpolate;

    #[test]
    fn the_frontier_is_interpolated_between_measured_rates_and_ends_at_the_fastest() {
        let pts = [(0.0, 1.0), (100.0, 3.0), (200.0, 7.0)];
        assert_eq!(interpolate(&pts, 50.0), Some(2.0));
        assert_eq!(interpolate(&pts, 150.0), Some(5.0));
        assert_eq!(interpolate(&pts, 200.0), Some(7.0));
        assert_eq!(interpolate(&pts, 0.0), Some(1.0));
        assert_eq!(interpolate(&pts, 201.0), None, "no static rate got there");
    }
}
