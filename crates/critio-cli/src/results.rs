//! `critio bench all --results docs/RESULTS.md`: runs every experiment and
//! writes one document with each table, its plot, the machine it ran on,
//! and what the paper reported for the same experiment, side by side.
//!
//! Each experiment runs on the devices its entry names
//! ([`bench::Experiment::results_on`]): the key-value experiments on a real
//! file in the results directory (io_uring, O_DIRECT; the section names the
//! disk, its kernel I/O scheduler and the kernel) and on the simulated
//! device, the drive-model experiments on the simulation only. Plots and
//! JSON go to `results/file/` and `results/sim/`. `--device SPEC` runs
//! every experiment once on SPEC instead.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::bench::{self, BenchArgs, Report, ResultsOn};

/// What each paper reported, per experiment (quoted from `papers/`).
fn paper(experiment: &str) -> &'static str {
    match experiment {
        "e1-request-latency" => {
            "Paper 000 (Figures 4-9): with RCP, up to 53% higher throughput and 42x better 99th-percentile \
             latency than Linux's default (84 ms vs 3581 ms), MongoDB/PostgreSQL/Redis under checkpoints; \
             CFQ-IDLE (the kernel-only option) helps little because of priority inversions."
        }
        "e2-device-priority" => {
            "Paper 001 (Figure 2): with priority passed to the drive, the foreground tail at QD 1 drops \
             from 1.4 s to 81 ms (over 10x) while IOPS decrease minimally; the gain shrinks as the \
             foreground queue depth grows."
        }
        "e3-antagonists" => {
            "Paper 004 (Tables 3-4, Figures 4-5): with priority levels in the non-work-conserving \
             anticipatory scheduler, the high-priority job's mean and max latency stay flat as antagonists \
             are added; a work-conserving scheduler cannot isolate it (a direct I/O goes straight to the \
             driver); tokens bound each level's batches."
        }
        "e4-write-cache" => {
            "Paper 002 (Figure 4a, PostgreSQL/TPC-C): CP+PI+IOI gains 80% throughput over ALL with a 32 MB \
             cache and, with a 4 GB cache, equal throughput with 72% fewer cached writes; for Redis/YCSB, \
             17-55% more throughput while writing up to 87% less to the cache."
        }
        "e5-ablation" => {
            "Paper 000 (Figure 10): disabling any one layer's component degrades throughput by 7-33% \
             (PostgreSQL) and 6-45% (MongoDB)."
        }
        "cache-entanglement" => {
            "Paper 000 (Section 2): a foreground write blocked by dirty throttling caused by background \
             writes, and a commit waiting for a journal busy with background work, cost requests up to \
             seconds."
        }
        "real-device-mix" => {
            "DESIGN.md section 8: on this kind of machine the kernel alone either lets the reader lose ~10x \
             or cuts the writer 5-13x; critio must keep the reader within 2x of alone while the writer \
             keeps half its throughput."
        }
        "run-redis" => {
            "Paper 000 (Section 7, Redis): the papers patched the kernel and Redis; issue 14 measured stock \
             Redis 7 (appendfsync always) going from SET p99.9 3.9 ms alone to 166 ms under a \
             BGSAVE/BGREWRITEAOF loop, and ionice -c3 on its children recovering an earlier 27 ms only to \
             8-9 ms."
        }
        "run-postgres" => {
            "Paper 000 (Figures 4-9, PostgreSQL under checkpoints): RCP cut the 99th-percentile latency by up \
             to 42x against Linux's default, with a patched kernel and PostgreSQL."
        }
        _ => "(no paper figure for this experiment)",
    }
}

fn machine() -> String {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map_or("unknown CPU".to_owned(), |s| s.trim().to_owned());
    let mem_kb: u64 = read("/proc/meminfo")
        .lines()
        .find(|l| l.starts_with("MemTotal"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let kernel = read("/proc/sys/kernel/osrelease");
    format!(
        "{cpu}, {cores} cores, {:.0} GiB memory, Linux {}",
        mem_kb as f64 / (1 << 20) as f64,
        kernel.trim()
    )
}

fn section(doc: &mut String, r: &Report, on: &str, plots: &[PathBuf], doc_dir: &Path, secs: f64) {
    let title = if on.is_empty() {
        r.experiment.clone()
    } else {
        format!("{} {on}", r.experiment)
    };
    let _ = writeln!(doc, "## {title}\n\n{}\n", r.description);
    let _ = writeln!(
        doc,
        "**What the paper reported.** {}\n",
        paper(&r.experiment)
    );
    let _ = writeln!(
        doc,
        "**What this run measured** ({secs:.0} s):\n\n```text\n{}```\n",
        r.render()
    );
    for p in plots {
        let rel = p.strip_prefix(doc_dir).unwrap_or(p);
        let _ = writeln!(doc, "![{}]({})\n", r.experiment, rel.display());
    }
}

/// Runs every experiment (`quick` shortens each) and writes the document.
pub fn write(path: &Path, quick: bool, device: Option<String>) -> Result<(), String> {
    let doc_dir = path.parent().unwrap_or(Path::new(".")).to_path_buf();
    let plot_dir = doc_dir.join("results");
    std::fs::create_dir_all(&plot_dir)
        .map_err(|e| format!("cannot create {}: {e}", plot_dir.display()))?;
    let mut doc = format!(
        "# critio results\n\nRegenerated by `cargo run --release -p critio-cli -- bench all --results {}`{}.\n\n\
         Machine: {}. Every figure below was measured by that command in one run; ratios compare \
         configurations measured side by side.\n\n",
        path.display(),
        if quick { " --quick" } else { "" },
        machine()
    );
    for e in bench::EXPERIMENTS {
        // With --device, every experiment once on it; else each on the
        // devices it is shown on, a real file first.
        let runs: Vec<(Option<ResultsOn>, Option<String>)> = match &device {
            Some(d) if !e.results_on.is_empty() => vec![(None, Some(d.clone()))],
            Some(_) => Vec::new(),
            None => e.results_on.iter().map(|&on| (Some(on), None)).collect(),
        };
        for (on, given) in runs {
            let dir = plot_dir.join(on.map_or("", ResultsOn::dir));
            std::fs::create_dir_all(&dir)
                .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
            // A real file's images live in a scratch directory beside the
            // results, removed when the experiment ends.
            let scratch = plot_dir.join(format!("scratch-{}", std::process::id()));
            let device = match on {
                Some(ResultsOn::File) => {
                    std::fs::create_dir_all(&scratch)
                        .map_err(|err| format!("cannot create {}: {err}", scratch.display()))?;
                    Some(format!("file:{}", scratch.join(e.name).display()))
                }
                _ => given,
            };
            let label = match on {
                Some(ResultsOn::File) => format!(
                    "on a file (io_uring, O_DIRECT): {}",
                    bench::host::describe(&scratch)
                ),
                Some(ResultsOn::Sim) => "on its simulated device".to_owned(),
                Some(ResultsOn::Any) => String::new(),
                None => format!("on {}", device.as_deref().unwrap_or("?")),
            };
            eprintln!("results: running {} {label}", e.name);
            let args = BenchArgs {
                quick,
                json: Some(dir.join(format!("{}.json", e.name))),
                device,
                workload: None,
                placement: Default::default(),
            };
            let started = Instant::now();
            let report = (e.run)(&args);
            let _ = std::fs::remove_dir_all(&scratch);
            let report = report?;
            report
                .write_json(args.json.as_deref().expect("set above"))
                .map_err(|err| format!("cannot write the JSON of {}: {err}", e.name))?;
            let plots: Vec<PathBuf> = std::fs::read_dir(&dir)
                .map_err(|err| err.to_string())?
                .filter_map(|d| d.ok().map(|d| d.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "png"))
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with(e.name))
                })
                .collect();
            section(
                &mut doc,
                &report,
                &label,
                &plots,
                &doc_dir,
                started.elapsed().as_secs_f64(),
            );
        }
    }
    std::fs::write(path, doc).map_err(|e| format!("cannot write {}: {e}", path.display()))
}
