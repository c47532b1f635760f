//! [`SimConfig`]: everything a simulated device is made of, every default
//! written down, validated with an error that names the field.

use std::path::PathBuf;

use super::hdd::HddParams;
use super::model::Firmware;
use super::ssd::SsdParams;
use super::store::StoreKind;
use crate::device::DeviceOpenError;
use crate::time::MS;

/// The block size of every simulated device (one sector).
pub const SIM_BLOCK_SIZE: u32 = 512;

/// The allowed range of [`SimConfig::speedup`].
pub const SPEEDUP_RANGE: std::ops::RangeInclusive<f64> = 0.001..=10_000.0;

/// Which drive is simulated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Profile {
    /// A 7200 rpm hard disk ([`HddParams`]). The default.
    #[default]
    Hdd,
    /// A flash drive ([`SsdParams`]).
    Ssd,
}

/// A simulated device's configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct SimConfig {
    /// HDD or SSD. Default: HDD.
    pub profile: Profile,
    /// Size in bytes, a positive multiple of 512. Default: 1 GiB.
    pub capacity: u64,
    /// Everything random (platter phase, GC stalls, which unflushed writes
    /// a power cut keeps) derives from this. Default: 0.
    pub seed: u64,
    /// Firmware serves `Class::Critical` commands first (paper 001).
    /// Default: false.
    pub priority_aware: bool,
    /// With `priority_aware`: `None` serves critical commands strictly
    /// first; `Some(ms)` keeps the throughput order and serves a critical
    /// command first once it has waited this long (see
    /// [`Firmware`](super::Firmware)). Default: None. Range 1..=60000.
    pub high_deadline_ms: Option<u64>,
    /// With strict `priority_aware`: a non-critical command waiting in the
    /// drive this long goes first. Default: 500 ms. Range 1..=60000.
    pub aging_ms: u64,
    /// Any command waiting in the drive this long goes first (the weak
    /// limit of throughput-first firmware). Default: 2000 ms. Range
    /// 1..=60000.
    pub max_age_ms: u64,
    /// Memory or a file. Default: memory.
    pub store: StoreKind,
    /// A volatile write cache: a completed write is durable only after a
    /// flush completes. Off: every completed write is durable. Default: on.
    /// (This is what a power cut may lose; how long writes and flushes
    /// take is the drive model's: the SSD's DRAM buffer is
    /// [`SsdParams::buffer_bytes`].)
    pub write_cache: bool,
    /// The cache's size for power cuts: past it the oldest unflushed writes
    /// are destaged (become durable). Default: 64 MiB.
    pub write_cache_bytes: u64,
    /// A power cut may tear an unflushed write (keep a prefix of its
    /// sectors). Default: false.
    pub torn_writes: bool,
    /// How many times faster than real time the driver runs the model
    /// (1.0 = real time; tests use 10-100 to run an HDD fast). Default: 1.0.
    pub speedup: f64,
    /// HDD timings (used by `Profile::Hdd`). Default: 7200 rpm, 16 ms full
    /// stroke, 1 MiB read-ahead.
    pub hdd: HddParams,
    /// SSD timings (used by `Profile::Ssd`). Default: 8 channels x 4 dies
    /// of Micron MT29F16G08MAAWP MLC flash behind an 8 MiB DRAM buffer.
    pub ssd: SsdParams,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            profile: Profile::Hdd,
            capacity: 1 << 30,
            seed: 0,
            priority_aware: false,
            high_deadline_ms: None,
            aging_ms: 500,
            max_age_ms: 2000,
            store: StoreKind::Memory,
            write_cache: true,
            write_cache_bytes: 64 << 20,
            torn_writes: false,
            speedup: 1.0,
            hdd: HddParams::default(),
            ssd: SsdParams::default(),
        }
    }
}

const _: () = assert!(SIM_BLOCK_SIZE.is_power_of_two());

impl SimConfig {
    /// An HDD of `capacity` bytes, defaults otherwise.
    pub fn hdd(capacity: u64, seed: u64) -> Self {
        Self {
            capacity,
            seed,
            ..Self::default()
        }
    }

    /// An SSD of `capacity` bytes, defaults otherwise.
    pub fn ssd(capacity: u64, seed: u64) -> Self {
        Self {
            profile: Profile::Ssd,
            ..Self::hdd(capacity, seed)
        }
    }

    /// The same config keeping its data in the file at `path`.
    pub fn with_file(self, path: impl Into<PathBuf>) -> Self {
        Self {
            store: StoreKind::File(path.into()),
            ..self
        }
    }

    /// The device's name in tables and errors.
    pub fn name(&self) -> String {
        let profile = match self.profile {
            Profile::Hdd => "sim-hdd",
            Profile::Ssd => "sim-ssd",
        };
        match &self.store {
            StoreKind::Memory => profile.to_string(),
            StoreKind::File(p) => format!("{profile}:{}", p.display()),
        }
    }

    /// The firmware policy this config asks for.
    pub fn firmware(&self) -> Firmware {
        Firmware {
            priority_aware: self.priority_aware,
            high_deadline_ns: self.high_deadline_ms.map(|ms| ms * MS),
            aging_ns: self.aging_ms * MS,
            max_age_ns: self.max_age_ms * MS,
        }
    }

    /// Checks every field; the error names the first bad one and what is
    /// allowed.
    pub fn validate(&self) -> Result<(), DeviceOpenError> {
        self.check()
            .map_err(|(field, why)| DeviceOpenError::InvalidOption {
                device: self.name(),
                field,
                why,
            })
    }

    /// The first bad field and what is wrong with it.
    fn check(&self) -> Result<(), (&'static str, String)> {
        let block = u64::from(SIM_BLOCK_SIZE);
        if self.capacity == 0 || self.capacity % block != 0 {
            return Err((
                "capacity",
                format!(
                    "{} must be a positive multiple of {block} bytes",
                    self.capacity
                ),
            ));
        }
        let deadline = ("high_deadline_ms", self.high_deadline_ms.unwrap_or(1));
        for (field, ms) in [
            ("aging_ms", self.aging_ms),
            ("max_age_ms", self.max_age_ms),
            deadline,
        ] {
            if !(1..=60_000).contains(&ms) {
                return Err((field, format!("{ms} must be within 1..=60000")));
            }
        }
        if self.write_cache && self.write_cache_bytes < block {
            return Err((
                "write_cache_bytes",
                format!(
                    "{} must be at least {block} (or turn write_cache off)",
                    self.write_cache_bytes
                ),
            ));
        }
        if !SPEEDUP_RANGE.contains(&self.speedup) {
            return Err((
                "speedup",
                format!(
                    "{} must be within {}..={} (1.0 = real time)",
                    self.speedup,
                    SPEEDUP_RANGE.start(),
                    SPEEDUP_RANGE.end()
                ),
            ));
        }
        // The drive's own parameters name their field (`hdd.queue_depth`).
        match self.profile {
            Profile::Hdd => self.hdd.validate().map_err(|why| ("hdd", why)),
            Profile::Ssd => self.ssd.validate().map_err(|why| ("ssd", why)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid_and_bad_fields_are_named() {
        SimConfig::default().validate().unwrap();
        SimConfig::ssd(1 << 20, 1).validate().unwrap();
        let bad = SimConfig {
            capacity: 1000,
            ..SimConfig::default()
        };
        let e = bad.validate().unwrap_err();
        assert!(
            matches!(
                e,
                DeviceOpenError::InvalidOption {
                    field: "capacity",
                    ..
                }
            ),
            "{e:?}"
        );
        let e = e.to_string();
        assert!(e.contains("invalid capacity: 1000"), "{e}");
        let bad = SimConfig {
            speedup: 0.0,
            ..SimConfig::default()
        };
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("speedup"), "{e}");
        let mut bad = SimConfig::default();
        bad.hdd.queue_depth = 0;
        let e = bad.validate().unwrap_err().to_string();
        assert!(e.contains("hdd.queue_depth"), "{e}");
    }
}
