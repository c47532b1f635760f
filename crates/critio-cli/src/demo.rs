//! `critio demo`: request latency with and without request-centric
//! prioritization, measured side by side in one run.
//!
//! critio-kv runs in-process on a real file in the output directory
//! (io_uring, O_DIRECT; falling back to the worker pool, then to the
//! simulated SSD, each with the reason printed), or on the device
//! `--device` names; closed-loop clients drive a
//! YCSB-A load (50% reads, 50% updates, zipfian keys, 1 KiB values, a data
//! set several times the page cache) over the Redis protocol while
//! checkpoints run every second. The same load runs under `none`,
//! `kernel-idle`, `static` and `rcp`, and under `rcp` with background work
//! off (the isolation limit). Results: a table, targets, JSON, and a CCDF
//! plot (PNG and SVG).

use std::path::{Path, PathBuf};
use std::time::Instant;

use critio::device::{DeviceSpec, OpenOptions};
use critio_kv::Scheme;
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use serde_json::json;

use crate::bench::report::{Goal, Report, Table, Target};
use crate::kvbench::{self, KvResult, RunSpec};
use crate::plot;
use crate::workload::KvWorkload;

const DEFAULT_WORKLOAD: &str = include_str!("../../../workloads/demo.toml");

/// Options of `critio demo`.
pub struct DemoArgs {
    /// The 15-second version.
    pub quick: bool,
    /// A workload file instead of the built-in one.
    pub workload: Option<PathBuf>,
    /// Where to write the JSON and the plots.
    pub out: PathBuf,
    /// The device (None: a real file in `out`, see [`real_device`]).
    pub device: Option<String>,
}

/// The demo's default device: a file in `out` through io_uring with
/// O_DIRECT; where that cannot be opened, the worker pool on the same file;
/// where neither can, the simulated SSD. Each fallback says why.
pub fn real_device(out: &Path) -> String {
    let probe = out.join("critio-probe.img");
    let mut why = Vec::new();
    for (kind, spec) in [
        ("io_uring", DeviceSpec::Uring(probe.clone())),
        ("pool", DeviceSpec::Pool(probe.clone())),
    ] {
        let opened = spec.open(OpenOptions {
            capacity: 1 << 20,
            ..OpenOptions::default()
        });
        let _ = std::fs::remove_file(&probe);
        match opened {
            Ok(_) => {
                let file = out.join("critio-demo.img");
                return match spec {
                    DeviceSpec::Uring(_) => format!("file:{}", file.display()),
                    _ => {
                        println!(
                            "critio demo: io_uring unavailable ({}); using the pool",
                            why.join("; ")
                        );
                        format!("pool:{}", file.display())
                    }
                };
            }
            Err(e) => why.push(format!("{kind}: {e}")),
        }
    }
    println!(
        "critio demo: no real device in {} ({}); using the simulated SSD",
        out.display(),
        why.join("; ")
    );
    "sim:ssd".into()
}

/// The runs of the demo, in table order.
pub const RUNS: [RunSpec; 5] = [
    RunSpec {
        label: "none",
        scheme: Scheme::None,
        background: true,
        tweak: None,
    },
    RunSpec {
        label: "kernel-idle",
        scheme: Scheme::KernelIdle,
        background: true,
        tweak: None,
    },
    RunSpec {
        label: "static",
        scheme: Scheme::Static,
        background: true,
        tweak: None,
    },
    RunSpec {
        label: "rcp",
        scheme: Scheme::Rcp,
        background: true,
        tweak: None,
    },
    RunSpec {
        label: "isolation (rcp, no background)",
        scheme: Scheme::Rcp,
        background: false,
        tweak: None,
    },
];

/// Loads the workload file, or the built-in one.
pub fn workload(path: Option<&Path>, default: &str, name: &str) -> Result<KvWorkload, String> {
    match path {
        Some(p) => KvWorkload::load(p),
        None => KvWorkload::from_toml(default, name),
    }
}

fn bar(mp: &MultiProgress, prefix: &str, len: u64) -> ProgressBar {
    let pb = mp.add(ProgressBar::new(len));
    let style = ProgressStyle::with_template("{prefix:>32} [{bar:30}] {msg}")
        .expect("static template")
        .progress_chars("=> ");
    pb.set_style(style);
    pb.set_prefix(prefix.to_owned());
    pb
}

/// Runs every spec on one preloaded store; shows a progress bar per run.
pub fn compare(w: &KvWorkload, specs: &[RunSpec], secs: f64) -> Result<Vec<KvResult>, String> {
    let mp = MultiProgress::new();
    let pre = bar(&mp, "preloading", w.records);
    let template = kvbench::preload(w, &pre)?;
    pre.finish_with_message(format!("{} keys", w.records));
    // (Printed directly: the progress bars are hidden when not on a terminal.)
    println!("device: {}", template.describe());
    let mut out: Vec<KvResult> = Vec::new();
    for spec in specs {
        // The isolation run is sized for the fastest run before it (or,
        // first, for a rate no run here has reached).
        let fastest = out.iter().map(|r| r.throughput).fold(0.0, f64::max);
        let rate = if fastest > 0.0 { fastest } else { 50_000.0 };
        let isolation = kvbench::Isolation::for_rate(w, rate, secs);
        let pb = bar(&mp, spec.label, 1000);
        let r = kvbench::run(w, &template, spec, secs, isolation, &pb)?;
        println!("  {}: {}", spec.label, r.how);
        pb.finish_with_message(format!(
            "{:.0} ops/s, p99.9 {:.1} ms",
            r.throughput,
            ms(&r, 0.999)
        ));
        out.push(r);
    }
    Ok(out)
}

fn ms(r: &KvResult, q: f64) -> f64 {
    r.latency.quantile(q).as_secs_f64() * 1e3
}

/// The results table shared by the demo and E1.
pub fn latency_table(title: &str, results: &[KvResult]) -> Table {
    let mut t = Table::new(
        title,
        &[
            "scheme",
            "ops/s",
            "p50 ms",
            "p99 ms",
            "p99.9 ms",
            "max ms",
            "checkpoints",
            "ckpt mean ms",
            "written back MiB",
            "throttled",
        ],
    );
    for r in results {
        t.row(vec![
            json!(r.label),
            json!(r.throughput),
            json!(ms(r, 0.5)),
            json!(ms(r, 0.99)),
            json!(ms(r, 0.999)),
            json!(r.latency.max().as_secs_f64() * 1e3),
            json!(r.checkpoints),
            json!(r.checkpoint_ms),
            json!(r.written_back_mib),
            json!(r.throttled),
        ]);
    }
    t
}

/// How each run was made on its device: the scheme as realized there (a
/// kernel baseline on a real file, an emulation on a simulated drive) and
/// how the isolation run was sized.
pub fn how_table(results: &[KvResult]) -> Table {
    let mut t = Table::new("how each run is made", &["run", "how"]);
    for r in results {
        t.row(vec![json!(r.label), json!(r.how)]);
    }
    t
}

/// Writes the CCDF plot of `results` to `stem`.{png,svg}.
pub fn ccdf_plot(
    stem: &Path,
    title: &str,
    results: &[KvResult],
) -> Result<(PathBuf, PathBuf), String> {
    let series: Vec<plot::Series> = results
        .iter()
        .map(|r| plot::Series {
            name: r.label.to_owned(),
            points: plot::ccdf_points(&r.latency),
        })
        .collect();
    plot::ccdf(stem, title, &series)
}

/// The targets of the demo and E1 (issue 6), from what was measured.
pub fn targets(results: &[KvResult]) -> Vec<Target> {
    let by = |label: &str| {
        results
            .iter()
            .find(|r| r.label.starts_with(label))
            .expect("every run is there")
    };
    let (none, idle, rcp, iso) = (by("none"), by("kernel-idle"), by("rcp"), by("isolation"));
    vec![
        Target::new(
            "rcp-p99.9-better-than-none",
            ms(none, 0.999) / ms(rcp, 0.999),
            Goal::AtLeast(10.0),
            "x",
        ),
        Target::new(
            "rcp-p99.9-better-than-kernel-idle",
            ms(idle, 0.999) / ms(rcp, 0.999),
            Goal::AtLeast(5.0),
            "x",
        ),
        Target::new(
            "rcp-throughput-vs-none",
            rcp.throughput / none.throughput,
            Goal::AtLeast(1.3),
            "x",
        ),
        Target::new(
            "rcp-checkpoints-vs-none",
            rcp.checkpoints as f64 / none.checkpoints.max(1) as f64,
            Goal::AtLeast(0.8),
            "x",
        ),
        Target::new(
            "rcp-p99.9-vs-isolation",
            ms(rcp, 0.999) / ms(iso, 0.999),
            Goal::AtMost(2.0),
            "x",
        ),
    ]
}

/// Runs the demo.
pub fn run(args: &DemoArgs) -> Result<(), String> {
    let mut w = workload(
        args.workload.as_deref(),
        DEFAULT_WORKLOAD,
        "workloads/demo.toml",
    )?;
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    match args.device.as_deref() {
        None => w.device = real_device(&args.out),
        Some("sim") => {}
        Some(spec) => w.device = spec.to_owned(),
    }
    let secs = if args.quick { w.quick() } else { w.duration_s };
    println!(
        "critio demo: critio-kv on {} ({} MiB page cache), {} keys x {} B, {} clients, YCSB-A ({:.0}% reads, {:?}), \
         checkpoints every {} ms; {secs} s per scheme\n",
        w.device,
        w.cache_bytes >> 20,
        w.records,
        w.value_bytes,
        w.clients,
        w.read_proportion * 100.0,
        w.distribution,
        w.checkpoint_interval_ms
    );
    let started = Instant::now();
    let results = compare(&w, &RUNS, secs)?;
    let title = format!(
        "YCSB-A on critio-kv, {} clients, checkpoints every {} ms",
        w.clients, w.checkpoint_interval_ms
    );
    let report = Report {
        experiment: "demo".into(),
        description: "request latency under each scheme, measured side by side in one run".into(),
        tables: vec![latency_table(&title, &results), how_table(&results)],
        targets: targets(&results),
    };
    print!("\n{}", report.render());
    std::fs::create_dir_all(&args.out)
        .map_err(|e| format!("cannot create {}: {e}", args.out.display()))?;
    let json = args.out.join("demo.json");
    report
        .write_json(&json)
        .map_err(|e| format!("cannot write {}: {e}", json.display()))?;
    let (png, svg) = ccdf_plot(&args.out.join("demo-ccdf"), &title, &results)?;
    println!(
        "\nwrote {}, {} and {} ({:.0} s in all)",
        json.display(),
        png.display(),
        svg.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod device_tests {
    use super::*;

    #[test]
    fn the_demo_falls_back_to_the_simulation_where_no_file_can_be_opened() {
        let nowhere = Path::new("/proc/critio-no-such-dir");
        assert_eq!(real_device(nowhere), "sim:ssd");
        let dir = std::env::temp_dir().join(format!("critio-demo-dev-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let spec = real_device(&dir);
        assert!(
            spec.starts_with("file:") || spec.starts_with("pool:") || spec == "sim:ssd",
            "{spec}"
        );
        assert!(
            !dir.join("critio-probe.img").exists(),
            "the probe is removed"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
