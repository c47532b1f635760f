//! `critio bench e1-request-latency`: paper 000 Figures 4-9 on critio-kv:
//! YCSB-A while checkpoints run, under every scheme and the isolation
//! limit; throughput, latency percentiles, checkpoints, the CCDF plot, and
//! where critical tasks waited per scheme (the shape of Tables 2-3).

use critio_kv::Scheme;

use super::report::{Report, Table};
use super::BenchArgs;
use crate::demo;
use crate::kvbench::RunSpec;

const DEFAULT_WORKLOAD: &str = include_str!("../../../../workloads/e1-request-latency.toml");

const RUNS: [RunSpec; 6] = [
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
        label: "sync-first",
        scheme: Scheme::SyncFirst,
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

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let mut w = demo::workload(
        args.workload.as_deref(),
        DEFAULT_WORKLOAD,
        "workloads/e1-request-latency.toml",
    )?;
    if let Some(d) = &args.device {
        w.device = d.clone();
    }
    let secs = if args.quick { w.quick() } else { w.duration_s };
    let results = demo::compare(&w, &RUNS, secs)?;
    let title = format!(
        "YCSB-A on critio-kv ({} keys x {} B, {} MiB cache, {} clients, checkpoints every {} ms, {secs} s per scheme)",
        w.records,
        w.value_bytes,
        w.cache_bytes >> 20,
        w.clients,
        w.checkpoint_interval_ms
    );
    let stem = args.out_dir().join("e1-request-latency-ccdf");
    let (png, _) = demo::ccdf_plot(&stem, "E1: request latency CCDF per scheme", &results)?;
    let mut tables = vec![
        demo::latency_table(&title, &results),
        demo::how_table(&results),
    ];
    for r in &results {
        tables.push(Table::wait_points(
            &format!("wait points of critical tasks: {}", r.label),
            &r.waits,
        ));
    }
    Ok(Report {
        experiment: "e1-request-latency".into(),
        description: format!(
            "request latency per scheme under checkpoints (CCDF plot: {})",
            png.display()
        ),
        tables,
        targets: demo::targets(&results),
    })
}
