//! Workloads as data (STYLE.md rule 16): a YCSB-style key-value load and the
//! stack it runs on, described in a TOML file users can copy and edit
//! (`workloads/*.toml` in the repository; each experiment embeds its own as
//! the default and takes `--workload FILE`).
//!
//! ```toml
//! records = 80000            # keys loaded before the run
//! value_bytes = 1024
//! read_proportion = 0.5      # YCSB-A: 50% reads, 50% updates
//! distribution = "zipfian"   # or "uniform"
//! clients = 8                # closed-loop clients
//! duration_s = 12.0
//! ```

mod zipf;

use std::path::Path;

use rand::Rng;
use serde::{Deserialize, Serialize};

pub use zipf::{KeyChooser, Zipfian};

/// How keys are chosen.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Distribution {
    /// YCSB's scrambled zipfian.
    Zipfian,
    /// Uniform.
    Uniform,
}

/// A key-value load and the store it runs against.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KvWorkload {
    /// Keys loaded before the run.
    pub records: u64,
    /// Keys loaded with `--quick` (still several times the cache).
    pub quick_records: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Fraction of operations that are reads (GET); the rest are updates
    /// (SET of a new value).
    pub read_proportion: f64,
    /// How keys are chosen.
    pub distribution: Distribution,
    /// Zipfian skew (YCSB: 0.99).
    pub zipf_theta: f64,
    /// Closed-loop clients.
    pub clients: usize,
    /// Seconds measured per run.
    pub duration_s: f64,
    /// Seconds of load before measuring.
    pub warmup_s: f64,
    /// Seconds measured per run with `--quick`.
    pub quick_duration_s: f64,
    /// The device (`sim:ssd`, `sim:hdd`, `file:PATH`, ...).
    pub device: String,
    /// Bytes of the device (simulated, or a file created for the run).
    pub capacity_bytes: u64,
    /// Bytes of the page cache (the data set should be several times it).
    pub cache_bytes: u64,
    /// Checkpoint interval, in ms.
    pub checkpoint_interval_ms: u64,
    /// Start a BGSAVE this often during the run (0: never), in s.
    pub bgsave_every_s: f64,
}

/// One operation of the load.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvOp {
    /// GET key.
    Read(u64),
    /// SET key to a new value.
    Update(u64),
}

/// The device of a `--quick` run at most: a short run writes little, and
/// every run copies the store (densely on a real file).
const QUICK_CAPACITY_BYTES: u64 = 512 << 20;

impl KvWorkload {
    /// The `--quick` version of this load: `quick_records` keys on a
    /// device of at most 512 MiB; returns the seconds to measure per run.
    pub fn quick(&mut self) -> f64 {
        self.records = self.quick_records;
        self.capacity_bytes = self.capacity_bytes.min(QUICK_CAPACITY_BYTES);
        self.quick_duration_s
    }

    /// Parses a workload file; errors name the file and the field.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, String> {
        let w: KvWorkload = toml::from_str(text).map_err(|e| format!("{origin}: {e}"))?;
        w.validate().map_err(|e| format!("{origin}: {e}"))?;
        Ok(w)
    }

    /// Reads a workload file.
    pub fn load(path: &Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        Self::from_toml(&text, &path.display().to_string())
    }

    /// Checks the fields.
    pub fn validate(&self) -> Result<(), String> {
        if self.records < 2 {
            return Err("records must be at least 2".into());
        }
        if !(0.0..=1.0).contains(&self.read_proportion) {
            return Err(format!(
                "read_proportion {} is not in [0, 1]",
                self.read_proportion
            ));
        }
        if !(self.zipf_theta > 0.0 && self.zipf_theta < 1.0) {
            return Err(format!("zipf_theta {} is not in (0, 1)", self.zipf_theta));
        }
        if self.clients == 0 || self.value_bytes == 0 {
            return Err("clients and value_bytes must be positive".into());
        }
        if self.duration_s <= 0.0 || self.quick_duration_s <= 0.0 {
            return Err("durations must be positive".into());
        }
        Ok(())
    }

    /// The key chooser of this workload.
    pub fn chooser(&self) -> KeyChooser {
        match self.distribution {
            Distribution::Zipfian => {
                KeyChooser::ScrambledZipfian(Zipfian::new(self.records, self.zipf_theta))
            }
            Distribution::Uniform => KeyChooser::Uniform(self.records),
        }
    }

    /// The next operation.
    pub fn next_op(&self, keys: &KeyChooser, rng: &mut impl Rng) -> KvOp {
        let key = keys.next_key(rng);
        if rng.gen_bool(self.read_proportion) {
            KvOp::Read(key)
        } else {
            KvOp::Update(key)
        }
    }
}

/// The key name of index `i` (YCSB style).
pub fn key_name(i: u64) -> String {
    format!("user{i:012}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::SeedableRng;

    fn demo() -> KvWorkload {
        KvWorkload::from_toml(include_str!("../../../../workloads/demo.toml"), "demo.toml").unwrap()
    }

    #[test]
    fn the_read_write_mix_matches_the_proportion() {
        let w = demo();
        let keys = w.chooser();
        let mut rng = SmallRng::seed_from_u64(3);
        let n = 100_000;
        let reads = (0..n)
            .filter(|_| matches!(w.next_op(&keys, &mut rng), KvOp::Read(_)))
            .count();
        let frac = reads as f64 / n as f64;
        assert!((frac - w.read_proportion).abs() < 0.01, "{frac}");
    }

    #[test]
    fn bad_files_name_the_problem() {
        let e = KvWorkload::from_toml("records = 5", "x.toml").unwrap_err();
        assert!(e.starts_with("x.toml"), "{e}");
        let mut w = demo();
        w.read_proportion = 1.5;
        assert!(w.validate().unwrap_err().contains("read_proportion"));
        assert_eq!(key_name(7), "user000000000007");
    }
}
