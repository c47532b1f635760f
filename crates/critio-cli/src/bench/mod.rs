//! `critio bench <experiment>`: the experiments, each reporting what it
//! measured side by side in one run, as a table, targets and optional JSON.

mod lock_overhead;
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
pub const EXPERIMENTS: &[Experiment] = &[Experiment {
    name: "lock-overhead",
    about: "critio Mutex vs parking_lot/std: uncontended cost (goal <= 2x) and contended hand-off",
    run: lock_overhead::run,
}];

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
