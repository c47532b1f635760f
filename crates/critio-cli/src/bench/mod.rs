//! `critio bench <experiment>`: the experiments, each reporting what it
//! measured side by side in one run, as a table, targets and optional JSON.

mod block_overhead;
mod cache_entanglement;
mod e2_device_priority;
mod lock_overhead;
mod real_device_mix;
pub mod report;

use std::path::PathBuf;

pub use report::Report;

/// Options every experiment accepts.
#[derive(Clone, Debug, Default)]
pub struct BenchArgs {
    /// A shorter run (for smoke tests); figures are noisier.
    pub quick: bool,
    /// Where to write the JSON copy of the report.
    pub json: Option<PathBuf>,
    /// The device to run on (`sim`, `sim:hdd`, `sim:ssd`, `file:PATH`, ...);
    /// each experiment documents its default.
    pub device: Option<String>,
}

/// An experiment: its name, a one-line description, and its entry point.
pub struct Experiment {
    /// The name given to `critio bench`.
    pub name: &'static str,
    /// What it shows.
    pub about: &'static str,
    /// Runs it.
    pub run: fn(&BenchArgs) -> Result<Report, String>,
}

/// Every experiment, in the order `critio bench --list` prints them.
pub const EXPERIMENTS: &[Experiment] = &[
    Experiment {
        name: "lock-overhead",
        about: "critio Mutex vs parking_lot/std: uncontended cost (goal <= 2x) and contended hand-off",
        run: lock_overhead::run,
    },
    Experiment {
        name: "e2-device-priority",
        about: "paper 001 Fig. 2 on the simulated HDD: fg QD 1..32 vs bg QD 32, device priority on/off",
        run: e2_device_priority::run,
    },
    Experiment {
        name: "real-device-mix",
        about: "critical QD1 reader + background QD32 writer on a real file, 6 configs (needs io_uring)",
        run: real_device_mix::run,
    },
    Experiment {
        name: "cache-entanglement",
        about: "fg write+commit latency vs a bg file writer: cache dirty limits and log inheritance on/off",
        run: cache_entanglement::run,
    },
    Experiment {
        name: "block-overhead",
        about: "4 KiB reads on the mem device, directly vs through the block layer (goal >= 0.9x)",
        run: block_overhead::run,
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
