//! `critio bench e5-ablation`: paper 000 Figure 10. The E1 load under full
//! rcp, then with each component switched off in turn; throughput is
//! normalized to full rcp (the paper saw 7-45% lost without any one layer).
//!
//! | run                     | switched off                                      |
//! |-------------------------|---------------------------------------------------|
//! | without cache limits    | per-class dirty limits (one shared limit)         |
//! | without block classes   | two queues and slot pools (one FIFO)              |
//! | without device cap      | the cap on non-critical requests at the device    |
//! | without task inheritance| locks and condvars passing criticality on         |
//! | without I/O inheritance | promotion of awaited requests, admission retries  |

use critio::block::{BlockScheme, NoncriticalCap};
use critio::config::Config;
use critio_kv::Scheme;
use serde_json::json;

use super::report::{Goal, Report, Table, Target};
use super::BenchArgs;
use crate::demo;
use crate::kvbench::{KvResult, RunSpec};

const DEFAULT_WORKLOAD: &str = include_str!("../../../../workloads/e5-ablation.toml");

fn no_cache_limits(c: &mut Config) {
    c.cache.dirty_limits = false;
}
fn no_block_classes(c: &mut Config) {
    c.block.scheme = BlockScheme::None;
}
fn no_device_cap(c: &mut Config) {
    c.block.noncritical_cap = NoncriticalCap::Fixed(0);
}
fn no_task_inheritance(c: &mut Config) {
    c.sync.inheritance = false;
}
fn no_io_inheritance(c: &mut Config) {
    c.block.scheme = BlockScheme::Static;
}

const fn rcp(label: &'static str, tweak: Option<fn(&mut Config)>) -> RunSpec {
    RunSpec {
        label,
        scheme: Scheme::Rcp,
        background: true,
        tweak,
    }
}

const RUNS: [RunSpec; 6] = [
    rcp("rcp (all on)", None),
    rcp("without cache limits", Some(no_cache_limits)),
    rcp("without block classes", Some(no_block_classes)),
    rcp("without device cap", Some(no_device_cap)),
    rcp("without task inheritance", Some(no_task_inheritance)),
    rcp("without I/O inheritance", Some(no_io_inheritance)),
];

fn p999(r: &KvResult) -> f64 {
    r.latency.quantile(0.999).as_secs_f64() * 1e3
}

/// Runs the experiment.
pub fn run(args: &BenchArgs) -> Result<Report, String> {
    let mut w = demo::workload(
        args.workload.as_deref(),
        DEFAULT_WORKLOAD,
        "workloads/e5-ablation.toml",
    )?;
    if let Some(d) = &args.device {
        w.device = d.clone();
    }
    let secs = if args.quick { w.quick() } else { w.duration_s };
    let results = demo::compare(&w, &RUNS, secs)?;
    let full = &results[0];
    let mut t = Table::new(
        &format!("YCSB-A on critio-kv under checkpoints, {secs} s per run; normalized to full rcp"),
        &[
            "run",
            "ops/s",
            "normalized",
            "p99.9 ms",
            "p99.9 vs full",
            "checkpoints",
            "written back MiB",
        ],
    );
    for r in &results {
        t.row(vec![
            json!(r.label),
            json!(r.throughput),
            json!(r.throughput / full.throughput),
            json!(p999(r)),
            json!(p999(r) / p999(full)),
            json!(r.checkpoints),
            json!(r.written_back_mib),
        ]);
    }
    let worst = results[1..]
        .iter()
        .map(|r| r.throughput / full.throughput)
        .fold(f64::MAX, f64::min);
    Ok(Report {
        experiment: "e5-ablation".into(),
        description:
            "throughput with each rcp component switched off in turn, normalized to full rcp".into(),
        tables: vec![t, demo::how_table(&results)],
        targets: vec![Target::new(
            "largest-throughput-loss-without-one-component",
            worst,
            Goal::AtMost(0.93),
            "x",
        )],
    })
}
