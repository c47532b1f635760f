//! `critio bench <experiment>`: the experiments, each reporting what it
//! measured side by side in one run, as a table, targets and optional JSON.
//! Workloads are TOML files (`workloads/`), embedded as defaults and
//! replaceable with `--workload FILE`.

mod block_overhead;
mod cache_entanglement;
mod e1_request_latency;
mod e2_device_priority;
mod e3_antagonists;
mod e4_write_cache;
mod e5_ablation;
mod fio;
pub(crate) mod host;
mod kv_background;
mod kv_cache_jobs;
mod kv_schedulers;
mod kv_vs_redis;
mod lock_overhead;
mod peers;
pub mod placement;
mod real_device_mix;
pub mod report;
mod run_postgres;
mod run_redis;
mod runq;
mod stalls;

use std::path::{Path, PathBuf};

pub use report::Report;

/// Options every experiment accepts.
#[derive(Clone, Debug, Default)]
pub struct BenchArgs {
    /// A shorter run (for smoke tests); figures are noisier.
    pub quick: bool,
    /// Where to write the JSON copy of the report (plots go beside it).
    pub json: Option<PathBuf>,
    /// The device to run on (`sim`, `sim:hdd`, `sim:ssd`, `file:PATH`, ...);
    /// each experiment documents its default.
    pub device: Option<String>,
    /// A workload file instead of the experiment's built-in one.
    pub workload: Option<PathBuf>,
    /// Where the servers and the load generator run (the server
    /// comparisons: kv-vs-redis, run-redis).
    pub placement: placement::Placement,
}

impl BenchArgs {
    /// Where plots go: beside the JSON, else `./critio-results`.
    pub fn out_dir(&self) -> PathBuf {
        self.json
            .as_deref()
            .and_then(Path::parent)
            .filter(|p| !p.as_os_str().is_empty())
            .map_or_else(|| PathBuf::from("critio-results"), Path::to_path_buf)
    }

    /// The directory an experiment that runs servers on a file system
    /// works in: `--device file:DIR`, else `experiment` in the results
    /// directory; created, and absolute (redis-server resolves its log
    /// file after changing into its data directory).
    pub fn file_system_dir(&self, experiment: &str) -> Result<PathBuf, String> {
        let dir = match self.device.as_deref() {
            None => self.out_dir().join(experiment),
            Some(d) => match d.strip_prefix("file:") {
                Some(path) => PathBuf::from(path),
                None => {
                    return Err(format!(
                        "{experiment} runs on a file system: give --device file:DIR, not `{d}`"
                    ))
                }
            },
        };
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        std::path::absolute(&dir).map_err(|e| format!("cannot resolve {}: {e}", dir.display()))
    }
}

/// An experiment: its name, a one-line description, and its entry point.
pub struct Experiment {
    /// The name given to `critio bench`.
    pub name: &'static str,
    /// What it shows.
    pub about: &'static str,
    /// Runs it.
    pub run: fn(&BenchArgs) -> Result<Report, String>,
    /// The devices `bench all` runs it on (docs/RESULTS.md), each in its
    /// own section; empty: not part of it.
    pub results_on: &'static [ResultsOn],
}

/// Where `bench all` runs an experiment.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ResultsOn {
    /// A file in the results directory, through io_uring with O_DIRECT.
    File,
    /// The experiment's simulated device (its default).
    Sim,
    /// No device (the primitives' overheads).
    Any,
}

impl ResultsOn {
    /// The subdirectory of `results/` its plots and JSON go in.
    pub fn dir(self) -> &'static str {
        match self {
            ResultsOn::File => "file",
            ResultsOn::Sim => "sim",
            ResultsOn::Any => "",
        }
    }
}

/// Every experiment, in the order `critio bench --list` prints them.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        name: "e1-request-latency",
        about: "paper 000 Fig. 4-9: YCSB-A on critio-kv under checkpoints, every scheme, CCDF + wait points",
        run: e1_request_latency::run,
        results_on: &[ResultsOn::File, ResultsOn::Sim],
    },
    Experiment {
        name: "e2-device-priority",
        about: "paper 001 Fig. 2 on the simulated HDD: fg QD 1..32 vs bg QD 32, device priority on/off",
        run: e2_device_priority::run,
        results_on: &[ResultsOn::Sim],
    },
    Experiment {
        name: "e3-antagonists",
        about: "paper 004: fg random reads vs 1..16 sequential antagonists on the simulated HDD",
        run: e3_antagonists::run,
        results_on: &[ResultsOn::Sim],
    },
    Experiment {
        name: "e4-write-cache",
        about: "paper 002 Fig. 4a: critio-kv on a sim HDD behind a write cache, every admission policy x cache size",
        run: e4_write_cache::run,
        results_on: &[ResultsOn::Sim],
    },
    Experiment {
        name: "e5-ablation",
        about: "paper 000 Fig. 10: throughput with each rcp component off in turn, normalized to rcp",
        run: e5_ablation::run,
        results_on: &[ResultsOn::File, ResultsOn::Sim],
    },
    Experiment {
        name: "cache-entanglement",
        about: "fg write+commit latency vs a bg file writer: cache dirty limits and log inheritance on/off",
        run: cache_entanglement::run,
        results_on: &[ResultsOn::File, ResultsOn::Sim],
    },
    Experiment {
        name: "real-device-mix",
        about: "critical QD1 reader + background QD32 writer on a real file, 7 configs (needs io_uring)",
        run: real_device_mix::run,
        results_on: &[ResultsOn::File],
    },
    Experiment {
        name: "kv-background",
        about: "redis-benchmark against critio-kv during checkpoints and BGSAVE: none vs rcp p50..max (needs redis-tools)",
        run: kv_background::run,
        results_on: &[ResultsOn::File],
    },
    Experiment {
        name: "kv-vs-redis",
        about: "critio-kv (file, none and rcp) vs stock Redis (appendfsync always): redis-benchmark alone and under BGSAVE/BGREWRITEAOF, two sizes (needs redis-server, redis-tools)",
        run: kv_vs_redis::run,
        results_on: &[ResultsOn::File],
    },
    Experiment {
        name: "kv-schedulers",
        about: "Redis and critio-kv none, kernel-idle (ionice -c3) and rcp under BGSAVE/BGREWRITEAOF on each kernel I/O scheduler of the disk (switching needs root; needs redis-tools)",
        run: kv_schedulers::run,
        results_on: &[ResultsOn::File],
    },
    Experiment {
        name: "kv-cache-jobs",
        about: "critio-kv rcp vs Redis: GETs of incompressible data that fits the cache, alone and under BGSAVE/BGREWRITEAOF; critio's cache misses (needs redis-tools)",
        run: kv_cache_jobs::run,
        results_on: &[ResultsOn::File],
    },
    Experiment {
        name: "run-redis",
        about: "unmodified Redis (appendfsync always) alone, and under BGSAVE/BGREWRITEAOF: stock, ionice -c3 children, critio run (needs redis-server, redis-tools)",
        run: run_redis::run,
        results_on: &[ResultsOn::File],
    },
    Experiment {
        name: "run-postgres",
        about: "unmodified PostgreSQL, pgbench TPC-B with checkpoints every 30 s: stock vs critio run (needs Debian's postgresql; runs as the postgres user)",
        run: run_postgres::run,
        results_on: &[ResultsOn::File],
    },
    Experiment {
        name: "lock-overhead",
        about: "critio Mutex vs parking_lot/std: uncontended cost (goal <= 2x) and contended hand-off",
        run: lock_overhead::run,
        results_on: &[ResultsOn::Any],
    },
    Experiment {
        name: "block-overhead",
        about: "4 KiB reads on the mem device, directly vs through the block layer (goal >= 0.9x)",
        run: block_overhead::run,
        results_on: &[ResultsOn::Any],
    },
];

/// Finds an experiment by name, or says which exist.
pub fn find(name: &str) -> Result<&'static Experiment, String> {
    EXPERIMENTS.iter().find(|e| e.name == name).ok_or_else(|| {
        let names: Vec<_> = EXPERIMENTS.iter().map(|e| e.name).collect();
        format!(
            "unknown experiment `{name}`; available: {}",
            names.join(", ")
        )
    })
}
