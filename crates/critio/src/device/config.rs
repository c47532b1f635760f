//! The `[device]` section of the config: which device a stack opens, how
//! large a memory, simulated or newly created device is, and which kernel
//! priorities each class's commands carry.
//!
//! ```toml
//! [device]
//! spec = "file:/var/lib/app/critio.img"  # mem | sim[:ssd|:hdd][:PATH] | file:PATH | pool:PATH
//! capacity_bytes = 1073741824            # size of mem/sim, or of a file created because it did not exist
//! seed = 1                               # the simulated device's random seed
//! priorities = "levels"                  # off | levels (BE 0 / BE 7) | classes (RT 0 / IDLE) | idle (BE 4 / IDLE)
//! queue_depth = 128                      # commands in flight on file:; 0 = the kernel's queue (nr_requests)
//! ```
//!
//! On a simulated drive, `levels` and `classes` also switch on the
//! firmware's priority (it serves critical commands first, paper 001);
//! `off` and `idle` leave it a plain throughput-first drive, as the kernel's
//! priorities never reach one.
//!
//! A [`DeviceSpec`] is written in the config as the same string the command
//! line takes (see [`super::spec`]).

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::{DeviceSpec, OpenOptions};
use crate::error::ConfigError;
use crate::sys::ClassPriorities;

/// The kernel I/O priority each class's commands carry on `file:` and
/// `pool:` devices.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PriorityMode {
    /// No per-command priority: the kernel uses each submitting thread's.
    Off,
    /// Levels within best-effort: BE 0 for critical, BE 7 for non-critical
    /// ([`ClassPriorities::LEVELS`]). The default: the kernel and drive see
    /// which I/O matters, and critio's block layer keeps the order and
    /// background progress.
    #[default]
    Levels,
    /// Strict classes: realtime 0 for critical, idle for non-critical
    /// ([`ClassPriorities::default`]), what `ionice` users pick.
    Classes,
    /// What `ionice -c3` on background threads gives, and nothing more:
    /// non-critical commands in the kernel's idle class, the rest at
    /// best-effort 4, the priority the kernel gives a thread nobody set
    /// ([`ClassPriorities::IDLE_BACKGROUND`]). The baseline that leaves
    /// priority to the kernel's I/O scheduler.
    Idle,
}

impl PriorityMode {
    /// The priorities a device is opened with (`None`: off).
    pub fn priorities(self) -> Option<ClassPriorities> {
        match self {
            PriorityMode::Off => None,
            PriorityMode::Levels => Some(ClassPriorities::LEVELS),
            PriorityMode::Classes => Some(ClassPriorities::default()),
            PriorityMode::Idle => Some(ClassPriorities::IDLE_BACKGROUND),
        }
    }

    /// Whether a simulated drive's firmware serves critical commands first
    /// under this mode: with `levels` and `classes`, the modes in which
    /// critio hands each command's class to the device.
    pub fn drive_priority(self) -> bool {
        matches!(self, PriorityMode::Levels | PriorityMode::Classes)
    }
}

/// The `[device]` section.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// The device, as on a command line. Default `mem` (memory, gone at
    /// exit): give `file:PATH` for a real file through io_uring.
    #[serde(serialize_with = "spec_to_str", deserialize_with = "spec_from_str")]
    pub spec: DeviceSpec,
    /// Size of a memory or simulated device, and of a file created because
    /// it did not exist (an existing file keeps its size). A multiple of
    /// 4096. Default 256 MiB.
    pub capacity_bytes: u64,
    /// The simulated device's random seed. Default 1.
    pub seed: u64,
    /// The kernel priority of each class's commands. Default `levels`.
    pub priorities: PriorityMode,
    /// Commands in flight at a `file:` device (its io_uring's size): a
    /// power of two up to 4096, or 0 for the kernel's own queue depth, the
    /// `nr_requests` of the file's disk (rounded up to a power of two; 128
    /// where it cannot be read). Default 128.
    pub queue_depth: u32,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            spec: DeviceSpec::Mem,
            capacity_bytes: 256 << 20,
            seed: 1,
            priorities: PriorityMode::Levels,
            queue_depth: crate::device::uring::ENTRIES_DEFAULT,
        }
    }
}

impl DeviceConfig {
    /// Checks every field; the error names the first bad one.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.capacity_bytes == 0 || self.capacity_bytes % 4096 != 0 {
            return Err(ConfigError::Invalid {
                field: "device.capacity_bytes",
                value: self.capacity_bytes.to_string(),
                allowed: "must be a positive multiple of 4096".into(),
            });
        }
        let depth = self.queue_depth;
        if depth != 0 && (!depth.is_power_of_two() || depth > crate::device::uring::ENTRIES_MAX) {
            return Err(ConfigError::Invalid {
                field: "device.queue_depth",
                value: depth.to_string(),
                allowed: format!(
                    "must be 0 (the kernel's queue depth) or a power of two up to {}",
                    crate::device::uring::ENTRIES_MAX
                ),
            });
        }
        Ok(())
    }

    /// The options [`DeviceSpec::open`] takes.
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions {
            capacity: self.capacity_bytes,
            seed: self.seed,
            priorities: self.priorities.priorities(),
            drive_priority: self.priorities.drive_priority(),
            queue_depth: self.queue_depth,
        }
    }
}

/// Writes a [`DeviceSpec`] as its command-line string.
pub(crate) fn spec_to_str<S: Serializer>(spec: &DeviceSpec, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(spec)
}

/// Reads a [`DeviceSpec`] from its command-line string.
pub(crate) fn spec_from_str<'de, D: Deserializer<'de>>(d: D) -> Result<DeviceSpec, D::Error> {
    let text = String::deserialize(d)?;
    text.parse().map_err(serde::de::Error::custom)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_device_section_round_trips_and_bad_values_are_named() {
        let text = "spec = \"sim:hdd\"\ncapacity_bytes = 8388608\npriorities = \"classes\"\n";
        let c: DeviceConfig = toml::from_str(text).unwrap();
        assert_eq!(c.spec.to_string(), "sim:hdd");
        assert_eq!(c.priorities.priorities(), Some(ClassPriorities::default()));
        c.validate().unwrap();
        let back: DeviceConfig = toml::from_str(&toml::to_string(&c).unwrap()).unwrap();
        assert_eq!(back, c);
        let err = toml::from_str::<DeviceConfig>("spec = \"disk:/x\"").unwrap_err();
        assert!(err.to_string().contains("is not a device"), "{err}");
        let bad = DeviceConfig {
            capacity_bytes: 1000,
            ..DeviceConfig::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("device.capacity_bytes"), "{err}");
        let bad = DeviceConfig {
            queue_depth: 100,
            ..DeviceConfig::default()
        };
        let err = bad.validate().unwrap_err().to_string();
        assert!(err.contains("device.queue_depth"), "{err}");
        let kernel = DeviceConfig {
            queue_depth: 0,
            ..DeviceConfig::default()
        };
        kernel.validate().unwrap();
    }

    #[test]
    fn each_mode_says_what_the_kernel_and_a_simulated_drive_get() {
        let idle: DeviceConfig = toml::from_str("priorities = \"idle\"").unwrap();
        let opts = idle.open_options();
        assert_eq!(opts.priorities, Some(ClassPriorities::IDLE_BACKGROUND));
        assert!(!opts.drive_priority, "ionice never reaches the drive");
        for (mode, drive) in [
            (PriorityMode::Off, false),
            (PriorityMode::Idle, false),
            (PriorityMode::Levels, true),
            (PriorityMode::Classes, true),
        ] {
            assert_eq!(mode.drive_priority(), drive, "{mode:?}");
        }
        assert_eq!(PriorityMode::Off.priorities(), None);
    }
}
