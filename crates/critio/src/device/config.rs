//! The `[device]` section of the config: which device a stack opens, how
//! large a memory, simulated or newly created device is, and which kernel
//! priorities each class's commands carry.
//!
//! ```toml
//! [device]
//! spec = "file:/var/lib/app/critio.img"  # mem | sim[:ssd|:hdd][:PATH] | file:PATH | pool:PATH
//! capacity_bytes = 1073741824            # size of mem/sim, or of a file created because it did not exist
//! seed = 1                               # the simulated device's random seed
//! priorities = "levels"                  # off | levels (BE 0 / BE 7) | classes (RT 0 / IDLE)
//! ```
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
}

impl PriorityMode {
    /// The priorities a device is opened with (`None`: off).
    pub fn priorities(self) -> Option<ClassPriorities> {
        match self {
            PriorityMode::Off => None,
            PriorityMode::Levels => Some(ClassPriorities::LEVELS),
            PriorityMode::Classes => Some(ClassPriorities::default()),
        }
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
}

impl Default for DeviceConfig {
    fn default() -> Self {
        Self {
            spec: DeviceSpec::Mem,
            capacity_bytes: 256 << 20,
            seed: 1,
            priorities: PriorityMode::Levels,
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
        Ok(())
    }

    /// The options [`DeviceSpec::open`] takes.
    pub fn open_options(&self) -> OpenOptions {
        OpenOptions {
            capacity: self.capacity_bytes,
            seed: self.seed,
            priorities: self.priorities.priorities(),
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
    }
}
